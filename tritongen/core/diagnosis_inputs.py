"""What `tritongen doctor`'s rules read: one server's snapshot (per-model windows made from two
scrapes of /metrics, its devices, the sidecar's headroom, the engines' and the sidecar's own
windows) and the targets it is judged against.

Its own module because two rule sets read these types: the classic rules (core/diagnosis.py) and
the LLM engine rules (core/llm_diagnosis.py), and the classic rules also run the LLM ones; with the
types in either rule module the two would import each other.

Pure: the adapter (tritongen/doctor.py) scrapes and reads configs; the functions here only turn two
parsed scrapes into deltas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tritongen.core.engine_window import EngineWindow, Samples, SidecarWindow, histogram_delta, select


@dataclass(frozen=True)
class ModelWindow:
    """One model's activity over the window (counter deltas, gauges at the end)."""

    model: str
    success: float = 0.0
    failure: float = 0.0
    failure_by_reason: Mapping[str, float] = field(default_factory=dict)
    inferences: float = 0.0
    executions: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0  # duration counters: each request of a batch adds the batch's time
    pending_start: float = 0.0
    pending_end: float = 0.0
    p99_request_us: float | None = None  # summary quantile at the end of the window
    p99_queue_us: float | None = None
    prompt_tokens_buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count delta), sidecar

    @property
    def compute_us(self) -> float:
        return self.compute_input_us + self.compute_infer_us + self.compute_output_us

    def mean_ms(self, total_us: float) -> float | None:
        return total_us / self.success / 1000 if self.success > 0 else None

    @property
    def mean_queue_ms(self) -> float | None:
        return self.mean_ms(self.queue_us)

    @property
    def mean_request_ms(self) -> float | None:
        return self.mean_ms(self.request_us)

    @property
    def mean_batch(self) -> float | None:
        return self.inferences / self.executions if self.executions > 0 else None

    @property
    def compute_per_exec_ms(self) -> float | None:
        """Triton adds an execution's duration to *each* request in it, so the mean per request is the
        mean duration of the execution a request ran in."""
        return self.compute_us / self.success / 1000 if self.success > 0 else None

    @property
    def busy_us(self) -> float:
        """Instance time spent executing: executions x their mean duration."""
        per_exec = self.compute_per_exec_ms
        return self.executions * per_exec * 1000 if per_exec is not None else 0.0


def _sum(samples: Samples, name: str, model: str, where: Mapping[str, str] | None = None) -> float:
    return sum(select(samples, name, {"model": model, **(where or {})}))


def models_in(samples: Samples) -> list[str]:
    return sorted({dict(lab)["model"] for s, lab in samples if s == "nv_inference_request_success" and "model" in dict(lab)})


def _quantile(samples: Samples, name: str, model: str, q: str = "0.99") -> float | None:
    values = [v for v in select(samples, name, {"model": model, "quantile": q}) if not math.isnan(v)]
    return max(values) if values else None


PROMPT_HISTOGRAM = "sidecar_prompt_tokens_bucket"  # the sidecar exports it (sidecar/metrics.py, per model)


def window_from_samples(before: Samples, after: Samples, prompt_hist: str = PROMPT_HISTOGRAM) -> dict[str, ModelWindow]:
    """Per-model deltas between two scrapes of the same server."""
    out: dict[str, ModelWindow] = {}
    for model in models_in(after):
        def delta(name: str, where: Mapping[str, str] | None = None) -> float:
            return max(0.0, _sum(after, name, model, where) - _sum(before, name, model, where))

        reasons = sorted({dict(lab).get("reason", "") for s, lab in after
                          if s == "nv_inference_request_failure" and dict(lab).get("model") == model})
        by_reason = {r or "unknown": delta("nv_inference_request_failure", {"reason": r} if r else None) for r in reasons}
        out[model] = ModelWindow(
            model=model,
            success=delta("nv_inference_request_success"),
            failure=delta("nv_inference_request_failure"),
            failure_by_reason={k: v for k, v in by_reason.items() if v > 0},
            inferences=delta("nv_inference_count"),
            executions=delta("nv_inference_exec_count"),
            request_us=delta("nv_inference_request_duration_us"),
            queue_us=delta("nv_inference_queue_duration_us"),
            compute_input_us=delta("nv_inference_compute_input_duration_us"),
            compute_infer_us=delta("nv_inference_compute_infer_duration_us"),
            compute_output_us=delta("nv_inference_compute_output_duration_us"),
            pending_start=_sum(before, "nv_inference_pending_request_count", model),
            pending_end=_sum(after, "nv_inference_pending_request_count", model),
            p99_request_us=_quantile(after, "nv_inference_request_summary_us", model),
            p99_queue_us=_quantile(after, "nv_inference_queue_summary_us", model),
            prompt_tokens_buckets=histogram_delta(before, after, prompt_hist, {"model": model}).buckets,
        )
    return out


