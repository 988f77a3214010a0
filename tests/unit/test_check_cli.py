"""`tritongen check`: repository walking, the three output formats and the exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import run_cli
import tritongen.cli.check_cmd as check_cmd
from tritongen.cli.main import app
from tritongen.core.findings import Finding
from tritongen.errors import BadInput
from tritongen.repository import CheckReport, check_repository, detect_gpu_count

MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def python_config(name: str, extra: str = "", mbs: int = 8) -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: {mbs}\n{IO}{extra}\n'


def add_model(root: Path, name: str, config: str | None, *, versions: tuple[str, ...] = ("1",),
              files: dict[str, str] | None = None, model_py: bool = True) -> Path:
    model_dir = root / name
    model_dir.mkdir(parents=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / version).mkdir()
        if model_py:
            (model_dir / version / "model.py").write_text(MODEL_PY)
    for rel, content in (files or {}).items():
        path = model_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return model_dir


def codes(report: CheckReport) -> list[str]:
    return [f.code for f in report.findings]


def only(report: CheckReport, code: str) -> Finding:
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, [(f.code, f.message) for f in report.findings]
    return found[0]


@pytest.fixture
def good_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    add_model(root, "echo", python_config("echo", "dynamic_batching { preferred_batch_size: [ 4, 8 ] }"))
    add_model(
        root, "pipeline",
        'name: "pipeline"\nplatform: "ensemble"\nmax_batch_size: 8\n' + IO
        + 'ensemble_scheduling { step [ { model_name: "echo" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }',
        model_py=False,
    )
    (root / "server_flags.txt").write_text("--rate-limit=off\n")  # files at the root are ignored
    (root / ".git").mkdir()  # hidden directories are skipped
    return root


@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    root = tmp_path / "broken"
    add_model(root, "batchy", python_config("batchy", "dynamic_batching { preferred_batch_size: [ 4, 16 ] }"))
    add_model(root, "typo", 'name: "typo"\nbackend: "python"\n  dynamic_batching { prefered_batch_size: 4 }\n')
    add_model(root, "auto", None)  # no config.pbtxt, but 1/model.py: a warning
    return root


# ---------------------------------------------------------------- check_repository


def test_good_repository_has_no_findings(good_repo: Path) -> None:
    report = check_repository(good_repo, gpu_available=False)
    assert report.findings == ()
    assert report.models == ("echo", "pipeline")
    assert report.ok and report.error_count == 0 and report.warning_count == 0
    assert report.summary()["models"] == 2


def test_broken_repository_findings_are_located(broken_repo: Path) -> None:
    report = check_repository(broken_repo, gpu_available=False)
    assert sorted(codes(report)) == ["TG101", "TG201", "TG203"]
    pbs = only(report, "TG101")
    assert pbs.path == str(broken_repo / "batchy" / "config.pbtxt")
    assert pbs.line == 7 and pbs.field == "dynamic_batching.preferred_batch_size"
    syntax = only(report, "TG203")
    assert syntax.line == 3 and "prefered_batch_size" in syntax.message and "column 22" in syntax.message
    auto = only(report, "TG201")
    assert auto.severity == "warning" and "1/model.py" in auto.message
    assert report.error_count == 2 and report.warning_count == 1 and not report.ok


def test_gpu_probe_is_injected(tmp_path: Path) -> None:
    add_model(tmp_path, "g", python_config("g", "instance_group [ { kind: KIND_GPU count: 1 } ]"))
    calls: list[int] = []

    def no_gpu() -> int:
        calls.append(1)
        return 0

    report = check_repository(tmp_path, gpu_probe=no_gpu)
    assert calls == [1] and report.gpu_available is False
    assert codes(report) == ["TG121"] and report.ok
    assert codes(check_repository(tmp_path, gpu_probe=lambda: 1)) == []
    assert codes(check_repository(tmp_path, gpu_available=True, gpu_probe=no_gpu)) == [] and calls == [1]


def test_detect_gpu_count_answers_without_raising() -> None:
    count = detect_gpu_count()
    assert count is None or count >= 0


def test_gpu_ids_are_checked_against_the_gpus_the_serving_host_has(tmp_path: Path) -> None:
    """Negative ids always; ids at or past the count when it is known (NVML or the spec); else a
    warning saying the ids could not be checked."""
    add_model(tmp_path, "g", python_config("g", "instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]"))
    add_model(tmp_path, "n", python_config("n", "instance_group [ { kind: KIND_GPU gpus: [ -1 ] } ]"))
    two = check_repository(tmp_path, gpu_count=2, gpu_count_source="the spec's hardware")
    beyond = [f for f in two.findings if f.code == "TG129"]
    assert [f.model for f in beyond] == ["g"] and "GPU 3 does not exist" in beyond[0].message
    assert "the spec's hardware has 2 GPU(s) (ids 0..1)" in beyond[0].message
    assert [f.model for f in two.findings if f.code == "TG119"] == ["n"]
    assert codes(check_repository(tmp_path, gpu_count=4)).count("TG129") == 0
    unknown = check_repository(tmp_path, gpu_available=True)  # there are GPUs, how many is not known
    assert [f.code for f in unknown.findings if f.model == "g"] == ["TG114"]
    assert "not checked" in next(f for f in unknown.findings if f.code == "TG114").message
    assert [f.code for f in unknown.findings if f.model == "n"] == ["TG119"]  # negative: always an error
    assert codes(check_repository(tmp_path, gpu_probe=lambda: None)).count("TG114") == 1  # NVML cannot tell


def test_auto_complete_is_read_from_the_model_file_and_can_be_turned_off(tmp_path: Path) -> None:
    """A config without dims loads when the server's auto-complete reads them from the model file."""
    partial = 'name: "{n}"\nmax_batch_size: 8\ninput [ {{ name: "X" data_type: TYPE_FP32 }} ]\n' \
              'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
    add_model(tmp_path, "onnx", partial.format(n="onnx"), files={"1/model.onnx": ""}, model_py=False)
    add_model(tmp_path, "pyauto", partial.format(n="pyauto") + 'backend: "python"\n', model_py=False,
              files={"1/model.py": "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n"})
    add_model(tmp_path, "pyplain", partial.format(n="pyplain") + 'backend: "python"\n')
    report = check_repository(tmp_path, gpu_available=False)
    by_model = {m: sorted({f.code for f in report.findings if f.model == m}) for m in ("onnx", "pyauto", "pyplain")}
    assert by_model == {"onnx": ["TG146"], "pyauto": ["TG146"], "pyplain": ["TG132"]}
    onnx_note = next(f for f in report.findings if f.model == "onnx")
    assert "1/model.onnx (ONNX Runtime)" in onnx_note.message and "not checked" in onnx_note.message
    strict = check_repository(tmp_path, gpu_available=False, autofill=False)
    assert sorted({f.code for f in strict.findings}) == ["TG132"]
    assert len(strict.errors) == 3


