"""`tritongen doctor`'s rules: the classic Triton serving failures, diagnosed from a metrics window.
The LLM rules live in core/llm_diagnosis.py, what both read (the server's snapshot, the per-model
windows, the targets) in core/diagnosis_inputs.py, and the engine windows in core/engine_window.py.

Pure: the adapter (tritongen/doctor.py) scrapes /metrics twice, some seconds apart, and reads each
model's config; core/diagnosis_inputs.py turns the two scrapes into per-model *deltas*
(`ModelWindow`) and this module runs the rules over them. Each problem is a `Finding` (the type
`check` uses) with the evidence in the message and the fix.

    DR101  queueing takes over half the latency budget     (the window or the batch is too large,
                                                           or the instances are saturated)
    DR102  high utilisation with a P99 over the target     (scale out)
    DR103  prompt lengths spread widely on one queue       (split into length lanes)
    DR104  memory near the watermark                       (GPU memory, sidecar headroom, KV pool)
    DR105  replicas whose configs (or model sets) differ   (re-render, roll every replica)
    DR106  a priority level starves                        (strict priority, no aging, saturated)
    DR107  requests failing                                (queue timeouts, backend errors)
    DR108-DR112: LLM engines, from their own metrics and the sidecar's (tritongen.core.llm_diagnosis)

Triton facts the rules rest on (server 2.51, shared/docs/triton-facts.md): the duration counters
are cumulative microseconds over successful requests; `nv_inference_pending_request_count` counts
requests queued, not executing; summaries (`--metrics-config summary_latencies=true`) give
quantiles; priority is strict with no aging; queue-full rejections are not counted as failures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tritongen.core.diagnosis_inputs import ModelWindow, ServerSnapshot, Targets
from tritongen.core.engine_window import Histogram
from tritongen.core.findings import Finding
from tritongen.core.fmt import fmt_ms
from tritongen.core.llm_diagnosis import LLM_CODES, llm_findings


MIN_REQUESTS = 5  # fewer successful requests in the window: too little evidence for the load rules
SATURATED = 0.85  # busy fraction (or GPU utilisation) from which latency is mostly queueing
BUSY_FLOOR = 0.60  # below this the instances idle: a standing queue is the batcher's window, not load
SPREAD_RATIO = 4.0  # P95 / P50 of prompt lengths above which one queue mixes very different requests
FAILURE_RATE = 0.01

CODES = {
    "DR101": "queueing over half the latency budget",
    "DR102": "high utilisation with P99 over target",
    "DR103": "prompt-length spread calls for length lanes",
    "DR104": "memory near the watermark",
    "DR105": "replicas with different configs",
    "DR106": "priority level starves",
    "DR107": "requests failing",
    **LLM_CODES,
}


# ---------------------------------------------------------------------------------------------
# Config helpers (Triton's JSON config, ints possibly as strings)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def instance_count(config: Mapping[str, Any]) -> int:
    total = 0
    for group in config.get("instance_group") or []:
        count = max(1, _int(group.get("count"), 1))
        gpus = group.get("gpus") or []
        total += count * max(1, len(gpus)) if group.get("kind") == "KIND_GPU" else count
    return max(1, total)


def batching(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("dynamic_batching") or {}


def busy_fraction(window: ModelWindow, config: Mapping[str, Any], window_s: float) -> float:
    """Share of the window the model's instances spent computing (1.0: every instance always busy)."""
    if window_s <= 0:
        return 0.0
    return window.busy_us / (window_s * 1e6 * instance_count(config))


def utilisation(window: ModelWindow, config: Mapping[str, Any], snap: ServerSnapshot) -> tuple[float, str]:
    busy = busy_fraction(window, config, snap.window_s)
    gpu = [d.utilization for d in snap.devices if d.utilization is not None]
    if gpu:
        top = max(gpu)
        if top > busy:
            return top, f"GPU utilisation {top:.0%}"
    return busy, f"instances busy {busy:.0%} of the window"


def saturated(window: ModelWindow, config: Mapping[str, Any], snap: ServerSnapshot) -> tuple[bool, str]:
    """At its throughput limit: busy (compute time, or GPU utilisation) from SATURATED up, or busy
    from BUSY_FLOOR up with a queue that was never empty (requests pending at both scrapes) and
    requests waiting longer than an execution takes. The second form matters because compute time
    misses the per-execution overhead outside the backend (a Python-backend instance that never
    idles reads 80-95% busy); the floor keeps out queues that only wait for a batching window.
    """
    util, text = utilisation(window, config, snap)
    if util >= SATURATED:
        return True, text
    per_exec = window.compute_per_exec_ms
    queue = window.mean_queue_ms
    if (util >= BUSY_FLOOR and window.pending_start >= 1 and window.pending_end >= 1
            and per_exec and queue and queue >= per_exec):
        return True, (f"{text}, with requests pending at both ends of the window and waiting {queue:.1f} ms, "
                      f"longer than an execution ({per_exec:.1f} ms)")
    return False, text


