"""What an LLM engine and the sidecar did over doctor's window, from their own metrics.

A decoupled model's `execute` returns as soon as it has handed the request to its engine, so
Triton's queue and compute counters end there and say nothing about the engine behind it: a
vLLM engine can hold requests for seconds while Triton reports 1 ms of compute. What does see
the engine is what the engine exports (vLLM's, TensorRT-LLM's or tinyllm's gauges, counters and
histograms on Triton's endpoint; names in `tritongen.core.engine_metrics`) and what the sidecar
measures in front of it (time to first token per class, queue wait, refusals, outcomes).

Pure: doctor's adapter scrapes every `--sample-every` seconds through the window and hands the
scrapes here. Gauges (running, waiting, KV usage) are summarised over every scrape, since two
instants would miss a queue that comes and goes; counters and histograms are deltas between the
first scrape and the last.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    """A gauge over the window's scrapes."""

    mean: float
    peak: float
    last: float
    samples: int


def _gauge(scrapes: Sequence[Samples], read) -> Gauge | None:
    seen = [v for v in (read(s) for s in scrapes) if v is not None]
    if not seen:
        return None
    return Gauge(mean=sum(seen) / len(seen), peak=max(seen), last=seen[-1], samples=len(seen))


# ---------------------------------------------------------------------------------------------
# The engine's window


@dataclass(frozen=True)
class EngineWindow:
    """One model's engine over the window, as far as its exported metrics tell."""

    model: str
    family: str  # "vLLM", "TensorRT-LLM", "tinyllm"
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

    return EngineWindow(
        model=model, family="vLLM", metrics=tuple(found), window_s=window_s,
        running=_gauge(scrapes, lambda s: _sum(s, names.VLLM_RUNNING, me)),
        waiting=_gauge(scrapes, lambda s: _sum(s, names.VLLM_WAITING, me)),
        kv_used=_gauge(scrapes, usage),
        preemptions=_first_delta(first, last, names.VLLM_PREEMPTIONS, me),
        ttft=hist(names.VLLM_TTFT), queue_time=hist(names.VLLM_QUEUE_TIME),
    )


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


def _tinyllm(model: str, scrapes: Sequence[Samples], found: list[str], window_s: float) -> EngineWindow:
    me = {"model": model}
    p = names.TINYLLM_PREFIX

    def usage(s: Samples) -> float | None:
        used, total = _sum(s, f"{p}kv_blocks_used", me), _sum(s, f"{p}kv_blocks_total", me)
        return used / total if used is not None and total else None

    return EngineWindow(
        model=model, family="tinyllm", metrics=tuple(found), window_s=window_s,
        running=_gauge(scrapes, lambda s: _sum(s, f"{p}running_sequences", me)),
        waiting=_gauge(scrapes, lambda s: _sum(s, f"{p}waiting_sequences", me)),
        kv_used=_gauge(scrapes, usage),
        oom_kills=_delta(scrapes[0], scrapes[-1], f"{p}oom_errors_total", me),
    )


def _family_of(name: str) -> str | None:
    if name.startswith("vllm:"):
        return "vllm"
    if name.startswith("nv_trt_llm_"):
        return "trtllm"
    if name.startswith(names.TINYLLM_PREFIX):
        return "tinyllm"
    return None


_READERS = {"vllm": _vllm, "trtllm": _trtllm, "tinyllm": _tinyllm}


def engine_windows(scrapes: Sequence[Samples], window_s: float) -> dict[str, EngineWindow]:
    """Per model: its engine's window, for every model some engine metric is labelled with."""
    if not scrapes:
        return {}
    last = scrapes[-1]
    found: dict[tuple[str, str], set[str]] = {}
    for sample, labels in last:
        family = _family_of(sample)
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
