"""The LLM stand-ins' engine without Triton, on a fake clock: hand-computed token times for both
memory policies (grow_preempt: vLLM's blocks and recompute preemption; reserve_kill: reserve up
front, kill what does not fit)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading

import pytest

from tests.helpers import EXAMPLES

STANDINS = EXAMPLES / "llm_standins"
_spec = importlib.util.spec_from_file_location("standin_engine", STANDINS / "standin_engine.py")
se = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("standin_engine", se)  # dataclasses look their module up while the class is built
_spec.loader.exec_module(se)

MS = 1e-3


class FakeClock:
    """time.monotonic and time.sleep stand-ins: only sleeping moves time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.t += seconds


class SlowSink(se.CollectingSink):
    """Sending a token costs `send_s` of (fake) time, like a response's IPC."""

    def __init__(self, clock: FakeClock, send_s: float) -> None:
        super().__init__(clock)
        self.send_s = send_s

    def token(self, text: str, index: int, final: bool) -> None:
        super().token(text, index, final)
        self.clock.t += self.send_s


class CancelAfter(se.CollectingSink):
    def __init__(self, clock: FakeClock, after: int) -> None:
        super().__init__(clock)
        self.after = after
        self.asked = 0

    def cancelled(self) -> bool:
        self.asked += 1
        return len(self.texts) >= self.after


class GoneSink(se.CollectingSink):
    def token(self, text: str, index: int, final: bool) -> None:
        raise ConnectionError("the client went away")


def engine(policy, max_running=8, lag_allowance_s=0.02, cancel_check_every=8, **costs):
    clock = FakeClock()
    cfg = se.EngineConfig(costs=se.Costs(**costs), policy=policy, max_running=max_running,
                          cancel_check_every=cancel_check_every)
    return se.Engine(cfg, clock=clock, sleep=clock.sleep, lag_allowance_s=lag_allowance_s), clock


def send(eng, clock, nbytes: int, max_tokens: int, sink=None):
    sink = sink if sink is not None else se.CollectingSink(clock)
    eng.submit(b"x" * nbytes, max_tokens, sink)
    return sink


def ms(sink) -> list[float]:
    return [round(t / MS, 9) for t in sink.times]


# -- costs and tokens --------------------------------------------------------------------------


def test_tokens_round_up_and_never_fall_below_one():
    costs = se.Costs(bytes_per_token=3)
    assert [costs.tokens(b"x" * n) for n in (0, 1, 3, 4, 6, 7)] == [1, 1, 1, 2, 2, 3]
    assert costs.tokens("é".encode()) == 1 and se.Costs(bytes_per_token=1).tokens("é".encode()) == 2
    assert se.output_text(3) == "a b c " and se.token_text(26) == "a "


def test_cost_files_are_checked():
    assert se.Costs.from_mapping({"decode_fixed_ms": 8, "bytes_per_token": 4}).decode_s(2, 10) == pytest.approx(0.008)
    for bad, words in (({"decode_ms": 1}, "unknown cost keys"), ({"decode_fixed_ms": -1}, ">= 0"),
                       ({"bytes_per_token": 2.5}, "whole number"), ({"prefill_fixed_ms": True}, "number"),
                       ({"bytes_per_token": 0}, ">= 1")):
        with pytest.raises(ValueError, match=words):
            se.Costs.from_mapping(bad)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        se.GrowPreempt(num_blocks=4, block_size=0)


@pytest.mark.parametrize("model", ["vllm_standin", "reserve_llm"])
def test_the_committed_stand_ins_stay_under_1500_responses_per_second(model):
    """On 2 cores the client decodes every response: the full-load token rate must stay modest."""
    version = STANDINS / "repository" / model / "1"
    costs = se.Costs.from_file(version / "standin.json")
    if model == "vllm_standin":
        most = json.loads((version / "model.json").read_text())["max_num_seqs"]
    else:
        config = (STANDINS / "repository" / model / "config.pbtxt").read_text()
        most = int(config.split('key: "max_active"')[1].split('"')[1])
    assert most / costs.decode_s(most, 0) < 1500


# -- timings follow the cost formula -----------------------------------------------------------


