"""What the profile infers where an engine exports no gauge: bytes per token from token counts,
KV capacity from a probe whose only signal is token timing (Triton's own vLLM backend)."""

from __future__ import annotations

import pytest

from tritongen.core.engine_inference import (
    ProbeRun,
    UsageRead,
    bytes_per_token_from_counts,
    capacity_from_probe,
    capacity_from_usage,
    tokens_added_per_prompt,
    counter_delta,
    only_timing_says_no,
    run_fits,
    stall_steps,
)


def test_bytes_per_token_is_the_slope_so_a_bos_token_does_not_count():
    # a tokenizer of 4 bytes per token that adds one BOS token to every prompt
    samples = [(128, 128 / 4 + 1), (512, 512 / 4 + 1)]
    assert bytes_per_token_from_counts(samples) == pytest.approx(4.0)
    # one size: the plain ratio (the BOS token then counts)
    assert bytes_per_token_from_counts([(512, 129)]) == pytest.approx(512 / 129)


POOL_BLOCKS, BLOCK = 168, 16


def held(streams: int) -> float:
    """The usage gauge while `streams` streams hold 5 blocks each."""
    return streams * 5 / POOL_BLOCKS


def test_the_usage_probe_believes_the_largest_read_because_the_gauge_lags_the_tokens():
    # CI, 2026-12-07: every client had its 2nd token while the gauge still showed the step before,
    # when one stream held its 5 blocks; the next reads show all four
    reads = [UsageRead(held(1), (3, 2, 2, 2)), UsageRead(held(4), (3, 3, 3, 3)), UsageRead(held(4), (5, 4, 4, 4))]
    assert capacity_from_usage(reads, 4, BLOCK) == POOL_BLOCKS * BLOCK


def test_the_usage_probe_needs_reads_over_a_window_in_which_the_engine_stepped():
    # one read just as the streams began could be a lagging one: no answer rather than a wrong one
    assert capacity_from_usage([UsageRead(held(1), (2, 2, 2, 2))], 4, BLOCK) is None
    assert capacity_from_usage([UsageRead(held(1), (2, 2, 2, 2)), UsageRead(held(1), (3, 3, 3, 3))], 4, BLOCK) is None
    assert capacity_from_usage([], 4, BLOCK) is None


def test_the_usage_probe_ignores_reads_outside_the_five_block_window():
    # a read before every stream had its 2nd token, one after a stream may have taken a 6th block,
    # one missing a stream, and a gauge that has not risen
    outside = [UsageRead(held(2), (1, 2, 2, 2)), UsageRead(held(5), (11, 9, 9, 9)), UsageRead(held(3), (4, 4, 4)),
               UsageRead(0.0, (4, 4, 4, 4))]
    inside = [UsageRead(held(4), (2, 2, 2, 2)), UsageRead(held(4), (4, 4, 4, 4))]
    assert capacity_from_usage(outside, 4, BLOCK) is None
    assert capacity_from_usage(outside + inside, 4, BLOCK) == POOL_BLOCKS * BLOCK


def test_the_tokens_an_engine_adds_to_every_prompt_are_the_counts_beyond_the_slope():
    # 4 bytes per token, and one BOS token on every prompt
    assert tokens_added_per_prompt([(128, 128 / 4 + 1), (512, 512 / 4 + 1)]) == 1
    assert tokens_added_per_prompt([(128, 32), (512, 128)]) == 0
    assert tokens_added_per_prompt([(512, 129)]) is None  # one size: the two cannot be told apart
    assert tokens_added_per_prompt([]) is None


def test_bytes_per_token_needs_counts_that_grow():
    assert bytes_per_token_from_counts([]) is None
    assert bytes_per_token_from_counts([(128, 0.0)]) is None
    assert bytes_per_token_from_counts([(128, 40.0), (512, 40.0)]) is None


def test_counter_delta_from_a_prompt_tokens_counter():
    assert counter_delta(1000.0, 1129.0) == 129.0
    assert counter_delta(None, 5.0) is None  # the backend does not export it
    assert counter_delta(10.0, 3.0) == 0.0  # a restarted server resets its counters


def streams(n: int, tokens: int, step: float, start_lag: float = 0.0, park: tuple[int, int, float] | None = None):
    """n streams stepping together; `park` = (stream, at token, seconds) holds one stream back."""
    out = []
    for i in range(n):
        t = 0.01 + start_lag * i
        times = []
        for k in range(tokens):
            if park and park[0] == i and park[1] == k:
                t += park[2]
            times.append(t)
            t += step
        out.append(tuple(times))
    return tuple(out)


