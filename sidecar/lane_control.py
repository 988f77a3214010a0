"""The lane's control plane: the asyncio task that hands lane slots to nginx and takes them back.

Each sync reads nginx's counts, feeds finished lane requests to the admission state, moves each
(model, class) pair's slots toward `lane.target_slots` and pushes them when they changed: every
`lane.sync_busy_ms` of the policy while its slots move, at once when a request enters the Python
queue, takes slots back or overflows the lane, every `lane.sync_idle_ms` otherwise (the policy is
read at every sync, so a reload applies it; tritongen/core/lane_tuning.py says where the defaults
come from). Every lane pair gets a cap, 0 while idle: nginx then counts the requests that overflow to
Python, the demand that grows its slots. Slots are given back only down to what the lane had in
flight at the last reading, so nginx never runs more than the state granted. If nginx stops
answering, the slots are kept and the sync retried; if the sidecar stops, nginx goes too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

from sidecar.accounting import Accounting
from sidecar.admission import AdmissionState
from sidecar.lane import LaneCounts, LaneKey, demand, lane_keys, since, target_slots
from sidecar.tasks import BackgroundTask

log = logging.getLogger("tritongen.sidecar")

Slot = tuple[str, int]


class LaneControl:
    def __init__(
        self,
        front: Any,  # NginxFront, or anything with `async exchange(caps | None) -> counts`
        state: AdmissionState,
        accounting: Accounting,  # the controller's: the lane's requests are counted as the Python path's
        upstream_up: Callable[[], bool],
        dispatch: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.front = front
        self.state = state
        self.accounting = accounting
        self.metrics = accounting.metrics
        self.upstream_up = upstream_up
        self.dispatch = dispatch
        self.keys = lane_keys(state.policy)
        self.slots: dict[LaneKey, list[Slot]] = {}
        self.pushed: dict[LaneKey, int] | None = None
        self.counts: dict[LaneKey, LaneCounts] = {}
        self._overflowed: dict[LaneKey, int] = {}  # requests that overflowed since the last plan
        self._used_at: dict[LaneKey, float] = {}  # when the pair last had lane demand
        self._peaks: dict[LaneKey, deque[tuple[float, int]]] = {}  # (when, demand), falling: _held_peak
        self.clock = clock
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._background = BackgroundTask(self._loop, "sidecar-lane-sync")
        self.failures = 0
        self.hot = False  # the last sync moved something: sync again soon
        self._synced_at = float("-inf")

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()

    def wake(self) -> None:
        """Sync now, not at the next period."""
        self._wake.set()

    def holds_slots(self) -> bool:
        return any(self.slots.values())

    def queued(self) -> None:
        """A request entered the Python queue: stop growing the lane now, not at the next period.
        A lane holding no slot has none to give back and is not growing: nothing to sync for. Why
        it matters: an LLM's requests queue one by one under overload, and a sync per queued
        request (an HTTP exchange with nginx) cost the sidecar more CPU than the requests did."""
        if self.holds_slots():
            self.wake()

    def overflowed(self, key: LaneKey) -> None:
        """A request the lane could carry reached Python: nginx found no free slot. Sync now rather
        than at the idle cadence, so a burst beyond the spare slots finds them after one exchange;
        at most once a busy period (a request naming a priority of a model without levels reads the
        same, and must not cost a sync each)."""
        quiet_s = self.clock() - self._synced_at
        if key in self.keys and not self.hot and quiet_s >= self.state.policy.lane.sync_busy_ms / 1000:
            self.hot = True
            self.wake()

    def policy_changed(self) -> None:
        """A reloaded policy may add or remove lane pairs; a removed one's slots go back as its
        lane requests finish (its cap drops to what it has in flight at once)."""
        self.keys = lane_keys(self.state.policy)
        self.wake()

    def reclaim(self, model: str) -> bool:
        """A Python-path request of `model` found no room: give the lane's idle slots of the model
        back now (those beyond what nginx had in flight at the last reading) and push the lower
        caps at once. Lane requests that arrived since that reading may briefly run beyond the
        state's count: at most one sync period's arrivals, counted again at the next sync."""
        returned = False
        for key, held in self.slots.items():
            if key[0] != model:
                continue
            busy = self.counts.get(key, LaneCounts()).inflight
            while len(held) > busy:
                self.state.return_lane_slot(held.pop())
                returned = True
        if returned:
            self.pushed = None  # the caps nginx holds are too high now: push at the next sync, now
            self.wake()
        return returned

    async def _loop(self) -> None:
        while True:
            # Quick while the slots move (caps pushed, requests overflowing, requests waiting in
            # Python): bursts must find their slots within a period, or they overflow into the
            # Python path, whose CPU a small host takes from Triton. Otherwise, busy or not, every
            # sync_idle_ms: a lane whose slots fit its load has nothing to move, and a sync every
            # busy period cost the sidecar 3-5% of a core under a steady closed loop (bench_sidecar's
            # identity model at 64 clients), taken from Triton on a small host. An idle pair's first
            # requests overflow to Python (its cap is 0) until a sync grows it.
            cfg = self.state.policy.lane
            try:
                await asyncio.wait_for(self._wake.wait(), (cfg.sync_busy_ms if self.hot else cfg.sync_idle_ms) / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self._revive()  # a dead master's orphaned worker may still answer: ask the process
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

    async def _revive(self) -> None:
        """nginx died: start it again; its counts start over and its caps are pushed anew."""
        revive = getattr(self.front, "revive", None)
        if revive is None:
            return
        try:
            if await revive():
                self.pushed = None
        except Exception:
            log.exception("nginx (the native front) could not be started again; retrying")

    async def sync(self) -> dict[LaneKey, int]:
        """One round: read, account, move the slots, push if changed. Returns the caps in force."""
        if not self.keys and not self.slots and self.pushed == {}:
            # No model the lane may carry (a policy of LLMs only): nginx was told so and has nothing
            # to count. An exchange per period here was the sidecar's largest idle cost.
            self.hot = False
            return {}
        self._synced_at = self.clock()
        counts = await self.front.exchange(None)
        self._account(counts)
        overflowed = any(self._overflowed.values())
        caps = self.plan(counts)
        # Requests waiting in Python keep the sync quick only while the lane holds slots they may need.
        self.hot = overflowed or caps != self.pushed or (self.state.waiting > 0 and self.holds_slots())
        if caps != self.pushed:
            self._account(await self.front.exchange(caps))
            self.pushed = caps
        return caps

    def _account(self, counts: dict[LaneKey, LaneCounts]) -> None:
        """Finished lane requests since the last reading go to the state and the metrics."""
        for key, now in counts.items():
            before = self.counts.get(key, LaneCounts())
            if now.done < before.done:  # nginx restarted: its counters began again
                before = LaneCounts()
            done, seconds = now.done - before.done, now.seconds - before.seconds
            model, klass = key
            if done > 0:
                self.state.lane_finished(model, done, seconds)
                # A lane request is admitted (its slot is a reservation) and ends like any other:
                # one accounting, counted when nginx reports it finished.
                self.accounting.lane_ended(model, klass, done, now.ends_since(before),
                                           since(now.buckets, before.buckets), seconds)
            overflow = now.overflow - before.overflow
            if overflow > 0:
                self.metrics.lane_overflow.labels(klass, self.accounting.label(model)).inc(overflow)
                self._overflowed[key] = self._overflowed.get(key, 0) + overflow
        self.counts = counts

    def plan(self, counts: dict[LaneKey, LaneCounts]) -> dict[LaneKey, int]:
        """Move each pair's slots toward its target and return the caps nginx should use."""
        up = self.upstream_up()
        at = self.clock()
        cfg = self.state.policy.lane
        caps: dict[LaneKey, int] = {}
        released = False
        grow = {model: self.state.lane_may_grow(model) for model in {k[0] for k in (*self.keys, *self.slots)}}
        beside = self.state.lane_like_inflight({slot for held in self.slots.values() for slot in held})
        for key in sorted(self.keys | set(self.slots)):
            model, klass = key
            held = self.slots.setdefault(key, [])
            now = counts.get(key, LaneCounts())
            inflight = now.inflight
            wanted = self._held_peak(key, at, cfg.hold_s, demand(now, self._overflowed.pop(key, 0), beside[key]))
            if wanted > 0:
                self._used_at[key] = at
            # Spare slots only for a pair in use: an idle class must not hold its model's room.
            recent = at - self._used_at.get(key, -cfg.idle_after_s) < cfg.idle_after_s
            want = target_slots(inflight, wanted, grow[model] and recent, up, cfg) if key in self.keys else 0
            while len(held) < want:
                slot = ("lane", next(self._ids))
                if not self.state.take_lane_slot(slot, model, klass):
                    break
                held.append(slot)
            while len(held) > max(want, inflight) or (len(held) > inflight and self.state.lane_overfull(model, klass)):
                self.state.return_lane_slot(held.pop())
                released = True
            if key in self.keys and up:
                caps[key] = len(held)
            self.metrics.lane_slots.labels(klass, self.accounting.label(model)).set(len(held))
            if not held and key not in self.keys:
                del self.slots[key]
                self._peaks.pop(key, None)
        if released:
            self.dispatch()  # the room went to whoever waits: hand them their grants
        return caps

    def _held_peak(self, key: LaneKey, at: float, hold_s: float, wanted: int) -> int:
        """The most the pair was asked for over the last `hold_s` (lane.hold_s). What nginx has read
        and not finished swings with its reads, not with the clients: 64 clients of a model that
        does nothing read 4-64 from one sync to the next while nginx's one worker was the bottleneck,
        and slots that followed each reading sent every swing up into the Python path (3-4% of the
        requests, each a decision in Python), and pushed new caps at every sync."""
        window = self._peaks.setdefault(key, deque())
        while window and window[-1][1] <= wanted:
            window.pop()
        window.append((at, wanted))
        while window[0][0] < at - hold_s:
            window.popleft()
        return window[0][1]

    def status(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per model and class: slots held (counted in the state's in-flight and reserved figures,
        idle or not), the bytes they reserve, and nginx's counts at the last reading."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for key in sorted(self.keys | set(self.slots)):
            model, klass = key
            held = len(self.slots.get(key, []))
            counts = self.counts.get(key, LaneCounts())
            out.setdefault(model, {})[klass] = {
                "slots": held, "reserved_bytes": held * self.state.model_policy(model).request_bytes,
                "inflight": counts.inflight, "done": counts.done, "overflow": counts.overflow,
            }
        return out
