"""Pure profile arithmetic: fits, percentiles, knees, window agreement, stats deltas, pads."""

from __future__ import annotations

import math
import random

import pytest

from tritongen.core import profile_math as pm
from tritongen.core.profile_types import CurveFit, CurvePoint, Profile, ProfileSettings, read_profile


def _points(costs: dict[int, float], count: int = 20) -> list[CurvePoint]:
    return [CurvePoint(batch_size=b, count=count, compute_infer_ms=y, compute_total_ms=y + 0.2) for b, y in costs.items()]


# ---------------------------------------------------------------------------------------------
# Fits


def test_linear_fit_recovers_fixed_and_per_item_costs_exactly():
    xs = [1, 2, 4, 8, 16, 32]
    ys = [4.0 + 0.25 * x for x in xs]
    fit = pm.fit_linear(xs, ys)
    assert fit.kind == "linear"
    assert fit.overhead_ms == pytest.approx(4.0, abs=1e-9)
    assert fit.per_item_ms == pytest.approx(0.25, abs=1e-9)
    assert fit.max_rel_error == pytest.approx(0.0, abs=1e-12)
    assert fit.predict(10) == pytest.approx(6.5)


def test_linear_fit_with_noise_stays_close_and_reports_its_error():
    rng = random.Random(3)
    xs = [b for b in (1, 2, 4, 8, 16, 32) for _ in range(5)]
    ys = [(4.0 + 0.25 * x) * (1 + rng.uniform(-0.03, 0.03)) for x in xs]
    fit = pm.fit_linear(xs, ys)
    assert fit.overhead_ms == pytest.approx(4.0, rel=0.05)
    assert fit.per_item_ms == pytest.approx(0.25, rel=0.05)
    assert 0 < fit.mean_rel_error <= fit.max_rel_error <= 0.06


def test_weights_follow_counts():
    # A rarely formed batch size with an outlying time moves the line less than a common one.
    xs, ys = [1, 8, 16], [4.25, 6.0, 12.0]
    light = pm.fit_linear(xs, ys, counts=[100, 100, 1])
    heavy = pm.fit_linear(xs, ys, counts=[100, 100, 100])
    assert light.per_item_ms < heavy.per_item_ms


def test_line_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="two distinct"):
        pm.fit_linear([4, 4], [5.0, 5.1])


def test_piecewise_fit_finds_the_bend():
    # 2 ms + 0.1 ms/item up to 16, then 0.5 ms/item (a saturated device).
    def cost(b: float) -> float:
        return 2.0 + 0.1 * b + (0.4 * (b - 16) if b > 16 else 0.0)

    xs = [1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64]
    ys = [cost(x) for x in xs]
    bent = pm.fit_piecewise(xs, ys)
    assert bent is not None and bent.kind == "piecewise"
    assert bent.breakpoint == 16
    assert bent.overhead_ms == pytest.approx(2.0, abs=1e-9)
    assert bent.per_item_ms == pytest.approx(0.1, abs=1e-9)
    assert bent.per_item_ms_after == pytest.approx(0.5, abs=1e-9)
    assert bent.predict(40) == pytest.approx(cost(40))
    chosen = pm.fit_curve(_points({int(x): y for x, y in zip(xs, ys)}))
    assert chosen is not None and chosen.kind == "piecewise"
    assert chosen.alternative and chosen.alternative.startswith("linear")


def test_fit_curve_keeps_the_line_when_the_data_is_straight():
    fit = pm.fit_curve(_points({b: 4.0 + 0.25 * b for b in (1, 2, 4, 8, 16, 32)}))
    assert fit is not None and fit.kind == "linear"
    assert fit.overhead_ms == pytest.approx(4.0)
    assert fit.per_item_ms == pytest.approx(0.25)
    assert fit.alternative and fit.alternative.startswith("piecewise")


def test_fit_curve_drops_rare_batch_sizes_when_enough_remain():
    points = _points({1: 4.25, 8: 6.0, 16: 8.0}) + [
        CurvePoint(batch_size=5, count=1, compute_infer_ms=50.0, compute_total_ms=50.0)
    ]
    fit = pm.fit_curve(points)
    assert fit is not None
    assert fit.points == 3
    assert fit.per_item_ms == pytest.approx(0.25)


