"""How likely an execution's end is to wake the batcher, at the host's current load.

Triton's instance thread notifies the batcher when it hands an instance back; on a busy host the
batcher sometimes checks for a free instance before the instance is released, and that wake is
lost. Its own module because the chance depends on the recent arrival rate, a quantity the rest of
the loop never needs.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tritongen.core.simulator.inputs import WAKE_LOSS_REFERENCE_PER_S, Overheads

# The recent arrival rate is counted over this trailing window.
_WAKE_RATE_WINDOW_S = 0.5


class WakeRace:
    """The load-dependent wake race of one run: its arrival times in order, to count the trailing rate
    by bisection."""

    def __init__(self, overheads: Overheads, send_times: Sequence[float]) -> None:
        self.ov = overheads
        self._send_sorted = sorted(send_times) if overheads.wake_loss_doubling_per_s > 0 else []

    def chance(self, at_reference: float, now: float) -> float:
        """The chance an execution's end wakes the batcher, at the host's current load.

        Traced on the embedded server (ranker, queue policies, one instance, 2 cores): 3-5% of
        hand-offs lost at 100 req/s, 7-10% at 200, 9-22% at 300: the busier the host's threads, the
        likelier the batcher checks for a free instance before the instance thread has released
        it. By Triton's mean batch and tail the loss doubles every ~200 req/s (EMBEDDED_CPU_OVERHEADS).
        """
        doubling = self.ov.wake_loss_doubling_per_s
        if doubling <= 0.0 or at_reference >= 1.0:
            return at_reference
        loss = (1.0 - at_reference) * 2.0 ** ((self._recent_rate(now) - WAKE_LOSS_REFERENCE_PER_S) / doubling)
        return 1.0 - min(1.0, loss)

    def _recent_rate(self, now: float) -> float:
        """Requests per second the server received over the trailing `_WAKE_RATE_WINDOW_S`."""
        sent = self._send_sorted
        span = min(_WAKE_RATE_WINDOW_S, max(now - sent[0], 0.05)) if sent else _WAKE_RATE_WINDOW_S
        recent = bisect.bisect_right(sent, now) - bisect.bisect_left(sent, now - span)
        return recent / span
