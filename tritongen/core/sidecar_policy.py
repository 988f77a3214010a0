"""The sidecar's policy, derived from the spec, its plan and (optionally) measured profiles. Pure.

`build_sidecar_policy(spec, plan, profiles)` returns the JSON document `tritongen render` writes
as `sidecar_policy.json` beside the models; `sidecar/policy.py` is its schema (version 1). Every
number comes from the same arithmetic the configs were rendered from:

* LLM cost: KV bytes per token measured by the profile (`memory.kv_bytes_per_token_measured`)
  when there is one (and it is not below the arithmetic), else the analytic `kv_shape` figure of
  the plan; the engine's block size;
  the profiled prefill peak per prompt length (`memory.prefill`).
* LLM quotas: the KV budget x engines (the pool the engine was rendered with) and max_sequences x
  engines in flight.
* Classic cost: one request's tensor bytes (inputs + outputs, one row); the profile format has no
  per-request memory figure yet.
* Classes: the spec's traffic classes; a request may wait in the sidecar for
  `p99_ms x queue_timeout_fraction` (the same window Triton's queue policy gets); lower classes
  may fill only part of each limit (normal 90 %, batch 80 %), keeping room for the top class.
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

from tritongen.core.kv import weight_bytes
from tritongen.core.plan import DeploymentPlan, ModelEntryPlan, default_class
from tritongen.core.profile_types import Profile
from tritongen.core.spec import MIB, DeploymentSpec, ModelSpec, TensorSpec, TrafficClass

POLICY_VERSION = 1
POLICY_FILE = "sidecar_policy.json"

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


def _default_max_tokens(model: ModelSpec) -> int | None:
    """The model's own `default_max_tokens` parameter, else its backend's default, else unknown
    (the sidecar then charges a request up to max_context)."""
    return _int_param(model, "default_max_tokens") or BACKEND_DEFAULT_MAX_TOKENS.get(model.backend)


def _int_param(model: ModelSpec, key: str) -> int | None:
    value = model.parameters.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _class_entry(spec: DeploymentSpec, klass: TrafficClass, top: int, queue_cap: int) -> dict[str, Any]:
    return {
        "name": klass.name,
        "kind": klass.kind,
        "priority": klass.priority,
        "p99_ms": klass.p99_ms,
        "max_queue_wait_ms": round(klass.p99_ms * spec.policy.queue_timeout_fraction, 3),
        "queue_cap": queue_cap,
        "budget_fraction": 1.0 if klass.priority == top else BUDGET_FRACTION[klass.kind],
    }


def _model_entry(
    spec: DeploymentSpec, plan: DeploymentPlan, entry: ModelEntryPlan, profile: Profile | None, notes: list[str]
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
    memory = profile.memory if profile is not None else None
    if entry.kv is not None:
        kv = entry.kv
        measured = memory.kv_bytes_per_token_measured if memory is not None else None
        # The measured figure when there is one; but never below the arithmetic, which is what a
        # pre-allocated pool of whole blocks holds per token (a low measurement is noise, not savings).
        source = "profile" if measured and measured >= kv.kv_bytes_per_token else "analytic"
        bpt: float = float(measured) if source == "profile" else float(kv.kv_bytes_per_token)
        if measured and source == "analytic":
            notes.append(
                f"{entry.name}: measured {measured:g} KV bytes/token is below the analytic "
                f"{kv.kv_bytes_per_token}; the analytic figure is used"
            )
        prefill = sorted(
            {p.prompt_tokens: p.peak_delta_bytes for p in (memory.prefill if memory else [])}.items()
        )
        grace = DEFAULT_GRACE_MS
        if profile is not None and profile.streaming is not None:
            itl = [lv.itl_p99_ms for lv in profile.streaming.levels if lv.itl_p99_ms]
            if itl:
                grace = max(100.0, round(16 * max(itl), 1))  # engines check for cancellation every few tokens
        out["kv"] = {
            "bytes_per_token": bpt,
            "bytes_per_token_source": source,
            "block_tokens": kv.block_tokens,
            "max_context": model.max_context,
            "default_max_tokens": _default_max_tokens(model),
            # the spec's tokenizer ratio; without one, bytes (the safe bound: never under-counts)
            "prompt_bytes_per_token": model.bytes_per_token or 1.0,
            "preallocated": True,
            "prefill_peak": [{"prompt_tokens": t, "peak_bytes": b} for t, b in prefill],
            "prefill_peak_source": "profile" if prefill else "none",
        }
        out["memory_quota_bytes"] = kv.budget_bytes * engines
        seqs = _engine_sequences(entry) or kv.max_sequences  # what the engine runs at once, as rendered (tuned)
        out["max_inflight"] = max(1, seqs * engines)
        out["release_grace_ms"] = grace
        notes.append(
            f"{entry.name}: {bpt:g} KV bytes/token ({source}), blocks of {kv.block_tokens} tokens; quota "
            f"{kv.budget_bytes} B x {engines} engine(s); {seqs} x {engines} in flight; "
            f"prefill peaks: {len(prefill) or 'none'}"
        )
    else:
        out["request_bytes"] = _row_bytes(model.inputs) + _row_bytes(model.outputs)
        out["request_bytes_source"] = "analytic"
        out["max_inflight"] = max(1, entry.max_batch_size) * engines * 2
        out["release_grace_ms"] = 0.0
        notes.append(
            f"{entry.name}: {out['request_bytes']} B per request (tensor bytes of one row); "
            f"{out['max_inflight']} in flight (max_batch_size {entry.max_batch_size} x {engines} instance(s) x 2)"
        )
    return out


def _devices(spec: DeploymentSpec, plan: DeploymentPlan) -> list[dict[str, Any]]:
    cap = spec.policy.memory_utilization_cap
    reserve = int(spec.policy.framework_reserve_mb * MIB)
    ids = ["cpu"] if plan.cpu_only else [f"gpu{i}" for i in range(len(plan.device_bytes))]
    used = {d: 0 for d in ids}
    for entry in plan.entries:
        model = next(m for m in spec.models if m.name == entry.spec_model)
        placement = next(p for p in plan.placements if p.model == entry.spec_model)
        per_engine = _weights(model) // model.tensor_parallel + reserve + (entry.kv.budget_bytes if entry.kv else 0)
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
    spec: DeploymentSpec, plan: DeploymentPlan, profiles: Mapping[str, Profile] | None = None
) -> dict[str, Any]:
    """The policy document (version 1) for `sidecar_policy.json`; profiles are keyed by model entry
    name (or spec model name) and are optional."""
    profiles = profiles or {}
    notes: list[str] = []
    models = [_model_entry(spec, plan, e, _profile_for(profiles, e), notes) for e in plan.entries]
    total_inflight = max(1, sum(m["max_inflight"] for m in models))
    top = min(c.priority for c in spec.traffic_classes)
    queue_cap = max(8, 2 * total_inflight)
    classes = [
        _class_entry(spec, c, top, queue_cap) for c in sorted(spec.traffic_classes, key=lambda c: c.priority)
    ]
    delay_high = round(min(c.p99_ms for c in spec.traffic_classes) * 0.25, 3)
    sources = ["triton_metrics", "static"] if plan.cpu_only else ["nvml", "triton_metrics", "static"]
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
        "concurrency": {
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
        },
        "headroom": {
            "sources": sources,
            "safety_pad_bytes": int(spec.policy.kv_safety_pad_mb * MIB),
            "poll_interval_ms": 500.0,
            "stale_after_ms": 5000.0,
        },
        "limits": {"max_body_bytes": 64 * MIB, "max_header_bytes": 16 * 1024, "max_retry_after_s": 30},
        "notes": notes,
    }


def _engine_sequences(entry: ModelEntryPlan) -> int | None:
    """max_num_seqs as the entry renders it: vLLM's model.json, or tritongen's engine parameters."""
    if entry.engine_args and entry.engine_args.get("max_num_seqs"):
        return int(entry.engine_args["max_num_seqs"])  # type: ignore[arg-type]
    value = entry.parameters.get("max_num_seqs")
    return int(value) if value and value.isdigit() else None
