"""Fleet arithmetic: the hand calculation, redone here, matches what `tritongen plan` prints.

The fixture profiles (RANKER, TINYLLM in tests/helpers.py) follow tritongen/core/profile_types.py
(`Profile`): `load_levels` for the classic ranker, `streaming.levels` for the streaming tinyllm.
The example spec's tightest class (interactive) has a 250 ms P99 target, TTFT for the streaming
model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, RANKER, TINYLLM, run_cli
from tritongen.core.capacity import (
    DailyCurve,
    ModelDemand,
    ceil_div,
    check_safety_factor,
    plan_capacity,
    prewarm_schedule,
    throughput_at_target,
)
from tritongen.core.profile_types import Profile
from tritongen.errors import BadInput, Infeasible

SPEC = EXAMPLES / "deployment.yaml"
CURVE = EXAMPLES / "traffic" / "daily-curve.yaml"


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    (tmp_path / "ranker.json").write_text(json.dumps(RANKER))
    (tmp_path / "tinyllm.json").write_text(json.dumps(TINYLLM))
    (tmp_path / "summary.json").write_text(json.dumps({"not": "a profile"}))  # skipped: no schema_version
    return tmp_path


# ---------------------------------------------------------------------------------------------
# The hand calculation (example spec, --peak-qps ranker=2600 --peak-qps tinyllm=40, safety 0.8,
# hot 0.7, the example daily curve with its 240 s cold start)
#
#   ranker:  1250 req/s at p99 180 ms <= 250 ms; x 0.8 = 1000 req/s per pod
#            pods = ceil(2600 / 1000) = ceil(2.6) = 3; hot = ceil(0.7 x 2600 / 1000) = ceil(1.82) = 2
#   tinyllm: 4 streams: 120 requests / 10 s = 12 req/s at TTFT p99 120 ms <= 250; x 0.8 = 9.6
#            pods = ceil(40 / 9.6) = ceil(4.1667) = 5; hot = ceil(28 / 9.6) = ceil(2.9167) = 3
#   fleet:   pods = max(3, 5) = 5 (binding tinyllm); hot = max(2, 3) = 3; cold = 5 - 3 = 2; GPUs 0
#   curve:   pods(f) = max(ceil(f x 2600 / 1000), ceil(f x 40 / 9.6))
#            0.8 -> max(3, 4) = 4, cold 1;  0.9 -> max(3, 4) = 4, cold 1;  1.0 -> max(3, 5) = 5, cold 2
#            0.7 -> max(2, 3) = 3, cold 0 (and everything lower)
#            stretches: 08:00-09:00 cold 1, 09:00-12:00 cold 2, 12:00-18:00 cold 1 (0.8, 0.8, 0.9 x4)
#            lead = ceil(240 / 60) = 4 min: scale up at 07:56, 08:56, 11:56

HAND_PODS = max(math.ceil(2600 / (1250 * 0.8)), math.ceil(40 / (12 * 0.8)))
HAND_HOT = max(math.ceil(0.7 * 2600 / 1000), math.ceil(0.7 * 40 / 9.6))


def test_hand_numbers_are_what_the_comment_says() -> None:
    assert (HAND_PODS, HAND_HOT) == (5, 3)


def test_throughput_at_target_takes_the_best_level_within_target_without_errors() -> None:
    ranker = throughput_at_target(Profile.model_validate(RANKER), 250.0)
    assert ranker.requests_per_s == 1250.0
    assert "concurrency 64" in ranker.source
    tiny = throughput_at_target(Profile.model_validate(TINYLLM), 250.0)
    assert tiny.requests_per_s == pytest.approx(12.0)
    with pytest.raises(Infeasible, match="no measured load level met the P99 target of 5 ms"):
        throughput_at_target(Profile.model_validate(RANKER), 5.0)


def test_plan_reproduces_the_hand_calculation(profiles: Path) -> None:
    result = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "ranker=2600",
                 "--peak-qps", "tinyllm=40", "--daily-curve", str(CURVE))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected_lines = [
        "ranker: capacity per pod = 1250 x 0.8 = 1000 req/s; pods = ceil(2600 / 1000) = ceil(2.6) = 3; "
        "instances = 3 x 1 = 3; GPUs = 3 x 0 = 0",
        "ranker: hot = ceil(0.7 x 2600 / 1000) = ceil(1.82) = 2",
        "tinyllm: capacity per pod = 12 x 0.8 = 9.6 req/s; pods = ceil(40 / 9.6) = ceil(4.1667) = 5; "
        "instances = 5 x 1 = 5; GPUs = 5 x 0 = 0",
        "tinyllm: hot = ceil(0.7 x 40 / 9.6) = ceil(2.9167) = 3",
        "fleet: every pod serves every model, so pods = max(ranker 3, tinyllm 5) = 5 (binding: tinyllm)",
        "hot pool = max(2, 3, 1) = 3 pods (0.7 of the daily peak, resident); cold pool = 5 - 3 = 2 pods at most (elastic)",
        "GPUs = 5 pods x 0 per pod = 0 (hot 0, cold up to 0)",
        f"cold start 240 s (from {CURVE}) -> scale up ceil(240 / 60) = 4 min before each "
        "stretch that needs cold pods",
        "08:00-09:00 at 0.8 of peak: pods = max(ceil(0.8 x 2600 / 1000) = 3, ceil(0.8 x 40 / 9.6) = 4) = 4; "
        "cold = 4 - 3 = 1; scale up at 07:56 (08:00 - 4 min), release at 09:00",
        "09:00-12:00 at 1 of peak: pods = max(ceil(1 x 2600 / 1000) = 3, ceil(1 x 40 / 9.6) = 5) = 5; "
        "cold = 5 - 3 = 2; scale up at 08:56 (09:00 - 4 min), release at 12:00",
        "12:00-18:00 at 0.9 of peak: pods = max(ceil(0.9 x 2600 / 1000) = 3, ceil(0.9 x 40 / 9.6) = 4) = 4; "
        "cold = 4 - 3 = 1; scale up at 11:56 (12:00 - 4 min), release at 18:00",
    ]
    for line in expected_lines:
        assert line in out, f"missing line:\n{line}\n--- output ---\n{out}"
    assert "safety factor 0.80 (allowed 0.70-0.85)" in out
    assert "1250 req/s per pod (concurrency 64: 1250 req/s, p99 180.0 ms <= 250 ms target)" in out
    assert f"fleet: {HAND_PODS} pods (0 GPUs) = hot {HAND_HOT} resident + cold up to 2 elastic" in out


def test_plan_json_carries_the_same_numbers(profiles: Path) -> None:
    result = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "ranker=2600",
                 "--peak-qps", "tinyllm=40", "--daily-curve", str(CURVE), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["pods"], plan["hot_pods"], plan["cold_max"], plan["binding_model"]) == (5, 3, 2, "tinyllm")
    assert [(s["start"], s["end"], s["cold_pods"], s["scale_up"]) for s in plan["prewarm"]] == [
        ("08:00", "09:00", 1, "07:56"), ("09:00", "12:00", 2, "08:56"), ("12:00", "18:00", 1, "11:56"),
    ]
    assert plan["timezone"] == "Europe/Berlin"


def test_one_peak_for_every_model_and_refusals(profiles: Path) -> None:
    result = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "40", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert {m["model"]: m["pods"] for m in plan["models"]} == {"ranker": 1, "tinyllm": 5}
    bad = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "40", "--safety-factor", "0.95")
    assert bad.returncode == 2 and "outside 0.7-0.85" in bad.stderr
    unknown = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "nosuch=3")
    assert unknown.returncode == 2 and "not models of the spec" in unknown.stderr
    (profiles / "tinyllm.json").unlink()
    missing = run_cli("plan", str(SPEC), "--profiles", str(profiles), "--peak-qps", "40")
    assert missing.returncode == 2 and "no profile for model entries ['tinyllm']" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_ceil_is_robust_to_float_noise() -> None:
    assert ceil_div(3.0000000000000004, 1.0) == 3
    assert ceil_div(2400, 800) == 3
    assert ceil_div(2401, 800) == 4
    assert ceil_div(0, 5) == 0


def test_safety_factor_range() -> None:
    assert check_safety_factor(0.7) == 0.7 and check_safety_factor(0.85) == 0.85
    for bad in (0.69, 0.86, 1.0):
        with pytest.raises(BadInput, match="outside"):
            check_safety_factor(bad)


def _demand(name: str, peak: float, thr: float) -> ModelDemand:
    return ModelDemand(model=name, peak_qps=peak, throughput_per_s=thr, target_ms=100, source="test",
                       instances_per_pod=2, gpus_per_pod=1)


def test_gpu_fleet_and_per_model_instances() -> None:
    plan = plan_capacity([_demand("a", 1000, 125), _demand("b", 100, 200)], gpus_per_pod=2)
    a, b = plan.models
    assert (a.capacity_per_pod, a.pods, a.instances, a.gpus) == (100, 10, 20, 10)
    assert (b.pods, b.hot_pods) == (1, 1)  # ceil(100 / 160) = 1; ceil(70 / 160) = 1
    assert (plan.pods, plan.hot_pods, plan.cold_max, plan.gpus) == (10, 7, 3, 20)
    assert (plan.hot_gpus, plan.cold_gpus) == (14, 6)


def test_points_curve_sizes_each_stretch_for_its_higher_end_and_wraps_midnight() -> None:
    curve = DailyCurve.model_validate({"points": [
        {"time": "06:00", "fraction": 0.2}, {"time": "09:00", "fraction": 1.0},
        {"time": "18:00", "fraction": 0.5}, {"time": "23:00", "fraction": 0.9},
    ]})
    segs = curve.segments()
    assert segs[0] == (0, 360, 0.9)  # 23:00 -> 06:00 wraps: max(0.9, 0.2)
    assert (360, 540, 1.0) in segs and (540, 1080, 1.0) in segs and (1080, 1380, 0.9) in segs
    assert segs[-1] == (1380, 1440, 0.9)
    assert sum(e - s for s, e, _ in segs) == 24 * 60


def test_prewarm_merges_a_stretch_over_midnight_and_wraps_the_lead() -> None:
    plan = plan_capacity([_demand("a", 1000, 125)], gpus_per_pod=1, hot_fraction=0.5,
                         curve=DailyCurve.model_validate({"hourly": [1.0] + [0.1] * 22 + [1.0]}), cold_start_s=600)
    # pods 10, hot 5: hours 23 and 0 need 10 pods -> one stretch 23:00-01:00, scale up at 22:50
    assert [(s.start_min, s.end_min, s.cold_pods, s.scale_up_min) for s in plan.prewarm] == [(23 * 60, 60, 5, 22 * 60 + 50)]
    assert plan.prewarm[0].scale_up_cron == "50 22 * * *" and plan.prewarm[0].end_cron == "0 1 * * *"


def test_curve_refusals() -> None:
    with pytest.raises(ValueError, match="24 factors"):
        DailyCurve.model_validate({"hourly": [0.5] * 23})
    with pytest.raises(ValueError, match="not both or neither"):
        DailyCurve.model_validate({})
    with pytest.raises(ValueError, match="HH:MM"):
        DailyCurve.model_validate({"points": [{"time": "7h", "fraction": 1}, {"time": "08:00", "fraction": 1}]})
    with pytest.raises(ValueError, match="zero all day"):
        DailyCurve.model_validate({"hourly": [0.0] * 24})


def test_no_prewarm_when_the_hot_pool_covers_the_curve() -> None:
    plan = plan_capacity([_demand("a", 100, 125)], gpus_per_pod=1, hot_fraction=1.0,
                         curve=DailyCurve.model_validate({"hourly": [1.0] * 24}))
    assert plan.cold_max == 0 and plan.prewarm == []
    assert any("no pre-warm needed" in line for line in plan.lines)
    assert prewarm_schedule(plan.models, DailyCurve.model_validate({"hourly": [0.5] * 24}), plan.hot_pods, 5) == []
