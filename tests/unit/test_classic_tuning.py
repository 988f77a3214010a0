"""Classic tuning calibrated on the server it tunes (issue 16): instance scaling on a shared device,
the profile's overheads in simulate/tune, the capacity objective and its live search.

Pure cases with answers computed by hand; the live counterparts are in
tests/integration/test_classic_profile.py."""

from __future__ import annotations

import pytest

from tests.helpers import ranker_inputs
from tritongen.core import profile_math as pm
from tritongen.core.profile_types import ScalingLevel
from tritongen.core.served_overheads import choose_overheads, profile_device_curve
from tritongen.core.simulator import EMBEDDED_CPU_OVERHEADS, Overheads, ServiceCurve
from tritongen.core.tune import Params, capacity_bound, capacity_factor, tune_model
from tritongen.errors import BadInput
from tritongen.profiler.classic import batch_scan_rows, batching_variant, scaled_variant, scaling_section
from tritongen.tuner.verify import CapacityProbe, search_capacity


# ---------------------------------------------------------------------------------------------
# Instance scaling


def test_a_shared_device_part_is_found_from_where_throughput_stops_growing() -> None:
    # One instance 100/s; a device part of 6 ms caps every count at 166.7/s.
    fit = pm.fit_instance_scaling([(1, 100.0), (2, 1000 / 6), (4, 1000 / 6)])
    assert fit.device_ms == pytest.approx(6.0, rel=0.01)
    assert fit.saturates_at == pytest.approx(1.667, rel=0.01)
    assert fit.max_rel_error < 0.01


def test_linear_scaling_shows_no_device_part() -> None:
    fit = pm.fit_instance_scaling([(1, 100.0), (2, 199.0), (4, 401.0)])
    assert fit.device_ms == 0.0 and fit.saturates_at is None


def test_partial_saturation_is_fitted_between_the_levels() -> None:
    # 2 instances still scale (200), 4 give 300: the cap is 300/s, a 3.33 ms device part.
    fit = pm.fit_instance_scaling([(1, 100.0), (2, 200.0), (4, 300.0)])
    assert fit.device_ms == pytest.approx(3.333, rel=0.02)
    assert pm.scaling_prediction(4, 100.0, fit.device_ms) == pytest.approx(300.0, rel=0.02)
    with pytest.raises(ValueError, match="one-instance level"):
        pm.fit_instance_scaling([(2, 100.0), (4, 150.0)])


def _level(n: int, rows: int, rate: float, exec_ms: float) -> ScalingLevel:
    return ScalingLevel(instances=n, rows=rows, concurrency=2 * n, requests=int(rate), errors=0, executions_per_s=rate, execution_ms=exec_ms)


def test_the_device_part_is_a_line_in_the_rows() -> None:
    # 1 row: 10 ms executions, device 2 ms (caps at 500/s, never reached by 4 x 100);
    # 64 rows: 40 ms executions, device 34 ms (caps at 29.4/s).
    levels = [_level(1, 1, 100, 10), _level(2, 1, 200, 10), _level(4, 1, 400, 10),
              _level(1, 64, 25, 40), _level(2, 64, 1000 / 34, 40), _level(4, 64, 1000 / 34, 40)]
    notes: list[str] = []
    section = scaling_section(levels, notes)
    assert section is not None and not notes
    one, big = section.parts
    assert one.device_ms == 0.0  # linear at one row: nothing seen
    assert big.device_ms == pytest.approx(34.0, rel=0.01)
    # the line through (1, 0) and (64, 34): 34/63 ms per row; its intercept (-0.54) clamped at 0
    assert section.device_per_row_ms == pytest.approx(34 / 63, rel=0.01)
    assert section.device_fixed_ms == 0.0
    curve, note = profile_device_curve(type("P", (), {"scaling": section, "kind": "classic", "model": "m"})())
    assert note is None and curve is not None and curve.ms(64) == pytest.approx(34 * 64 / 63, rel=0.01)


def test_one_instance_count_carries_no_fit_and_says_so() -> None:
    notes: list[str] = []
    assert scaling_section([_level(1, 1, 100, 10)], notes) is None
    assert "fewer than two instance counts" in notes[0]


