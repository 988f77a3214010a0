"""What an LLM engine and the sidecar did over doctor's window, from their own metrics.

A decoupled model's `execute` returns as soon as it has handed the request to its engine, so
Triton's queue and compute counters end there and say nothing about the engine behind it: a
vLLM engine can hold requests for seconds while Triton reports 1 ms of compute. What does see
the engine is what the engine exports (vLLM's, TensorRT-LLM's or a Python backend's `llm_engine_*`
gauges, counters and histograms on Triton's endpoint; names and the convention in
`tritongen.core.engine_metrics`) and what the sidecar measures in front of it (time to first
token per class, queue wait, refusals, outcomes).

Pure: doctor's adapter scrapes every `--sample-every` seconds through the window and hands the
scrapes here. Gauges (running, waiting, KV usage) are summarised over every scrape, since two
instants would miss a queue that comes and goes; counters and histograms are deltas between the
first scrape and the last.

Triton's own vLLM backend exports no gauge of the engine's queue or its running sequences, only
histograms (time to first token, end-to-end latency). From those two, over the window, Little's law
gives both on average (`LittlesLaw`): the window's completions per second times the time a request
spends decoding is what runs, and times the part of its time to first token above the engine's
baseline is what waits for a slot. A real gauge always wins; an inferred one is named in
`EngineWindow.inferred` so every reader can say it is inferred.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tritongen.core import engine_metrics as names

LabelSet = tuple[tuple[str, str], ...]
Samples = Mapping[tuple[str, LabelSet], float]

# The sidecar's own metric names as prometheus_client writes them (counters gain `_total`,
# histograms `_bucket`); tests/unit/test_engine_window.py holds them against sidecar/metrics.py.
SIDECAR_TTFT = "sidecar_time_to_first_token_seconds_bucket"
SIDECAR_QUEUE_WAIT = "sidecar_queue_wait_seconds_bucket"
SIDECAR_REJECTED = "sidecar_requests_rejected_total"
SIDECAR_FINISHED = "sidecar_requests_finished_total"
SIDECAR_ADMITTED = "sidecar_requests_admitted_total"
SIDECAR_OOM_OUTCOME = "oom"  # sidecar_requests_finished's outcome for a request its engine killed

BASELINE_TTFT_QUANTILE = 0.1
"""The quantile of an engine's times to first token read as its baseline: the first token of a request
that found a slot at once (its prefill and about a step), so what lies above it was spent waiting for
a slot. A low quantile rather than the minimum, so that one short prompt does not set it; low enough
that the requests under it found the engine with room even while most waited. Under a queue that never
drains even the P10 waited, and the baseline is then too high, so the wait inferred from it is
understated; prompts of very different lengths put the longer prefills above it, which overstates the
wait. Either way the inferred queue is an estimate, said as such wherever it is quoted. The sidecar's queueing-engine law (sidecar/engine_concurrency.py,
`QueueingEnginePolicy.baseline_quantile`) and doctor's Little's-law inference both read it."""

MIN_OBSERVATIONS = 5
"""Fewer observations of a histogram in a window are too few for its quantiles or its mean: doctor
neither calls a target missed nor infers a queue from them."""


# ---------------------------------------------------------------------------------------------
# Histograms


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts over the window: ((le, count of observations <= le), ...), sorted."""

    buckets: tuple[tuple[float, float], ...] = ()

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket that holds rank q (Prometheus' histogram_quantile);
        a rank in the +Inf bucket answers the last finite bound, so read it as "at least"."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        prev_le, prev_count = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return prev_le
                span = cumulative - prev_count
                return prev_le + (le - prev_le) * ((rank - prev_count) / span if span > 0 else 1.0)
            prev_le, prev_count = le, cumulative
        return prev_le

    def share_within(self, limit: float) -> tuple[float, float]:
        """(at least, at most) the share of observations <= limit. Buckets only bound it: the lower
        figure counts the bucket edges at or under the limit, the upper one the first edge above.
        A rule that wants to be sure a target was missed reads the upper figure."""
        total = self.count
        if total <= 0:
            return 0.0, 1.0
        low = max((c for le, c in self.buckets if le <= limit), default=0.0)
        high = min((c for le, c in self.buckets if le >= limit), default=total)
        return low / total, high / total

    def bucket_mean(self) -> float | None:
        """The mean as the buckets tell it, for an exporter without `_sum`: each bucket's observations
        at its midpoint, the +Inf bucket's at the last finite bound (so an understatement there)."""
        total = self.count
        if total <= 0:
            return None
        weighted, prev_le, prev_count = 0.0, 0.0, 0.0
        for le, cumulative in self.buckets:
            at = prev_le if math.isinf(le) else (prev_le + le) / 2
            weighted += at * (cumulative - prev_count)
            prev_le, prev_count = le, cumulative
        return weighted / total


def histogram_delta(before: Samples, after: Samples, name: str, where: Mapping[str, str]) -> Histogram:
    """One histogram's window, summed over every series whose labels include `where`."""
    out: dict[float, float] = {}
    for (sample, labels), value in after.items():
        if sample != name:
            continue
        lab = dict(labels)
        if "le" not in lab or any(_label(lab, k) != v for k, v in where.items()):
            continue
        le = float(lab["le"])
        out[le] = out.get(le, 0.0) + max(0.0, value - before.get((sample, labels), 0.0))
    return Histogram(tuple(sorted(out.items())))


def _label(labels: Mapping[str, str], key: str) -> str | None:
    """`model` also matches vLLM's own `model_name` label."""
    if key == "model":
        for alias in names.VLLM_MODEL_LABELS:
            if alias in labels:
                return labels[alias]
        return None
    return labels.get(key)


def select(samples: Samples, name: str, where: Mapping[str, str]) -> list[float]:
    """The value of every series of `name` whose labels include `where`, in scrape order (NaN kept)."""
    out = []
    for (sample, labels), value in samples.items():
        if sample == name:
            lab = dict(labels)
            if all(_label(lab, k) == v for k, v in where.items()):
                out.append(value)
    return out


def _values(samples: Samples, name: str, where: Mapping[str, str]) -> list[float]:
    return [v for v in select(samples, name, where) if not math.isnan(v)]


# ---------------------------------------------------------------------------------------------
# Gauges over the scrapes


@dataclass(frozen=True)
class Gauge:
    """A gauge over the window's scrapes; `samples` 0 when it was inferred rather than read (the
    window's `EngineWindow.inferred` says which and `inference` how): its mean, peak and last are then
    the one inferred mean."""

    mean: float
    peak: float
    last: float
    samples: int


def _gauge(scrapes: Sequence[Samples], read) -> Gauge | None:
    seen = [v for v in (read(s) for s in scrapes) if v is not None]
    if not seen:
        return None
    return Gauge(mean=sum(seen) / len(seen), peak=max(seen), last=seen[-1], samples=len(seen))


def inferred_gauge(mean: float) -> Gauge:
    """A gauge no scrape read: one mean over the window, no peak of its own."""
    return Gauge(mean=mean, peak=mean, last=mean, samples=0)


# ---------------------------------------------------------------------------------------------
# The engine's window


@dataclass(frozen=True)
class EngineWindow:
    """One model's engine over the window, as far as its exported metrics tell."""

    model: str
    family: str  # "vLLM", "TensorRT-LLM", `engine_metrics.PY_ENGINE_FAMILY`
    metrics: tuple[str, ...]  # the engine metric names found for the model
    running: Gauge | None = None
    waiting: Gauge | None = None
    kv_used: Gauge | None = None  # fraction of the KV pool in use, 0..1
    max_running: float | None = None  # the engine's own bound on running sequences, where it exports one
    preemptions: float | None = None  # in the window; None: not exported
    oom_kills: float | None = None  # requests the engine failed for want of KV memory; None: not exported
    ttft: Histogram | None = None  # seconds, engine-wide (no class)
    queue_time: Histogram | None = None  # seconds spent waiting inside the engine
    window_s: float = 0.0
    inferred: tuple[str, ...] = ()  # the gauges inferred, not read: "running", "waiting"
    inference: str = ""  # how they were inferred, with the figures, for a reader

    @property
    def preemptions_per_s(self) -> float | None:
        if self.preemptions is None or self.window_s <= 0:
            return None
        return self.preemptions / self.window_s


def _sum(samples: Samples, name: str, where: Mapping[str, str]) -> float | None:
    values = _values(samples, name, where)
    return sum(values) if values else None


def _delta(before: Samples, after: Samples, name: str, where: Mapping[str, str]) -> float | None:
    end = _sum(after, name, where)
    if end is None:
        return None
    return max(0.0, end - (_sum(before, name, where) or 0.0))


def _first_delta(before: Samples, after: Samples, candidates: Sequence[str], where: Mapping[str, str]) -> float | None:
    for name in candidates:
        value = _delta(before, after, name, where)
        if value is not None:
            return value
    return None


def _has_histogram(samples: Samples, name: str, model: str) -> bool:
    return bool(_values(samples, f"{name}_bucket", {"model": model}))


@dataclass(frozen=True)
class LittlesLaw:
    """What an engine ran and queued on average over the window, from its latency histograms alone.

    Little's law (in a system = arrivals per second x time in it) holds for any part of a request's
    life once the window is long next to a request: with the window's completions per second, a
    request's time past its first token gives the sequences decoding, and the part of its time to
    first token above the engine's baseline (`BASELINE_TTFT_QUANTILE`) the requests waiting for a slot.
    Averages only: a queue that came and went reads as its mean."""

    completions_per_s: float
    mean_ttft_s: float
    baseline_ttft_s: float
    mean_e2e_s: float

    @property
    def running(self) -> float:
        return self.completions_per_s * max(0.0, self.mean_e2e_s - self.mean_ttft_s)

    @property
    def waiting(self) -> float:
        return self.completions_per_s * self.queued_s

    @property
    def queued_s(self) -> float:
        return max(0.0, self.mean_ttft_s - self.baseline_ttft_s)

    @property
    def text(self) -> str:
        return (f"by Little's law from its TTFT and end-to-end latency histograms: {self.completions_per_s:.1f} "
                f"completions/s, mean TTFT {1000 * self.mean_ttft_s:.0f} ms of which {1000 * self.queued_s:.0f} ms "
                f"above its P{100 * BASELINE_TTFT_QUANTILE:.0f} baseline, mean end-to-end "
                f"{1000 * self.mean_e2e_s:.0f} ms")


def _mean(before: Samples, after: Samples, name: str, where: Mapping[str, str], hist: Histogram) -> float | None:
    """A histogram's mean over the window: the delta of `_sum` over that of `_count`, or the buckets'."""
    total = _delta(before, after, f"{name}_sum", where)
    count = _delta(before, after, f"{name}_count", where) or hist.count
    if total is not None and count > 0:
        return total / count
    return hist.bucket_mean()


def littles_law(before: Samples, after: Samples, where: Mapping[str, str], window_s: float,
                ttft: Histogram | None, e2e: Histogram | None) -> LittlesLaw | None:
    """The window's Little's law from vLLM's TTFT and end-to-end histograms (deltas `ttft`, `e2e`);
    None without either, or with fewer than `MIN_OBSERVATIONS` completions or first tokens."""
    if ttft is None or e2e is None or window_s <= 0:
        return None
    completions = _delta(before, after, f"{names.VLLM_E2E}_count", where) or e2e.count
    if completions < MIN_OBSERVATIONS or ttft.count < MIN_OBSERVATIONS:
        return None
    mean_ttft = _mean(before, after, names.VLLM_TTFT, where, ttft)
    mean_e2e = _mean(before, after, names.VLLM_E2E, where, e2e)
    baseline = ttft.quantile(BASELINE_TTFT_QUANTILE)
    if mean_ttft is None or mean_e2e is None or baseline is None:
        return None
    return LittlesLaw(completions / window_s, mean_ttft, baseline, mean_e2e)


def _vllm(model: str, scrapes: Sequence[Samples], found: list[str], window_s: float) -> EngineWindow:
    first, last = scrapes[0], scrapes[-1]
    me = {"model": model}

    def usage(s: Samples) -> float | None:
        for name in names.VLLM_USAGE_GAUGES:
            values = _values(s, name, me)
            if values:
                return max(values)  # one per engine (data parallel): the fullest
        return None

    def hist(name: str) -> Histogram | None:
        return histogram_delta(first, last, f"{name}_bucket", me) if _has_histogram(last, name, model) else None

    window = EngineWindow(
        model=model, family="vLLM", metrics=tuple(found), window_s=window_s,
        running=_gauge(scrapes, lambda s: _sum(s, names.VLLM_RUNNING, me)),
        waiting=_gauge(scrapes, lambda s: _sum(s, names.VLLM_WAITING, me)),
        kv_used=_gauge(scrapes, usage),
        preemptions=_first_delta(first, last, names.VLLM_PREEMPTIONS, me),
        ttft=hist(names.VLLM_TTFT), queue_time=hist(names.VLLM_QUEUE_TIME),
    )
    if window.running is not None and window.waiting is not None:
        return window
    return _with_inferred(window, littles_law(first, last, me, window_s, window.ttft, hist(names.VLLM_E2E)))


def _with_inferred(window: EngineWindow, law: LittlesLaw | None) -> EngineWindow:
    """The window with the gauges it lacks inferred by `law`; the gauges it read stay as read."""
    if law is None:
        return window
    running = window.running or inferred_gauge(law.running)
    waiting = window.waiting or inferred_gauge(law.waiting)
    inferred = tuple(n for n, g in (("running", window.running), ("waiting", window.waiting)) if g is None)
    return replace(window, running=running, waiting=waiting, inferred=inferred, inference=law.text)


def _trtllm(model: str, scrapes: Sequence[Samples], found: list[str], window_s: float) -> EngineWindow:
    me = {"model": model}

    def request(kind: str):
        return lambda s: _sum(s, names.TRTLLM_REQUESTS, {**me, names.TRTLLM_REQUEST_TYPE: kind})

    def usage(s: Samples) -> float | None:
        blocks = {"model": model}
        used = _sum(s, names.TRTLLM_KV_BLOCKS, {**blocks, names.TRTLLM_BLOCK_TYPE: "used"})
        most = _sum(s, names.TRTLLM_KV_BLOCKS, {**blocks, names.TRTLLM_BLOCK_TYPE: "max"})
        if used is not None and most:
            return used / most
        return _sum(s, names.TRTLLM_KV_BLOCKS, {**blocks, names.TRTLLM_BLOCK_TYPE: "fraction"})

    most = _gauge(scrapes, request("max"))
    return EngineWindow(
        model=model, family="TensorRT-LLM", metrics=tuple(found), window_s=window_s,
        running=_gauge(scrapes, request("active")), waiting=_gauge(scrapes, request("waiting")),
        kv_used=_gauge(scrapes, usage), max_running=most.last if most else None,
    )


def _python_backend(model: str, scrapes: Sequence[Samples], found: list[str], window_s: float) -> EngineWindow:
    """A Python backend's engine that follows tritongen's `llm_engine_*` convention."""
    me = {"model": model}

    def usage(s: Samples) -> float | None:
        used, total = _sum(s, names.PY_KV_BLOCKS_USED, me), _sum(s, names.PY_KV_BLOCKS_TOTAL, me)
        return used / total if used is not None and total else None

    return EngineWindow(
        model=model, family=names.PY_ENGINE_FAMILY, metrics=tuple(found), window_s=window_s,
        running=_gauge(scrapes, lambda s: _sum(s, names.PY_RUNNING, me)),
        waiting=_gauge(scrapes, lambda s: _sum(s, names.PY_WAITING, me)),
        kv_used=_gauge(scrapes, usage),
        oom_kills=_delta(scrapes[0], scrapes[-1], names.PY_OOM_ERRORS, me),
    )


def metric_family(name: str) -> str | None:
    """The engine a metric family name belongs to: 'vllm', 'trtllm', 'llm_engine' (a Python engine's own
    gauges), None for Triton's own and anything else."""
    if name.startswith("vllm:"):
        return "vllm"
    if name.startswith("nv_trt_llm_"):
        return "trtllm"
    if name.startswith(names.PY_ENGINE_PREFIX):
        return "llm_engine"
    return None


_READERS = {"vllm": _vllm, "trtllm": _trtllm, "llm_engine": _python_backend}


def engine_windows(scrapes: Sequence[Samples], window_s: float) -> dict[str, EngineWindow]:
    """Per model: its engine's window, for every model some engine metric is labelled with."""
    if not scrapes:
        return {}
    last = scrapes[-1]
    found: dict[tuple[str, str], set[str]] = {}
    for sample, labels in last:
        family = metric_family(sample)
        model = _label(dict(labels), "model")
        if family and model:
            found.setdefault((model, family), set()).add(_base_name(sample))
    out: dict[str, EngineWindow] = {}
    for (model, family), seen in sorted(found.items()):
        if model not in out:  # one family per model: the first in name order (one engine per model)
            out[model] = _READERS[family](model, scrapes, sorted(seen), window_s)
    return out


def _base_name(sample: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


# ---------------------------------------------------------------------------------------------
# The sidecar's window


@dataclass(frozen=True)
class SidecarClass:
    """One traffic class of one model, as the sidecar in front of it saw the window."""

    klass: str
    ttft: Histogram = field(default_factory=Histogram)  # seconds, arrival at the sidecar to first response
    admitted: float = 0.0
    rejected: Mapping[str, float] = field(default_factory=dict)  # by reason
    finished: Mapping[str, float] = field(default_factory=dict)  # by outcome


@dataclass(frozen=True)
class SidecarWindow:
    model: str
    classes: Mapping[str, SidecarClass]
    queue_wait: Mapping[str, Histogram] = field(default_factory=dict)  # by class, every model of the sidecar

    @property
    def oom_kills(self) -> float:
        return sum(c.finished.get(SIDECAR_OOM_OUTCOME, 0.0) for c in self.classes.values())

    @property
    def refused(self) -> float:
        return sum(sum(c.rejected.values()) for c in self.classes.values())


def _by(before: Samples, after: Samples, name: str, model: str, klass: str, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (sample, labels), value in after.items():
        lab = dict(labels)
        if sample != name or lab.get("model") != model or lab.get("class") != klass:
            continue
        change = max(0.0, value - before.get((sample, labels), 0.0))
        if change > 0:
            out[lab.get(key, "")] = out.get(lab.get(key, ""), 0.0) + change
    return out


def sidecar_windows(before: Samples, after: Samples) -> dict[str, SidecarWindow]:
    """Per model the sidecar labels (its `other` bucket included): classes, their TTFT and refusals."""
    pairs = sorted({(dict(lab).get("model", ""), dict(lab).get("class", "")) for s, lab in after
                    if s in (SIDECAR_ADMITTED, SIDECAR_REJECTED, SIDECAR_TTFT) and dict(lab).get("model")})
    waits = sorted({dict(lab).get("class", "") for s, lab in after if s == SIDECAR_QUEUE_WAIT})
    queue_wait = {k: histogram_delta(before, after, SIDECAR_QUEUE_WAIT, {"class": k}) for k in waits}
    out: dict[str, SidecarWindow] = {}
    for model in sorted({m for m, _ in pairs}):
        classes = {}
        for _, klass in (p for p in pairs if p[0] == model):
            where = {"model": model, "class": klass}
            classes[klass] = SidecarClass(
                klass=klass,
                ttft=histogram_delta(before, after, SIDECAR_TTFT, where),
                admitted=_delta(before, after, SIDECAR_ADMITTED, where) or 0.0,
                rejected=_by(before, after, SIDECAR_REJECTED, model, klass, "reason"),
                finished=_by(before, after, SIDECAR_FINISHED, model, klass, "outcome"),
            )
        out[model] = SidecarWindow(model=model, classes=classes, queue_wait=queue_wait)
    return out