def test_one_request_prefill_then_decode_steps_with_context_cost():
    eng, clock = engine(se.GrowPreempt(num_blocks=10, block_size=16), prefill_fixed_ms=4, prefill_ms_per_token=0.5,
                        decode_fixed_ms=8, decode_ms_per_seq=1, decode_ms_per_context_token=0.1, bytes_per_token=4)
    sink = send(eng, clock, 40, 3)  # 10 tokens
    eng.run_until_idle()
    # prefill 4 + 0.5 x 10 = 9; decode 8 + 1 + 0.1 x 10 = 10, then 8 + 1 + 0.1 x 11 = 10.1
    assert ms(sink) == [9.0, 19.0, 29.1]
    assert sink.text == "a b c " and sink.error_message is None
    stats = eng.stats()
    assert (stats.prompt_tokens_total, stats.generation_tokens_total, stats.finished_total) == (10, 3, 1)
    assert (stats.memory_used, stats.running, stats.waiting) == (0, 0, 0)


def test_newcomers_prefill_one_after_another_then_decode_together():
    eng, clock = engine(se.GrowPreempt(num_blocks=10, block_size=16), prefill_fixed_ms=4, prefill_ms_per_token=0.5,
                        decode_fixed_ms=8, decode_ms_per_seq=1, decode_ms_per_context_token=0.1, bytes_per_token=4)
    a, b = send(eng, clock, 40, 2), send(eng, clock, 8, 2)
    eng.run_until_idle()
    # prefills 9 then 5; one decode of 2 sequences over 12 cached tokens: 8 + 2 + 1.2
    assert ms(a) == [9.0, 25.2] and ms(b) == [14.0, 25.2]


def test_a_max_tokens_1_request_finishes_at_its_prefill():
    eng, clock = engine(se.ReserveKill(pool_tokens=100), prefill_fixed_ms=3, decode_fixed_ms=50)
    sink = send(eng, clock, 4, 1)
    eng.run_until_idle()
    assert ms(sink) == [3.0] and eng.stats().steps == 1 and eng.memory_free == 100


def test_sending_time_is_absorbed_so_a_step_lasts_max_of_cost_and_work():
    costs = dict(prefill_fixed_ms=5, decode_fixed_ms=10)
    eng, clock = engine(se.ReserveKill(pool_tokens=100), **costs)
    sink = send(eng, clock, 4, 4, SlowSink(clock, 2 * MS))
    eng.run_until_idle()
    assert ms(sink) == [5.0, 15.0, 25.0, 35.0]  # each 2 ms send hides inside the next step's 10 ms
    eng, clock = engine(se.ReserveKill(pool_tokens=100), lag_allowance_s=0.0, **costs)
    sink = send(eng, clock, 4, 4, SlowSink(clock, 2 * MS))
    eng.run_until_idle()
    assert ms(sink) == [5.0, 15.0, 27.0, 39.0]  # without the allowance the sends add up
    eng, clock = engine(se.ReserveKill(pool_tokens=100), **costs)
    sink = send(eng, clock, 4, 4, SlowSink(clock, 15 * MS))
    eng.run_until_idle()
    assert ms(sink) == [5.0, 20.0, 35.0, 50.0]  # work (15 ms) above cost (10 ms): steps take the work


def test_a_request_that_wakes_the_engine_is_timed_from_its_arrival():
    eng, clock = engine(se.ReserveKill(pool_tokens=100), prefill_fixed_ms=5, decode_fixed_ms=10)
    first = send(eng, clock, 4, 2)
    clock.t += 0.5 * MS  # the engine thread wakes up late
    eng.run_until_idle()
    clock.t += 100 * MS  # idle
    second = send(eng, clock, 4, 2)
    clock.t += 3 * MS
    eng.run_until_idle()
    assert ms(first) == [5.0, 15.0] and ms(second) == [120.0, 130.0]


def test_a_request_that_arrives_after_a_back_dated_step_started_waits_for_the_next():
    """A's second token is sent (2 ms of IPC) after its step's deadline; B arrives 1 ms into that
    send. The next step counts from the deadline, before B arrived, so B joins the step after:
    its first token comes a whole prefill after its arrival, never sooner (no real engine lets a
    request into a step that had started without it)."""
    eng, clock = engine(se.ReserveKill(pool_tokens=100), prefill_fixed_ms=5, decode_fixed_ms=10)
    late: list = []

    class SubmitWhileSending(se.CollectingSink):
        def token(self, text: str, index: int, final: bool) -> None:
            super().token(text, index, final)
            if index == 1:  # at 15 ms: the send takes 2 ms, B arrives 1 ms into it
                clock.t += 1 * MS
                late.append((clock.t, send(eng, clock, 4, 2)))
                clock.t += 1 * MS

    a = send(eng, clock, 4, 4, SubmitWhileSending(clock))
    eng.run_until_idle()
    (arrived, b), = late
    assert ms(a) == [5.0, 15.0, 25.0, 40.0]  # the step from 25 ms runs B's prefill, then decodes both
    assert round(arrived / MS, 9) == 16.0 and ms(b) == [30.0, 40.0]
    assert b.times[0] - arrived >= 5 * MS


