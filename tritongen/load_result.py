"""What an open-loop run (`tritongen.loadgen.run_load`) measured, request by request in the arrivals'
order, and its figures with the simulator's own definitions, so a prediction and a measurement
compare field by field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tritongen.core.simulator import OK, ClassStats, measurement_window, summarize_requests


@dataclass
class LoadResult:
    """What a run measured, request by request, in the arrivals' order."""

    scheduled_t: np.ndarray
    send_t: np.ndarray
    done_t: np.ndarray
    first_t: np.ndarray
    status: np.ndarray
    tokens: np.ndarray
    cls: np.ndarray
    class_names: list[str]
    warmup_s: float
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    # time.perf_counter() at scheduled time 0: CLOCK_MONOTONIC on Linux, the clock of Triton's trace
    clock_zero: float = 0.0
    # Per request: its error message (whitespace folded, at most 300 characters), None when it had
    # none; tells apart what one status code lumps together (a sidecar refusal and the reason it
    # names, a model's out-of-memory kill). Empty for results built without it.
    messages: list[str | None] = field(default_factory=list)

    @property
    def window(self) -> tuple[float, float]:
        """The simulator's measurement window over the same send times."""
        return measurement_window(self.scheduled_t, self.warmup_s)

    def goodput_per_s(self, targets_ms: Mapping[str, float], first_token: bool) -> float:
        """Requests served within their class's target per second of the measurement window (the
        first token's time for a stream, the whole request's otherwise): what a client could use,
        which completed/s alone does not tell, since a run that serves everything seconds late
        completes as much as one that serves in time. A class without a target counts when served."""
        lo, hi = self.window
        targets = np.array([targets_ms.get(name, np.inf) for name in self.class_names])
        end = self.first_t if first_token else self.done_t
        inside = (self.scheduled_t >= lo) & (self.scheduled_t < hi)
        served = (self.status == OK) & np.isfinite(end) & inside
        good = served & ((end - self.scheduled_t) * 1000.0 <= targets[self.cls.astype(int)])
        return float(good.sum()) / max(hi - lo, 1e-9)

    def clock_span(self) -> tuple[float, float]:
        """When the run's requests were due, on the perf_counter clock (CLOCK_MONOTONIC, which Triton's
        trace also uses): the first one's time, and 0.1 s after the last one's."""
        if not len(self.scheduled_t):
            return (self.clock_zero, self.clock_zero)
        return (self.clock_zero + float(self.scheduled_t[0]) - 0.001, self.clock_zero + float(self.scheduled_t[-1]) + 0.1)

    def send_lag_ms(self, q: float = 99) -> float:
        """How late the client sent (percentile, ms): a big lag means the client, not the server, was slow."""
        sent = np.isfinite(self.send_t)
        if not sent.any():
            return 0.0
        return float(np.percentile((self.send_t[sent] - self.scheduled_t[sent]) * 1000.0, q))

    def summary(self) -> tuple[list[ClassStats], float]:
        """Per-class figures with the simulator's own definitions (`summarize_requests`).

        Latency counts from the *scheduled* send time, so a late client shows as latency rather
        than hiding it; the window is the arrivals' (warm-up left out)."""
        first = self.first_t if np.isfinite(self.first_t).any() else None
        return summarize_requests(
            self.scheduled_t, self.done_t, self.status, self.cls, self.class_names, self.window, first_t=first
        )
