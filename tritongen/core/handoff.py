"""Batcher hand-offs: how soon the next batch starts after an execution ends, from request timestamps.

Triton's dynamic batcher with queue policies does not always start the next batch when an
execution ends: the end's notify can be lost, and then the batcher waits for the next arrival (or
its 500 ms tick). Even when it is not lost, the instance is back a fraction of a millisecond after
the execution's last response. Both shape the tail latency at low load more than anything else the
simulator models, and both can be read directly off Triton's request trace (QUEUE_START,
COMPUTE_START, COMPUTE_END per request, see `tritongen.triton_trace`) or off a simulation's own
request times, so the model is calibrated on what the server did rather than on a noisy P99.

Pure: arrays in, counts out. Single-instance models only (a hand-off is "the previous execution on
the one instance ended"); with several instances executions overlap and the previous end is not
the one that freed the instance the next batch used.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# A start later than this after the moment it could have happened is a lost wake: the prompt
# hand-offs traced on the embedded server took 0.2-0.35 ms at the median and under 1.1 ms at P90.
LATE_S = 0.0015


class HandoffStats(NamedTuple):
    """Hand-offs of one run: executions that ended with requests waiting for the instance."""

    handoffs: int
    lost: int  # the next batch started more than LATE_S after it could have (the wake was lost)
    gap_mean_ms: float  # prompt hand-offs whose batch was due at the end: delay from the end to the next start
    gap_p90_ms: float

    @property
    def lost_share(self) -> float:
        return self.lost / self.handoffs if self.handoffs else 0.0


def executions(queue_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray) -> list[tuple[float, float, np.ndarray]]:
    """(start, end, queue-entry times of its requests) per execution, in start order.

    Requests of one execution share its start time (Triton stamps COMPUTE_START once per batch).
    """
    order = np.argsort(start_s, kind="stable")
    out: list[tuple[float, float, list[float]]] = []
    for i in order:
        if out and abs(float(start_s[i]) - out[-1][0]) < 1e-7:
            out[-1][2].append(float(queue_s[i]))
        else:
            out.append((float(start_s[i]), float(end_s[i]), [float(queue_s[i])]))
    return [(s, e, np.asarray(q)) for s, e, q in out]


def handoff_stats(queue_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, window_s: float) -> HandoffStats:
    """Classify every hand-off of a single-instance model.

    A hand-off is an execution whose next batch has a request that was already queued when it
    ended. The next batch could start at that end, or when its oldest request's batching window
    (`window_s`, the config's max_queue_delay) ran out, whichever is later; a start more than
    LATE_S after that moment is a lost wake.
    """
    queue_s, start_s, end_s = (np.asarray(a, dtype=float) for a in (queue_s, start_s, end_s))
    ok = np.isfinite(queue_s) & np.isfinite(start_s) & np.isfinite(end_s)
    ex = executions(queue_s[ok], start_s[ok], end_s[ok])
    handoffs = lost = 0
    gaps: list[float] = []
    for k in range(1, len(ex)):
        start, _, queued = ex[k]
        prev_end = ex[k - 1][1]
        oldest = float(queued.min())
        if oldest >= prev_end:
            continue  # nothing was waiting: the batcher had nothing to hand over
        handoffs += 1
        if start - max(prev_end, oldest + window_s) > LATE_S:
            lost += 1
        elif oldest + window_s <= prev_end:  # due at the end itself: the gap is the hand-off's own delay
            gaps.append(max(0.0, start - prev_end) * 1000.0)
    return HandoffStats(
        handoffs=handoffs,
        lost=lost,
        gap_mean_ms=float(np.mean(gaps)) if gaps else 0.0,
        gap_p90_ms=float(np.percentile(gaps, 90)) if gaps else 0.0,
    )
