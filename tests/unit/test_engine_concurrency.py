"""The in-flight limit of an engine that queues (sidecar/engine_concurrency.py), against a simulated
engine: continuous batching with `slots` sequences at once, a FIFO queue of its own beyond them,
steps that grow with the batch. The sidecar keeps requests waiting (a flood) and forwards one each
time one ends, up to its limit; the law sees what a sidecar sees: first tokens and token gaps."""

from __future__ import annotations

import random
import statistics
from collections import deque

import pytest

from sidecar.engine_concurrency import EngineConcurrency
from tritongen.core.sidecar_policy.sections import QueueingEnginePolicy


class QueueingEngine:
    """vLLM in miniature: each step every running sequence makes one token; a sequence enters at a
    step's start when a slot is free, and its first token comes at that step's end."""

    def __init__(self, slots: int, output_tokens: int, step_s=lambda running: 0.004 + 0.001 * running, seed: int = 0):
        self.slots, self.output, self.step_s = slots, output_tokens, step_s
        self.queue: deque[float] = deque()  # forward times
        self.running: list[list[float]] = []  # [forwarded_at, first_token_at or -1, tokens]
        self.rng = random.Random(seed)

    def forward(self, now: float) -> None:
        self.queue.append(now)

    def pending_ages(self, now: float) -> list[float]:
        return [now - t for t in self.queue] + [now - seq[0] for seq in self.running if seq[1] < 0]

    @property
    def started(self) -> int:
        return sum(1 for seq in self.running if seq[1] >= 0)

    @property
    def inflight(self) -> int:
        return len(self.queue) + len(self.running)

    def step(self, now: float, law: EngineConcurrency) -> tuple[float, int]:
        """One step from `now`: returns (its end, sequences finished)."""
        while self.queue and len(self.running) < self.slots:
            self.running.append([self.queue.popleft(), -1.0, 0])
        end = now + self.step_s(len(self.running)) * self.rng.uniform(0.9, 1.1)
        finished = 0
        for seq in list(self.running):
            seq[2] += 1
            if seq[1] < 0:
                seq[1] = end
                law.observe_first_token(end - seq[0])
                law.observe_running(self.started, end)
            if seq[2] >= self.output:
                law.observe_gap((end - seq[1]) / max(1, seq[2] - 1))
                self.running.remove(seq)
                law.observe_running(self.started, end)
                finished += 1
        return end, finished


def run(law: EngineConcurrency, engine: QueueingEngine, seconds: float, demand: bool = True) -> list[int]:
    """Drive the engine with the sidecar's limit for `seconds`; the limit after each tick."""
    now, next_tick, limits = 0.0, 0.0, []
    while now < seconds:
        while demand and engine.inflight < law.limit:
            engine.forward(now)
        now, _ = engine.step(now, law)
        if now >= next_tick:
            law.update(now, demand=demand, pending_ages=engine.pending_ages(now), running=engine.started)
            limits.append(law.limit)
            next_tick = now + 0.1
    return limits


CFG = QueueingEnginePolicy()


def measured_law(start: int, first_token_s: float, gap_s: float = 0.01) -> EngineConcurrency:
    """A law that has measured enough to judge: `min_samples` first tokens and a token gap."""
    law = EngineConcurrency(CFG, start=start)
    for _ in range(CFG.min_samples):
        law.observe_first_token(first_token_s)
    law.observe_gap(gap_s)
    return law