# -- grow_preempt (vLLM semantics) -------------------------------------------------------------

TINY = dict(prefill_fixed_ms=1, prefill_ms_per_token=1, decode_fixed_ms=10, decode_ms_per_seq=1, bytes_per_token=1)


def test_preemption_recomputes_and_the_preempted_goes_back_to_the_front():
    """4 blocks of 2 tokens; A, B run, C waits for a slot. At step 3 A's 3rd block is missing:
    B (newest) is preempted and later resumed before C, recomputing 2 + 3 tokens."""
    eng, clock = engine(se.GrowPreempt(num_blocks=4, block_size=2, max_num_batched_tokens=100, max_model_len=100),
                        max_running=2, **TINY)
    a, b, c = (send(eng, clock, 2, 4) for _ in range(3))
    for _ in range(3):
        eng.step()
    stats = eng.stats()
    assert (stats.preemptions_total, stats.running, stats.waiting) == (1, 0, 2)
    eng.run_until_idle()
    assert ms(a) == [3.0, 18.0, 30.0, 41.0]
    # step 4 (at 41): B recomputes 5 tokens (6 ms, nothing sent), C prefills 2 (3 ms) and sends its
    # first token at 50; C's block is missing and C, the newest, preempts itself; B decodes alone.
    assert ms(b) == [6.0, 18.0, 30.0, 61.0]
    # C resumes alone at 61 with a 3-token recompute (4 ms), then decodes three times (11 ms each)
    assert ms(c) == [50.0, 76.0, 87.0, 98.0]
    assert [s.text for s in (a, b, c)] == ["a b c d "] * 3
    stats = eng.stats()
    assert (stats.preemptions_total, stats.killed_total, stats.finished_total) == (2, 0, 3)
    assert stats.prompt_tokens_total == 6  # a recompute does not count the prompt again
    assert stats.generation_tokens_total == 12 and eng.memory_free == 4


def test_the_head_waits_for_blocks_and_nothing_behind_it_jumps():
    eng, clock = engine(se.GrowPreempt(num_blocks=4, block_size=4), prefill_ms_per_token=1, decode_fixed_ms=10,
                        bytes_per_token=1)
    a = send(eng, clock, 8, 4)  # 2 blocks, then a 3rd
    b = send(eng, clock, 12, 1)  # 3 blocks: does not fit beside A
    c = send(eng, clock, 1, 1)  # 1 block would fit, but B is ahead
    eng.step()
    assert (eng.stats().running, eng.stats().waiting) == (1, 2)
    eng.run_until_idle()
    assert ms(a) == [8.0, 18.0, 28.0, 38.0]
    assert ms(b) == [50.0] and ms(c) == [51.0]
    assert eng.stats().preemptions_total == 0


def test_max_num_batched_tokens_caps_the_prefill_tokens_admitted_per_step():
    eng, clock = engine(se.GrowPreempt(num_blocks=100, block_size=16, max_num_batched_tokens=10), prefill_ms_per_token=1,
                        decode_fixed_ms=10, bytes_per_token=1)
    a, b, c = (send(eng, clock, 6, 3) for _ in range(3))
    eng.run_until_idle()
    assert ms(a) == [6.0, 16.0, 32.0]
    assert ms(b) == [22.0, 32.0, 48.0]
    assert ms(c) == [38.0, 48.0, 58.0]


def test_a_prompt_above_the_batch_budget_is_admitted_alone():
    eng, clock = engine(se.GrowPreempt(num_blocks=100, block_size=16, max_num_batched_tokens=10), prefill_ms_per_token=1,
                        decode_fixed_ms=10, bytes_per_token=1)
    big, small = send(eng, clock, 20, 1), send(eng, clock, 1, 1)
    eng.run_until_idle()
    assert ms(big) == [20.0] and ms(small) == [21.0]


def test_requests_vllm_refuses_at_once():
    eng, clock = engine(se.GrowPreempt(num_blocks=2, block_size=4, max_model_len=16), bytes_per_token=1)
    too_long = send(eng, clock, 10, 7)
    too_big = send(eng, clock, 5, 4)  # 9 tokens: 3 blocks, the cache has 2
    no_tokens = send(eng, clock, 1, 0)
    assert not eng.has_work()
    assert too_long.error_kind == "invalid" and "maximum context length is 16" in too_long.error_message
    assert too_big.error_kind == "invalid" and "cache has 2" in too_big.error_message
    assert no_tokens.error_kind == "invalid" and "at least 1" in no_tokens.error_message