def test_cli_takes_the_gpu_count_and_the_auto_complete_mode(tmp_path: Path) -> None:
    add_model(tmp_path, "g", python_config("g", "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]"))
    one = runner.invoke(app, ["check", str(tmp_path), "--gpus", "1"])
    assert one.exit_code == 1 and "TG129" in one.stdout and "the serving host (--gpus) has 1 GPU(s)" in one.stdout
    two = runner.invoke(app, ["check", str(tmp_path), "--gpus", "2", "--no-autofill"])
    assert two.exit_code == 0, two.stdout
    assert runner.invoke(app, ["check", str(tmp_path), "--gpus", "-1"]).exit_code == 2


@pytest.mark.parametrize(
    ("setup", "code", "values"),
    [
        (lambda r: add_model(r, "nocfg", None, model_py=False), "TG202", ["no config.pbtxt"]),
        (lambda r: add_model(r, "nobackend", 'name: "nobackend"\nmax_batch_size: 8\n' + IO, model_py=False),
         "TG202", ["backend and platform are both empty"]),
        (lambda r: add_model(r, "nover", python_config("nover"), versions=()), "TG204", ["no numeric version"]),
        (lambda r: add_model(r, "nopy", python_config("nopy"), model_py=False), "TG207", ["model.py", "hangs"]),
        (lambda r: add_model(r, "fn", python_config("fn", 'default_model_filename: "echo.py"')), "TG207",
         ["echo.py"]),
        (lambda r: add_model(r, "spec", python_config("spec", "version_policy { specific { versions: [ 3 ] } }")),
         "TG206", ["[3]", "present: [1]"]),
        (lambda r: add_model(r, "lbl", python_config("lbl").replace('dims: [ 4 ] } ]\n\n', 'dims: [ 4 ] label_filename: "labels.txt" } ]\n\n')),
         "TG208", ["labels.txt"]),
        (lambda r: add_model(r, "env", python_config("env", 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }')),
         "TG209", ["$$TRITON_MODEL_DIRECTORY/env.tar.gz"]),
        (lambda r: add_model(r, "warm", python_config("warm", 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } } } ]')),
         "TG210", ["in.bin", "warmup"]),
    ],
    ids=["no_config_no_file", "no_backend_no_file", "no_version", "no_model_py", "no_default_file",
         "specific_missing", "label_missing", "env_missing", "warmup_file_missing"],
)
def test_repository_error_rules(tmp_path: Path, setup, code: str, values: list[str]) -> None:
    setup(tmp_path)
    report = check_repository(tmp_path, gpu_available=False)
    finding = only(report, code)
    assert finding.severity == "error" and not report.ok
    for value in values:
        assert value in finding.message, f"{value!r} not in {finding.message}"
    assert finding.fix.strip()