def test_streams_that_all_advance_fit():
    run = ProbeRun(streams=8, prompt=100, output=64, token_times=streams(8, 64, 0.01, start_lag=0.01))
    assert stall_steps(run) == pytest.approx(7.0, rel=0.01)  # staggered prefills: a few steps
    assert run_fits(run)


def test_a_parked_stream_means_the_pool_ran_out_without_any_counter():
    # a preempted sequence waits for another to finish: about the output's length in steps
    run = ProbeRun(streams=16, prompt=100, output=64, token_times=streams(16, 64, 0.01, park=(15, 20, 0.5)))
    assert stall_steps(run) == pytest.approx(51.0, rel=0.02)
    assert not run_fits(run)


def test_an_out_of_memory_answer_or_a_counted_preemption_means_it_did_not_fit():
    times = streams(4, 32, 0.01)
    assert not run_fits(ProbeRun(streams=4, prompt=10, output=32, token_times=times, out_of_memory=True))
    assert not run_fits(ProbeRun(streams=4, prompt=10, output=32, token_times=times, preemptions=2.0))
    assert run_fits(ProbeRun(streams=4, prompt=10, output=32, token_times=times, preemptions=0.0))


def test_only_a_parked_stream_is_weak_enough_to_be_tried_again():
    parked = streams(4, 64, 0.01, park=(3, 20, 0.5))
    assert only_timing_says_no(ProbeRun(streams=4, prompt=100, output=64, token_times=parked))
    # a definite answer from the engine is never re-run
    assert not only_timing_says_no(ProbeRun(streams=4, prompt=100, output=64, token_times=parked, out_of_memory=True))
    assert not only_timing_says_no(ProbeRun(streams=4, prompt=100, output=64, token_times=parked, preemptions=1.0))
    # and a run that fits is not a failure at all
    assert not only_timing_says_no(ProbeRun(streams=4, prompt=100, output=64, token_times=streams(4, 64, 0.01)))


def test_capacity_from_a_probe_is_the_most_streams_that_all_ran():
    def level(n: int, parked: bool) -> ProbeRun:
        return ProbeRun(streams=n, prompt=100, output=60,
                        token_times=streams(n, 60, 0.01, park=(n - 1, 10, 0.5) if parked else None))

    runs = [level(1, False), level(2, False), level(4, False), level(8, False), level(16, True),
            level(12, True), level(10, False), level(11, True)]
    verdict = capacity_from_probe(runs)
    assert verdict is not None
    assert (verdict.fits, verdict.fails) == (10, 11)
    assert verdict.capacity_tokens == 10 * 160
    assert "parked" in verdict.detail


def test_no_capacity_until_the_knee_is_bracketed():
    fine = [ProbeRun(streams=n, prompt=10, output=40, token_times=streams(n, 40, 0.01)) for n in (1, 2, 4)]
    assert capacity_from_probe(fine) is None
    assert capacity_from_probe([]) is None


def test_streams_opened_one_after_another_are_not_read_as_parked():
    # a client opens 10 streams 30 ms apart; each gets its first token 20 ms after its own send
    times = streams(10, 64, 0.01, start_lag=0.03)
    starts = tuple(t[0] - 0.02 for t in times)
    run = ProbeRun(streams=10, prompt=96, output=64, token_times=times, starts=starts)
    assert stall_steps(run) == pytest.approx(1.0, rel=0.01)
    assert run_fits(run)
    assert not run_fits(ProbeRun(streams=10, prompt=96, output=64, token_times=times))  # without send times, 27 steps apart


def test_prefills_one_after_another_are_not_read_as_parked_but_a_parked_stream_still_is():
    # a CPU engine: a 96-token prefill takes 110 ms, a decode step 10 ms; three streams sent together
    # get their first tokens 110 ms apart (the bench's "3 streams: a stream parked 22 steps")
    staggered = streams(3, 64, 0.01, start_lag=0.11)
    assert not run_fits(ProbeRun(streams=3, prompt=96, output=64, token_times=staggered))
    assert run_fits(ProbeRun(streams=3, prompt=96, output=64, token_times=staggered, prefill_s=0.11))
    # one of them also waits for another to finish (64 steps): still parked with the prefills taken off
    parked = streams(3, 64, 0.01, start_lag=0.11, park=(2, 10, 0.64))
    assert stall_steps(ProbeRun(streams=3, prompt=96, output=64, token_times=parked, prefill_s=0.11)) > 16
    assert not run_fits(ProbeRun(streams=3, prompt=96, output=64, token_times=parked, prefill_s=0.11))
