"""Batcher hand-offs: how soon the next batch starts after an execution ends, from request timestamps.

Triton's dynamic batcher with queue policies does not always start the next batch when an
execution ends: the end's notify can be lost, and then the batcher waits for the next arrival (or
its 500 ms tick). Even when it is not lost, the instance is back a fraction of a millisecond after
the execution's last response. Both shape the tail latency at low load more than anything else the
simulator models, and both can be read directly off Triton's request trace (QUEUE_START,
COMPUTE_START, COMPUTE_END per request, see `tritongen.triton_trace`) or off a simulation's own
request times, so the model is calibrated on what the server did rather than on a noisy P99.

Pure: arrays in, counts out. Triton's trace does not say which instance ran an execution, so with
several instances a hand-off is counted only at an end that left no other instance free.
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


def handoff_stats(
    queue_s: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, window_s: float, instances: int = 1
) -> HandoffStats:
    """Classify every hand-off of a model with `instances` instances.

    A hand-off is an execution's end that freed the model's only free instance while requests were
    waiting (queued before the end, started after it). The next batch could start at that end, or
    when the oldest waiting request's batching window (`window_s`, the config's max_queue_delay)
    ran out, whichever is later; a start more than LATE_S after that moment is a lost wake. Ends
    while another instance was already free are not counted: the batcher had a slot either way.
    """
    queue_s, start_s, end_s = (np.asarray(a, dtype=float) for a in (queue_s, start_s, end_s))
    ok = np.isfinite(queue_s) & np.isfinite(start_s) & np.isfinite(end_s)
    ex = executions(queue_s[ok], start_s[ok], end_s[ok])
    if len(ex) < 2:
        return HandoffStats(0, 0, 0.0, 0.0)
    starts = np.asarray([e[0] for e in ex])
    ends = np.asarray([e[1] for e in ex])
    # oldest queue entry among the requests of executions k.. (executions are in start order)
    oldest_from = np.minimum.accumulate(np.asarray([float(e[2].min()) for e in ex])[::-1])[::-1]
    ended_by = np.sort(ends)
    handoffs = lost = 0
    gaps: list[float] = []
    for end in ends:
        # instances still busy at this end: started before it, not yet ended (a batch that starts at
        # the very moment of the end is the hand-off itself)
        busy = int(np.searchsorted(starts, end, side="left")) - int(np.searchsorted(ended_by, end, side="right"))
        if busy != instances - 1:
            continue  # another instance was free already (or, with ties, another end counts this one)
        nxt = int(np.searchsorted(starts, end, side="left"))
        if nxt >= len(ex) or oldest_from[nxt] >= end:
            continue  # nothing was waiting: the batcher had nothing to hand over
        handoffs += 1
        oldest = float(oldest_from[nxt])
        start = float(starts[nxt])
        if start - max(end, oldest + window_s) > LATE_S:
            lost += 1
        elif oldest + window_s <= end:  # due at the end itself: the gap is the hand-off's own delay
            gaps.append(max(0.0, start - end) * 1000.0)
    return HandoffStats(
        handoffs=handoffs,
        lost=lost,
        gap_mean_ms=float(np.mean(gaps)) if gaps else 0.0,
        gap_p90_ms=float(np.percentile(gaps, 90)) if gaps else 0.0,
    )