def test_a_falling_segment_is_never_chosen():
    # Seen on the real server: a slow (cold) batch-1 mean made a "bend" with a negative slope.
    points = _points({1: 5.45, 4: 5.38, 8: 6.51, 9: 6.81, 16: 8.41})
    bent = pm.fit_piecewise([p.batch_size for p in points], [p.compute_infer_ms for p in points])
    assert bent is None or (bent.per_item_ms >= 0 and bent.per_item_ms_after >= 0)
    fit = pm.fit_curve(points)
    assert fit is not None and fit.per_item_ms > 0


def test_fit_curve_with_one_batch_size_is_none():
    assert pm.fit_curve(_points({8: 6.0})) is None
    assert pm.fit_piecewise([1, 2, 3], [1.0, 2.0, 3.0]) is None


# ---------------------------------------------------------------------------------------------
# Percentiles and windows


def test_percentile_matches_linear_interpolation():
    data = [float(v) for v in range(1, 101)]
    assert pm.percentile(data, 50) == pytest.approx(50.5)
    assert pm.percentile(data, 99) == pytest.approx(99.01)
    assert pm.percentile(data, 0) == 1.0 and pm.percentile(data, 100) == 100.0
    assert pm.percentile([7.0], 90) == 7.0
    assert pm.percentile([], 50) is None
    with pytest.raises(ValueError):
        pm.percentile(data, 101)


def test_percentiles_ms_converts_seconds():
    p50, p99 = pm.percentiles_ms([0.001, 0.002, 0.003], (50, 99))
    assert p50 == pytest.approx(2.0)
    assert p99 == pytest.approx(2.98)


def test_windows_agree_within_tolerance():
    assert pm.windows_agree(100, 109)
    assert not pm.windows_agree(100, 112)
    assert pm.windows_agree(0, 0)
    assert pm.windows_agree(100, 130, tolerance=0.3)


def test_level_done_needs_agreement_or_the_cap():
    assert pm.level_done([100], 2, 5) == (False, False)
    assert pm.level_done([100, 104], 2, 5) == (True, True)
    assert pm.level_done([100, 150], 2, 5) == (False, False)
    assert pm.level_done([100, 150, 80, 120, 60], 2, 5) == (True, False)
    assert pm.level_done([100, 101], 3, 5) == (False, True)  # agreed, but not enough windows yet
    with pytest.raises(ValueError):
        pm.level_done([1.0], 3, 2)


def test_window_counts_and_gaps():
    assert pm.window_counts([0.1, 0.5, 1.2, 1.9, 2.5, -1.0], start=0.0, window_s=1.0, windows=2) == [2, 2]
    assert pm.inter_token_gaps([1.0, 1.5, 1.75]) == [0.5, 0.25]
    assert pm.inter_token_gaps([1.0]) == []


# ---------------------------------------------------------------------------------------------
# Triton's batch_stats


def _stats(entries: dict[int, tuple[int, int]]) -> list[dict]:
    return [
        {
            "batch_size": b,
            "compute_input": {"count": c, "ns": c * 100_000},
            "compute_infer": {"count": c, "ns": ns},
            "compute_output": {"count": c, "ns": c * 50_000},
        }
        for b, (c, ns) in entries.items()
    ]


def test_batch_stats_delta_and_curve_points():
    before = _stats({1: (10, 10 * 4_250_000), 8: (5, 5 * 6_000_000)})
    after = _stats({1: (10, 10 * 4_250_000), 8: (25, 5 * 6_000_000 + 20 * 6_100_000), 16: (4, 4 * 8_000_000)})
    delta = pm.batch_stats_delta(before, after)
    assert list(delta) == [8, 16]  # batch size 1 did not run in between
    assert delta[8].count == 20 and delta[8].infer_ns == 20 * 6_100_000
    points = pm.curve_points(delta)
    assert [p.batch_size for p in points] == [8, 16]
    assert points[0].compute_infer_ms == pytest.approx(6.1)
    assert points[0].compute_total_ms == pytest.approx(6.25)
    assert pm.mean_batch_size(delta) == pytest.approx((8 * 20 + 16 * 4) / 24)
    merged = pm.merge_deltas([delta, {8: pm.BatchDelta(1, 7_000_000, 7_000_000)}])
    assert merged[8].count == 21
    assert pm.mean_batch_size({}) is None


