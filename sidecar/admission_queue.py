"""The sidecar's wait queue and the order requests leave it in. Pure.

Queueing is strict priority with aging: a waiting request is promoted one level for every
`starvation_guard_ms` it has waited (never level with the top class), and requests of equal
effective level leave in arrival order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from sidecar.admission_types import Request

Group = tuple[str, str]  # ("model", name), ("tenant", name) or the adaptive limit's ("limit", "llm")


@dataclass
class Waiting:
    request: Request
    enqueued_at: float
    deadline: float
    priority: int
    seq: int
    # The groups this request holds and is held by (`AdmissionState._groups`): asked for every
    # waiting request on every pass of the queue, so worked out once (again on a policy reload).
    groups: tuple[Group, ...] = ()


class WaitQueue(dict):  # type: ignore[type-arg]
    """The waiting requests by id, in arrival order (a request is put in once, when it is queued).
    `rev` counts every change, so a cached walk of the queue (`order`) knows it is stale without
    each place that adds or removes a request having to say so; the state changes it only by
    `[id] = `, `del` and `pop`, which count."""

    rev = 0

    def __init__(self) -> None:
        super().__init__()
        self._top = 1
        self._guard_s = 0.0
        self._seq = 0
        # `order`'s last answer, valid while the instant, the queue (its `rev`) and the policy are
        # the same: one instant may walk the queue more than once (a submit's pump, a tick's), and
        # under overload the queue holds hundreds of requests.
        self._order_cache: tuple[float, int, list[Waiting]] | None = None

    def configure(self, top_level: int, starvation_guard_ms: float) -> None:
        """The policy's most urgent level and starvation guard (again on a reload: the levels may move)."""
        self._top = top_level
        self._guard_s = starvation_guard_ms / 1000
        self._order_cache = None

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def __setitem__(self, key: Hashable, value: Waiting) -> None:
        self.rev += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: Hashable) -> None:
        self.rev += 1
        super().__delitem__(key)

    def pop(self, key: Hashable, *default: Any) -> Any:
        self.rev += 1
        return super().pop(key, *default)

    # -- order ----------------------------------------------------------------------------------------

    def level_of(self, now: float) -> Callable[[Waiting], int]:
        """A waiting request's effective level at `now`: promoted one level per starvation guard
        period waited, but never level with the top class: a waiting request of a lower class has a
        deadline of its own (it is refused, never starved for ever), while one promoted beside the
        top class would, under sustained overload, queue every new top-class request behind the
        whole backlog and see them refused. A one-argument function, the constants read once: the
        queue's order asks it for every waiting request."""
        top = self._top
        guard_s = self._guard_s

        def level(waiting: Waiting) -> int:
            priority = waiting.priority
            if priority <= top or guard_s <= 0:
                return priority
            return max(top + 1, priority - int((now - waiting.enqueued_at) // guard_s))

        return level

    def order(self, now: float) -> list[Waiting]:
        """The waiting requests in the order they leave: effective level, then arrival. A fresh list
        (callers remove from the queue while they walk it)."""
        cached = self._order_cache
        if cached is not None and cached[0] == now and cached[1] == self.rev:
            return list(cached[2])
        # The queue keeps arrival order (enqueued_at, then seq), so the order is the levels'
        # buckets in turn, each in arrival order, with no sort of the whole queue.
        level_of = self.level_of(now)
        buckets: dict[int, list[Waiting]] = defaultdict(list)
        for waiting in self.values():
            buckets[level_of(waiting)].append(waiting)
        order = [w for level in sorted(buckets) for w in buckets[level]]
        self._order_cache = (now, self.rev, order)
        return list(order)

    def ahead(self, model: str, key: tuple[int, float, int], now: float) -> int:
        """Waiting requests of `model` that leave before one of (level, arrival, seq) `key`."""
        level = self.level_of(now)
        return sum(
            1 for w in self.values()
            if w.request.model == model and (level(w), w.enqueued_at, w.seq) < key
        )