def test_repository_files_that_satisfy_the_rules(tmp_path: Path) -> None:
    add_model(tmp_path, "fn", python_config("fn", 'default_model_filename: "echo.py"'), model_py=False,
              files={"1/echo.py": MODEL_PY})
    add_model(tmp_path, "inferred", 'name: "inferred"\nmax_batch_size: 8\n' + IO)  # python from 1/model.py
    add_model(tmp_path, "lbl", python_config("lbl").replace('dims: [ 4 ] } ]\n\n', 'dims: [ 4 ] label_filename: "l.txt" } ]\n\n'),
              files={"l.txt": "a\nb\n"})
    add_model(tmp_path, "env", python_config("env", 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'),
              files={"env.tar.gz": "x"})
    add_model(tmp_path, "warm", python_config("warm", 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } } } ]'),
              files={"warmup/in.bin": "x"})
    # only the selected (latest) version needs the model file
    add_model(tmp_path, "old", python_config("old"), versions=("1", "2"), model_py=False, files={"2/model.py": MODEL_PY})
    linked = add_model(tmp_path, "linked", python_config("linked"), versions=(), model_py=False)
    (linked / "1").symlink_to(tmp_path / "old" / "2", target_is_directory=True)
    assert check_repository(tmp_path, gpu_available=False).findings == ()


def test_repository_warnings(tmp_path: Path) -> None:
    add_model(tmp_path, "partial", python_config("partial", "version_policy { specific { versions: [ 1, 3 ] } }"))
    add_model(tmp_path, "odd", python_config("odd"), files={"v2/model.py": MODEL_PY})
    report = check_repository(tmp_path, gpu_available=False)
    assert sorted(codes(report)) == ["TG205", "TG213"] and report.ok
    assert "[3]" in only(report, "TG213").message and "'v2'" in only(report, "TG205").message


def test_ensemble_step_version_must_be_loaded(good_repo: Path) -> None:
    config = good_repo / "pipeline" / "config.pbtxt"
    config.write_text(config.read_text().replace("model_version: -1", "model_version: 7"))
    finding = only(check_repository(good_repo, gpu_available=False), "TG211")
    assert "'echo' version 7" in finding.message and "[1]" in finding.message
    assert finding.line == 7 and finding.field == "ensemble_scheduling.step[0].model_version"


def test_ensemble_step_without_model_version_means_version_zero(good_repo: Path) -> None:
    config = good_repo / "pipeline" / "config.pbtxt"
    config.write_text(config.read_text().replace("model_version: -1 ", ""))
    finding = only(check_repository(good_repo, gpu_available=False), "TG211")
    assert "version 0 (model_version is not set" in finding.message and "model_version: -1" in finding.fix


def test_ensemble_step_missing_model_and_unparsable_member(good_repo: Path) -> None:
    (good_repo / "echo" / "config.pbtxt").write_text("name: \"echo\"\nbogus_field: 1\n")
    report = check_repository(good_repo, gpu_available=False)
    assert codes(report) == ["TG203"]  # the ensemble is not blamed for its broken member
    config = good_repo / "pipeline" / "config.pbtxt"
    config.write_text(config.read_text().replace('"echo"', '"nosuch"'))
    assert "TG190" in codes(check_repository(good_repo, gpu_available=False))


def test_empty_repository_warns(tmp_path: Path) -> None:
    report = check_repository(tmp_path, gpu_available=False)
    assert codes(report) == ["TG200"] and report.ok and report.models == ()


def test_unusable_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        check_repository(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="not a directory"):
        check_repository(tmp_path / "file")


def test_extra_rules_hook_gets_configs_and_findings_are_located(good_repo: Path) -> None:
    seen: dict[str, object] = {}

    def kv_budget(configs):
        seen.update(configs)
        mbs = configs["echo"].max_batch_size
        return [Finding("error", "TG901", "echo", "max_batch_size",
                        f"model 'echo': max_batch_size {mbs} needs 9 GiB of KV cache, budget 4 GiB",
                        "lower max_batch_size to 3")]

    report = check_repository(good_repo, gpu_available=False, extra_rules=[kv_budget])
    assert sorted(seen) == ["echo", "pipeline"]
    finding = only(report, "TG901")
    assert finding.path == str(good_repo / "echo" / "config.pbtxt") and finding.line == 3
    assert not report.ok


