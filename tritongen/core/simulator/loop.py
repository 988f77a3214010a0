"""The event loop of one simulation: arrivals, the batcher thread, instances, devices and LLM engine steps.

One class over one state: every event (an arrival, a batcher timer, an execution's host part or end,
an instance's release, an engine step) reads and changes the same queues, instances and devices, so
the handlers stay together; what can be asked of a model entry's queues alone lives in
`model_state`, the rate limiter's pool in `rate_limiter`, the wake race in `wake_race`. What each
rule models and where its values come from: the package docstring (`tritongen.core.simulator`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from tritongen.core.engine import DONE, FIRST, KILLED, REFUSED, EngineState
from tritongen.core.handoff import HandoffStats, handoff_stats
from tritongen.core.prefix_cache import PromptSharing
from tritongen.core.simulator.inputs import ServerSim
from tritongen.core.simulator.model_state import EXECUTING, READY, REQUESTED, ModelState, Payload
from tritongen.core.simulator.rate_limiter import ResourcePool, resource_totals
from tritongen.core.simulator.results import (
    NO_ROUTE, OK, OOM, QUEUE_FULL, TOO_LARGE, ModelStats, SimResult, measurement_window, summarize_requests,
)
from tritongen.core.simulator.routing import route_requests
from tritongen.core.simulator.wake_race import WakeRace
from tritongen.core.traffic import Arrivals

_TIMER, _EXEC_DONE, _TICK, _STEP, _WAKE, _RELEASE, _HOST_DONE = 1, 2, 3, 4, 5, 6, 7
_IDLE_WAIT_S = 0.5  # Triton's default_wait_microseconds: 500 ms


class Simulation:
    """One run. Use `simulate()`; this class holds the state while it runs."""

    def __init__(self, server: ServerSim, arrivals: Arrivals, seed: int = 0) -> None:
        self.server = server
        self.arr = arrivals
        self.ov = server.overheads
        self.models = [ModelState(i, m, server.overheads) for i, m in enumerate(server.models)]
        self.rng = np.random.default_rng(seed)
        n = len(arrivals)
        self.n = n
        self.t_send = arrivals.t.tolist()
        self.rows = arrivals.rows.tolist()
        self.prompt = arrivals.prompt.tolist()
        self.output = arrivals.output.tolist()
        self.prio = arrivals.priorities().tolist()
        self.route = route_requests(server.models, arrivals)
        self.level = [0] * n
        self.deadline = [0.0] * n
        self.status = [0] * n
        self.t_done = [math.nan] * n
        self.t_start = [math.nan] * n
        self.t_first = [math.nan] * n
        sharing = PromptSharing(arrivals.prefix_id.tolist(), arrivals.prefix_tokens.tolist(),
                                arrivals.conversation.tolist()) if arrivals.shares_prompts else None
        for m in self.models:
            if m.llm is not None:
                m.engine = EngineState(m.llm, self.prompt, self.output, sharing)
        self.heap: list[tuple] = []
        self.seq = 0
        self.now = 0.0
        self.window = measurement_window(arrivals.t, arrivals.warmup_s)
        # rate limiter
        self.rl = server.rate_limit and any(m.resources for m in server.models)
        self.resources = ResourcePool(resource_totals(server.resources, self.models) if self.rl else {})
        self.staged_seq = 0
        # devices
        self.dev_busy_count: dict[int, int] = {}
        self.dev_busy_since: dict[int, float] = {}
        self.dev_busy_s: dict[int, float] = {}
        # shared device parts: who holds each device, and who waits for it (model, instance, payload, seconds)
        self.dev_held: set[int] = set()
        self.dev_waiting: dict[int, deque[tuple[ModelState, int, Payload, float]]] = {}
        self.wake_s = self.ov.wake_ms / 1000.0
        self.wake_race = WakeRace(self.ov, self.t_send)
        self.release_s = self.ov.release_ms / 1000.0
        self._uni_buf: list[float] = []
        self._exp_buf: list[float] = []
        self._jitter = self.ov.jitter_cv > 0
        if self._jitter:
            sigma = math.sqrt(math.log(1.0 + self.ov.jitter_cv**2))
            self._jit_mu = -sigma * sigma / 2.0
            self._jit_sigma = sigma
            self._jit_buf: list[float] = []

    # -- helpers ---------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: int, b: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _jitter_factor(self) -> float:
        if not self._jitter:
            return 1.0
        if not self._jit_buf:
            if self.ov.jitter_shape == "gamma":
                k = 1.0 / self.ov.jitter_cv**2
                self._jit_buf = self.rng.gamma(k, 1.0 / k, 4096).tolist()
            else:
                self._jit_buf = self.rng.lognormal(self._jit_mu, self._jit_sigma, 4096).tolist()
        return self._jit_buf.pop()

    def _uniform(self) -> float:
        if not self._uni_buf:
            self._uni_buf = self.rng.random(4096).tolist()
        return self._uni_buf.pop()

    def _exponential(self) -> float:
        """A standard exponential draw (mean 1)."""
        if not self._exp_buf:
            self._exp_buf = self.rng.standard_exponential(4096).tolist()
        return self._exp_buf.pop()

    def _finish(self, r: int, status: int, t: float) -> None:
        self.status[r] = status
        self.t_done[r] = t + self.ov.request_ms / 1000.0

    def _window_overlap(self, a: float, b: float) -> float:
        w0, w1 = self.window
        return max(0.0, min(b, w1) - max(a, w0))

    # -- arrivals --------------------------------------------------------------------------

    def _arrive(self, r: int, now: float) -> None:
        mi = self.route[r]
        if mi < 0:
            self._finish(r, NO_ROUTE, now)
            return
        m = self.models[mi]
        if m.batcher is None:  # default scheduler: every request is its own execution
            p = Payload(m.payload_seq)
            m.payload_seq += 1
            p.reqs.append(r)
            p.rows = self.rows[r]
            p.state = REQUESTED
            self.staged_seq += 1
            p.seq = self.staged_seq
            m.pending.append(p)
            self._dispatch(now)
            return
        level = m.batcher.level_of(self.prio[r])
        pol = m.policy[level]
        if pol.max_queue_size and len(m.queue[level]) + len(m.delayed[level]) >= pol.max_queue_size:
            self._finish(r, QUEUE_FULL, now)
            return
        self.level[r] = level
        self.deadline[r] = now + pol.timeout_us / 1e6 if pol.timeout_us else 0.0
        m.queue[level].append(r)
        m.qsize += 1
        m.queued_rows += self.rows[r]
        if m.bstate == "running":
            return
        wake = self._slot_available(m) and (
            m.saturated or m.curr.state == EXECUTING or m.queued_rows >= m.next_pref
        )
        if wake:
            self._notify(m, now)
        elif m.bstate == "empty":
            # Not woken: the batcher notices the request at the end of its current 500 ms wait.
            k = math.floor((now - m.idle_since) / _IDLE_WAIT_S) + 1
            m.bstate = "idle"
            m.token += 1
            self._push(m.idle_since + k * _IDLE_WAIT_S, _TIMER, m.index, m.token)

    # -- the batcher thread ----------------------------------------------------------------

    def _slot_available(self, m: ModelState) -> bool:
        if m.prefetch:
            return len(m.pending) < 2 * m.n_inst
        return len(m.idle) - len(m.pending) > 0

    def _notify(self, m: ModelState, now: float) -> None:
        if m.batcher is None or m.bstate == "running":
            return
        if self.wake_s > 0.0:
            if not m.wake_pending:  # the thread wakes a little later and looks at the state then
                m.wake_pending = True
                self._push(now + self.wake_s, _WAKE, m.index, None)
            return
        self._notify_now(m, now)

    def _notify_now(self, m: ModelState, now: float) -> None:
        if m.bstate == "running":
            return
        if m.bstate in ("idle", "empty"):
            m.token += 1
            self._batcher_run(m, now, from_slot=False)
        elif m.bstate == "slot" and self._slot_available(m):
            m.token += 1
            self._batcher_run(m, now, from_slot=True)

    def _wait(self, m: ModelState, now: float, seconds: float, state: str) -> None:
        m.token += 1
        if state == "empty":  # cv_.wait_for(500 ms) over an empty queue: wakes every 500 ms, no event needed
            m.bstate = "empty"
            m.idle_since = now
            return
        m.bstate = state
        self._push(now + seconds, _TIMER if state == "idle" else _TICK, m.index, m.token)

    def _batcher_run(self, m: ModelState, now: float, from_slot: bool) -> None:
        m.bstate = "running"
        for _ in range(100000):
            if not from_slot:
                if m.saturated or m.curr.state == EXECUTING:
                    m.curr = Payload(m.payload_seq)
                    m.payload_seq += 1
                    m.saturated = False
                    m.next_pref = 0
                if m.qsize == 0:
                    self._wait(m, now, _IDLE_WAIT_S, "empty")
                    return
                if m.saturated:
                    continue
                if not self._slot_available(m):
                    self._wait(m, now, _IDLE_WAIT_S, "slot")
                    return
            from_slot = False
            if m.curr.state == EXECUTING:
                continue
            wait_s = m.dynamic_batch(now, self.rows, self.t_send, self.deadline, self._finish)
            if wait_s > 0:
                self._wait(m, now, wait_s, "idle")
                return
            if m.curr.state == READY:
                m.curr.state = REQUESTED
                self.staged_seq += 1
                m.curr.seq = self.staged_seq
                m.pending.append(m.curr)
                self._dispatch(now)
        raise RuntimeError(f"simulator: the batcher of {m.cfg.name!r} did not settle (a bug)")

    # -- instances and the rate limiter ----------------------------------------------------

    def _dispatch(self, now: float) -> None:
        """Start waiting payloads on idle instances (FIFO per model; the rate limiter across models)."""
        if not self.rl:
            for m in self.models:
                while m.pending and m.idle:
                    self._start(m, m.idle.pop(0), m.pending.popleft(), now)
            return
        while True:
            best: tuple | None = None
            for m in self.models:
                if m.pending and m.idle:
                    key = (m.cfg.rate_limiter_priority, m.pending[0].seq, m.index)
                    if best is None or key < best[0]:
                        best = (key, m)
            if best is None:
                return
            m = best[1]
            inst = m.idle[0]
            if m.cfg.resources and not self.resources.fits(m, inst):
                return  # the head of the staging queue waits; so does everything behind it
            m.idle.pop(0)
            if m.cfg.resources:
                self.resources.take(m, inst, +1)
            self._start(m, inst, m.pending.popleft(), now)

    def _start(self, m: ModelState, inst: int, p: Payload, now: float) -> None:
        p.state = EXECUTING
        n_req = len(p.reqs)
        service = (m.curve.ms(p.rows) / 1000.0 if m.curve is not None else 0.0)
        jitter = self._jitter_factor()
        p.out_of_memory = m.over_memory(p.reqs, self.prompt, self.output)  # fails as it starts: no service time
        dur = ((0.0 if p.out_of_memory else service) + m.batch_s + m.req_exec_s * n_req) * jitter
        for r in p.reqs:
            self.t_start[r] = now
        m.running_count += 1
        p.started = now
        if m.llm is None:  # an LLM's device time is its engine's steps, not the hand-off
            m.executions += 1
            m.exec_rows += p.rows
            if m.running_count == 1:
                m.any_busy_since = now
            self._device_busy(m.inst_device[inst], now, +1)
        if m.device_curve is not None:
            device_s = min(dur, m.device_curve.ms(p.rows) / 1000.0 * jitter)
            self._push(now + dur - device_s, _HOST_DONE, m.index, (inst, p, device_s))
        else:
            self._push(now + dur, _EXEC_DONE, m.index, (inst, p))
        self._notify(m, now)  # the payload's callback wakes the batcher

    def _host_done(self, m: ModelState, inst: int, p: Payload, device_s: float, now: float) -> None:
        """The host part is over: take the device, or queue for it behind the instances holding it."""
        dev = m.inst_device[inst]
        if dev in self.dev_held:
            self.dev_waiting.setdefault(dev, deque()).append((m, inst, p, device_s))
            return
        self.dev_held.add(dev)
        self._push(now + device_s, _EXEC_DONE, m.index, (inst, p))

    def _device_free(self, dev: int, now: float) -> None:
        waiting = self.dev_waiting.get(dev)
        if waiting:
            m, inst, p, device_s = waiting.popleft()
            self._push(now + device_s, _EXEC_DONE, m.index, (inst, p))
        else:
            self.dev_held.discard(dev)

    def _device_busy(self, dev: int, now: float, delta: int) -> None:
        count = self.dev_busy_count.get(dev, 0)
        if delta > 0 and count == 0:
            self.dev_busy_since[dev] = now
        elif delta < 0 and count == 1:
            self.dev_busy_s[dev] = self.dev_busy_s.get(dev, 0.0) + self._window_overlap(self.dev_busy_since[dev], now)
        self.dev_busy_count[dev] = count + delta

    def _exec_done(self, m: ModelState, inst: int, p: Payload, now: float) -> None:
        m.running_count -= 1
        if m.device_curve is not None:
            self._device_free(m.inst_device[inst], now)
        if m.llm is None:
            m.busy_s += self._window_overlap(p.started, now)
            if m.running_count == 0 and m.any_busy_since is not None:
                m.any_busy_s += self._window_overlap(m.any_busy_since, now)
            self._device_busy(m.inst_device[inst], now, -1)
        if m.llm is not None:
            assert m.engine is not None
            for r in p.reqs:
                m.engine.submit(r)
            if not m.engine_busy and m.engine.busy:
                m.engine_busy = True
                self._engine_busy(m, now, +1)
                self._push(now, _STEP, m.index, None)
        else:
            for r in p.reqs:
                self._finish(r, OOM if p.out_of_memory else OK, now)
        if self.release_s > 0.0:  # the responses are out; the instance comes back a little later
            self._push(now + self.release_s * self._exponential(), _RELEASE, m.index, inst)
        else:
            self._release(m, inst, now)

    def _release(self, m: ModelState, inst: int, now: float) -> None:
        """The instance is free again: it takes a waiting payload, and its notify may wake the batcher."""
        holds_resources = bool(self.rl and m.cfg.resources)
        if holds_resources:
            self.resources.take(m, inst, -1)
        m.idle.append(inst)
        m.idle.sort()
        self._dispatch(now)
        # The load dependence was measured for a batcher asleep on an empty queue (one instance);
        # for one blocked on a slot (several instances) the runs showed none, so that chance is flat.
        if m.bstate == "slot":
            chance = self.ov.completion_wake_p
        else:
            chance = self.wake_race.chance(self.ov.completion_wake_p_idle, now)
        if holds_resources and chance < 1.0:  # the resources went back before the notify
            chance = 1.0 - min(1.0, (1.0 - chance) * self.ov.rate_limited_wake_loss)
        # The race is lost only when this instance is the batcher's one chance of a slot: if another
        # instance already waits idle (its own wake was lost), this notify finds that one.
        others_idle = len(m.idle) - len(m.pending) > 1
        if m.prefetch or others_idle or chance >= 1.0 or self._uniform() < chance:
            self._notify(m, now)
        # else: the notify raced the instance thread and was lost; the next arrival (a slot is now
        # free, so it wakes the batcher) or the batcher's own timer picks the instance up.

    # -- the LLM engine --------------------------------------------------------------------

    def _engine_busy(self, m: ModelState, now: float, delta: int) -> None:
        if delta > 0:
            m.any_busy_since = now
            self._device_busy(m.inst_device[0], now, +1)
        else:
            if m.any_busy_since is not None:
                m.any_busy_s += self._window_overlap(m.any_busy_since, now)
            self._device_busy(m.inst_device[0], now, -1)

    _ENGINE_STATUS = {DONE: OK, KILLED: OOM, REFUSED: TOO_LARGE}

    def _engine_step(self, m: ModelState, now: float) -> None:
        """One engine step (`tritongen.core.engine`); the engine stays busy until it ends."""
        engine = m.engine
        assert engine is not None
        t, events = engine.step(now)
        request_s = self.ov.request_ms / 1000.0
        for r, what, at in events:
            if what == FIRST:
                self.t_start[r] = now
                self.t_first[r] = at + request_s
            else:
                self._finish(r, self._ENGINE_STATUS[what], at)
        if t > now or engine.busy:
            # The step occupies the engine until t: newcomers wait for the next step there.
            self._push(t, _STEP, m.index, None)
        else:
            m.engine_busy = False
            self._engine_busy(m, t, -1)
        if engine.last_batch:
            m.executions += 1
            m.exec_rows += engine.last_batch

    # -- the loop --------------------------------------------------------------------------

    def window_latencies_s(self) -> np.ndarray:
        """After `run`: latencies of the requests served and sent inside the measurement window,
        the set a live run's P99 is taken over (`LiveRun.window_latencies_s`)."""
        w0, w1 = self.window
        t = self.arr.t
        keep = (np.asarray(self.status) == OK) & (t >= w0) & (t <= w1)
        return (np.asarray(self.t_done) - t)[keep]

    def handoff_stats(self) -> HandoffStats:
        """After `run`: the hand-offs of the first model, classified as a Triton trace's are
        (`tritongen.core.handoff`)."""
        m = self.models[0]
        ok = np.asarray(self.status) == OK
        end = np.asarray(self.t_done) - self.ov.request_ms / 1000.0
        return handoff_stats(self.arr.t[ok], np.asarray(self.t_start)[ok], end[ok], m.delay_s, m.n_inst)

    def run(self) -> SimResult:
        heap = self.heap
        t_send = self.t_send
        n = self.n
        i = 0
        models = self.models
        pop = heapq.heappop
        while heap or i < n:
            if heap and (i >= n or heap[0][0] <= t_send[i]):
                t, _, kind, a, b = pop(heap)
                self.now = t
                m = models[a]
                if kind == _EXEC_DONE:
                    self._exec_done(m, b[0], b[1], t)
                elif kind == _STEP:
                    self._engine_step(m, t)
                elif kind == _WAKE:
                    m.wake_pending = False
                    self._notify_now(m, t)
                elif kind == _RELEASE:
                    self._release(m, b, t)
                elif kind == _HOST_DONE:
                    self._host_done(m, b[0], b[1], b[2], t)
                elif b == m.token:  # a live timer (a notify supersedes the pending one)
                    if kind == _TIMER:
                        self._batcher_run(m, t, from_slot=False)
                    elif self._slot_available(m):
                        self._batcher_run(m, t, from_slot=True)
                    else:
                        m.reject_timeouts(t, self.rows, self.deadline, self._finish)
                        self._wait(m, t, _IDLE_WAIT_S, "slot")
            else:
                t = t_send[i]
                self.now = t
                self._arrive(i, t)
                i += 1
        return self._result()

    def _result(self) -> SimResult:
        arr = self.arr
        w0, w1 = self.window
        span = max(1e-9, w1 - w0)
        status = np.asarray(self.status, dtype=np.int64)
        first = np.asarray(self.t_first, dtype=float)
        classes, total = summarize_requests(
            arr.t, np.asarray(self.t_done, dtype=float), status, arr.cls, arr.class_names, self.window,
            first_t=first if np.isfinite(first).any() else None, start_t=np.asarray(self.t_start, dtype=float),
        )
        models = []
        for m in self.models:
            models.append(
                ModelStats(
                    name=m.cfg.name,
                    executions=m.executions,
                    mean_batch_rows=(m.exec_rows / m.executions) if m.executions else None,
                    # an engine's steps run back to back while it is busy, so its busy time is its busy periods
                    utilisation=min(1.0, (m.any_busy_s if m.llm else m.busy_s) / (span * (1 if m.llm else m.n_inst))),
                    busy_fraction=min(1.0, m.any_busy_s / span),
                    preemptions=m.engine.preemptions if m.engine else 0,
                    engine_killed=m.engine.killed if m.engine else 0,
                    prefix_cache_hit_rate=m.engine.hit_rate(lambda r: w0 <= self.t_send[r] <= w1) if m.engine else None,
                    prefix_cache_evictions=m.engine.cache.evictions if m.engine and m.engine.cache else 0,
                )
            )
        return SimResult(
            window_s=span,
            classes=classes,
            models=models,
            throughput_per_s=total,
            device_busy={d: min(1.0, s / span) for d, s in sorted(self.dev_busy_s.items())},
            requests=self.n,
        )


def simulate(server: ServerSim, arrivals: Arrivals, seed: int = 0) -> SimResult:
    """Run `arrivals` through `server`; deterministic for a given seed."""
    if len(arrivals) == 0:
        raise ValueError("no arrivals to simulate")
    return Simulation(server, arrivals, seed).run()


def simulate_detail(server: ServerSim, arrivals: Arrivals, seed: int = 0) -> "Simulation":
    """Like `simulate` but returns the finished run, for per-request inspection (tests, debugging)."""
    sim = Simulation(server, arrivals, seed)
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim
