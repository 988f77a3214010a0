"""What a run reports: request statuses, per-class and per-model figures, and the measurement window.

Shared with live runs (`tritongen.loadgen`, `tritongen.tuner.verify`): a simulated and a measured run
are summarised by the same code, so their figures compare like for like.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field


OK, QUEUE_FULL, TIMEOUT, OOM, NO_ROUTE, TOO_LARGE = 1, 2, 3, 4, 5, 6
STATUS_NAMES = {0: "pending", OK: "ok", QUEUE_FULL: "queue_full", TIMEOUT: "timeout", OOM: "oom", NO_ROUTE: "no_route", TOO_LARGE: "too_large"}


class ClassStats(BaseModel):
    name: str
    sent: int = Field(description="Requests sent in the measured window.")
    completed: int
    rejected_queue_full: int
    rejected_timeout: int
    oom_killed: int
    other_errors: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    queue_p50_ms: float | None = None
    queue_p99_ms: float | None = None
    throughput_per_s: float

    @property
    def rejected(self) -> int:
        return self.rejected_queue_full + self.rejected_timeout

    @property
    def failed_fraction(self) -> float:
        return 0.0 if self.sent == 0 else (self.sent - self.completed) / self.sent


class ModelStats(BaseModel):
    name: str
    executions: int
    mean_batch_rows: float | None
    utilisation: float = Field(description="Instance busy time / (instances x window).")
    busy_fraction: float = Field(description="Share of the window with at least one instance (or the engine) busy.")
    preemptions: int = Field(default=0, description="LLM engines: sequences preempted (recomputed later), whole run.")
    engine_killed: int = Field(default=0, description="LLM engines: sequences killed for want of KV memory, whole run.")
    prefix_cache_hit_rate: float | None = Field(
        default=None,
        description="LLM engines with a prefix cache, on traffic whose prompts share: prompt tokens the cache served "
        "/ prompt tokens, over the requests sent in the window that the engine admitted. None: no cache, or nothing shared.",
    )
    prefix_cache_evictions: int = Field(default=0, description="LLM engines: cached blocks evicted for room, whole run.")


class SimResult(BaseModel):
    window_s: float
    classes: list[ClassStats]
    models: list[ModelStats]
    throughput_per_s: float
    device_busy: dict[int, float] = Field(default_factory=dict, description="Per device (-1 = CPU): share of the window busy.")
    requests: int

    def klass(self, name: str) -> ClassStats:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def model(self, name: str) -> ModelStats:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def percentile_ms(values_s: np.ndarray, q: float) -> float | None:
    if len(values_s) == 0:
        return None
    return float(np.percentile(values_s, q) * 1000.0)


def summarize_requests(
    send_t: np.ndarray,
    done_t: np.ndarray,
    status: np.ndarray,
    cls: np.ndarray,
    class_names: Sequence[str],
    window: tuple[float, float],
    first_t: np.ndarray | None = None,
    start_t: np.ndarray | None = None,
) -> tuple[list[ClassStats], float]:
    """Per-class figures over a window, the same way for simulated and measured requests.

    Latency percentiles cover successful requests *sent* in [w0, w1]; throughput counts successes
    *completed* in [w0, w1] divided by the window. `done_t` and `first_t` are client-side times
    (response received), `start_t` the execution start (queue time = start - send).
    """
    w0, w1 = window
    span = max(1e-9, w1 - w0)
    sent_in = (send_t >= w0) & (send_t <= w1)
    ok = status == OK
    done_in = ok & (done_t >= w0) & (done_t <= w1)
    out: list[ClassStats] = []
    total_done = 0
    for i, name in enumerate(class_names):
        mine = cls == i
        s = sent_in & mine
        good = s & ok
        lat = done_t[good] - send_t[good]
        ttft = None
        if first_t is not None:
            ft = first_t[good]
            ft_ok = np.isfinite(ft)
            ttft = ft[ft_ok] - send_t[good][ft_ok]
        queue = None
        if start_t is not None:
            st = start_t[good]
            st_ok = np.isfinite(st)
            queue = st[st_ok] - send_t[good][st_ok]
        n_done = int((done_in & mine).sum())
        total_done += n_done
        st_mine = status[s]
        out.append(
            ClassStats(
                name=name,
                sent=int(s.sum()),
                completed=int(good.sum()),
                rejected_queue_full=int((st_mine == QUEUE_FULL).sum()),
                rejected_timeout=int((st_mine == TIMEOUT).sum()),
                oom_killed=int((st_mine == OOM).sum()),
                other_errors=int(((st_mine != OK) & (st_mine != QUEUE_FULL) & (st_mine != TIMEOUT) & (st_mine != OOM)).sum()),
                p50_ms=percentile_ms(lat, 50),
                p90_ms=percentile_ms(lat, 90),
                p99_ms=percentile_ms(lat, 99),
                mean_ms=float(lat.mean() * 1000.0) if len(lat) else None,
                ttft_p50_ms=percentile_ms(ttft, 50) if ttft is not None else None,
                ttft_p99_ms=percentile_ms(ttft, 99) if ttft is not None else None,
                queue_p50_ms=percentile_ms(queue, 50) if queue is not None else None,
                queue_p99_ms=percentile_ms(queue, 99) if queue is not None else None,
                throughput_per_s=n_done / span,
            )
        )
    return out, total_done / span


def measurement_window(t: np.ndarray, warmup_s: float) -> tuple[float, float]:
    """The stretch whose figures count: after the warm-up, and before a short cool-down.

    The cool-down (5% of the traffic, at most 1 s) leaves out the last requests, which would
    otherwise be measured with nothing arriving behind them: a server that notices work on the
    next arrival (Triton's batcher often does, see `tritongen.core.simulator`) treats them unlike the
    requests of a running stream. The same window serves simulated and live runs.
    """
    if len(t) == 0:
        return (0.0, 0.0)
    first, last = float(t[0]), float(t[-1])
    start = first + warmup_s
    end = last - min(1.0, 0.05 * (last - first))
    if end <= start:
        return (first, last)
    return (start, end)