# ---------------------------------------------------------------------------------------------
# Knee


def test_knee_is_the_first_level_where_latency_outgrows_throughput():
    # Throughput doubles with clients up to 8, then flattens; p99 stays flat, then climbs.
    levels = [(1, 100.0, 10.0), (2, 200.0, 10.5), (4, 390.0, 11.0), (8, 700.0, 12.0), (16, 760.0, 22.0), (32, 770.0, 45.0)]
    knee = pm.find_knee(levels)
    assert knee.concurrency == 16
    assert knee.latency_slopes[0] is None and knee.throughput_slopes[0] is None
    assert knee.latency_slopes[4] == pytest.approx(math.log(22 / 12) / math.log(2))
    assert knee.throughput_slopes[4] == pytest.approx(math.log(760 / 700) / math.log(2))


def test_no_knee_while_throughput_keeps_up():
    levels = [(1, 100.0, 10.0), (2, 200.0, 10.0), (4, 400.0, 10.2)]
    assert pm.find_knee(levels).concurrency is None
    assert pm.find_knee([(1, 100.0, None), (2, 150.0, 20.0)]).concurrency is None


# ---------------------------------------------------------------------------------------------
# Memory


def test_recommended_pad_is_peak_times_margin_rounded_up():
    assert pm.recommended_pad_mb(2 * pm.MIB, 1.25) == pytest.approx(2.5)
    assert pm.recommended_pad_mb(1_000_000, 1.25) == pytest.approx(1.2)  # 1.1921 -> 1.20
    assert pm.recommended_pad_mb(0) == 0.0
    with pytest.raises(ValueError):
        pm.recommended_pad_mb(100, 0.9)
    with pytest.raises(ValueError):
        pm.recommended_pad_mb(-1)


def test_bytes_per_token_and_relative_difference():
    assert pm.bytes_per_token_from_delta(33_554_432, 65_536) == 512.0
    assert pm.relative_difference(515.0, 512) == pytest.approx(3 / 512)
    assert pm.relative_difference(515.0, None) is None
    with pytest.raises(ValueError):
        pm.bytes_per_token_from_delta(100, 0)


def test_paged_accounting():
    assert pm.blocks_needed([128, 130, 0], 16) == 8 + 9
    assert pm.paged_bytes_per_token(17, 16, 512, 258) == pytest.approx(17 * 16 * 512 / 258)
    assert pm.paged_bytes_per_token(1, 16, 512, 0) is None
    assert pm.probe_blocks(32 * pm.MIB, 16, 512) == 4096
    assert pm.probe_blocks(1, 16, 512) == 1


def test_prefill_lengths_double_and_end_at_the_longest():
    assert pm.prefill_lengths(255, count=6) == [16, 32, 64, 128, 255]
    assert pm.prefill_lengths(255, count=4) == [16, 32, 64, 255]
    assert pm.prefill_lengths(10) == [10]
    assert pm.peak_delta(100, 90) == 0 and pm.peak_delta(100, 150) == 50


# ---------------------------------------------------------------------------------------------
# The profile type


def test_profile_round_trips_and_rejects_unknown_versions():
    settings = ProfileSettings(
        quick=True, concurrency_levels=[1], stream_concurrency_levels=[1], warmup_s=0.1, window_s=0.2,
        min_windows=1, max_windows=2, agreement=0.1, pad_margin=1.25, kv_probe_mb=0, seed=0,
    )
    fit = CurveFit(kind="linear", overhead_ms=4, per_item_ms=0.25, max_rel_error=0, mean_rel_error=0, points=2)
    profile = Profile(
        model="m", kind="classic", server_version="2.51.0", server_url="http://x", created_at="2024-01-01T00:00:00Z",
        tritongen_version="0", complete=True, duration_s=1.0, max_batch_size=8, settings=settings, fit=fit,
    )
    again = read_profile(profile.model_dump_json())
    assert again == profile
    data = profile.model_dump(mode="json")
    data["schema_version"] = 2
    with pytest.raises(Exception, match="schema_version"):
        Profile.model_validate(data)
