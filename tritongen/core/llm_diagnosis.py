"""doctor's rules for LLMs: the engine behind a decoupled model, seen through its own metrics.

    DR108  requests waiting while the KV cache is near full   (more KV, fewer sequences, scale out)
    DR109  preemptions above a threshold                       (max_num_seqs over what the KV holds)
    DR110  time to first token over the class target           (capacity, or prefill too long)
    DR111  KV near full with few sequences running             (requests sized too large, or the
                                                               sidecar's pad / estimate too big)
    DR112  out-of-memory kills                                 (admit by footprint, or a pool overstated)
    DR113  requests waiting at the sequence bound, KV to spare (max_num_seqs set too low)

Each finding names the file and the field to change, which depend on the backend: the vLLM
backend's `1/model.json`, TensorRT-LLM's `config.pbtxt` parameters, or the spec's `engine:` section
for a hand-written Python backend (`engine_knobs`). A decoupled model with no engine metrics and
no sidecar in front is not "healthy": `blind_spots` says what doctor could not see and how to
make it visible.

Triton's own vLLM backend exports latency histograms but no queue or running gauge: there the
engine window infers both by Little's law (`engine_window.LittlesLaw`), and every finding and blind
spot that reads them says they were inferred. The KV rules (DR108, DR111, DR113) still need the
engine's KV gauge, which nothing infers.

Evidence comes from `tritongen.core.engine_window`: the engine's gauges over every scrape of the
window, its counters and histograms as deltas, and the sidecar's per-class histograms. A target
is called missed only when the histogram's buckets prove it (`Histogram.share_within`'s upper
bound under 99%), so coarse buckets never raise a false alarm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritongen.core.diagnosis_inputs import ModelWindow, ServerSnapshot, Targets
from tritongen.core.engine_metrics import PY_ENGINE_PREFIX
from tritongen.core.engine_window import MIN_OBSERVATIONS, EngineWindow, Histogram, SidecarWindow
from tritongen.core.findings import Finding

KV_NEAR_FULL = 0.90  # peak KV usage in the window from which new sequences wait for blocks (the mean
# swings with every sequence that finishes: vLLM's stand-in at 1.7x its capacity read 77% mean, 95% peak)
WAITING = 1.0  # mean requests waiting inside the engine: a standing queue, not a passing one
PREEMPT_MIN = 5  # fewer preemptions in a window are noise
PREEMPT_SHARE = 0.05  # preemptions per finished request from which the recompute costs real time
FEW_RUNNING = 0.5  # running under this share of the engine's bound while the KV is full: large sequences
SIDECAR_FULL = 0.05  # sidecar headroom under this share of its capacity: it is holding requests back
ENGINE_ROOMY = 0.60  # ... while the engine's KV cache is at most this full: the sidecar over-reserves
TTFT_QUANTILE = 0.99  # the share of first tokens a class target promises
AT_BOUND = 0.9  # running at least this share of the engine's bound on average: the bound, not the KV, binds
KV_SPARE = 0.80  # ... while the KV cache never passed this: room for more sequences

LLM_CODES = {
    "DR108": "requests waiting while the KV cache is near full",
    "DR109": "preemptions above threshold",
    "DR110": "time to first token over the class target",
    "DR111": "KV cache near full with few sequences running",
    "DR112": "out-of-memory kills",
    "DR113": "requests waiting at the sequence bound with KV to spare",
}


@dataclass(frozen=True)
class EngineKnobs:
    """Where an engine's settings live, in the words its owner edits."""

    file: str
    kv: str  # what sizes the KV pool
    seqs: str  # what bounds the running sequences
    lengths: str  # what bounds one sequence's tokens
    prefill: str  # what splits long prefills