@dataclass(frozen=True)
class Device:
    """One GPU at the end of the window (Triton's nv_gpu_* gauges)."""

    uuid: str
    utilization: float | None
    used_bytes: float | None
    total_bytes: float | None


def devices_from_samples(after: Samples) -> list[Device]:
    uuids = sorted({dict(lab).get("gpu_uuid", "") for s, lab in after if s.startswith("nv_gpu_") and "gpu_uuid" in dict(lab)})

    def gauge(name: str, uuid: str) -> float | None:
        values = select(after, name, {"gpu_uuid": uuid})
        return values[0] if values else None

    return [Device(u, gauge("nv_gpu_utilization", u), gauge("nv_gpu_memory_used_bytes", u),
                   gauge("nv_gpu_memory_total_bytes", u)) for u in uuids]


@dataclass(frozen=True)
class Headroom:
    """The sidecar's view of one memory scope ('gpu0', 'cpu', 'pool:<model>'): what it may still
    reserve (its safety pad already taken off) out of what it may hold in all."""

    scope: str
    headroom_bytes: float
    capacity_bytes: float | None


def sidecar_headroom(after: Samples, headroom: str = "sidecar_headroom_bytes",
                     capacity: str = "sidecar_memory_capacity_bytes") -> list[Headroom]:
    def per_scope(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (sample, labels), value in after.items():
            if sample == name:
                scope = dict(labels).get("scope", "all")
                out[scope] = min(out.get(scope, value), value)
        return out

    caps = per_scope(capacity)
    return [Headroom(scope, value, caps.get(scope)) for scope, value in sorted(per_scope(headroom).items())]


@dataclass(frozen=True)
class ServerSnapshot:
    """What the adapter gathered from one server."""

    url: str
    window_s: float
    models: Mapping[str, ModelWindow]
    configs: Mapping[str, Mapping[str, Any]]  # /v2/models/M/config
    index: Sequence[Mapping[str, Any]] = ()  # /v2/repository/index
    devices: Sequence[Device] = ()
    headroom: Sequence[Headroom] = ()
    engines: Mapping[str, EngineWindow] = field(default_factory=dict)  # LLM engines' own metrics
    sidecar: Mapping[str, SidecarWindow] = field(default_factory=dict)  # the sidecar's view, per model


class ClassTarget(NamedTuple):
    p99_ms: float  # the class's P99 target (TTFT for streaming LLMs)
    share: float  # its share of the traffic


@dataclass(frozen=True)
class Targets:
    """Latency budgets (the class P99 a model must meet) and memory limits."""

    default_budget_ms: float = 1000.0
    budget_ms: Mapping[str, float] = field(default_factory=dict)
    classes: Mapping[str, Mapping[str, ClassTarget]] = field(default_factory=dict)  # model -> class -> target
    max_num_seqs: Mapping[str, int] = field(default_factory=dict)  # the spec's engine.max_num_seqs per model
    memory_cap: float = 0.85  # the device-memory watermark, fraction of total
    headroom_fraction: float = 0.05  # sidecar headroom under this share of its capacity: at the watermark
    source: str = "default"

    def budget(self, model: str) -> float:
        return self.budget_ms.get(model, self.default_budget_ms)

    def class_budget(self, model: str, klass: str) -> float:
        """A class's own target (TTFT for streaming LLMs); the model's tightest for a class the spec
        does not give it."""
        target = self.classes.get(model, {}).get(klass)
        return target.p99_ms if target is not None else self.budget(model)

    def classes_of(self, model: str) -> list[tuple[str, float, float]]:
        """(class, target ms, share of the model's traffic) for the classes the spec gives a model."""
        classes = self.classes.get(model, {})
        total = sum(c.share for c in classes.values())
        if total <= 0:
            return []
        return [(k, c.p99_ms, c.share / total) for k, c in classes.items()]