@pytest.mark.parametrize("start", [4, 7, 28, 60])
def test_from_a_wrong_start_the_limit_finds_what_the_engine_runs_and_stays(start: int) -> None:
    engine = QueueingEngine(slots=14, output_tokens=64)
    law = EngineConcurrency(CFG, start=start)
    limits = run(law, engine, seconds=60.0)
    settled = limits[len(limits) // 2:]
    # Never far below what the engine runs (that would cost throughput), never far above it (the
    # engine would queue what the sidecar should order and refuse), and no swinging between.
    assert min(settled) >= 13, (start, settled)
    assert max(settled) <= 18, (start, settled)
    assert statistics.median(settled) >= 14


def test_it_converges_within_thirty_seconds() -> None:
    for start in (7, 28):
        engine = QueueingEngine(slots=14, output_tokens=64, seed=start)
        law = EngineConcurrency(CFG, start=start)
        run(law, engine, seconds=30.0)
        assert 13 <= law.limit <= 18, (start, law.limit, law.last)


def test_a_large_engine_with_short_outputs_is_reached_too() -> None:
    # 256 sequences of 16 tokens: a queued request waits a fraction of a step per sequence ahead.
    engine = QueueingEngine(slots=256, output_tokens=16, step_s=lambda running: 0.01 + 0.0001 * running)
    law = EngineConcurrency(CFG, start=32)
    run(law, engine, seconds=60.0)
    assert law.limit >= 230, law.last


def test_it_never_exceeds_the_pool_and_never_moves_without_demand() -> None:
    engine = QueueingEngine(slots=64, output_tokens=32)
    law = EngineConcurrency(CFG, start=8, ceiling=20)
    assert max(run(law, engine, seconds=30.0)) <= 20
    idle = EngineConcurrency(CFG, start=8)
    run(idle, QueueingEngine(slots=64, output_tokens=32), seconds=10.0, demand=False)
    assert idle.limit == 9 and idle.last.startswith("hold")  # what the engine is said to run, and one more


def test_it_holds_until_it_has_measured_enough() -> None:
    law = EngineConcurrency(CFG, start=5)
    law.observe_first_token(0.01)
    assert law.update(2.0, demand=True, pending_ages=[5.0], running=1) == "hold" and "too few" in law.last
    assert law.limit == 6


def test_without_demand_the_limit_drops_on_the_engines_queue_but_not_on_one_slow_prefill() -> None:
    law = measured_law(start=63, first_token_s=0.05)
    # late: past 50 ms + 2 steps of 10 ms
    assert law.update(10.0, demand=False, pending_ages=[1.0, 0.01], running=40) == "hold"
    assert law.limit == 64
    # two late: the engine's queue, once the next judgement finds them still there
    assert law.update(20.0, demand=False, pending_ages=[1.0, 0.9, 0.01], running=40) == "hold"
    assert law.limit == 64 and "next judgement" in law.last
    assert law.update(30.0, demand=False, pending_ages=[2.0, 1.9, 0.01], running=40) == "down"
    assert law.limit == 48  # a quarter down at most per judgement
    assert law.update(40.0, demand=False, pending_ages=[3.0, 2.9, 0.01], running=40) == "down"
    assert law.limit == 41  # what ran, and one more


def test_a_clump_of_prefills_late_for_one_judgement_moves_nothing() -> None:
    """The real vLLM on a CPU at 0.7x (bench_llm_guard, 2026-12-03 21:54): a few prompts that arrive
    together are late at one judgement and started by the next. That is no full engine."""
    law = measured_law(start=13, first_token_s=0.08)
    assert law.update(1.0, demand=True, pending_ages=[0.3, 0.25], running=4) == "hold"
    assert law.update(2.0, demand=True, pending_ages=[0.05], running=7) in ("up", "hold")
    assert law.limit >= 14, law.last


def test_it_never_steps_below_what_the_engine_ran_with_none_late_lately() -> None:
    """The real vLLM on a CPU (bench_llm_guard, 2026-12-03): prompts admitted together after a step
    up prefill for several steps, and the last of them is late with room for all. The engine ran 12
    with none late a few judgements ago: a late prefill now while 4 run is not a full engine."""
    law = measured_law(start=13, first_token_s=0.08)
    for t in range(1, 6):
        law.update(float(t), demand=True, pending_ages=[0.01], running=12)  # 12 ran, none late
    law.update(6.0, demand=True, pending_ages=[0.3, 0.25, 0.2], running=4)
    assert law.limit >= 13, law.last
    # what it ran long ago no longer holds the limit up: the engine may have less room now
    for t in range(7, 7 + CFG.proven_judgements + 8):
        law.update(float(t), demand=True, pending_ages=[0.3, 0.25, 0.2], running=4)
    assert law.limit == 5, law.last


def test_its_memory_counts_judgements_not_ticks() -> None:
    """The sidecar calls `update` every tick (20 ms) and it judges once per interval: 30 judgements
    of history are 30 s, not 30 ticks, even while nothing waits."""
    law = measured_law(start=13, first_token_s=0.08)
    t = 0.0
    while t < 2.0:  # 12 ran for a second, then 3, nothing waiting: no move, but a history
        law.update(t, demand=False, pending_ages=[], running=12 if t < 1.0 else 3)
        t += 0.02
    for t in (2.5, 3.5, 4.5):  # then late requests while 4 run, three judgements in a row
        law.update(t, demand=True, pending_ages=[0.3, 0.25], running=4)
    assert law.limit >= 13, law.last  # the engine ran 12 with none late two seconds ago


def test_what_ran_is_the_count_held_not_a_moment_above_it() -> None:
    # Relayed out of order (a busy event loop, nginx's batched reports), first tokens are counted
    # before the ends of the requests they replaced: 44-45 past their first token for moments,
    # where the engine runs 32 (seen on the real vLLM, max_num_seqs 32).
    law = measured_law(start=39, first_token_s=0.05)
    law.observe_running(32, 0.0)
    law.observe_running(45, 0.5)
    law.observe_running(32, 0.55)
    assert law.update(1.0, demand=True, pending_ages=[1.0, 0.9], running=32) == "hold"  # full once: wait for the next
    law.observe_running(44, 1.5)
    law.observe_running(32, 1.52)
    assert law.update(2.0, demand=True, pending_ages=[2.0, 1.9], running=32) == "down"
    assert law.limit == 33 and law.signals["running"] == 32, law.last


def test_what_ran_is_not_the_dip_between_two_batches() -> None:
    # Sequences that start together end together: between one batch and the next the count drops
    # for a step; the judgement at that instant still reads what ran.
    law = measured_law(start=39, first_token_s=0.05)
    for t in (0.0, 1.0):
        law.observe_running(32, t)
        law.observe_running(2, t + 0.95)
        law.update(t + 1.0, demand=True, pending_ages=[9.0, 9.0], running=2)
    assert law.limit == 33 and law.signals["running"] == 32, law.last
