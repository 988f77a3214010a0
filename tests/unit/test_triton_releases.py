"""`--triton-release` on check and render (issue 46 item 5): the release table, the ModelConfig
fields newer than the embedded 2.51, and the TensorRT-LLM each release ships."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from tests.helpers import EXAMPLES, run_cli
from tritongen.cli.check_cmd import format_github_line
from tritongen.core import triton_releases as tr
from tritongen.core.trtllm_args import RELEASE, RELEASE_CONTAINER
from tritongen.render import release_findings, render_repository
from tritongen.repository import check_repository
from tritongen.specio import load_spec

METRICS = "model_metrics { metric_control { metric_identifier { family: \"nv_inference_first_response_histogram_ms\" }" \
          " histogram_options { buckets: [ 1, 10, 100 ] } } }"
ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  max_inflight_requests: 16
  step [ { model_name: "echo" model_version: -1
           input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ]
}
"""


LLMAPI = Path(__file__).parent / "data" / "llmapi"
MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
IO = """input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def python_config(name: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n{IO}{extra}\n'


def add_model(root: Path, name: str, config: str, model_py: bool = True) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    if model_py:
        (root / name / "1" / "model.py").write_text(MODEL_PY)


def llmapi_folder(root: Path) -> None:
    """TensorRT-LLM's own LLM-API folder: upstream's config.pbtxt and model.yaml (1.1)."""
    (root / "tensorrt_llm" / "1").mkdir(parents=True)
    (root / "tensorrt_llm" / "config.pbtxt").write_text((LLMAPI / "upstream_config.pbtxt").read_text())
    (root / "tensorrt_llm" / "1" / "model.yaml").write_text((LLMAPI / "upstream_1.1_model.yaml").read_text())
    (root / "tensorrt_llm" / "1" / "model.py").write_text("# stands in for TensorRT-LLM's llmapi model.py\n")


def release_codes(root: Path, release: str | None) -> list[tuple[str, str, str]]:
    report = check_repository(root, gpu_available=False, release=tr.resolve(release) if release else None)
    return [(f.code, f.severity, f.field) for f in report.findings if f.code in ("TG214", "TG215", "TG412")]


# ---------------------------------------------------------------------------------------------
# The table


def test_the_table_is_in_release_order_and_starts_at_the_embedded_server() -> None:
    assert tr.RELEASES[0].container == tr.EMBEDDED and tr.resolve(None).server == "2.51.0"
    containers = [r.container for r in tr.RELEASES]
    assert containers == sorted(containers) and len(set(containers)) == len(containers)
    servers = [tuple(map(int, r.server.split("."))) for r in tr.RELEASES]
    assert servers == sorted(servers) and len(set(servers)) == len(servers)
    assert {a.added_in for a in tr.ADDED_FIELDS} <= set(containers)


def test_the_added_fields_are_fields_of_the_proto_check_parses_with() -> None:
    """Each path names a real field of tritonclient's (newer) ModelConfig, so check can parse it and
    this table, not the parser, decides whether the target release knows it."""
    for added in tr.ADDED_FIELDS:
        message, name = added.proto.rsplit(".", 1)
        descriptor = getattr(model_config_pb2, message).DESCRIPTOR
        assert name in descriptor.fields_by_name, added.proto
        walk = model_config_pb2.ModelConfig.DESCRIPTOR
        for part in added.config_path.split(".")[:-1]:
            walk = walk.fields_by_name[part].message_type
        assert walk.full_name.endswith(message) and added.config_path.endswith(name)


def test_the_key_tables_release_is_the_one_its_container_ships() -> None:
    """trtllm_args names TensorRT-LLM 1.1.0 for 25.12; the release table must say the same."""
    container = RELEASE_CONTAINER.split(":")[1].split("-")[0]
    assert tr.resolve(container).trtllm == RELEASE


@pytest.mark.parametrize("spelling, container", [
    ("24.10", "24.10"), ("r25.12", "25.12"), ("25.12-trtllm-python-py3", "25.12"), ("2.51", "24.10"),
    ("2.51.0", "24.10"), ("2.59.1", "25.07"), ("2.64.0", "25.12"), (" 26.07 ", "26.07"),
])
def test_either_spelling_names_a_release(spelling: str, container: str) -> None:
    assert tr.resolve(spelling).container == container


@pytest.mark.parametrize("spelling", ["27.01", "2.50.0", "24.09", "latest", "25.1"])
def test_an_unknown_release_lists_the_known_ones(spelling: str) -> None:
    with pytest.raises(tr.UnknownRelease, match=r"known: 24\.10 \(2\.51\.0\), .*26\.07 \(2\.71\.0\)"):
        tr.resolve(spelling)


# ---------------------------------------------------------------------------------------------
# check


def test_a_field_newer_than_the_default_release_is_an_error_naming_the_release_and_the_fix(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo", METRICS))
    report = check_repository(tmp_path, gpu_available=False)
    [finding] = [f for f in report.findings if f.code == "TG214"]
    assert finding.severity == "error" and finding.field == "model_metrics" and finding.line == 6
    assert "added in Triton 24.11 (2.52.0)" in finding.message and "24.10 (2.51.0)" in finding.message
    assert "remove `model_metrics`" in finding.fix and "--triton-release 24.11" in finding.fix
    assert not report.ok


def test_at_or_after_its_release_the_field_is_a_note_said_once(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo", METRICS))
    assert release_codes(tmp_path, "24.11") == [("TG215", "note", "model_metrics")]
    assert release_codes(tmp_path, "2.71.0") == [("TG215", "note", "model_metrics")]
    assert check_repository(tmp_path, gpu_available=False, release=tr.resolve("24.11")).ok


def test_an_ensemble_field_is_checked_against_its_own_release(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo"))
    add_model(tmp_path, "ens", ENSEMBLE, model_py=False)
    field = "ensemble_scheduling.max_inflight_requests"
    assert release_codes(tmp_path, "25.10") == [("TG214", "error", field)]
    assert release_codes(tmp_path, "25.11") == [("TG215", "note", field)]


def test_a_config_without_newer_fields_says_nothing_about_the_release(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo"))
    for release in (None, "24.10", "26.07"):
        assert release_codes(tmp_path, release) == []


def test_a_named_release_says_which_tensorrt_llm_it_ships_when_it_is_not_the_key_tables(tmp_path: Path) -> None:
    llmapi_folder(tmp_path)
    assert release_codes(tmp_path, None) == []  # unnamed: the key table's release, as before
    assert release_codes(tmp_path, "25.12") == []  # 25.12 ships the table's 1.1.0
    [note] = [f for f in check_repository(tmp_path, gpu_available=False, release=tr.resolve("26.04")).findings
              if f.code == "TG412"]
    assert note.severity == "note" and note.path and note.path.endswith("model.yaml")
    assert "ships TensorRT-LLM 1.2.1" in note.message and f"checked against {RELEASE}" in note.message


def test_the_cli_takes_the_flag_and_refuses_an_unknown_release(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo", METRICS))
    refused = run_cli("check", str(tmp_path), "--no-gpu")
    assert refused.returncode == 1 and "TG214" in refused.stdout
    accepted = run_cli("check", str(tmp_path), "--no-gpu", "--triton-release", "24.11")
    assert accepted.returncode == 0, accepted.stdout
    assert "note TG215" in accepted.stdout and "1 note" in accepted.stdout
    unknown = run_cli("check", str(tmp_path), "--triton-release", "30.01")
    assert unknown.returncode == 2 and "known: 24.10 (2.51.0)" in unknown.stderr + unknown.stdout


def test_a_note_is_a_github_notice(tmp_path: Path) -> None:
    add_model(tmp_path, "echo", python_config("echo", METRICS))
    [note] = [f for f in check_repository(tmp_path, gpu_available=False, release=tr.resolve("25.01")).findings
              if f.code == "TG215"]
    assert format_github_line(note).startswith("::notice file=")


# ---------------------------------------------------------------------------------------------
# render


def test_the_built_in_templates_write_no_field_the_oldest_release_lacks() -> None:
    """Today render writes no ModelConfig field newer than 2.51, so --triton-release refuses nothing:
    only the TensorRT-LLM note remains (the spec's LLM-API model, key table 1.1.0)."""
    rendered = render_repository(load_spec(EXAMPLES / "gpu-deployment.yaml"))
    oldest = release_findings(rendered, tr.RELEASES[0])
    assert [(f.code, f.severity) for f in oldest] == [("TG412", "note")]
    assert release_findings(rendered, tr.resolve("25.12")) == []


def test_render_refuses_a_user_template_that_writes_a_field_the_release_lacks(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    from tritongen.render import builtin_templates_dir

    base = (builtin_templates_dir() / "config.pbtxt.j2").read_text()
    (templates / "config.pbtxt.j2").write_text(base.rstrip("\n") + "\n" + METRICS + "\n")
    spec = str(EXAMPLES / "deployment.yaml")
    out = tmp_path / "repo"
    refused = run_cli("render", spec, "-o", str(out), "--templates", str(templates), "--triton-release", "24.10")
    assert refused.returncode == 2 and "model_metrics" in refused.stderr and "24.11" in refused.stderr
    assert not out.exists()
    written = run_cli("render", spec, "-o", str(out), "--templates", str(templates), "--triton-release", "25.12")
    assert written.returncode == 0, written.stderr
    assert "not modelled" in written.stdout
