"""`check SPEC DIR`: the deployment spec's own rules over a repository's configs.

Syntax and the server's load-time rules say whether Triton will load a model; these say whether
it will *survive traffic*: do the models placed on each GPU fit under the utilisation cap, can the
KV budget hold `max_batch_size` sequences at the full context, and do the committed configs still
say what the spec renders (drift)?
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from tritongen.core.findings import Finding
from tritongen.core.plan import DeploymentPlan, ModelEntryPlan
from tritongen.core.spec import MIB
from tritongen.llmapi_spec_rules import llmapi_rules
from tritongen.pbtxt import parse_model_config
from tritongen.profiles import measured_pads_mb, read_profiles
from tritongen.render import render_repository
from tritongen.specio import LoadedSpec, load_spec

ExtraRule = Callable[[dict[str, ModelConfig]], list[Finding]]


def rules_for_spec(spec_path: Path, profiles_dir: Path | None = None, repository: Path | None = None) -> list[ExtraRule]:
    """The spec's rules over a repository's configs; with `repository`, also over the backend files
    check reads there (TensorRT-LLM's model.yaml: `llmapi_spec_rules`)."""
    loaded = load_spec(spec_path)
    profiles = read_profiles(profiles_dir) if profiles_dir is not None else None
    pads = measured_pads_mb(profiles) if profiles else None
    rendered = render_repository(loaded, measured_pads_mb=pads, profiles=profiles)
    assert rendered.plan is not None
    plan = rendered.plan
    expected = {
        path.split("/")[0]: parse_model_config(text, path)
        for path, text in rendered.files.items()
        if path.endswith("/config.pbtxt")
    }
    rules: list[ExtraRule] = [
        lambda configs: memory_per_device(configs, plan),
        lambda configs: kv_capacity(configs, plan),
        lambda configs: drift_findings(configs, expected, loaded),
    ]
    if repository is not None:
        rules.append(llmapi_rules(plan, rendered.files, Path(repository), str(loaded.path)))
    return rules


def memory_per_device(configs: dict[str, ModelConfig], plan: DeploymentPlan) -> list[Finding]:
    """Sum each model's quota over the devices its instance groups name, against memory x cap."""
    quotas = {p.model: p.quota_bytes for p in plan.placements}
    spec_model_of = {e.name: e.spec_model for e in plan.entries}
    load: dict[int, list[tuple[str, int]]] = defaultdict(list)
    findings: list[Finding] = []
    seen_spec_models: set[tuple[str, int]] = set()
    for name, config in sorted(configs.items()):
        spec_model = spec_model_of.get(name)
        if spec_model is None:
            findings.append(Finding(
                "warning", "TG301", name, "",
                f"model {name!r} is in the repository but not in the spec, so its memory is not accounted for",
                "add it to the spec's models (with its weights and memory_quota_mb) or remove it",
            ))
            continue
        for device in _devices_of(config, plan, spec_model):
            if (spec_model, device) in seen_spec_models:
                continue  # lanes of one spec model share its quota
            seen_spec_models.add((spec_model, device))
            load[device].append((spec_model, quotas[spec_model]))
    for device, holders in sorted(load.items()):
        capacity = int(plan.device_bytes[device] * plan.utilization_cap)
        used = sum(q for _, q in holders)
        if used > capacity:
            who = ", ".join(f"{m} {q / MIB:.0f} MiB" for m, q in holders)
            label = "the CPU pool" if plan.cpu_only else f"GPU {device}"
            findings.append(Finding(
                "error", "TG302", holders[-1][0], "instance_group.gpus",
                f"{label} holds {used / MIB:.0f} MiB of model quotas ({who}) but has "
                f"{capacity / MIB:.0f} MiB under the {plan.utilization_cap:.0%} cap",
                "move a model to another GPU (instance_group.gpus), lower memory_quota_mb, or add GPUs",
            ))
    return findings


def _devices_of(config: ModelConfig, plan: DeploymentPlan, spec_model: str) -> list[int]:
    """GPUs the config pins; KIND_MODEL engines (vLLM, tensor parallel) sit where the plan put them."""
    if plan.cpu_only:
        return [0]
    planned = next(p.gpus for p in plan.placements if p.model == spec_model)
    devices: set[int] = set()
    for group in config.instance_group:
        if group.kind == ModelInstanceGroup.KIND_GPU:
            devices.update(group.gpus or range(len(plan.device_bytes)))
        elif group.kind == ModelInstanceGroup.KIND_MODEL:
            devices.update(planned)
    return sorted(devices)


def kv_capacity(configs: dict[str, ModelConfig], plan: DeploymentPlan) -> list[Finding]:
    """max_batch_size (or max_num_seqs) x bytes per sequence must fit in the KV budget."""
    findings: list[Finding] = []
    for entry in plan.entries:
        config = configs.get(entry.name)
        if config is None or entry.kv is None:
            continue
        kv = entry.kv
        # A hybrid's sequence is not tokens x bytes/token (windows, chunks, fixed state): say so.
        how = (f"{kv.context_tokens} tokens x {kv.kv_bytes_per_token} B" if kv.footprint is None or kv.footprint.uniform
               else f"{kv.context_tokens} tokens, each layer kind as it grows")
        planned = (entry.engine_args or {}).get("max_num_seqs") if entry.backend == "vllm" else None
        for sequences, field in _sequences_of(config, entry):
            if isinstance(planned, int):
                # vLLM preempts and recomputes when its pool runs dry, it does not run out of memory: its
                # limit is the pool at the typical sequence (kv_plan.typical_sequences), not at full context
                if sequences > planned:
                    findings.append(Finding(
                        "error", "TG303", entry.name, field,
                        f"{field} {sequences} is more sequences than the KV pool holds at the typical sequence "
                        f"({planned}): the engine would preempt and recompute most of the time",
                        f"lower {field} to {planned}, or raise memory_quota_mb",
                    ))
                continue
            need = sequences * kv.bytes_per_sequence
            if need > kv.budget_bytes:
                findings.append(Finding(
                    "error", "TG303", entry.name, field,
                    f"{field} {sequences} x {kv.bytes_per_sequence / MIB:.2f} MiB per sequence "
                    f"({how}) = {need / MIB:.1f} MiB exceeds "
                    f"the KV budget {kv.budget_bytes / MIB:.1f} MiB; full-context requests will run out of memory",
                    f"lower {field} to {kv.max_sequences} (what the budget holds), or raise memory_quota_mb",
                ))
        pool = config.parameters.get("kv_pool_blocks")
        if pool is not None and pool.string_value.isdigit():
            pool_bytes = int(pool.string_value) * kv.block_tokens * kv.kv_bytes_per_token
            if pool_bytes > kv.budget_bytes:
                findings.append(Finding(
                    "error", "TG304", entry.name, "parameters.kv_pool_blocks",
                    f"parameters.kv_pool_blocks {pool.string_value} allocates {pool_bytes / MIB:.1f} MiB, over "
                    f"the KV budget {kv.budget_bytes / MIB:.1f} MiB",
                    f"set kv_pool_blocks to {kv.pool_blocks} or less",
                ))
    return findings


def _sequences_of(config: ModelConfig, entry: ModelEntryPlan) -> list[tuple[int, str]]:
    """Every setting that bounds concurrent sequences: Triton's batch and the engine's own limit."""
    bounds = []
    if config.max_batch_size:
        bounds.append((config.max_batch_size, "max_batch_size"))
    seqs = config.parameters.get("max_num_seqs")
    if seqs is not None and seqs.string_value.isdigit():
        bounds.append((int(seqs.string_value), "parameters.max_num_seqs"))
    if entry.engine_args is not None:
        bounds.append((int(entry.engine_args["max_num_seqs"]), "max_num_seqs (model.json)"))  # type: ignore[arg-type]
    return bounds


def drift_findings(
    configs: dict[str, ModelConfig], expected: dict[str, ModelConfig], loaded: LoadedSpec
) -> list[Finding]:
    """Compare parsed configs (not text: comments and layout may differ) with the spec's render."""
    findings: list[Finding] = []
    for name, want in sorted(expected.items()):
        have = configs.get(name)
        if have is None:
            findings.append(Finding(
                "error", "TG305", name, "",
                f"the spec {loaded.path.name} renders model {name!r} but the repository has no config for it",
                f"run `tritongen render {loaded.path} -o <repository>`",
            ))
            continue
        if have != want:
            fields = _differing_fields(have, want)
            findings.append(Finding(
                "error", "TG306", name, fields[0] if fields else "",
                f"config.pbtxt of {name!r} drifted from what {loaded.path.name} renders "
                f"(differs in: {', '.join(fields)})",
                f"edit the spec instead of the file, then run `tritongen render {loaded.path} -o <repository>`",
            ))
    return findings


def _differing_fields(have: ModelConfig, want: ModelConfig) -> list[str]:
    a = json_format.MessageToDict(have, preserving_proto_field_name=True)
    b = json_format.MessageToDict(want, preserving_proto_field_name=True)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
