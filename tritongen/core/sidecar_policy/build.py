"""The sidecar's policy, derived from the spec, its plan and (optionally) measured profiles. Pure.

`build_sidecar_policy(spec, plan, profiles)` returns the JSON document `tritongen render` writes
as `sidecar_policy.json` beside the models; `schema.py` beside it is its schema. Every
number comes from the same arithmetic the configs were rendered from:

* LLM cost: KV bytes per token measured by the profile (`memory.kv_bytes_per_token_measured`)
  when there is one (and it is not below the arithmetic), else the analytic `kv_shape` figure of
  the plan; for a model whose layers do not all grow alike (windows, chunks, a recurrent state),
  the plan's footprint instead: bytes per token of the growing layers, the capped layers with
  their caps and the fixed state bytes, so the sidecar charges each request its exact footprint at
  its own length (a single measured bytes/token cannot say how those layers grow, so it is not
  used for them); the profiled prefill peak per prompt length (`memory.prefill`); prompt bytes per
  token from the spec, else the backend's own token counts in the profile, else 1 (the bound
  that never under-counts), and the tokenizer.json that counts prompts exactly where one is
  known (the spec's `tokenizer`, else the one the caller found in the model's own directory);
  the prompt and max_tokens inputs of the model's interface.
* LLM limits: the engine the model runs (engine_sources: vLLM's model.json, TensorRT-LLM's
  parameters, tritongen's engine parameters, the spec's `engine:` section, the profile, the KV
  plan): its KV policy, its pool (tokens x KV bytes per token, per engine; the quota is that x
  engines), its block size, max_context and max_num_seqs x engines in flight. Engines that
  reserve or kill get each request's footprint reserved; a grow-and-preempt engine (vLLM) gets no
  reservation. A model whose engine nothing describes is reserved against the KV plan's pool.
* Classic limits: what Triton itself accepts (`_triton_accepts`), or none; cost: one request's
  tensor bytes (inputs + outputs, one row).
* Classes: the spec's traffic classes; a request may wait in the sidecar for its class's target
  less the model's measured upstream time, and is refused only when its predicted wait exceeds
  that (no count cap); lower classes may fill only part of each limit (normal 90 %, batch 80 %),
  keeping room for the top class.
* Devices: memory x utilisation cap, and what the plan placed on each (weights, framework
  reserve, pre-allocated KV pools) for the static fallback.
* Tenants: none. The spec says nothing about who sends the traffic, so the policy names the
  tenant header (`x-tenant`) and an empty `tenants` list, with no `default_tenant` quota: every
  tenant is unlimited (within the model and class limits) until an operator adds quotas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tritongen.core.engine_sources import (
    EngineLimits,
    EngineSourceError,
    entry_sources,
    measured_from_profile,
    resolve_engine_limits,
)
from tritongen.core.kv import KVFootprint, weight_bytes
from tritongen.core.llm_interface import LLMInterface, UnknownInterface, plan_entry_interface
from tritongen.core.plan import DeploymentPlan, ModelEntryPlan, default_class
from tritongen.core.profile_types import Profile
from tritongen.core.sidecar_policy.schema import POLICY_VERSION
from tritongen.core.spec import MIB, DeploymentSpec, ModelSpec, TensorSpec, TrafficClass
from tritongen.errors import BadInput

BUDGET_FRACTION = {"interactive": 1.0, "normal": 0.9, "batch": 0.8}
TENANT_HEADER = "x-tenant"
TENSOR_BYTES = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
    "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "STRING": 0,
}
DEFAULT_GRACE_MS = 500.0


def _profile_for(profiles: Mapping[str, Profile], entry: ModelEntryPlan) -> Profile | None:
    return profiles.get(entry.name) or profiles.get(entry.spec_model)


def _engines(entry: ModelEntryPlan) -> int:
    total = 0
    for group in entry.instance_groups:
        total += group.count * (len(group.gpus) if group.kind == "KIND_GPU" and group.gpus else 1)
    return max(1, total)


def _row_bytes(tensors: list[TensorSpec]) -> int:
    total = 0
    for t in tensors:
        elements = math.prod(d for d in t.dims if d > 0)
        total += elements * TENSOR_BYTES[t.data_type]
    return total


def _weights(model: ModelSpec) -> int:
    if model.weights is None:
        return 0
    if model.weights.bytes is not None:
        return model.weights.bytes
    assert model.weights.parameters is not None and model.weights.dtype is not None
    return weight_bytes(model.weights.parameters, model.weights.dtype)


# What a backend generates when a request names no max_tokens (vLLM: SamplingParams' default).
BACKEND_DEFAULT_MAX_TOKENS = {"vllm": 16}


def _default_max_tokens(model: ModelSpec, interface: LLMInterface | None) -> int | None:
    """The model's own `default_max_tokens` parameter, else its interface's or backend's default,
    else unknown (the sidecar then charges a request up to max_context)."""
    return (_int_param(model, "default_max_tokens") or (interface.default_max_tokens if interface else None)
            or BACKEND_DEFAULT_MAX_TOKENS.get(model.backend))


def _int_param(model: ModelSpec, key: str) -> int | None:
    value = model.parameters.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _class_entry(spec: DeploymentSpec, klass: TrafficClass, top: int) -> dict[str, Any]:
    return {
        "name": klass.name,
        "kind": klass.kind,
        "priority": klass.priority,
        "p99_ms": klass.p99_ms,
        # The whole target: the sidecar subtracts the model's measured time to first token (or to the
        # end, unary) itself (admission.allowed_wait_s), so a request waits as long as it can still
        # make its target, and no longer. (Triton's own queue policy keeps queue_timeout_fraction:
        # it cannot measure what comes after its queue.)
        "max_queue_wait_ms": float(klass.p99_ms),
        "queue_cap": None,  # refused by predicted wait, not by a count
        "budget_fraction": 1.0 if klass.priority == top else BUDGET_FRACTION[klass.kind],
    }


def _model_entry(
    spec: DeploymentSpec, plan: DeploymentPlan, entry: ModelEntryPlan, profile: Profile | None, notes: list[str],
    found_tokenizer: str | None = None,
) -> dict[str, Any]:
    model = next(m for m in spec.models if m.name == entry.spec_model)
    placement = next(p for p in plan.placements if p.model == entry.spec_model)
    devices = ["cpu"] if plan.cpu_only else [f"gpu{i}" for i in placement.gpus]
    engines = _engines(entry)
    batching = entry.dynamic_batching
    out: dict[str, Any] = {
        "name": entry.name,
        "kind": entry.kind,
        "streaming": entry.decoupled,
        "devices": devices,
        "engines": engines,
        "classes": list(model.classes) if model.classes else None,
        "priority_levels": batching.priority_levels if batching else 0,
        "default_priority": batching.default_priority_level if batching else 0,
    }
    if entry.kv is not None:
        out.update(_llm_entry(spec, model, entry, profile, engines, notes, found_tokenizer))
    else:
        out["request_bytes"] = _row_bytes(model.inputs) + _row_bytes(model.outputs)
        out["request_bytes_source"] = "analytic"
        out["max_inflight"], why = _triton_accepts(entry, engines)
        out["release_grace_ms"] = 0.0
        notes.append(f"{entry.name}: {out['request_bytes']} B per request (tensor bytes of one row); {why}")
    return out


def _triton_accepts(entry: ModelEntryPlan, engines: int) -> tuple[int | None, str]:
    """What Triton itself takes of a classic model at once: a batch per instance, plus every
    priority queue's max_queue_size when all of them are bounded; None when a queue is unbounded
    (no dynamic batching, or a max_queue_size of 0). The sidecar never holds a model below it."""
    running = max(1, entry.max_batch_size) * engines
    batching = entry.dynamic_batching
    if batching is None:
        return None, f"no in-flight limit (Triton's default scheduler queues without bound; {running} run at once)"
    queues = batching.priority_queue_policies or [batching.default_queue_policy]
    sizes = [q.max_queue_size for q in queues]
    if not sizes or min(sizes) <= 0:
        return None, "no in-flight limit (a Triton queue of the model is unbounded)"
    total = running + sum(sizes)
    return total, (f"{total} in flight: what Triton accepts (max_batch_size {entry.max_batch_size} x {engines} "
                   f"instance(s) running + max_queue_size {' + '.join(map(str, sizes))} queued)")


def _llm_entry(
    spec: DeploymentSpec, model: ModelSpec, entry: ModelEntryPlan, profile: Profile | None, engines: int,
    notes: list[str], found_tokenizer: str | None = None,
) -> dict[str, Any]:
    """An LLM's cost model and limits, from the engine it runs (engine_sources: the backend's files,
    the spec's engine: section, the profile, the KV plan) at its traffic's typical request size.
    `found_tokenizer`: the tokenizer.json of the model's own directory, when the caller found one."""
    kv = entry.kv
    assert kv is not None
    memory = profile.memory if profile is not None else None
    measured = memory.kv_bytes_per_token_measured if memory is not None else None
    hybrid = kv.footprint if kv.footprint is not None and not kv.footprint.uniform else None
    # The measured figure when there is one; but never below the arithmetic, which is what a
    # pre-allocated pool of whole blocks holds per token (a low measurement is noise, not savings).
    source = "profile" if measured and measured >= kv.kv_bytes_per_token and hybrid is None else "analytic"
    bpt: float = float(measured) if source == "profile" else float(kv.kv_bytes_per_token)
    if hybrid is not None:
        bpt = float(hybrid.growing_bytes_per_token)
        if measured:
            notes.append(f"{entry.name}: measured {measured:g} KV bytes/token is not used: the model's layers do not "
                         "all grow alike, and its footprint is charged by layer kind")
    elif measured and source == "analytic":
        notes.append(
            f"{entry.name}: measured {measured:g} KV bytes/token is below the analytic "
            f"{kv.kv_bytes_per_token}; the analytic figure is used"
        )
    prefill = prefill_points(profile)
    grace = release_grace_ms(profile)
    limits = _engine_limits(model, entry, profile)
    interface = _interface(entry)
    prompt_bpt, prompt_bpt_source = _prompt_bytes_per_token(model, profile)
    tokenizer, counted_by = _tokenizer(model, found_tokenizer)
    if limits is None:
        # Nothing states how the engine behaves: reserve each request's footprint against the
        # KV plan's pool, which is safe whatever the engine does.
        policy, block, pool_tokens = None, kv.block_tokens, kv.pool_blocks * kv.block_tokens
        seqs = _engine_sequences(entry) or kv.max_sequences
        max_context = model.max_context
        pool_from = "tritongen's KV plan; kv_policy unknown, so each request's footprint is reserved"
    else:
        policy, block, pool_tokens, seqs = limits.kv_policy, limits.kv_block_tokens, limits.pool_tokens, limits.max_num_seqs
        max_context = limits.max_context or model.max_context
        pool_from = limits.sources.get("kv_pool_blocks", "?")
    engine_pool = math.ceil(pool_tokens * bpt)
    if hybrid is not None:
        # The pool in bytes, as the engine model holds it (engine_sources): the plan's budget, or a
        # stated pool read as tokens of every attention layer.
        engine_pool = (limits.kv_pool_bytes if limits is not None and limits.kv_pool_bytes
                       else kv.budget_bytes if limits is None else pool_tokens * hybrid.kv_bytes_per_token)
    reserves = policy != "grow_preempt"
    out: dict[str, Any] = {
        "kv": {
            "bytes_per_token": bpt,
            "bytes_per_token_source": source,
            "block_tokens": block,
            "max_context": max_context,
            "kv_policy": policy,
            "engine_pool_bytes": engine_pool,
            "default_max_tokens": _default_max_tokens(model, interface),
            "prompt_bytes_per_token": prompt_bpt,
            "tokenizer": tokenizer,
            "prompt_input": interface.text_input if interface else "text_input",
            # only where true: a text model's policy reads as it always did
            **({"prompt_token_ids": True} if interface and interface.speaks_token_ids else {}),
            "max_tokens_input": (interface.max_tokens_input if interface else None) or "max_tokens",
            "preallocated": True,
            "prefill_peak": prefill,
            "prefill_peak_source": "profile" if prefill else "none",
            # where the engine reserves, a prompt block several requests in flight begin with is held once
            # (written only when on: the policies of engines without a cache read as before)
            **({"prefix_caching": True} if limits is not None and limits.prefix_caching else {}),
            **_footprint_fields(hybrid),
        },
        "memory_quota_bytes": engine_pool * engines if reserves else None,
        "max_inflight": max(1, seqs * engines),
        "release_grace_ms": grace,
    }
    typical = (model.typical_prompt_tokens or 0) + (model.typical_output_tokens or 0)
    whole = -(-typical // block) * block
    per_typical = hybrid.bytes_at(whole) if hybrid is not None else whole * bpt
    fitting = f"{int(engine_pool // per_typical)} sequences of the typical {typical} tokens" if typical else "?"
    admits = ("each request's own footprint (prompt + max_tokens) reserved against the pool"
              if reserves else "no KV reservation (the engine preempts, never kills): an in-flight limit that starts "
              "at its sequence limit and follows the engine's first tokens (the policy's queueing_engines), and the "
              "predicted wait")
    notes.append(
        f"{entry.name}: engine {policy or 'kv_policy unknown'}: pool "
        f"{f'{engine_pool} bytes' if hybrid is not None else f'{pool_tokens} tokens'} in blocks of {block} "
        f"({pool_from}; {fitting} fit), {seqs} sequences x {engines} engine(s) in flight; admits by {admits}; "
        f"{bpt:g} KV bytes/token ({source})"
        f"{'; ' + _footprint_note(hybrid) if hybrid is not None else ''}; prompts "
        f"{'counted by ' + counted_by + ', else ' if counted_by else ''}at {prompt_bpt:g} bytes/token "
        f"({prompt_bpt_source}); "
        f"prefill peaks: {len(prefill) or 'none'}"
    )
    return out


def _footprint_fields(footprint: KVFootprint | None) -> dict[str, Any]:
    """The policy's per-sequence description of a model that is not uniform (kv_cost.py
    KVCost.capped, state_bytes); nothing for a classic one, whose policy stays as it was."""
    if footprint is None:
        return {}
    return {
        "capped": [{"cap_tokens": c.cap_tokens, "bytes_per_token": c.bytes_per_token} for c in footprint.capped],
        "state_bytes": footprint.state_bytes,
    }


def _footprint_note(footprint: KVFootprint) -> str:
    caps = ", ".join(f"{c.bytes_per_token} B/token up to {c.cap_tokens} tokens" for c in footprint.capped)
    return (f"on the growing layers only{'; capped layers ' + caps if caps else ''}"
            f"{f'; {footprint.state_bytes} B of fixed state a sequence' if footprint.state_layers else ''}")


def _engine_limits(model: ModelSpec, entry: ModelEntryPlan, profile: Profile | None) -> EngineLimits | None:
    """The engine the entry runs, or None when nothing states its KV policy (a user's own backend
    the spec says nothing about); contradictions between sources are errors (EngineSourceError)."""
    stated = (model.engine is not None or entry.backend in ("vllm", "tensorrtllm")
              or entry.llm_args is not None or "kv_policy" in entry.parameters)
    if not stated:
        return None
    engine = getattr(profile, "engine", None)
    try:
        measured = measured_from_profile(engine) if engine is not None else None
        return resolve_engine_limits(measured=measured, **entry_sources(entry, model))  # type: ignore[arg-type]
    except EngineSourceError as err:
        raise BadInput(f"the sidecar policy of {entry.name}: {err}") from None


def _interface(entry: ModelEntryPlan) -> LLMInterface | None:
    try:
        return plan_entry_interface(entry)
    except UnknownInterface:
        return None


def _tokenizer(model: ModelSpec, found: str | None) -> tuple[str | None, str | None]:
    """The tokenizer.json the sidecar counts prompts with, and how the note names it: the spec's
    `tokenizer`, else the one the caller found in the model's own directory (the file the engine
    tokenizes with), else none (the bytes-per-token bound counts)."""
    if model.tokenizer is not None:
        return str(model.tokenizer), model.tokenizer.name
    if found is not None:
        return found, f"{found} (the model directory's tokenizer.json)"
    return None, None


def _prompt_bytes_per_token(model: ModelSpec, profile: Profile | None) -> tuple[float, str]:
    """Prompt bytes per token: the spec's tokenizer ratio, else what the backend's own token counts
    showed the profile, else 1.0, the bound that never under-counts (a token is at least a byte)."""
    if model.bytes_per_token:
        return float(model.bytes_per_token), "the spec"
    engine = getattr(profile, "engine", None)
    if engine is not None and engine.bytes_per_token_source == "backend token counts":
        return float(engine.bytes_per_token), "the profile, from the backend's token counts"
    return 1.0, "no tokenizer ratio known: one byte per token, the bound that never under-counts"


def _devices(spec: DeploymentSpec, plan: DeploymentPlan) -> list[dict[str, Any]]:
    cap = spec.policy.memory_utilization_cap
    ids = ["cpu"] if plan.cpu_only else [f"gpu{i}" for i in range(len(plan.device_bytes))]
    used = {d: 0 for d in ids}
    for entry in plan.entries:
        model = next(m for m in spec.models if m.name == entry.spec_model)
        placement = next(p for p in plan.placements if p.model == entry.spec_model)
        per_engine = (_weights(model) // model.tensor_parallel + placement.reserve_bytes
                      + (entry.kv.budget_bytes if entry.kv else 0))
        if plan.cpu_only:
            used["cpu"] += per_engine * max(1, model.instances)
        else:
            for gpu in placement.gpus:
                used[f"gpu{gpu}"] += per_engine * max(1, model.instances)
    return [
        {"id": d, "memory_bytes": b, "utilization_cap": cap, "static_used_bytes": used[d]}
        for d, b in zip(ids, plan.device_bytes)
    ]


def build_sidecar_policy(
    spec: DeploymentSpec, plan: DeploymentPlan, profiles: Mapping[str, Profile] | None = None,
    model_tokenizers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The policy document (POLICY_VERSION) for `sidecar_policy.json`; profiles are keyed by model entry
    name (or spec model name) and are optional. `model_tokenizers` (model entry name -> path) are
    the tokenizer.json files the caller found in the models' own directories (this module reads no
    files: tritongen.render.model_dir_tokenizers); a spec's `tokenizer` wins over them."""
    profiles = profiles or {}
    found = model_tokenizers or {}
    notes: list[str] = []
    models = [_model_entry(spec, plan, e, _profile_for(profiles, e), notes, found.get(e.name)) for e in plan.entries]
    # The adaptive limit counts LLM requests only (classic ones are bounded by what Triton takes).
    total_inflight = max(1, sum(m["max_inflight"] for m in models if m["kind"] == "llm"))
    top = min(c.priority for c in spec.traffic_classes)
    classes = [_class_entry(spec, c, top) for c in sorted(spec.traffic_classes, key=lambda c: c.priority)]
    sources = ["triton_metrics", "static"] if plan.cpu_only else ["nvml", "triton_metrics", "static"]
    if spec.safety_pad_mb() != spec.policy.kv_safety_pad_mb:
        notes.append("headroom: no safety pad (no LLM prefills here and the spec states no policy.kv_safety_pad_mb)")
    return {
        "version": POLICY_VERSION,
        "deployment": spec.name,
        "class_header": "x-traffic-class",
        "class_parameter": "traffic_class",
        "default_class": default_class(spec.traffic_classes).name,
        "starvation_guard_ms": spec.policy.starvation_guard_ms,
        "tenant_header": TENANT_HEADER,
        "tenants": [],
        "classes": classes,
        "devices": _devices(spec, plan),
        "models": models,
        "concurrency": concurrency_section(total_inflight, min(c.p99_ms for c in spec.traffic_classes)),
        "headroom": headroom_section(sources, int(spec.safety_pad_mb() * MIB)),
        "limits": dict(LIMITS),
        "notes": notes,
    }


def concurrency_section(total_inflight: int, shortest_target_ms: float) -> dict[str, Any]:
    """The adaptive limit over LLM requests: from a third of what the engines run up to all of it;
    Triton's queueing delay counts as high at a quarter of the tightest class target, so the limit
    steps down well before that class's requests could miss it."""
    delay_high = round(shortest_target_ms * 0.25, 3)
    return {
        "min": max(1, math.ceil(total_inflight / 3)),
        "max": total_inflight,
        "initial": None,
        "high_watermark": 0.9,
        "low_watermark": 0.7,
        "queue_delay_high_ms": delay_high,
        "queue_delay_low_ms": round(delay_high / 2, 3),
        "adjust_interval_ms": 1000.0,
        "increase_hold_ms": 3000.0,
        "decrease_factor": 0.9,
        "increase_step": 1,
    }


def headroom_section(sources: list[str], safety_pad_bytes: int) -> dict[str, Any]:
    """Where live headroom is read, in order ('static' last, the fallback that always answers)."""
    return {"sources": sources, "safety_pad_bytes": safety_pad_bytes, "poll_interval_ms": 500.0, "stale_after_ms": 5000.0}


LIMITS = {"max_body_bytes": 64 * MIB, "max_header_bytes": 16 * 1024, "max_retry_after_s": 30}


def prefill_points(profile: Profile | None) -> list[dict[str, int]]:
    """The profiled prefill peaks by prompt length, as the policy states them (empty: none measured)."""
    memory = profile.memory if profile is not None else None
    peaks = sorted({p.prompt_tokens: p.peak_delta_bytes for p in (memory.prefill if memory else [])}.items())
    return [{"prompt_tokens": t, "peak_bytes": b} for t, b in peaks]


def release_grace_ms(profile: Profile | None) -> float:
    """How long a cancelled request's reservation is kept: an engine notices a cancellation only
    between steps, every few tokens, so 16 of the slowest token gaps the profile measured (at least
    100 ms), else DEFAULT_GRACE_MS where no stream was measured."""
    if profile is not None and profile.streaming is not None:
        itl = [lv.itl_p99_ms for lv in profile.streaming.levels if lv.itl_p99_ms]
        if itl:
            return max(100.0, round(16 * max(itl), 1))
    return DEFAULT_GRACE_MS


def _engine_sequences(entry: ModelEntryPlan) -> int | None:
    """max_num_seqs as the entry renders it: vLLM's model.json, TensorRT-LLM's model.yaml
    (max_batch_size), or tritongen's engine parameters."""
    if entry.engine_args and entry.engine_args.get("max_num_seqs"):
        return int(entry.engine_args["max_num_seqs"])  # type: ignore[arg-type]
    if entry.llm_args and entry.llm_args.get("max_batch_size"):
        return int(entry.llm_args["max_batch_size"])  # type: ignore[call-overload]
    value = entry.parameters.get("max_num_seqs")
    return int(value) if value and value.isdigit() else None
