"""`simulate` without --config runs the config the server reported when the profile was taken
(`Profile.served_config`): a model profiled through --url alone, with no repository at hand, can be
simulated (issue 43: the whole flow on --url)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import EXAMPLE_PROFILES, EXAMPLES, MODEL_REPOSITORY, run_cli
from tritongen.pbtxt import config_to_json, parse_model_config

POISSON = str(EXAMPLES / "traffic" / "poisson.yaml")


def served_profile(tmp_path: Path, name: str, config: Path) -> Path:
    doc = json.loads((EXAMPLE_PROFILES / f"{name}.json").read_text())
    doc["served_config"] = json.loads(config_to_json(parse_model_config(config.read_text())))
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


def test_a_profile_with_its_served_config_simulates_without_a_config_file(tmp_path: Path) -> None:
    ranker = served_profile(tmp_path, "ranker", MODEL_REPOSITORY / "ranker" / "config.pbtxt")
    done = run_cli("simulate", "--profile", str(ranker), "--traffic", POISSON, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ranker"]["throughput_per_s"] > 0
    # the same figures as from the config file itself
    with_file = run_cli("simulate", "--profile", str(ranker), "--traffic", POISSON, "--json",
                        "--config", str(MODEL_REPOSITORY / "ranker" / "config.pbtxt"))
    assert json.loads(with_file.stdout)["ranker"] == json.loads(done.stdout)["ranker"]


def test_a_streaming_llm_profiled_through_url_simulates_from_its_engine_section(tmp_path: Path) -> None:
    standin = served_profile(tmp_path, "vllm_standin",
                             EXAMPLES / "llm_standins" / "repository" / "vllm_standin" / "config.pbtxt")
    done = run_cli("simulate", "--profile", str(standin), "--traffic", POISSON)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no --config: the config the server reported when profiled (vllm_standin)" in " ".join(done.stdout.split())


def test_without_a_config_and_without_a_served_one_the_error_names_the_fix(tmp_path: Path) -> None:
    done = run_cli("simulate", "--profile", str(EXAMPLE_PROFILES / "ranker.json"), "--traffic", POISSON)
    assert done.returncode == 2
    assert "no --config given" in done.stderr and "--config path/to/config.pbtxt" in done.stderr