# ---------------------------------------------------------------- formats (in process)

runner = CliRunner()

try:  # the other command modules are written concurrently; check works on its own too
    import tritongen.cli.commands  # noqa: F401
except ImportError:
    pass


def invoke(*args: str):
    # Typer runs a single registered command without its name
    prefix = ["check"] if len(app.registered_commands) > 1 else []
    return runner.invoke(app, [*prefix, *args])


def test_text_format(broken_repo: Path) -> None:
    result = invoke(str(broken_repo), "--no-gpu")
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    pbs = next(line for line in lines if "TG101" in line)
    assert pbs == (
        f"{broken_repo}/batchy/config.pbtxt:7: error TG101 batchy dynamic_batching.preferred_batch_size: "
        "model 'batchy': dynamic_batching.preferred_batch_size 16 is greater than max_batch_size 8 "
        "(fix: lower dynamic_batching.preferred_batch_size to at most 8, or raise max_batch_size to at least 16)"
    )
    assert any(line.startswith(f"{broken_repo}/typo/config.pbtxt:3: error TG203 typo: ") for line in lines)
    assert any(line.startswith(f"{broken_repo}/auto: warning TG201 auto: ") for line in lines)
    assert "2 errors, 1 warning" in lines[-1] and "3 models" in lines[-1]


def test_json_format(broken_repo: Path) -> None:
    result = invoke(str(broken_repo), "--json", "--no-gpu")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["summary"]["errors"] == 2 and data["summary"]["warnings"] == 1
    assert data["summary"]["models"] == 3 and data["summary"]["ok"] is False
    assert data["summary"]["gpu_available"] is False
    first = next(f for f in data["findings"] if f["code"] == "TG101")
    assert set(first) == {"severity", "code", "model", "field", "message", "fix", "path", "line"}
    assert first["line"] == 7 and first["model"] == "batchy" and first["severity"] == "error"


def test_github_format(broken_repo: Path) -> None:
    result = invoke(str(broken_repo), "--github", "--no-gpu")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert (
        f"::error file={broken_repo}/batchy/config.pbtxt,line=7,title=TG101 dynamic_batching.preferred_batch_size::"
        "model 'batchy': dynamic_batching.preferred_batch_size 16 is greater than max_batch_size 8"
    ) in result.output
    assert any(re.match(r"^::warning file=[^,]+/auto,title=TG201::", line) for line in lines)
    assert sum(line.startswith("::error ") for line in lines) == 2


def test_github_escapes_properties_and_data() -> None:
    finding = Finding("warning", "TG1", "m", "a,b", "50% of\nthe: thing", "fix, it", path="x:y,z.pbtxt", line=2)
    line = check_cmd.format_github_line(finding)
    assert line == "::warning file=x%3Ay%2Cz.pbtxt,line=2,title=TG1 a%2Cb::50%25 of%0Athe: thing (fix: fix, it)"


def test_warnings_only_exit_zero(tmp_path: Path) -> None:
    add_model(tmp_path, "auto", None)
    result = invoke(str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "TG201" in result.output and "0 errors, 1 warning" in result.output


def test_gpu_flag_controls_kind_gpu_warning(tmp_path: Path) -> None:
    add_model(tmp_path, "g", python_config("g", "instance_group [ { kind: KIND_GPU count: 1 } ]"))
    assert "TG121" in invoke(str(tmp_path), "--no-gpu").output
    result = invoke(str(tmp_path), "--gpu")
    assert result.exit_code == 0 and "TG121" not in result.output and "no findings" in result.output


def test_good_repository_exit_zero(good_repo: Path) -> None:
    result = invoke(str(good_repo))
    assert result.exit_code == 0 and "no findings" in result.output



# ---------------------------------------------------------------- exit codes via the console script


def test_console_script_exit_codes(good_repo: Path, broken_repo: Path, tmp_path: Path) -> None:
    ok = run_cli("check", str(good_repo))
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("check", str(broken_repo), "--json")
    assert json.loads(bad.stdout)["summary"]["errors"] == 2
    assert bad.returncode == 1, "error findings must exit 1 (cli/main.run must pass typer.Exit's code on)"
    missing = run_cli("check", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "file.txt").write_text("x")
    not_dir = run_cli("check", str(tmp_path / "file.txt"))
    assert not_dir.returncode == 2 and "not a directory" in not_dir.stderr
    usage = run_cli("check", str(good_repo), "--format", "xml")
    assert usage.returncode == 2