def _params(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("parameters") or {}


def engine_knobs(model: str, config: Mapping[str, Any]) -> EngineKnobs:
    """The backend's own files first; a Python backend's settings are the spec's `engine:` section
    (rendered into config.pbtxt parameters when it reads them, as tinyllm does)."""
    backend = str(config.get("backend") or "")
    if backend == "vllm":
        return EngineKnobs(f"{model}/1/model.json", "gpu_memory_utilization", "max_num_seqs",
                           "max_model_len (and the clients' max_tokens)", "max_num_batched_tokens with enable_chunked_prefill")
    if backend == "tensorrtllm":
        return EngineKnobs(f"{model}/config.pbtxt", "parameters.kv_cache_free_gpu_mem_fraction (or max_tokens_in_paged_kv_cache)",
                           "the engine's max_batch_size (trtllm-build --max_batch_size)",
                           "parameters.max_attention_window_size (and the clients' max_tokens)", "parameters.enable_chunked_context")
    rendered = any(k in _params(config) for k in ("kv_pool_blocks", "max_num_seqs"))
    where = f"the spec's engine: section (rendered into {model}/config.pbtxt parameters)" if rendered else \
        "the spec's engine: section (and the backend's own settings)"
    return EngineKnobs(where, "engine.kv_pool_tokens (or memory_quota_mb)", "engine.max_num_seqs",
                       "max_context (and the clients' max_tokens)", "engine.max_batched_tokens")


def _f(model: str, code: str, message: str, fix: str, field_: str, where: str, severity: str = "error") -> Finding:
    return Finding(severity=severity, code=code, model=model, field=field_, message=message, fix=fix, path=where)  # type: ignore[arg-type]


def _bound(model: str, engine: EngineWindow, config: Mapping[str, Any], targets: Targets) -> float | None:
    """The most sequences the engine may run: its own metric, the config's rendered parameter, the spec."""
    if engine.max_running:
        return engine.max_running
    raw = (_params(config).get("max_num_seqs") or {}).get("string_value")
    try:
        if raw is not None:
            return float(raw)
    except ValueError:
        pass
    return targets.max_num_seqs.get(model)


# EngineWindow.inferred in words: what was inferred, and the gauge the backend lacks
INFERRED_WORDS = {"waiting": "the engine's queue", "running": "its running sequences"}
GAUGE_WORDS = {"waiting": "queue", "running": "running-sequence"}


def _about(engine: EngineWindow, name: str) -> str:
    """An inferred figure is an estimate: say so where it is quoted."""
    return "about " if name in engine.inferred else ""


def _inferred_note(engine: EngineWindow) -> str:
    if not engine.inferred:
        return ""
    gauges = " or ".join(GAUGE_WORDS[name] for name in engine.inferred)
    # Little's law holds in a steady state; under a queue that grows through the window the requests
    # that finished waited less than those still waiting, so the figures are low (measured on a real
    # vLLM against its own gauges: 10.2 / 34.9 inferred where 21.8 ran and 140.2 waited; docs/commands.md).
    return (f" (inferred from its TTFT and latency histograms by Little's law, a lower bound while the queue "
            f"grows; the backend exports no {gauges} gauge)")


def _queue_text(engine: EngineWindow) -> str:
    running = engine.running
    ran = f"{_about(engine, 'running')}{running.mean:.1f} ran" if running else "the running count is not exported"
    waiting = engine.waiting
    if waiting is None:
        return ran
    peak = "" if "waiting" in engine.inferred else f" (peak {waiting.peak:.0f})"
    return (f"{_about(engine, 'waiting')}{waiting.mean:.1f} requests waited inside the engine on average{peak} "
            f"and {ran}{_inferred_note(engine)}")


def rule_kv_waiting(model: str, e: EngineWindow, knobs: EngineKnobs, where: str) -> list[Finding]:
    kv, waiting = e.kv_used, e.waiting
    if kv is None or waiting is None or kv.peak < KV_NEAR_FULL or waiting.mean < WAITING:
        return []
    return [_f(model, "DR108",
               f"{e.family} engine: the KV cache reached {kv.peak:.0%} full (mean {kv.mean:.0%}) while "
               f"{_queue_text(e)}: new sequences wait for KV blocks, so their first token waits too",
               f"give the engine more KV memory ({knobs.kv} in {knobs.file}), or move the load onto more replicas "
               "(`tritongen plan --peak-qps` sizes them); put `tritongen sidecar` in front so overflow is refused "
               "at once (429) instead of queueing for seconds",
               knobs.kv, where)]


def rule_preemptions(model: str, e: EngineWindow, w: ModelWindow | None, knobs: EngineKnobs, where: str) -> list[Finding]:
    if e.preemptions is None or e.preemptions < PREEMPT_MIN:
        return []
    finished = w.success if w is not None else 0.0
    if finished > 0 and e.preemptions < PREEMPT_SHARE * finished:
        return []
    share = f", {e.preemptions / finished:.0%} of the {finished:.0f} requests that finished" if finished > 0 else ""
    return [_f(model, "DR109",
               f"{e.family} engine: {e.preemptions:.0f} preemptions in {e.window_s:.0f} s "
               f"({e.preemptions_per_s or 0:.1f}/s{share}): running sequences outgrow the KV cache and are evicted "
               "and recomputed, which repeats their prefill and stalls their tokens",
               f"lower {knobs.seqs} in {knobs.file} to what the KV cache holds at the traffic's length (KV tokens / "
               f"(prompt + output tokens)), or raise {knobs.kv}; `tritongen tune` with the model's profile finds the bound",
               knobs.seqs, where)]


def _ttft_miss(hist: Histogram, budget_ms: float, share: float = 1.0) -> tuple[float, float, float] | None:
    """(at most this share within the target, P50 ms, P99 ms) when the buckets prove the target missed
    by the `share` of the requests it binds."""
    if hist.count < MIN_OBSERVATIONS:
        return None
    _, at_most = hist.share_within(budget_ms / 1000)
    if at_most >= TTFT_QUANTILE * share:
        return None
    return at_most, 1000 * (hist.quantile(0.5) or 0.0), 1000 * (hist.quantile(0.99) or 0.0)


def _engine_wide_miss(hist: Histogram, model: str, targets: Targets) -> tuple[str, float, tuple[float, float, float]] | None:
    """An engine-wide histogram holds every class. Class k's target binds its own requests and those
    of every class with a target as tight: if fewer first tokens came within k's target than 99% of
    those classes' share of the traffic (the spec's shares), some of them surely missed, however the
    engine ordered them. Without the spec's classes, the model's budget binds every request.
    Returns (what missed, its target in ms, the miss)."""
    classes = targets.classes_of(model)
    if not classes:
        miss = _ttft_miss(hist, targets.budget(model))
        return ("its latency budget", targets.budget(model), miss) if miss else None
    bound = 0.0
    for name, budget_ms, share in sorted(classes, key=lambda c: c[1]):
        bound += share
        miss = _ttft_miss(hist, budget_ms, min(1.0, bound))
        if miss is not None:
            return (f"class {name}'s target ({bound:.0%} of the traffic has one this tight)", budget_ms, miss)
    return None


def _ttft_cause(e: EngineWindow | None, s: SidecarWindow | None, klass: str | None, knobs: EngineKnobs) -> tuple[str, str, str]:
    """(why, fix, field) from what else the window shows."""
    waits = []
    if e is not None and e.waiting is not None and e.waiting.mean >= WAITING:
        waits.append(_queue_text(e))
    if e is not None and e.queue_time is not None and e.queue_time.count:
        waits.append(f"engine queue time P50 {1000 * (e.queue_time.quantile(0.5) or 0):.0f} ms")
    if s is not None and klass is not None and klass in s.queue_wait and s.queue_wait[klass].count:
        p50 = 1000 * (s.queue_wait[klass].quantile(0.5) or 0)
        if p50 >= 1.0:
            waits.append(f"the sidecar held {klass} requests {p50:.0f} ms at the P50")
    if waits:
        return ("; ".join(waits) + ": the engine is past its capacity",
                f"add capacity: more replicas, or a larger KV pool ({knobs.kv} in {knobs.file}); with the sidecar in "
                "front, classes with tight targets go first and the rest are refused early instead of waiting",
                knobs.kv)
    idle = _queue_text(e) if e is not None and "waiting" in e.inferred else "nothing waits"
    return (f"{idle}, so the prefill itself is slow: long prompts",
            f"split long prefills ({knobs.prefill} in {knobs.file}), or route long prompts to their own lane (the spec's "
            "`lanes: {split_prompt_tokens: N}`)", knobs.prefill)


def rule_ttft(model: str, e: EngineWindow | None, s: SidecarWindow | None, knobs: EngineKnobs, targets: Targets,
              where: str) -> list[Finding]:
    out: list[Finding] = []
    if s is not None:  # per class, each against its own target
        for klass, c in sorted(s.classes.items()):
            budget = targets.class_budget(model, klass)
            miss = _ttft_miss(c.ttft, budget)
            if miss is None:
                continue
            at_most, p50, p99 = miss
            why, fix, field_ = _ttft_cause(e, s, klass, knobs)
            out.append(_f(model, "DR110",
                          f"class {klass}: time to first token P50 {p50:.0f} ms, P99 {p99:.0f} ms as the sidecar saw it, "
                          f"against its {budget:g} ms target; at most {at_most:.0%} of {c.ttft.count:.0f} first tokens "
                          f"came within it; {why}", fix, field_, where))
        if out or any(c.ttft.count for c in s.classes.values()):
            return out
    if e is None or e.ttft is None:
        return out
    found = _engine_wide_miss(e.ttft, model, targets)
    if found is None:
        return out
    what, budget, (at_most, p50, p99) = found
    why, fix, field_ = _ttft_cause(e, s, None, knobs)
    return [_f(model, "DR110",
               f"{e.family} engine: time to first token P50 {p50:.0f} ms, P99 {p99:.0f} ms over every request, against "
               f"{what}: {budget:g} ms; at most {at_most:.0%} of {e.ttft.count:.0f} first tokens came within it; {why}",
               fix, field_, where)]


def rule_kv_few_running(model: str, e: EngineWindow, bound: float | None, knobs: EngineKnobs, where: str) -> list[Finding]:
    kv, running = e.kv_used, e.running
    if kv is None or running is None or bound is None or kv.peak < KV_NEAR_FULL or running.mean > FEW_RUNNING * bound:
        return []
    return [_f(model, "DR111",
               f"{e.family} engine: the KV cache reached {kv.peak:.0%} (mean {kv.mean:.0%}) with only {running.mean:.1f} "
               f"sequences running on average, of the {bound:.0f} it may run: each sequence holds about "
               f"{kv.peak / max(running.mean, 1):.0%} of the pool, so requests are sized too large for it",
               f"bound a sequence's length ({knobs.lengths}), or give the pool more memory ({knobs.kv} in {knobs.file}); "
               f"{knobs.seqs} above what the pool holds only adds waiting and preemption",
               knobs.lengths, where, severity="warning")]


def rule_seq_bound(model: str, e: EngineWindow, bound: float | None, knobs: EngineKnobs, where: str) -> list[Finding]:
    kv, running, waiting = e.kv_used, e.running, e.waiting
    if kv is None or running is None or waiting is None or bound is None:
        return []
    if waiting.mean < WAITING or kv.peak >= KV_SPARE or running.mean < AT_BOUND * bound:
        return []
    room = max(1, int(bound * (KV_SPARE / max(kv.peak, 1e-3) - 1)))
    return [_f(model, "DR113",
               f"{e.family} engine: {waiting.mean:.1f} requests waited on average while {running.mean:.1f} ran, at its "
               f"bound of {bound:.0f} sequences, and the KV cache never passed {kv.peak:.0%}: the sequence bound, not "
               "the memory, holds requests back",
               f"raise {knobs.seqs} in {knobs.file} (the KV cache has room for about {room} more at this length before "
               f"{KV_SPARE:.0%}); `tritongen tune` checks the latency at the new bound", knobs.seqs, where,
               severity="warning")]


def rule_sidecar_overreserves(model: str, e: EngineWindow | None, snap: ServerSnapshot, where: str) -> list[Finding]:
    if e is None or e.kv_used is None or e.kv_used.mean > ENGINE_ROOMY:
        return []
    for room in snap.headroom:
        if room.scope != f"pool:{model}" or not room.capacity_bytes:
            continue
        if room.headroom_bytes > SIDECAR_FULL * room.capacity_bytes:
            continue
        return [_f(model, "DR111",
                   f"the sidecar can reserve only {room.headroom_bytes / 2**20:.1f} of {room.capacity_bytes / 2**20:.0f} MiB "
                   f"for {model} while the engine's KV cache is {e.kv_used.mean:.0%} full: the policy charges requests more "
                   "than the engine holds for them, so it queues or refuses work the engine could run",
                   "lower policy.kv_safety_pad_mb in the spec, or correct the model's engine.kv_pool_tokens / "
                   "bytes_per_token (`tritongen profile` measures both), then re-render sidecar_policy.json",
                   "policy.kv_safety_pad_mb", where, severity="warning")]
    return []


def kills_seen(e: EngineWindow | None, s: SidecarWindow | None) -> tuple[float, float]:
    """(out-of-memory kills the engine counted, kills the sidecar saw in its answers) in the window.
    Both may count the same requests, so the larger is the count."""
    return ((e.oom_kills or 0.0) if e is not None else 0.0), (s.oom_kills if s is not None else 0.0)


def rule_kills(model: str, e: EngineWindow | None, s: SidecarWindow | None, knobs: EngineKnobs, where: str) -> list[Finding]:
    engine_kills, sidecar_kills = kills_seen(e, s)
    kills = max(engine_kills, sidecar_kills)
    if kills <= 0:
        return []
    seen = f"{e.family} engine's counter" if engine_kills >= sidecar_kills else "the sidecar, from the engine's error answers"
    if sidecar_kills > 0:
        fix = ("the sidecar in front admits what its policy says fits, so the policy overstates the pool: set "
               f"engine.kv_pool_tokens in the spec to the measured pool (`tritongen profile --kv-capacity-probe`) and "
               f"re-render sidecar_policy.json; or lower {knobs.seqs}")
    else:
        fix = ("put `tritongen sidecar` in front with the policy `tritongen render` writes: it admits each request by its "
               f"own KV footprint, so overflow becomes a fast 429 instead of a kill; or lower {knobs.seqs} "
               f"in {knobs.file} / the clients' max_tokens")
    return [_f(model, "DR112",
               f"{kills:.0f} requests were killed with an out-of-memory error in the window (seen by {seen}): the "
               "engine admitted more sequences than its KV pool holds", fix, knobs.seqs, where)]


def llm_findings(snap: ServerSnapshot, model: str, config: Mapping[str, Any], targets: Targets) -> list[Finding]:
    e = snap.engines.get(model)
    s = snap.sidecar.get(model)
    if e is None and s is None:
        return []
    knobs = engine_knobs(model, config)
    out: list[Finding] = []
    if e is not None:
        out += rule_kv_waiting(model, e, knobs, snap.url)
        out += rule_preemptions(model, e, snap.models.get(model), knobs, snap.url)
        bound = _bound(model, e, config, targets)
        out += rule_kv_few_running(model, e, bound, knobs, snap.url)
        out += rule_seq_bound(model, e, bound, knobs, snap.url)
    out += rule_ttft(model, e, s, knobs, targets, snap.url)
    out += rule_sidecar_overreserves(model, e, snap, snap.url)
    out += rule_kills(model, e, s, knobs, snap.url)
    return out


# ---------------------------------------------------------------------------------------------
# What doctor could not see


@dataclass(frozen=True)
class BlindSpot:
    """A decoupled model doctor cannot fully see inside, what it inferred instead, and how to see it."""

    model: str
    missing: tuple[str, ...]  # what doctor could not see: "the engine's queue", "its KV-cache usage", ...
    why: str  # why it could not: "its vLLM metrics leave these out"
    how: str  # how to make it visible
    inferred: tuple[str, ...] = ()  # what it inferred instead of seeing, in words: "the engine's queue", ...
    inference: str = ""  # how it inferred them, with the figures

    @property
    def text(self) -> str:
        instead = f"; inferred {' and '.join(self.inferred)} {self.inference}" if self.inferred else ""
        return f"{self.model}: could not see {', '.join(self.missing)} ({self.why}){instead}. To see them, {self.how}."


NO_ENGINE_METRICS = ("it is decoupled, so Triton's queue and compute times end when execute hands a request to "
                     "its engine, and it exports no engine metrics")
MAKE_VISIBLE = (
    "export the engine's state on Triton's metrics endpoint (pb_utils.MetricFamily, vLLM's names: "
    "vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc, vllm:num_preemptions_total, "
    f"vllm:time_to_first_token_seconds; or, from a Python backend, tritongen's {PY_ENGINE_PREFIX}* names, listed in "
    "tritongen/core/engine_metrics.py), or put `tritongen sidecar` in front and pass --sidecar-metrics-url"
)


def _decoupled(config: Mapping[str, Any]) -> bool:
    return bool((config.get("model_transaction_policy") or {}).get("decoupled"))


def blind_spots(snap: ServerSnapshot) -> list[BlindSpot]:
    """Decoupled models whose engine doctor cannot see: Triton's queue and compute times end when
    `execute` hands the request over, so without the engine's metrics or the sidecar's, "no
    problem" would only mean "no evidence". A queue inferred from the engine's histograms is not
    missing, but the spot says it was inferred and how."""
    out = []
    for model, config in sorted(snap.configs.items()):
        if not _decoupled(config) or model in snap.sidecar:
            continue
        e = snap.engines.get(model)
        missing = []
        if e is None or e.waiting is None:
            missing.append(INFERRED_WORDS["waiting"])
        if e is None or e.kv_used is None:
            missing.append("its KV-cache usage")
        if e is None or (e.preemptions is None and e.oom_kills is None):
            missing.append("preemptions or out-of-memory kills")
        if e is None or e.ttft is None:
            missing.append("time to first token")
        if not missing:
            continue
        if e is None:
            out.append(BlindSpot(model, tuple(missing), NO_ENGINE_METRICS, MAKE_VISIBLE))
            continue
        inferred = tuple(words for name, words in INFERRED_WORDS.items() if name in e.inferred)
        out.append(BlindSpot(model, tuple(missing), f"its {e.family} metrics leave these out", MAKE_VISIBLE,
                             inferred, e.inference))
    return out
