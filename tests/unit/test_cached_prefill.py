"""What an arrival with a cached prefix costs (`tritongen.core.cached_prefill`): the line fitted on
the profile's bursts, against hand-worked bursts, and the engine pricing such an arrival on it."""

from __future__ import annotations

import pytest

from tritongen.core.cached_prefill import CachedPrefillCost, fit_cached_prefill
from tritongen.core.engine import EngineModel, EngineState, LLMCurve
from tritongen.core.engine_sources import MeasuredEngine, resolve_engine
from tritongen.core.prefix_cache import PromptSharing
from tritongen.core.profile_types import ArrivalBurst

CURVE = LLMCurve(prefill_fixed_ms=1.0, prefill_ms_per_token=0.1, decode_fixed_ms=2.0, decode_ms_per_seq=1.0,
                 prefill_in_step=True)
BLOCK = 4


def model(caching: bool = True, added: int = 0) -> EngineModel:
    return EngineModel(kv_policy="grow_preempt", kv_block_tokens=BLOCK, kv_pool_blocks=64, max_num_seqs=8, curve=CURVE,
                       prefix_caching=caching, prompt_added_tokens=added)


def burst(shared: int, own: int, marginal: float, single: float = 20.0, n: int = 8) -> ArrivalBurst:
    return ArrivalBurst(shared_tokens=shared, own_tokens=own, burst=n, rounds=5, single_ms=single,
                        burst_ms=single + marginal * (n - 1), burst_spread_ms=1.0)


def cached(b: ArrivalBurst) -> tuple[int, int]:
    prompt = b.shared_tokens + b.own_tokens
    tokens = model().cacheable_blocks(prompt, b.shared_tokens) * BLOCK
    return prompt - tokens, tokens


def test_the_fit_recovers_a_line_worked_by_hand() -> None:
    # one more arrival = the decode of one more sequence (1 ms) + 5 + 0.2 x computed + 0.05 x cached
    # (40, 0): 36 cached (the last block is computed), 4 computed -> 1 + 5 + 0.8 + 1.8 = 8.6
    # (10, 0): 8 cached, 2 computed -> 1 + 5 + 0.4 + 0.4 = 6.8
    # (10, 20): 8 cached, 22 computed -> 1 + 5 + 4.4 + 0.4 = 10.8
    # (20, 20): 20 cached, 20 computed -> 1 + 5 + 4 + 1 = 11
    bursts = [burst(40, 0, 8.6), burst(10, 0, 6.8), burst(10, 20, 10.8), burst(20, 20, 11.0)]
    cost = fit_cached_prefill(bursts, cached, decode_ms_per_seq=1.0)
    assert cost is not None
    assert (cost.fixed_ms, cost.ms_per_token, cost.ms_per_cached_token) == pytest.approx((5.0, 0.2, 0.05))
    assert "40 cached + 0 own: 8.6 ms" in cost.evidence


def test_a_coefficient_the_data_put_below_zero_is_held_at_zero() -> None:
    # longer cached prefixes a little cheaper (noise): no negative price per cached token
    bursts = [burst(40, 0, 6.0), burst(10, 0, 6.5), burst(10, 20, 10.9), burst(20, 20, 10.5)]
    cost = fit_cached_prefill(bursts, cached, decode_ms_per_seq=1.0)
    assert cost is not None and cost.ms_per_cached_token == 0.0
    assert cost.fixed_ms > 0 and cost.ms_per_token > 0


def test_too_few_bursts_that_hit_the_cache_fit_nothing() -> None:
    # a prefix within one block is not served from the cache: two bursts are left, under three unknowns
    assert fit_cached_prefill([burst(3, 10, 5.0), burst(40, 0, 8.6), burst(10, 0, 6.8)], cached, 1.0) is None
    assert fit_cached_prefill([], cached, 1.0) is None


def test_the_step_prices_a_cached_arrival_on_its_line_and_a_fresh_one_on_the_prefill_line() -> None:
    line = CachedPrefillCost(fixed_ms=5.0, ms_per_token=0.2, ms_per_cached_token=0.05, evidence="by hand")
    m = model().model_copy(update={"curve": CURVE.model_copy(update={"cached_prefill": line})})
    state = EngineState(m, [12, 12], [1, 1], PromptSharing([0, 0], [10, 10], [-1, -1]))
    state.submit(0)
    t0, _ = state.step(0.0)
    state.submit(1)
    t1, _ = state.step(1.0)
    # the first computes all 12 (nothing cached yet): decode 2 + 1, prefill 1 + 0.1 x 12
    # the second finds 8 cached and computes 4: decode 2 + 1, then 5 + 0.2 x 4 + 0.05 x 8
    assert round(t0 * 1000, 6) == 5.2 and round((t1 - 1.0) * 1000, 6) == pytest.approx(9.2)


def test_the_profiles_bursts_reach_the_engine_only_where_it_caches() -> None:
    bursts = (burst(40, 0, 8.6), burst(10, 0, 6.8), burst(10, 20, 10.8), burst(20, 20, 11.0))
    measured = MeasuredEngine(curve=CURVE, kv_capacity_tokens=256, kv_block_tokens=BLOCK, prefix_caching=True,
                              arrival_bursts=bursts)
    on = resolve_engine(model="llm", backend="python", parameters={"kv_policy": "grow_preempt"}, measured=measured)
    assert on.curve.cached_prefill is not None and "bursts" in on.sources["cached prefill"]
    off = model(caching=False).with_cached_prefill(bursts)
    assert off.curve.cached_prefill is None


def test_the_engines_own_leading_tokens_count_in_the_split() -> None:
    # a BOS token leads every prompt: (40, 0) is 41 tokens, 40 cached; the fit is split that way
    bursts = [burst(40, 0, 1 + 5 + 0.2 + 2.0), burst(10, 0, 1 + 5 + 0.6 + 0.4), burst(10, 20, 1 + 5 + 4.6 + 0.4),
              burst(20, 20, 1 + 5 + 4.2 + 1.0)]
    got = model(added=1).with_cached_prefill(bursts).curve.cached_prefill
    assert got is not None
    assert (got.fixed_ms, got.ms_per_token, got.ms_per_cached_token) == pytest.approx((5.0, 0.2, 0.05))


def test_the_engines_own_counts_split_a_burst_where_the_profile_read_them() -> None:
    # said 40 + 0, counted 47 (a whole prompt of 47: 44 cached, 3 computed); said 10 + 0, counted 13
    # (12 cached, 1 computed); said 10 + 20, counted 13 + 20 = 33 (12 cached, 21 computed); 20 + 20
    # counted 21 + 22 (20 cached, 23 computed)
    line = (5.0, 0.2, 0.05)
    counts = [((40, 0), (47, 47), (3, 44)), ((10, 0), (13, 13), (1, 12)), ((10, 20), (33, 13), (21, 12)),
              ((20, 20), (43, 21), (23, 20))]
    bursts = [burst(s, o, 1 + line[0] + line[1] * c + line[2] * k).model_copy(
        update={"counted_tokens": n, "counted_shared_tokens": sh}) for (s, o), (n, sh), (c, k) in counts]
    got = model().with_cached_prefill(bursts).curve.cached_prefill
    assert got is not None
    assert (got.fixed_ms, got.ms_per_token, got.ms_per_cached_token) == pytest.approx(line)