def test_under_heavy_load_grow_preempt_preempts_but_finishes_everything():
    eng, clock = engine(se.GrowPreempt(num_blocks=8, block_size=4), prefill_fixed_ms=1, decode_fixed_ms=5,
                        bytes_per_token=1)
    sinks = [send(eng, clock, 8, 16) for _ in range(6)]
    eng.run_until_idle()
    stats = eng.stats()
    assert stats.preemptions_total > 0 and stats.killed_total == 0
    assert all(s.text == se.output_text(16) and s.error_message is None for s in sinks)
    assert stats.finished_total == 6 and stats.prompt_tokens_total == 48 and eng.memory_free == 8


# -- reserve_kill (a naive backend) ------------------------------------------------------------


def test_reserve_kill_kills_what_does_not_fit_and_tries_the_next():
    eng, clock = engine(se.ReserveKill(pool_tokens=20), max_running=4, prefill_ms_per_token=1, decode_fixed_ms=10,
                        bytes_per_token=1)
    a = send(eng, clock, 8, 4)  # reserves 12 of 20
    b = send(eng, clock, 6, 4)  # 10 > 8 free: killed
    c = send(eng, clock, 2, 4)  # 6 <= 8: runs
    eng.step()
    assert eng.memory_free == 2
    eng.run_until_idle()
    assert b.error_kind == "oom" and "out of memory" in b.error_message and b.error_time == 0.0 and b.texts == []
    assert ms(a) == [8.0, 20.0, 30.0, 40.0] and ms(c) == [10.0, 20.0, 30.0, 40.0]
    assert eng.stats().killed_total == 1 and eng.memory_free == 20
    d = send(eng, clock, 16, 4)  # the reservations came back: the whole pool fits
    eng.run_until_idle()
    assert d.text == "a b c d " and eng.stats().killed_total == 1


def test_reserve_kill_waits_for_a_running_slot_rather_than_killing():
    eng, clock = engine(se.ReserveKill(pool_tokens=100), max_running=1, prefill_fixed_ms=2, decode_fixed_ms=10)
    a, b = send(eng, clock, 4, 2), send(eng, clock, 4, 2)
    eng.run_until_idle()
    assert ms(a) == [2.0, 12.0] and ms(b) == [14.0, 24.0] and eng.stats().killed_total == 0


# -- cancellation, gone clients, the thread ----------------------------------------------------


def test_a_cancelled_sequence_is_freed_at_its_next_check():
    eng, clock = engine(se.GrowPreempt(num_blocks=4, block_size=4), cancel_check_every=2, decode_fixed_ms=1,
                        bytes_per_token=1)
    sink = send(eng, clock, 4, 10, CancelAfter(clock, 3))
    eng.run_until_idle()
    # asked at admission (0 tokens), after 2 (not yet) and after 4 tokens (cancelled)
    assert sink.error_kind == "cancelled" and len(sink.texts) == 4 and sink.asked == 3
    assert eng.memory_free == 4 and eng.stats().running == 0
    follow = send(eng, clock, 4, 12)  # needs the whole cache: it was freed
    eng.run_until_idle()
    assert len(follow.texts) == 12


def test_a_client_that_is_gone_stops_its_sequence_and_nothing_else():
    eng, clock = engine(se.ReserveKill(pool_tokens=100), decode_fixed_ms=1)
    gone, fine = send(eng, clock, 4, 5, GoneSink(clock)), send(eng, clock, 4, 5)
    eng.run_until_idle()
    assert gone.texts == [] and fine.text == se.output_text(5) and eng.memory_free == 100


def test_the_engine_thread_serves_real_time_and_stops_cleanly():
    cfg = se.EngineConfig(costs=se.Costs(prefill_fixed_ms=1, decode_fixed_ms=1), policy=se.ReserveKill(pool_tokens=100),
                          max_running=4)
    eng = se.Engine(cfg)
    eng.start()
    sinks = [se.CollectingSink() for _ in range(3)]
    senders = [threading.Thread(target=eng.submit, args=(b"hello", 5, s)) for s in sinks]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    assert all(s.done.wait(5) for s in sinks)
    eng.stop()
    assert [s.text for s in sinks] == [se.output_text(5)] * 3
    late = se.CollectingSink()
    assert eng.submit(b"late", 2, late) is False and late.error_kind == "unavailable"
