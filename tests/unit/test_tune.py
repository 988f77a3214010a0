"""The tuner: candidates, constraints, ranking and the way back to a rendered config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import EXAMPLES, ranker_inputs, run_cli
from tests.helpers import TUNE_CLASSES as CLASSES
from tests.helpers import TUNE_PLAN as PLAN
from tests.helpers import TUNE_SPEC as SPEC
from tests.helpers import tune_traffic as traffic
from tritongen.core.plan import plan_deployment
from tritongen.core.engine import EngineModel, LLMCurve
from tritongen.core.simulator import Overheads, ServiceCurve
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.core.tune import (
    Params,
    TuneInputs,
    apply_candidate,
    apply_results,
    baseline_params,
    capacity_factor,
    evaluate,
    memory_budget,
    queue_policies,
    tune_model,
)
from tritongen.core.tune.candidates import delay_options, powers_of_two, preferred_options
from tritongen.pbtxt import parse_model_config
from tritongen.render import render_plan
from tritongen.specio import load_spec



def test_search_grids() -> None:
    assert powers_of_two(1, 32) == [1, 2, 4, 8, 16, 32]
    assert powers_of_two(2, 24) == [2, 4, 8, 16, 24]
    assert preferred_options(16) == [(), (8, 16), (4, 8, 16)]
    assert preferred_options(1) == [()]
    # windows up to a quarter of the tightest target (250 ms -> 62.5 ms)
    assert max(delay_options(CLASSES)) == 32_000
    assert delay_options(CLASSES)[0] == 0


def test_a_light_load_is_feasible_and_the_winner_meets_every_target() -> None:
    result = tune_model(ranker_inputs(200.0), top_coarse=2, capacity_top=3)
    w = result.winner
    assert w.feasible and w.worst_ratio <= 1.0
    assert result.runner_up is not None and result.runner_up.params != w.params
    assert result.feasible >= 2 and result.candidates > 50
    assert w.capacity_factor is not None and w.capacity_factor > 1.0
    # the ranking puts feasible, higher-capacity candidates first
    caps = [e.capacity_factor for e in result.table if e.feasible]
    assert caps == sorted(caps, reverse=True)


def test_capacity_grows_with_batching_on_a_fixed_cost_curve() -> None:
    inputs = ranker_inputs(300.0, curve=ServiceCurve(fixed_ms=20.0, per_item_ms=0.2))
    small = Params(max_batch_size=1, preferred=(), delay_us=0, instances=1, policy="strict")
    big = Params(max_batch_size=32, preferred=(16, 32), delay_us=4000, instances=1, policy="strict")
    # one row per 20 ms cannot carry 300/s at all; batches of 32 can
    assert not evaluate(inputs, small)[0].feasible
    assert capacity_factor(inputs, big, inputs.arrivals) > 1.5


def test_an_impossible_target_yields_the_closest_candidate_and_a_note() -> None:
    inputs = ranker_inputs(200.0, curve=ServiceCurve(fixed_ms=400.0, per_item_ms=1.0))  # 400 ms > the 250 ms target
    result = tune_model(inputs, top_coarse=1)
    assert result.feasible == 0
    assert not result.winner.feasible
    assert "no candidate meets every target" in result.notes[0]
    assert "interactive P99" in result.winner.reason


def test_memory_budget_caps_instances() -> None:
    entry = PLAN.entry("ranker")
    available, per_instance = memory_budget(PLAN, entry)
    assert per_instance > 0 and available >= per_instance
    inputs = ranker_inputs(200.0, memory_available_bytes=per_instance * 2, instance_bytes=per_instance, max_instances=4)
    result = tune_model(inputs, top_coarse=1, capacity_top=1)
    assert max(e.params.instances for e in result.table) <= 2
    over = Params(max_batch_size=8, preferred=(4, 8), delay_us=1000, instances=3, policy="strict")
    assert "exceed" in evaluate(inputs, over)[0].reason


def test_the_streaming_llm_is_judged_on_time_to_first_token() -> None:
    entry = PLAN.entry("tinyllm")
    curve = LLMCurve(prefill_ms_per_token=0.05, decode_fixed_ms=0.7, decode_ms_per_seq=0.4)
    engine = EngineModel(kv_policy="grow_kill", kv_block_tokens=entry.kv.block_tokens, kv_pool_blocks=entry.kv.pool_blocks,
                         max_num_seqs=entry.kv.max_sequences, curve=curve)
    inputs = TuneInputs(spec=SPEC, entry=entry, arrivals=traffic(30.0, n=800), classes=list(CLASSES), engine=engine)
    e, res = evaluate(inputs, baseline_params(entry))
    assert e.p99_ms["interactive"] == pytest.approx(res.klass("interactive").ttft_p99_ms)
    result = tune_model(inputs, top_coarse=1, capacity_top=1)
    assert result.winner.params.max_num_seqs is not None and result.winner.params.instances == 1


def test_policies_render_as_the_server_reads_them() -> None:
    strict = Params(max_batch_size=16, preferred=(8, 16), delay_us=2000, instances=2, policy="strict")
    batcher, per_level, default, levels, default_level = queue_policies(strict, CLASSES, SPEC)
    assert levels == 3 and default_level == 2 and default.class_name == "normal"
    assert [p.action for p in per_level] == ["REJECT", "REJECT", "DELAY"]
    assert per_level[0].timeout_us == int(250 * SPEC.policy.queue_timeout_fraction * 1000)
    assert batcher.policy(1).max_queue_size == SPEC.policy.queue_depth_batches * 16 * 2
    loose = queue_policies(strict.model_copy(update={"policy": "strict-loose"}), CLASSES, SPEC)[1]
    assert loose[0].timeout_us == 250_000
    single = queue_policies(strict.model_copy(update={"policy": "single"}), CLASSES, SPEC)
    assert single[3] == 0 and single[1] == [] and single[0].prefetching is False  # max_queue_size stays


def test_apply_candidate_renders_a_config_triton_parses_with_the_chosen_values() -> None:
    entry = PLAN.entry("ranker")
    params = Params(max_batch_size=16, preferred=(8, 16), delay_us=2000, instances=2, policy="strict")
    tuned = apply_results(PLAN, {"ranker": apply_candidate(entry, params, CLASSES, SPEC)})
    rendered = render_plan(tuned, "deployment.yaml")
    config = parse_model_config(rendered.files["ranker/config.pbtxt"])
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.instance_group[0].count == 2
    assert config.dynamic_batching.priority_levels == 3
    assert "tuned by `tritongen tune`" in rendered.files["ranker/config.pbtxt"]
    # the other model is rendered as planned
    assert rendered.files["tinyllm/config.pbtxt"] == render_plan(PLAN, "deployment.yaml").files["tinyllm/config.pbtxt"]


def test_llm_candidates_change_the_engine_parameter_too() -> None:
    entry = PLAN.entry("tinyllm")
    params = baseline_params(entry).model_copy(update={"max_num_seqs": 40, "max_batch_size": 40})
    out = apply_candidate(entry, params, CLASSES, SPEC)
    assert out.parameters["max_num_seqs"] == "40" and out.max_batch_size == 40


def test_baseline_reads_the_plan() -> None:
    p = baseline_params(PLAN.entry("ranker"))
    assert p.max_batch_size == 32 and p.preferred == (8, 16, 32) and p.policy == "strict"


def test_tune_cli_end_to_end(tmp_path) -> None:
    out = tmp_path / "repo"
    report = tmp_path / "tune.json"
    result = run_cli(
        "tune", str(EXAMPLES / "deployment.yaml"), "--profiles", str(EXAMPLES / "profiles"),
        "--traffic", str(EXAMPLES / "traffic" / "poisson.yaml"), "--requests", "600", "--model", "ranker", "-o", str(out),
        "--json", "--report", str(report),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # --json: stdout is the JSON document alone (the one --report writes); the tables go to stderr
    assert json.loads(result.stdout) == json.loads(report.read_text())
    assert json.loads(result.stdout)["models"]["ranker"]["feasible"] is True
    assert "winner" in result.stderr and "runner-up" in result.stderr
    text = (out / "ranker" / "config.pbtxt").read_text()
    assert "tuned by `tritongen tune`" in text
    parse_model_config(text)


def test_simulate_cli_compares_configs_and_refuses_bad_input(tmp_path) -> None:
    cfg = EXAMPLES.parent / "model_repository" / "ranker" / "config.pbtxt"
    other = tmp_path / "ranker-1ms.pbtxt"
    other.write_text(cfg.read_text().replace("max_queue_delay_microseconds: 8000", "max_queue_delay_microseconds: 1000"))
    ok = run_cli("simulate", "--profile", str(EXAMPLES / "profiles" / "ranker.json"), "--config", str(cfg), "--config", str(other),
             "--traffic", str(EXAMPLES / "traffic" / "bursty.yaml"), "--requests", "2000")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ranker-1ms" in ok.stdout and "P50 / P90 / P99" in ok.stdout
    bad = run_cli("simulate", "--profile", str(EXAMPLES / "profiles" / "ranker.json"), "--config", str(cfg),
              "--traffic", str(EXAMPLES / "traffic" / "daily-curve.yaml"))
    assert bad.returncode == 2 and "not a traffic shape" in bad.stderr
    missing = run_cli("simulate", "--profile", str(tmp_path / "nope.json"), "--config", str(cfg), "--traffic", str(EXAMPLES / "traffic" / "poisson.yaml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_every_example_traffic_file_loads() -> None:
    from tritongen.traffic_files import read_traffic

    import yaml

    files = [p for p in (EXAMPLES / "traffic").glob("*.yaml") if "shape" in (yaml.safe_load(p.read_text()) or {})]
    assert len(files) >= 4
    for path in files:
        spec, text = read_traffic(path)
        arr = generate_arrivals(spec, seed=0, trace_text=text, requests=200 if spec.shape != "trace" else None)
        assert len(arr) > 0 and np.all(np.diff(arr.t) >= 0)
        assert {c.name for c in spec.classes} <= {c.name for c in CLASSES}
