"""Run-time state of one model entry, and how its batcher forms a batch from its queues.

The queue half of Triton's dynamic batcher (`GetDynamicBatch`, `RejectTimeoutRequests`): which
requests join the current payload, which time out, and how long the batcher waits. When the
batcher thread runs, and what a payload does once formed, is the event loop's (`loop`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable

from tritongen.core.engine import EngineState
from tritongen.core.simulator.inputs import ModelSim, Overheads, QueuePolicy
from tritongen.core.simulator.results import TIMEOUT

# A payload's life: empty, holding requests, handed to the rate limiter / instances, running.
UNINIT, READY, REQUESTED, EXECUTING = 0, 1, 2, 3

# Ends a request with a status at a time (the loop's `_finish`).
Finish = Callable[[int, int, float], None]


class Payload:
    """One batch in the making, then executing: its requests and rows."""

    __slots__ = ("reqs", "rows", "state", "seq", "started", "out_of_memory")

    def __init__(self, seq: int) -> None:
        self.reqs: list[int] = []
        self.rows = 0
        self.state = UNINIT
        self.seq = seq
        self.started = 0.0
        self.out_of_memory = False  # a static-batch LLM's execution whose tokens its memory cannot hold


class ModelState:
    """Run-time state of one model entry: the queues the batcher scans, the payload it fills, and
    the instances and counters the loop updates."""

    def __init__(self, index: int, cfg: ModelSim, overheads: Overheads) -> None:
        self.index = index
        self.cfg = cfg
        self.batcher = cfg.batcher()
        b = self.batcher
        self.max_batch = max(1, cfg.max_batch_size)
        if b is not None:
            self.preferred = sorted(set(b.preferred_batch_sizes))
            self.pref_set = set(self.preferred)
            self.max_pref = max(self.preferred) if self.preferred else 0
            self.delay_s = b.max_queue_delay_us / 1e6
            self.prefetch = b.prefetching
            levels = sorted({0} if b.priority_levels == 0 else set(range(1, b.priority_levels + 1)))
        else:
            self.preferred, self.pref_set, self.max_pref, self.delay_s, self.prefetch = [], set(), 0, 0.0, True
            levels = [0]
        self.levels = levels
        self.queue: dict[int, deque[int]] = {lv: deque() for lv in levels}
        self.delayed: dict[int, deque[int]] = {lv: deque() for lv in levels}
        self.policy: dict[int, QueuePolicy] = {lv: (b.policy(lv) if b else QueuePolicy()) for lv in levels}
        self.qsize = 0
        self.queued_rows = 0
        self.curr = Payload(0)
        self.saturated = False
        self.next_pref = 0
        self.pending: deque[Payload] = deque()  # enqueued to the rate limiter, not started
        self.bstate = "empty"  # empty (waiting, queue empty) | idle (timed wait) | slot | running
        self.idle_since = 0.0
        self.wake_pending = False
        self.token = 0
        self.n_inst = cfg.instance_count
        devices = cfg.devices or [-1]
        self.inst_device = [devices[i // cfg.instances] if i // cfg.instances < len(devices) else devices[-1] for i in range(self.n_inst)]
        self.idle: list[int] = list(range(self.n_inst))
        self.curve = cfg.curve
        self.device_curve = cfg.device_curve if cfg.llm is None else None
        self.batch_s = overheads.batch_ms / 1000.0
        self.req_exec_s = overheads.request_exec_ms / 1000.0
        self.busy_s = 0.0
        self.executions = 0
        self.exec_rows = 0
        self.any_busy_since: float | None = None
        self.any_busy_s = 0.0
        self.running_count = 0
        self.payload_seq = 1
        # engine
        self.llm = cfg.llm
        self.engine: EngineState | None = None  # built by the simulation (it holds the token counts)
        self.engine_busy = False

    def dynamic_batch(self, now: float, rows: list[int], t_send: list[float], deadline: list[float], finish: Finish) -> float:
        """GetDynamicBatch: scan the queue, move a batch into the current payload or say how long to wait."""
        payload_rows = self.curr.rows
        max_pref = self.max_pref
        max_batch = self.max_batch
        pref = self.pref_set
        pending: list[tuple[int, bool, int]] = []  # (level, delayed?, request)
        pending_rows = 0
        best_rows = 0
        mark = 0
        send_now = False
        oldest = math.inf
        closest = math.inf
        stop = False
        for level in self.levels:
            pol = self.policy[level]
            for delayed in (False, True):
                q = self.delayed[level] if delayed else self.queue[level]
                i = 0
                while i < len(q):
                    r = q[i]
                    if not delayed and deadline[r] and now > deadline[r]:
                        del q[i]
                        if pol.action == "DELAY":
                            self.delayed[level].append(r)
                            deadline[r] = 0.0
                        else:
                            self.qsize -= 1
                            self.queued_rows -= rows[r]
                            finish(r, TIMEOUT, now)
                        continue
                    bs = rows[r]
                    if payload_rows + len(pending) != 0:
                        if payload_rows + pending_rows + bs > max_pref and best_rows == 0:
                            best_rows = pending_rows
                            mark = len(pending)
                            self.saturated = True
                        if payload_rows + pending_rows + bs > max_batch:
                            send_now = True
                            stop = True
                            break
                    pending.append((level, delayed, r))
                    pending_rows += bs
                    t_enq = t_send[r]
                    if t_enq < oldest:
                        oldest = t_enq
                    if not delayed and deadline[r] and deadline[r] < closest:
                        closest = deadline[r]
                    if pending_rows + payload_rows in pref:
                        best_rows = pending_rows
                        mark = len(pending)
                    i += 1
                if stop:
                    break
            if stop:
                break
        delay = self.delay_s
        exceeded = delay > 0 and (now - oldest) >= delay - 1e-9
        if best_rows and not exceeded:
            if delay == 0:
                self.saturated = True
            self.take(pending[:mark], rows)
            return 0.0
        if not pending:
            return 0.0
        if send_now or payload_rows + pending_rows >= max_pref:
            self.saturated = True
            self.take(pending, rows)
            return 0.0
        if exceeded or delay == 0:
            self.take(pending, rows)
            return 0.0
        j = bisect.bisect_right(self.preferred, pending_rows + payload_rows)
        nxt = self.preferred[j] if j < len(self.preferred) else (self.preferred[0] if self.preferred else 0)
        self.next_pref = nxt - payload_rows if nxt else 0
        if not self.saturated and payload_rows and payload_rows not in pref:
            self.take(pending, rows)
            return 0.0
        wait = delay - (now - oldest)
        if closest < math.inf:
            wait = min(closest - now, wait) if now <= closest else 1e-6
        return max(wait, 1e-6)

    def over_memory(self, reqs: list[int], prompt: list[int], output: list[int]) -> bool:
        """Whether an execution of these requests needs more tokens than a static-batch LLM's memory
        holds (ModelSim.static_batch_tokens): such a batch fails whole, out of memory."""
        pool = self.cfg.static_batch_tokens
        return pool is not None and sum(prompt[r] + output[r] for r in reqs) > pool

    def take(self, items: list[tuple[int, bool, int]], rows: list[int]) -> None:
        p = self.curr
        for level, delayed, r in items:
            (self.delayed[level] if delayed else self.queue[level]).remove(r)
            p.reqs.append(r)
            p.rows += rows[r]
            self.qsize -= 1
            self.queued_rows -= rows[r]
        if items and p.state == UNINIT:
            p.state = READY

    def reject_timeouts(self, now: float, rows: list[int], deadline: list[float], finish: Finish) -> None:
        """RejectTimeoutRequests: the 500 ms tick of a batcher waiting for a slot (REJECT only)."""
        for level in self.levels:
            if self.policy[level].action != "REJECT" or not self.policy[level].timeout_us:
                continue
            q = self.queue[level]
            expired = [r for r in q if deadline[r] and now > deadline[r]]
            if not expired:
                continue
            keep = deque(r for r in q if not (deadline[r] and now > deadline[r]))
            self.queue[level] = keep
            for r in expired:
                self.qsize -= 1
                self.queued_rows -= rows[r]
                finish(r, TIMEOUT, now)