def _f(model: str, code: str, severity: str, message: str, fix: str, field_: str = "", where: str | None = None) -> Finding:
    return Finding(severity=severity, code=code, model=model, field=field_, message=message, fix=fix, path=where)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The rules


def rule_queueing(snap: ServerSnapshot, model: str, w: ModelWindow, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    queue_ms = w.mean_queue_ms
    if w.success < MIN_REQUESTS or queue_ms is None:
        return []
    budget = targets.budget(model)
    if queue_ms <= 0.5 * budget:
        return []
    db = batching(config)
    delay_ms = _int(db.get("max_queue_delay_microseconds")) / 1000
    mbs = _int(config.get("max_batch_size"))
    busy = busy_fraction(w, config, snap.window_s)
    batch = w.mean_batch or 0.0
    per_exec = w.compute_per_exec_ms or 0.0
    evidence = (
        f"requests waited {queue_ms:.1f} ms on average in Triton's queue (P99 queue {fmt_ms(w.p99_queue_us / 1000 if w.p99_queue_us else None, ' ms')}), "
        f"over half of its {budget:g} ms latency budget ({0.5 * budget:g} ms); mean batch {batch:.1f} of "
        f"max_batch_size {mbs}, {per_exec:.1f} ms per execution, instances busy {busy:.0%}"
    )
    if db and delay_ms > 0 and busy < 0.7 and delay_ms >= 0.25 * budget:
        suggest = max(0.1, min(0.1 * budget, delay_ms / 4))
        return [_f(model, "DR101", "error",
                   f"{evidence}; the batcher holds requests up to max_queue_delay_microseconds = {delay_ms:g} ms "
                   "waiting for a fuller batch while the instances idle: the window is too large",
                   f"lower dynamic_batching.max_queue_delay_microseconds to about {suggest * 1000:.0f} "
                   f"(<= 10% of the budget) and set preferred_batch_size to the batch the load forms "
                   f"(~{max(1, round(batch))}); `tritongen tune` picks both from a profile",
                   "dynamic_batching.max_queue_delay_microseconds", snap.url)]
    if per_exec > 0.25 * budget:
        return [_f(model, "DR101", "error",
                   f"{evidence}; each execution takes {per_exec:.1f} ms, so a request waits for whole large "
                   "batches ahead of it: the batch is too large for the budget",
                   f"lower max_batch_size / preferred_batch_size so one execution takes <= {0.25 * budget:g} ms "
                   f"(the curve from `tritongen profile` gives the size), or add instances",
                   "max_batch_size", snap.url)]
    return [_f(model, "DR101", "error",
               f"{evidence}; the instances are saturated, so requests queue behind each other",
               "add instances or replicas (`tritongen plan` computes how many for the peak), and give the queue a "
               "timeout so excess load is shed instead of waiting",
               "instance_group", snap.url)]


def rule_saturation(snap: ServerSnapshot, model: str, w: ModelWindow, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    if w.success < MIN_REQUESTS:
        return []
    full, util_text = saturated(w, config, snap)
    if not full:
        return []
    budget = targets.budget(model)
    if w.p99_request_us is not None:
        p99_ms, how = w.p99_request_us / 1000, "P99"
    elif w.mean_request_ms is not None:
        p99_ms, how = w.mean_request_ms, "mean (so P99 is at least this)"
    else:
        return []
    if p99_ms <= budget:
        return []
    qps = w.success / snap.window_s if snap.window_s > 0 else 0.0
    return [_f(model, "DR102", "error",
               f"{util_text} at {qps:.1f} req/s and the request latency {how} is {p99_ms:.1f} ms, over the "
               f"{budget:g} ms target: the model runs at its throughput limit and the tail is queueing",
               "scale out: more replicas or instances (`tritongen plan --peak-qps` sizes them at a 0.7-0.85 "
               "safety factor); or cut work per request (smaller batches)",
               "instance_group", snap.url)]


def rule_length_spread(snap: ServerSnapshot, model: str, w: ModelWindow, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    if model.endswith(("_short", "_long")) or not w.prompt_tokens_buckets:
        return []
    total = w.prompt_tokens_buckets[-1][1]
    if total < MIN_REQUESTS:
        return []
    lengths = Histogram(w.prompt_tokens_buckets)
    p50, p95 = lengths.quantile(0.50), lengths.quantile(0.95)
    if not p50 or not p95 or p95 < SPREAD_RATIO * p50:
        return []
    split = int(math.ceil(2 * p50))
    return [_f(model, "DR103", "warning",
               f"prompt lengths spread widely on one queue: P50 {p50:.0f} tokens, P95 {p95:.0f} tokens "
               f"(x{p95 / p50:.1f}); short requests wait in batches paced by long prefills",
               f"split the model into length lanes: in the spec, `lanes: {{split_prompt_tokens: {split}}}` "
               f"(about 2 x P50), and re-render; the short lane gets the short queue window",
               "", snap.url)]


def rule_memory(snap: ServerSnapshot, targets: Targets) -> list[Finding]:
    out: list[Finding] = []
    for dev in snap.devices:
        if dev.used_bytes is None or not dev.total_bytes:
            continue
        frac = dev.used_bytes / dev.total_bytes
        if frac >= targets.memory_cap - 0.02:
            out.append(_f("", "DR104", "error",
                          f"GPU {dev.uuid}: {dev.used_bytes / 2**30:.1f} of {dev.total_bytes / 2**30:.1f} GiB used "
                          f"({frac:.0%}), at the {targets.memory_cap:.0%} watermark: the next prefill spike or "
                          "batch growth is an out-of-memory error",
                          "lower max_batch_size / the engine's max_num_seqs or gpu_memory_utilization, move a model "
                          "to another GPU (memory_quota_mb), or add replicas; keep the spec's kv_safety_pad_mb",
                          "", snap.url))
    for room in snap.headroom:
        limit = targets.headroom_fraction * room.capacity_bytes if room.capacity_bytes else 0.0
        if room.headroom_bytes > limit:
            continue
        of = f" of {room.capacity_bytes / 2**20:.0f} MiB" if room.capacity_bytes else ""
        model = room.scope.removeprefix("pool:") if room.scope.startswith("pool:") else ""
        out.append(_f(model, "DR104", "warning",
                      f"the sidecar can reserve only {room.headroom_bytes / 2**20:.1f} MiB more{of} on {room.scope} "
                      f"(under {targets.headroom_fraction:.0%}, its safety pad already kept): it is queueing or "
                      "refusing requests (429) to stay under the watermark",
                      "add replicas for the load, or give the scope more memory (memory_quota_mb, fewer models per "
                      "GPU); if requests are refused while the GPU is idle, the KV cost estimate is too high",
                      "", snap.url))
    return out


def rule_starvation(snap: ServerSnapshot, model: str, w: ModelWindow, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    db = batching(config)
    levels = _int(db.get("priority_levels"))
    if levels < 2:
        return []
    full, util_text = saturated(w, config, snap)
    if not full:
        return []
    stuck = w.pending_start > 0 and w.pending_end > 0
    mean_q = w.mean_queue_ms or 0.0
    tail = w.p99_queue_us is not None and mean_q > 0 and w.p99_queue_us / 1000 >= 5 * mean_q
    timed_out = w.failure_by_reason.get("REJECTED", 0.0) > 0
    if not (stuck or tail or timed_out):
        return []
    evidence = []
    if stuck:
        evidence.append(f"requests stayed queued through the whole window ({w.pending_start:.0f} at the start, "
                        f"{w.pending_end:.0f} at the end)")
    if tail:
        evidence.append(f"P99 queue time {w.p99_queue_us / 1000:.0f} ms vs a mean of {mean_q:.1f} ms: a few "
                        "requests wait far longer than the rest")
    if timed_out:
        evidence.append(f"{w.failure_by_reason['REJECTED']:.0f} requests timed out in the queue")
    policies = db.get("priority_queue_policy") or {}
    default_level = _int(db.get("default_priority_level"), levels)
    waiting_forever = []
    for level in range(2, levels + 1):
        policy = policies.get(str(level)) or policies.get(level) or (db.get("default_queue_policy") or {})
        if policy.get("timeout_action", "REJECT") == "DELAY" or _int(policy.get("default_timeout_microseconds")) == 0:
            waiting_forever.append(level)
    forever = (f"; levels {waiting_forever} have no queue timeout (or DELAY), so their requests wait indefinitely"
               if waiting_forever else "")
    return [_f(model, "DR106", "error",
               f"strict priority with {levels} levels (Triton has no aging) on saturated instances ({util_text}): "
               f"{'; '.join(evidence)}. Levels 2..{levels} (default level {default_level}) are served only when "
               f"level 1's queue is empty, so they starve{forever}",
               "keep level 1's load under capacity (add instances or replicas), give lower levels a queue timeout "
               "(timeout_action REJECT + default_timeout_microseconds) so they fail fast, and let the sidecar's "
               "anti-starvation guard (policy.starvation_guard_ms) promote requests that waited too long",
               "dynamic_batching.priority_levels", snap.url)]


def rule_failures(snap: ServerSnapshot, model: str, w: ModelWindow, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    total = w.success + w.failure
    if w.failure <= 0 or total < MIN_REQUESTS or w.failure / total < FAILURE_RATE:
        return []
    reasons = ", ".join(f"{r} {n:.0f}" for r, n in sorted(w.failure_by_reason.items())) or "no reason label"
    fix = ("REJECTED: requests timed out in the queue; add capacity or shorten the queue window; "
           if "REJECTED" in w.failure_by_reason else "")
    return [_f(model, "DR107", "warning",
               f"{w.failure:.0f} of {total:.0f} requests failed ({w.failure / total:.1%}): {reasons}",
               fix + "read the server log for BACKEND errors; CANCELED means clients gave up (their timeout < the "
               "queue + compute time)",
               "", snap.url)]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in sorted(value, key=str):
            out.update(_flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        if all(not isinstance(v, (Mapping, list)) for v in value):
            return {prefix: value}
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def rule_drift(snaps: Sequence[ServerSnapshot]) -> list[Finding]:
    """Replicas must serve the same models with the same configs."""
    if len(snaps) < 2:
        return []
    out: list[Finding] = []
    ready = [{e.get("name") for e in s.index if e.get("state", "READY") == "READY"} or set(s.configs) for s in snaps]
    everything = set().union(*ready)
    for name in sorted(everything):
        missing = [s.url for s, models in zip(snaps, ready) if name not in models]
        if missing:
            have = [s.url for s, models in zip(snaps, ready) if name in models]
            out.append(_f(name, "DR105", "error",
                          f"model {name!r} is ready on {', '.join(have)} but not on {', '.join(missing)}: replicas "
                          "behind one Service serve different model sets",
                          "deploy every replica from the same rendered repository (one ConfigMap: `tritongen "
                          "deploy`) and roll them; check the missing replica's log for a failed load", "", missing[0]))
    for name in sorted(everything):
        flats = [(s.url, _flatten(s.configs[name])) for s in snaps if name in s.configs]
        if len(flats) < 2:
            continue
        keys = sorted(set().union(*(f.keys() for _, f in flats)))
        differing = [k for k in keys if len({repr(f.get(k)) for _, f in flats}) > 1]
        if not differing:
            continue
        shown = "; ".join(
            f"{k}: " + ", ".join(f"{url} = {f.get(k)!r}" for url, f in flats) for k in differing[:4]
        )
        more = f" (+{len(differing) - 4} more)" if len(differing) > 4 else ""
        out.append(_f(name, "DR105", "error",
                      f"replicas serve {name!r} with different configs: {shown}{more}; the same request gets "
                      "different batching, queueing and latency depending on the pod it lands on",
                      "re-render from the spec and roll every replica onto the same config (`tritongen deploy` puts "
                      "it in one ConfigMap whose hash rolls the pods); `tritongen render --check` in CI",
                      differing[0], flats[0][0]))
    return out


PER_MODEL_RULES = (rule_queueing, rule_saturation, rule_length_spread, rule_starvation, rule_failures)


def diagnose(snaps: Sequence[ServerSnapshot], targets: Targets) -> list[Finding]:
    findings: list[Finding] = []
    for snap in snaps:
        for model, window in sorted(snap.models.items()):
            config = snap.configs.get(model, {})
            for rule in PER_MODEL_RULES:
                findings.extend(rule(snap, model, window, config, targets))
        for model in sorted(set(snap.engines) | set(snap.sidecar)):
            findings.extend(llm_findings(snap, model, snap.configs.get(model, {}), targets))
        findings.extend(rule_memory(snap, targets))
    findings.extend(rule_drift(snaps))
    return findings


def idle_models(snaps: Iterable[ServerSnapshot]) -> list[str]:
    """Models with too little traffic in the window for the load rules."""
    return sorted({f"{m}@{s.url}" for s in snaps for m, w in s.models.items() if w.success < MIN_REQUESTS})
