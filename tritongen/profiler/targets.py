"""What to profile: the models on the server (`Target`), resolved from the spec's entries or the
names given and checked against the server's model index, each classified as an LLM or a classic
model (`core.model_kind`: the spec's `kind` or --kind first, the config's look only where nobody
said), and the streaming inputs of a target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tritongen.client import tensors_from_config
from tritongen.core.kv import kv_shape, weight_bytes
from tritongen.core.llm_interface import LLMInterface
from tritongen.core.model_kind import KindRefused, StatedKind, classify
from tritongen.core.plan import ModelEntryPlan, TensorView, plan_deployment
from tritongen.core.profile_types import MeasurementGap, StatedEngine
from tritongen.errors import BadInput, RunFailed
from tritongen.profiler.engine import stream_inputs as engine_stream_inputs
from tritongen.specio import LoadedSpec
from tritongen.triton_admin import TritonAdmin


@dataclass(frozen=True)
class Target:
    """One model entry on the server, with what the spec (if any) says about it."""

    name: str
    kind: str  # classic | streaming
    max_batch_size: int
    inputs: list[TensorView]
    outputs: list[TensorView]
    config: dict
    spec_model: str | None = None
    kv_bytes_per_token_analytic: int | None = None
    weights_bytes_analytic: int | None = None
    max_context: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    max_prompt_tokens: int | None = None  # a short lane takes prompts up to its split only
    bytes_per_token: float | None = None  # the spec's tokenizer ratio
    interface: LLMInterface | None = None  # the LLM interface it speaks; None on a classic model not measured as an LLM
    stated_engine: StatedEngine | None = None  # the spec's engine: section, carried into the profile
    kind_note: str | None = None  # a stated kind that decided against the config's look, for the profile's notes
    kind_gap: MeasurementGap | None = None  # taken for an LLM from its config alone: the guess, and how to say otherwise

    @property
    def parameters(self) -> dict[str, str]:
        raw = self.config.get("parameters") or {}
        return {k: (v.get("string_value", "") if isinstance(v, dict) else str(v)) for k, v in raw.items()}

    def int_parameter(self, key: str) -> int | None:
        try:
            return int(self.parameters[key])
        except (KeyError, ValueError):
            return None

    @property
    def instance_kinds(self) -> set[str]:
        return {g.get("kind", "KIND_AUTO") for g in self.config.get("instance_group") or []}

    @property
    def gpus(self) -> list[int]:
        return sorted({int(i) for g in self.config.get("instance_group") or [] for i in g.get("gpus") or []})


def _server_target(name: str, config: dict, stated: StatedKind | None = None, **spec_fields) -> Target:
    """The target of one served model, classified before anything is measured: a kind its config
    cannot be profiled as is bad input now, not a failure half-way through the run."""
    try:
        how = classify(name, config, stated)
    except KindRefused as err:
        raise BadInput(str(err)) from None
    target = Target(
        name=name,
        kind=how.profiled_as,
        max_batch_size=int(config.get("max_batch_size", 0)),
        inputs=tensors_from_config(config.get("input") or []),
        outputs=tensors_from_config(config.get("output") or []),
        config=config,
        interface=how.interface,
        kind_note=how.note,
        kind_gap=how.gap,
        **spec_fields,
    )
    if target.max_context is None and target.int_parameter("max_context"):
        target = replace(target, max_context=target.int_parameter("max_context"))
    return target


def unknown_model_error(names: Sequence[str], available: Sequence[str], where: str) -> BadInput:
    listing = ", ".join(sorted(available)) or "(none)"
    missing = ", ".join(repr(n) for n in names)
    return BadInput(f"model {missing} is not on the server at {where}; the server has: {listing}")


def spec_entries(loaded: LoadedSpec, names: Sequence[str] = ()) -> list[ModelEntryPlan]:
    """The spec's model entries (lanes included), or those named by entry or spec-model name."""
    entries = list(plan_deployment(loaded.spec, loaded.architectures).entries)
    if names:
        unknown = [n for n in names if not any(e.name == n or e.spec_model == n for e in entries)]
        if unknown:
            raise BadInput(
                f"{loaded.path}: no model entry named {', '.join(map(repr, unknown))}; "
                f"the spec has: {', '.join(e.name for e in entries)}"
            )
        entries = [e for e in entries if e.name in names or e.spec_model in names]
    return entries


def resolve_targets(admin: TritonAdmin, names: Sequence[str], loaded: LoadedSpec | None,
                    kinds: Mapping[str, StatedKind] | None = None) -> list[Target]:
    """Spec entries (all, or those named) or the named models, checked against the server. Each
    spec entry's kind is its model's `kind:`; without a spec, `kinds` (--kind) states some models'."""
    entries = spec_entries(loaded, names) if loaded is not None else []
    wanted = [e.name for e in entries] if loaded is not None else list(dict.fromkeys(names))
    index = admin.models()
    available = {m["name"]: m for m in index}
    missing = [n for n in wanted if n not in available]
    if missing:
        raise unknown_model_error(missing, list(available), f"http://{admin.endpoints.http}")
    not_ready = [n for n in wanted if str(available[n].get("state", "READY")) != "READY" or not admin.model_ready(n)]
    if not_ready:
        states = ", ".join(f"{n} ({available[n].get('state') or 'not ready'}: {available[n].get('reason', '')})" for n in not_ready)
        raise RunFailed(f"model(s) not ready on the server: {states}")
    targets = []
    if loaded is None:
        return [_server_target(n, admin.config(n), (kinds or {}).get(n)) for n in wanted]
    for entry in entries:
        model = next(m for m in loaded.spec.models if m.name == entry.spec_model)
        arch = loaded.architectures.get(model.name)
        kv_analytic = entry.kv.kv_bytes_per_token if entry.kv else None
        if kv_analytic is None and arch is not None:
            kv_analytic = kv_shape(arch, model.kv_dtype, model.tensor_parallel).kv_bytes_per_token
        weights = None
        if model.weights is not None:
            weights = model.weights.bytes
            if weights is None and model.weights.parameters is not None and model.weights.dtype is not None:
                weights = weight_bytes(model.weights.parameters, model.weights.dtype)
        targets.append(
            _server_target(
                entry.name,
                admin.config(entry.name),
                StatedKind(model.kind),
                spec_model=model.name,
                kv_bytes_per_token_analytic=kv_analytic,
                weights_bytes_analytic=weights,
                max_context=model.max_context,
                prompt_tokens=model.typical_prompt_tokens,
                output_tokens=model.typical_output_tokens,
                max_prompt_tokens=entry.prompt_tokens_max,
                bytes_per_token=model.bytes_per_token,
                stated_engine=StatedEngine.of(model, loaded.path),
            )
        )
    return targets


def stream_inputs(target: Target, prompt_tokens: int, max_tokens: int) -> dict[str, np.ndarray]:
    """A streaming request in the model's own interface (`target.interface`), stream on; the prompt
    is `prompt_tokens` bytes (the memory probes count bytes as tinyllm's byte tokenizer does)."""
    assert target.interface is not None
    return engine_stream_inputs(target.interface, prompt_tokens, max_tokens, 1.0)