def test_variants_loaded_through_the_load_api() -> None:
    served = {"name": "m", "max_batch_size": 64, "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
              "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    scaled = scaled_variant(served, 4)
    assert scaled["instance_group"] == [{"kind": "KIND_GPU", "count": 4, "gpus": [0]}]
    assert "dynamic_batching" not in scaled and served["instance_group"][0]["count"] == 1  # the original untouched
    assert batching_variant({"name": "m", "max_batch_size": 8})["dynamic_batching"] == {}
    assert batch_scan_rows(64, quick=False) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_scan_rows(64, quick=True) == [1, 4, 16, 64]
    assert batch_scan_rows(24, quick=False) == [1, 2, 4, 8, 16, 24]
    assert batch_scan_rows(0, quick=False) == []


# ---------------------------------------------------------------------------------------------
# Overheads: the profile's by default, the embedded constants only when asked


class _Measured:
    request_ms, batch_ms, request_exec_ms = 1.5, 0.4, 0.05


class _Profile:
    model, kind, server_url, engine, scaling = "m", "classic", "http://h:1", None, None
    overheads = _Measured()


def test_simulate_and_tune_use_the_profiles_overheads_and_say_so() -> None:
    ov, why = choose_overheads(None, _Profile())
    assert (ov.request_ms, ov.batch_ms, ov.request_exec_ms) == (1.5, 0.4, 0.05)
    assert ov.completion_wake_p == 1.0 and ov.release_ms == 0.0  # not measured: ideal
    assert "measured by the profile" in why
    embedded, why = choose_overheads("embedded", _Profile())
    assert embedded == EMBEDDED_CPU_OVERHEADS and "2-core" in why
    over, why = choose_overheads("batch_ms=2", _Profile())
    assert over.batch_ms == 2.0 and over.request_ms == 1.5 and "batch_ms=2" in why
    bare = type("Old", (), {"model": "m", "kind": "classic", "server_url": "u", "overheads": None, "engine": None})()
    none, why = choose_overheads(None, bare)
    assert none == Overheads() and "ideal server" in why and "--overheads embedded" in why
    with pytest.raises(BadInput, match="request_ms"):
        choose_overheads("request_ms=-1", _Profile())
    with pytest.raises(BadInput, match="key=value"):
        choose_overheads("fast", _Profile())
    _, note = profile_device_curve(_Profile())
    assert note is not None and "linearly" in note


# ---------------------------------------------------------------------------------------------
# The capacity objective


def test_a_device_curve_caps_the_capacity_bound_and_the_simulated_capacity() -> None:
    p = Params(max_batch_size=8, preferred=(4, 8), delay_us=2000, instances=2, policy="strict")
    free = ranker_inputs(200.0)
    shared = ranker_inputs(200.0, device_curve=ServiceCurve(fixed_ms=4.0, per_item_ms=0.25))  # all of the curve
    assert capacity_bound(shared, p) < capacity_bound(free, p)
    # a device part as long as the curve: two instances carry what one does, but for the
    # per-execution overhead (0.5 ms of ~6 ms) that overlaps
    one = capacity_factor(shared, p.model_copy(update={"instances": 1}), shared.arrivals)
    two = capacity_factor(shared, p, shared.arrivals)
    assert one < two < 1.3 * one
    assert capacity_factor(free, p, free.arrivals) > 1.3 * two


def test_objective_capacity_ranks_by_the_highest_rate_within_targets_even_above_the_traffic() -> None:
    # 12000 req/s is beyond every candidate (two instances of 32 rows: 5333/s at most): the default objective has nothing feasible, the
    # capacity objective still finds the config that carries the most within every target.
    from dataclasses import replace

    from tritongen.core.traffic import scale_rate

    slow = ranker_inputs(200.0, objective="capacity")
    inputs = replace(slow, arrivals=scale_rate(slow.arrivals, 60.0))
    result = tune_model(inputs, top_coarse=2, capacity_top=2)
    assert result.objective == "capacity"
    caps = [e.capacity_factor or 0.0 for e in result.table]
    assert caps == sorted(caps, reverse=True) and caps[0] > 0.0
    assert 0.0 < result.winner.capacity_factor < 1.0
    assert any("needs about" in n for n in result.notes)
    # the capacity, simulated once more at that rate, meets the targets
    from tritongen.core.tune import evaluate
    assert evaluate(inputs, result.winner.params, scale_rate(inputs.arrivals, result.winner.capacity_factor))[0].feasible


def test_the_live_capacity_search_brackets_the_rate_that_passes() -> None:
    true = 1.37  # every rate up to this passes

    def probe(f: float) -> CapacityProbe:
        return CapacityProbe(factor=f, passed=f <= true, throughput_per_s=f * 100, detail="")

    found, probes = search_capacity(probe, start=1.0, max_runs=8)
    assert found <= true and found > true / 1.05
    found_down, _ = search_capacity(probe, start=2.5, max_runs=8)
    assert found_down <= true and found_down > true / 1.15
    nothing, probes = search_capacity(lambda f: CapacityProbe(f, False, 0.0, ""), start=1.0, max_runs=3)
    assert nothing == 0.0 and len(probes) == 3


def test_the_search_skips_instances_a_shared_device_cannot_use() -> None:
    from tritongen.core.tune.candidates import coarse_candidates, useful_instances

    # 4 + 0.25 x 8 = 6 ms executions (+0.5 ms batch overhead), 5 ms of them on the device at 8 rows:
    # two instances keep it busy, a third may wait on the host side, a fourth adds nothing.
    shared = ranker_inputs(200.0, max_instances=4, device_curve=ServiceCurve(fixed_ms=3.0, per_item_ms=0.25))
    assert useful_instances(shared, 8) == 3
    assert max(p.instances for p in coarse_candidates(shared) if p.max_batch_size == 8) == 3
    free = ranker_inputs(200.0, max_instances=4)
    assert max(p.instances for p in coarse_candidates(free) if p.max_batch_size == 8) == 4


def test_a_closed_loops_rate_comes_from_the_spacing_of_its_completions() -> None:
    # Four completions 107 ms apart in a 0.4 s span: 9.35/s, where a count per span says 10/s.
    done = [0.05, 0.157, 0.264, 0.371]
    assert pm.completion_rate(done, 0.4) == pytest.approx(1 / 0.107, rel=1e-6)
    assert pm.completion_rate([0.1, 0.2], 0.4) == pytest.approx(5.0)
    assert pm.completion_rate([], 0.4) == 0.0
