"""What the user stated once travels: a spec's engine: section reaches `simulate` through the
profile written from it and through `simulate SPEC`, and the spec's class targets are reported.

In process (`run_cli`, the profile writer's own builder): no server, port or subprocess. The
streaming model is a Python-backend config that does not say its KV policy, so without the spec's
facts `simulate` has to refuse it; with them, the run equals the one `--engine` used to demand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import EXAMPLE_PROFILES, EXAMPLES, ServedIndex, run_cli
from tritongen.core.class_targets import check_targets
from tritongen.core.profile_types import StatedEngine, read_profile
from tritongen.core.simulator import ClassStats, SimResult
from tritongen.core.spec import EngineSection
from tritongen.engine_files import engine_for
from tritongen.pbtxt import parse_model_config
from tritongen.profiler.profile_builder import ProfileBuilder
from tritongen.profiler.run import default_settings, write_profile
from tritongen.profiler.targets import resolve_targets
from tritongen.specio import load_spec

TRAFFIC = str(EXAMPLES / "traffic" / "poisson.yaml")
STREAMED = {"max_batch_size": 8, "model_transaction_policy": {"decoupled": True},
            "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}]}


def write_spec(folder: Path, engine: dict) -> Path:
    """examples/deployment.yaml with tinyllm's engine: section replaced by `engine`."""
    doc = yaml.safe_load((EXAMPLES / "deployment.yaml").read_text())
    tinyllm = next(m for m in doc["models"] if m["name"] == "tinyllm")
    tinyllm["architecture_config"] = str(EXAMPLES / "architectures" / "tinyllm.json")
    tinyllm["engine"] = engine
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def write_config(folder: Path, name: str = "tinyllm") -> Path:
    """A Python backend's streaming config that states nothing of its engine."""
    path = folder / name / "config.pbtxt"
    path.parent.mkdir(parents=True)
    path.write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\nmodel_transaction_policy {{ decoupled: true }}\n')
    return path


def profile_from_spec(spec: Path, out: Path) -> Path:
    """What `tritongen profile SPEC -o OUT` writes for tinyllm: the writer's own path from the spec's
    entries to the JSON file, with tinyllm's measured engine costs (examples/profiles)."""
    loaded = load_spec(spec)
    targets = resolve_targets(ServedIndex({"ranker": {"max_batch_size": 32}, "tinyllm": STREAMED}), ["tinyllm"], loaded)  # type: ignore[arg-type]
    builder = ProfileBuilder(targets[0], default_settings(quick=True), "2.51.0", "http://x")
    builder.engine = read_profile((EXAMPLE_PROFILES / "tinyllm.json").read_text()).engine
    out.mkdir()
    return write_profile(builder.build(True, None), out)


def simulate_json(*args: str) -> dict:
    done = run_cli("simulate", *args, "--traffic", TRAFFIC, "--requests", "300", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_profile_of_a_spec_with_an_engine_section_simulates_without_engine(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, {"kv_policy": "grow_kill", "max_num_seqs": 6})
    profile = profile_from_spec(spec, tmp_path / "profiles")
    stated = json.loads(profile.read_text())["stated_engine"]
    assert (stated["section"]["kv_policy"], stated["section"]["max_num_seqs"]) == ("grow_kill", 6)
    assert stated["source"] == f"{spec}, model 'tinyllm'"
    config = str(write_config(tmp_path))

    carried = simulate_json("--profiles", str(tmp_path / "profiles"), "--config", config)
    # the same run as the profile without the spec's section, with the section repeated as --engine
    repeated = simulate_json("--profile", str(EXAMPLE_PROFILES / "tinyllm.json"), "--config", config,
                             "--engine", "kv_policy=grow_kill,max_num_seqs=6")
    assert carried == repeated
    assert "targets" not in carried["tinyllm"]  # no SPEC: the document is as before

    refused = run_cli("simulate", "--profile", str(EXAMPLE_PROFILES / "tinyllm.json"), "--config", config,
                      "--traffic", TRAFFIC, "--requests", "300", "--json")
    assert refused.returncode != 0 and "its KV policy is unknown" in refused.stderr


def test_simulate_takes_the_spec_first_and_uses_its_engine_section_and_targets(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, {"kv_policy": "grow_kill", "max_num_seqs": 6})
    config = str(write_config(tmp_path))
    old_profile = str(EXAMPLE_PROFILES / "tinyllm.json")  # written before profiles carried the section

    with_spec = simulate_json(str(spec), "--profile", old_profile, "--config", config)
    repeated = simulate_json("--profile", old_profile, "--config", config, "--engine", "kv_policy=grow_kill,max_num_seqs=6")
    targets = with_spec["tinyllm"].pop("targets")
    assert with_spec == repeated

    assert set(targets) == {"interactive", "normal", "batch"}
    interactive = next(c for c in repeated["tinyllm"]["classes"] if c["name"] == "interactive")
    assert targets["interactive"]["target_ms"] == 250
    assert targets["interactive"]["p99_ms"] == interactive["ttft_p99_ms"]  # a streaming class: TTFT
    assert targets["interactive"]["met"] == (interactive["ttft_p99_ms"] <= 250)

    table = run_cli("simulate", str(spec), "--profile", old_profile, "--config", config, "--traffic", TRAFFIC,
                    "--requests", "300")
    assert table.returncode == 0, table.stderr
    assert "P99 (TTFT) target ms" in table.stdout and "(5000)" in table.stdout


def test_engine_wins_over_the_spec_which_wins_over_what_the_profile_carried(tmp_path: Path) -> None:
    config_path = write_config(tmp_path)
    config = parse_model_config(config_path.read_text(), str(config_path))
    profile = read_profile((EXAMPLE_PROFILES / "tinyllm.json").read_text()).model_copy(update={"stated_engine": StatedEngine(
        section=EngineSection(kv_policy="reserve_kill", max_num_seqs=4, max_batched_tokens=64), source="old.yaml, model 'tinyllm'")})
    spec = StatedEngine(section=EngineSection(kv_policy="grow_kill", max_num_seqs=6), source="spec.yaml, model 'tinyllm'")

    model = engine_for(config, profile, stated=EngineSection(max_num_seqs=3), spec=spec, max_context=256)
    assert (model.kv_policy, model.max_num_seqs, model.max_batched_tokens, model.max_context) == ("grow_kill", 3, 64, 256)
    assert model.sources["max_num_seqs"] == "--engine"
    assert model.sources["kv_policy"] == "the spec's engine: section (spec.yaml, model 'tinyllm')"
    assert model.sources["max_batched_tokens"] == "the spec's engine: section (old.yaml, model 'tinyllm'), carried by the profile"
    assert model.sources["max_context"] == "the spec's max_context"


def test_a_config_the_spec_does_not_know_is_refused_naming_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, {"kv_policy": "grow_kill"})
    done = run_cli("simulate", str(spec), "--profile", str(EXAMPLE_PROFILES / "tinyllm.json"),
                   "--config", str(write_config(tmp_path, "chat")), "--traffic", TRAFFIC, "--requests", "300")
    assert done.returncode != 0
    assert "model 'chat' is not a model entry of" in done.stderr and "leave SPEC out" in done.stderr


