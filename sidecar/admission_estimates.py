"""What admission measures of each model, and the wait it predicts from it: how fast the model
drains (completions, and in flight over the mean service time), its recent upstream time, how fast
more urgent requests arrive, and the mean sequence length. Pure, times passed in.

The wait. A request at `position` in its model's queue leaves after `position` departures at the
drain rate, less what the top class's arrivals (which always pass it) take of that rate, plus the
middle classes' arrivals until the starvation guard has promoted it to their level. Below the top
class the state asks for a high quantile of that wait (`wait_from` with z > 0), not its mean.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

from tritongen.core.admission_tuning import (
    ARRIVAL_WINDOW_S,
    ARRIVALS_KEPT,
    COMPLETIONS_KEPT,
    DRAIN_MIN_SAMPLES,
    DRAIN_WINDOW_S,
    LATENCY_MIN_SAMPLES,
    LATENCY_SAMPLES,
    SEQ_LEN_ALPHA,
    SERVICE_ALPHA,
    STARVED_FRACTION,
)

WaitTerms = tuple[float, float]  # (places added, rate): the wait at `position` is (position + places) / rate


def wait_from(terms: WaitTerms, position: int, z: float = 0.0) -> float:
    """The wait at `position` from `Estimates.wait_terms`: the mean, or with `z` > 0 a high
    quantile of it. Leaving takes `n` = position + places departures at `rate`; their sum has mean
    n / rate and spread sqrt(n) / rate (departures roughly Poisson), so (n + z sqrt(n)) / rate."""
    places, rate = terms
    if rate <= 0:
        return math.inf
    n = position + places
    return (n + z * math.sqrt(n)) / rate


def _ewma(previous: float | None, sample: float, alpha: float) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)


class Estimates:
    """Per-model measurements, fed by the admission state as requests arrive, start and end."""

    def __init__(self) -> None:
        self.completions: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=COMPLETIONS_KEPT))
        self.lane_reported: dict[str, float] = {}  # when lane_finished last heard of a model
        self.seq_len: dict[str, float] = {}  # moving mean of a sequence's tokens, per model
        self.service_s: dict[str, float] = {}  # moving mean of admitted -> released, per model
        self.upstream_latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=LATENCY_SAMPLES))
        self.arrivals: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        # Per model, how many of `arrivals` are at each level: a rate is a sum over the few levels,
        # not a walk of the window (thousands of arrivals under a burst, asked on every decision).
        self.arrival_counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._arrival_rates: dict[tuple[str, int, float], float] = {}  # see arrival_rate

    # -- feeding -----------------------------------------------------------------------------------

    def observe_upstream(self, model: str, seconds: float) -> None:
        """Admission to first response (streams), or to the end (unary requests)."""
        self.upstream_latency[model].append(seconds)

    def observe_end(self, model: str, now: float, service_s: float, whole: bool,
                    tokens_per_sequence: float | None) -> None:
        """A request ended after `service_s` in flight; `whole`: it had no streamed response, so its
        service time is also its upstream time."""
        self.completions[model].append(now)
        if whole:
            self.upstream_latency[model].append(service_s)
        self.service_s[model] = _ewma(self.service_s.get(model), service_s, SERVICE_ALPHA)
        if tokens_per_sequence is not None:
            self.seq_len[model] = _ewma(self.seq_len.get(model), tokens_per_sequence, SEQ_LEN_ALPHA)

    def lane_finished(self, model: str, now: float, count: int, seconds: float) -> None:
        """`count` lane requests of `model` ended, taking `seconds` in all (count > 0)."""
        done = self.completions[model]
        # They ended over the time since the previous report (at most a second): spread them over
        # it, or a window of stamps all at `now` would read as a burst.
        since = max(0.0, min(1.0, now - self.lane_reported.get(model, now)))
        self.lane_reported[model] = now
        kept = min(count, done.maxlen or count)
        done.extend(now - since * (kept - 1 - i) / kept for i in range(kept))
        mean = max(0.0, seconds) / count
        self.service_s[model] = _ewma(self.service_s.get(model), mean, SERVICE_ALPHA)
        self.upstream_latency[model].append(mean)

    def note_arrival(self, model: str, priority: int, now: float) -> None:
        """A request that is admitted or waits (a refused one takes nothing from the drain)."""
        seen, counts = self.arrivals[model], self.arrival_counts[model]
        if len(seen) >= ARRIVALS_KEPT:
            counts[seen.popleft()[1]] -= 1
        seen.append((now, priority))
        counts[priority] += 1
        self._arrival_rates.clear()

    # -- reading -----------------------------------------------------------------------------------

    def drain_rate(self, model: str, now: float, inflight: int) -> float | None:
        """Requests of `model` that finish per second, the larger of two readings that each fall short
        of what a busy model drains: in flight / mean service time (Little's law; it does not lag
        behind a burst that follows a quiet spell, but dips whenever departures leave slots empty for
        a moment), and the completions of the last window (steady, but low after a quiet spell). Read
        from the first alone, a wait predicted at a dip refused requests the engine would have served
        in time (measured on a real vLLM at 1.5x its capacity: most of a 10 s class refused while the
        ones served waited 4 s at the P99). None before anything finished."""
        service = self.service_s.get(model)
        readings = [self._completion_rate(model, now)]
        if inflight > 0 and service:
            readings.append(inflight / max(service, 1e-3))
        seen = [r for r in readings if r is not None]
        return max(seen) if seen else None

    def _completion_rate(self, model: str, now: float) -> float | None:
        """Completions per second over the last window; None with too few. Counted over one mean
        service time at least: requests that started together end together, and two that just did
        say nothing of a rate."""
        done = self.completions.get(model)
        if not done:
            return None
        while done and done[0] < now - DRAIN_WINDOW_S:
            done.popleft()
        if len(done) < DRAIN_MIN_SAMPLES:
            return None
        return len(done) / max(now - done[0], self.service_s.get(model) or 0.0, 0.05)

    def upstream_latency_s(self, model: str, quantile: float) -> float | None:
        """`quantile` of admission -> first response (streams) or -> end (unary), recent samples."""
        samples = self.upstream_latency.get(model)
        if not samples or len(samples) < LATENCY_MIN_SAMPLES:
            return None
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]

    def wait_terms(self, model: str, now: float, priority: int | None, inflight: int, top: int,
                   guard_ms: float) -> WaitTerms | None:
        """(places added, rate) so that the wait at `position` is (position + places) / rate
        (`wait_from`); rate 0: never (the top class takes it all). None: no drain measured. Apart
        from the position so that a walk of the queue works them out once per level. `top`: the
        most urgent level; `guard_ms`: the starvation guard (one level promoted per guard waited)."""
        rate = self.drain_rate(model, now, inflight)
        if rate is None or rate <= 0:
            return None
        if priority is None or priority <= top:
            return (0.0, rate)
        passing_top = self.arrival_rate(model, now, below=top + 1)
        passing_mid = self.arrival_rate(model, now, below=priority) - passing_top
        promoted_s = max(0, priority - top - 1) * guard_ms / 1000
        left = rate - passing_top  # what the top class leaves for everyone else
        if left <= STARVED_FRACTION * rate:
            return (0.0, 0.0)
        return (passing_mid * promoted_s, left)

    def arrival_rate(self, model: str, now: float, below: int) -> float:
        """Requests per second of levels more urgent than `below` (lower numbers), recent window.
        Counted once per model, level and instant: a tick asks it for every waiting request."""
        key = (model, below, now)
        cached = self._arrival_rates.get(key)
        if cached is not None:
            return cached
        if len(self._arrival_rates) > 64:
            self._arrival_rates.clear()
        seen = self.arrivals.get(model)
        rate = 0.0
        if seen:
            counts = self.arrival_counts[model]
            while seen and seen[0][0] < now - ARRIVAL_WINDOW_S:
                counts[seen.popleft()[1]] -= 1
            if len(seen) >= DRAIN_MIN_SAMPLES:
                rate = sum(n for level, n in counts.items() if level < below) / max(now - seen[0][0], 0.5)
        self._arrival_rates[key] = rate
        return rate
