"""The lane's control plane: the asyncio task that hands lane slots to nginx and takes them back.

Each sync (every `period_s` while the lane is busy, at once when a request enters the Python queue,
and every `idle_s` otherwise) reads nginx's counts, feeds finished lane requests to the admission
state, moves each model's slots toward `lane.target_slots`, and, when they changed, pushes them.
Slots are reservations in the `AdmissionState` (sidecar/lane.py), so between two syncs the lane can
never hold more than the state granted; slots are given back only down to what the lane has in
flight (an in-flight request's slot is never taken from under it).

If nginx stops answering, the slots are kept (nginx may still use them) and the sync is retried;
if the sidecar stops, nginx goes with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from sidecar.admission import AdmissionState
from sidecar.lane import LaneCounts, demand, lane_models, target_slots
from sidecar.metrics import SidecarMetrics
from sidecar.tasks import BackgroundTask

log = logging.getLogger("tritongen.sidecar")


class LaneControl:
    def __init__(
        self,
        front: Any,  # NginxFront, or anything with `exchange(caps | None) -> counts`
        state: AdmissionState,
        metrics: SidecarMetrics,
        upstream_up: Callable[[], bool],
        dispatch: Callable[[], None],
        period_s: float = 0.02,
        idle_s: float = 0.25,
    ) -> None:
        self.front = front
        self.state = state
        self.metrics = metrics
        self.upstream_up = upstream_up
        self.dispatch = dispatch
        self.period_s = period_s
        self.idle_s = idle_s
        self.models = lane_models(state.policy)
        self.slots: dict[str, list[tuple[str, int]]] = {}
        self.pushed: dict[str, int] | None = None
        self.counts: dict[str, LaneCounts] = {}
        self._overflow_seen: dict[str, int] = {}  # overflow counts at the last plan
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._background = BackgroundTask(self._loop, "sidecar-lane-sync")
        self.failures = 0

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()

    def wake(self) -> None:
        """Something entered the Python queue: stop growing the lane now, not at the next period."""
        self._wake.set()

    def reclaim(self, model: str) -> bool:
        """A Python-path request of `model` found no room: give the lane's idle slots of it back now
        (those beyond what nginx had in flight at the last sync) and push the lower cap at once.
        Lane requests that arrived since that sync may briefly run beyond the state's count; at
        most one sync period's arrivals, and they are counted again at the next sync."""
        held = self.slots.get(model)
        if not held:
            return False
        busy = self.counts.get(model, LaneCounts()).inflight
        returned = False
        while len(held) > busy:
            self.state.return_lane_slot(held.pop())
            returned = True
        if returned:
            self.pushed = None  # the cap nginx holds is now too high: push at the next sync, now
            self.wake()
        return returned

    def policy_changed(self) -> None:
        """A reloaded policy may add or remove lane models; a removed one's slots go back as its
        lane requests finish (its cap drops to what it has in flight at once)."""
        self.models = lane_models(self.state.policy)
        self.wake()

    async def _loop(self) -> None:
        while True:
            busy = any(c.inflight for c in self.counts.values()) or any(self.slots.values())
            try:
                await asyncio.wait_for(self._wake.wait(), self.period_s if busy else self.idle_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 1000 == 0:
                    log.warning("the lane's nginx control socket did not answer (%d times): %s", self.failures, err)
            except Exception:  # never let the sync die: the lane would keep stale slots for ever
                log.exception("lane sync failed")

    async def sync(self) -> dict[str, int]:
        """One round: read, account, move the slots, push if changed. Returns the caps in force."""
        counts = await self.front.exchange(None)
        self._account(counts)
        caps = self.plan(counts)
        if caps != self.pushed:
            self._account(await self.front.exchange(caps))
            self.pushed = caps
        return caps

    def _account(self, counts: dict[str, LaneCounts]) -> None:
        """Finished lane requests since the last reading go to the state and the metrics."""
        for name, now in counts.items():
            before = self.counts.get(name, LaneCounts())
            if now.done < before.done:  # nginx restarted: its counters began again
                before = LaneCounts()
            done, seconds = now.done - before.done, now.seconds - before.seconds
            if done > 0:
                self.state.lane_finished(name, done, seconds)
                self.metrics.lane_requests.labels(self._label(name)).inc(done)
            overflow = now.overflow - before.overflow
            if overflow > 0:
                self.metrics.lane_overflow.labels(self._label(name)).inc(overflow)
        self.counts = counts

    def _label(self, name: str) -> str:
        return name if self.state.known_model(name) else "other"

    def plan(self, counts: dict[str, LaneCounts]) -> dict[str, int]:
        """Move each model's slots toward its target and return the caps nginx should use."""
        up = self.upstream_up()
        caps: dict[str, int] = {}
        released = False
        for name in set(self.models) | set(self.slots):
            held = self.slots.setdefault(name, [])
            now = counts.get(name, LaneCounts())
            inflight = now.inflight
            wanted = demand(now, now.overflow - self._overflow_seen.get(name, now.overflow))
            self._overflow_seen[name] = now.overflow
            want = target_slots(inflight, wanted, self.state.lane_may_grow(name), up) if name in self.models else 0
            while len(held) < want:
                slot = ("lane", next(self._ids))
                if not self.state.take_lane_slot(slot, name):
                    break
                held.append(slot)
            while len(held) > max(want, inflight) or (len(held) > inflight and self.state.lane_overfull(name)):
                self.state.return_lane_slot(held.pop())
                released = True
            if name in self.models and up:
                caps[name] = len(held)
            self.metrics.lane_slots.labels(self._label(name)).set(len(held))
            if not held and name not in self.models:
                del self.slots[name]
        if released:
            self.dispatch()  # the room went to whoever waits: hand them their grants
        return caps

    def status(self) -> dict[str, dict[str, int]]:
        """Per lane model: slots held (counted in the state's in-flight and reserved figures, idle
        or not), the bytes they reserve, and nginx's counts at the last sync."""
        out: dict[str, dict[str, int]] = {}
        for name in sorted(set(self.models) | set(self.slots)):
            held = len(self.slots.get(name, []))
            counts = self.counts.get(name, LaneCounts())
            out[name] = {"slots": held, "reserved_bytes": held * self.state.model_policy(name).request_bytes,
                         "inflight": counts.inflight, "done": counts.done, "overflow": counts.overflow}
        return out