@pytest.mark.parametrize("streaming, held", [(False, 40.0), (True, 12.0)])
def test_a_target_holds_ttft_for_a_stream_and_the_end_to_end_p99_otherwise(streaming: bool, held: float) -> None:
    from tritongen.core.spec import TrafficClass

    def stats(name: str, sent: int) -> ClassStats:
        return ClassStats(name=name, sent=sent, completed=sent, rejected_queue_full=0, rejected_timeout=0, oom_killed=0,
                          other_errors=0, p50_ms=20.0, p90_ms=30.0, p99_ms=40.0, mean_ms=22.0, ttft_p99_ms=12.0,
                          throughput_per_s=1.0)

    result = SimResult(window_s=1.0, classes=[stats("a", 5), stats("b", 5), stats("idle", 0)], models=[],
                       throughput_per_s=1.0, requests=10)
    classes = [TrafficClass(name=n, kind="normal", priority=i + 1, p99_ms=20.0, share=0.5) for i, n in enumerate(["a", "idle"])]
    checks = check_targets(result, classes, streaming)
    assert set(checks) == {"a"}  # b has no target, idle sent nothing
    assert (checks["a"].p99_ms, checks["a"].met) == (held, held <= 20.0)


def test_with_a_spec_the_classes_keep_the_spec_priorities_as_tune_gives_them(tmp_path: Path) -> None:
    """A traffic file whose priorities disagree with the spec's simulates as tune simulates it: with
    the spec's (ranker's config has three priority levels, so the order changes who waits)."""
    doc = yaml.safe_load((EXAMPLES / "traffic" / "poisson.yaml").read_text())
    doc["rate_per_s"] = 3000  # past capacity, so the levels' order shows in who waits
    for klass in doc["classes"]:
        klass["priority"] = 4 - klass["priority"]  # interactive last, batch first
    reversed_traffic = tmp_path / "reversed.yaml"
    reversed_traffic.write_text(yaml.safe_dump(doc))
    doc["classes"] = [{**c, "priority": 4 - c["priority"]} for c in doc["classes"]]
    as_spec = tmp_path / "as_spec.yaml"
    as_spec.write_text(yaml.safe_dump(doc))

    def run(*args: str, traffic: Path) -> dict:
        done = run_cli("simulate", *args, "--profile", str(EXAMPLE_PROFILES / "ranker.json"), "--config",
                       str(EXAMPLES.parent / "model_repository" / "ranker" / "config.pbtxt"), "--traffic", str(traffic),
                       "--requests", "2000", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)["ranker"]
        result.pop("targets", None)
        return result

    spec = str(EXAMPLES / "deployment.yaml")
    assert run(spec, traffic=reversed_traffic) == run(spec, traffic=as_spec)
    assert run(traffic=reversed_traffic) != run(traffic=as_spec)  # without the spec the file's priorities hold
