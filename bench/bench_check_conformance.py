"""Benchmark: `tritongen check` against Triton's own model-config conformance suite.

Triton's server repository holds, under `qa/L0_model_config`, configs the server refuses at load
(each with the server's `expected` message) and configs it loads. This replays them through
`check_repository` the way the server's own test does (`qa/L0_model_config/test.sh`) and prints,
per directory, how many refused cases `check` catches with an error (recall) and how many loadable
configs it raises an error on (false alarms). The server repository is not vendored; fetch it:

    git clone --depth 1 https://github.com/triton-inference-server/server /tmp/triton-server
    .venv/bin/python -m bench.bench_check_conformance --server-repo /tmp/triton-server

Without it the benchmark says so and takes no figures.

- `noautofill_platform/*`: one model per case; test.sh replaces the platform line (here with
  `--platform`, ONNX by default) and adds the `1/` version folder. A stub model file is written.
- `autofill_noplatform/<backend>/*` and `autofill_noplatform_success/<backend>/*`: one model per
  case, or several (ensembles with their steps). They rely on what autofill reads from real model
  files, which a stub cannot give; a case `check` can only flag as "depends on autofill" (a
  warning saying so) is counted apart, neither caught nor missed.
- Loadable configs: every config.pbtxt under `docs/examples`, `deploy/` and `qa/python_models`
  (the Python models Triton's tests load), each alone, and the `autofill_noplatform_success` cases;
  each error is a false alarm, unless the checkout lacks a file the server would read.

GPU ids: the server's CI hosts have GPUs, this one may not. `--gpus N` tells `check` how many the
target host has (the server's case `invalid_gpu` asks for GPU 42); without it the host's NVML count
is used, and an id that cannot be checked is a warning.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tritongen.repository import check_repository

STUB_FILES = {  # the model file a platform's backend looks for (a stub: check reads names only)
    "onnxruntime_onnx": "model.onnx", "tensorrt_plan": "model.plan", "pytorch_libtorch": "model.pt",
    "tensorflow_savedmodel": "model.savedmodel", "tensorflow_graphdef": "model.graphdef",
    # the autofill directories, by the backend test.sh copies a real model file for
    "onnx": "model.onnx", "tensorrt": "model.plan", "pytorch": "model.pt", "openvino": "model.xml",
}
# Directories whose refusals come from comparing the config with the model file's own tensors, or
# from running the model's auto_complete_config: a check that reads configs cannot apply there.
NEEDS_MODEL = {"onnx", "tensorrt", "pytorch", "openvino", "python"}
AUTOFILL_NOTE = "autofill"  # a warning whose message names autofill: could not be decided without model files


@dataclass
class Tally:
    caught: list[str] = field(default_factory=list)
    autofill: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)

    @property
    def decided(self) -> int:
        return len(self.caught) + len(self.missed)


def _is_model_dir(path: Path) -> bool:
    return (path / "config.pbtxt").is_file() or (path / "1").is_dir() or any(p.suffix == ".py" for p in path.iterdir())


def _copy_model(src: Path, dst: Path, platform: str | None, stub_for: str | None = None) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("expected*"))
    config = dst / "config.pbtxt"
    if platform is not None and config.is_file():
        text = re.sub(r"^\s*platform:.*$", "", config.read_text(), flags=re.M)
        config.write_text(text.rstrip() + f'\nplatform: "{platform}"\n')
    version = dst / "1"
    version.mkdir(exist_ok=True)
    stub = STUB_FILES.get(platform or stub_for or "")
    if stub and not any(version.iterdir()):
        (version / stub).write_bytes(b"")
    for script in dst.glob("*.py"):  # test.sh copies a Python model's model.py into its version folder
        if not (version / script.name).exists():
            shutil.copy(script, version / script.name)


def _check(repo: Path, gpus: int | None, autofill: bool = True):
    return check_repository(repo, gpu_count=gpus, autofill=autofill)  # no count given: NVML's


def _verdict(case: Path, repo: Path, gpus: int | None, autofill: bool) -> str:
    report = _check(repo, gpus, autofill)
    if report.errors:
        return "caught"
    if any(AUTOFILL_NOTE in f.message for f in report.warnings):
        return "autofill"
    return "missed"


def refused_cases(directory: Path) -> Iterator[tuple[str, Path, list[Path]]]:
    """(name, case dir, model dirs) for each refused case: a folder with an `expected` file."""
    for case in sorted(p for p in directory.iterdir() if p.is_dir()):
        if not any(case.glob("expected*")):
            continue
        models = [case] if (case / "config.pbtxt").is_file() and not any(
            _is_model_dir(p) for p in case.iterdir() if p.is_dir() and p.name != "1") else \
            [p for p in sorted(case.iterdir()) if p.is_dir() and _is_model_dir(p)] or [case]
        yield case.name, case, models


def _repository(work: Path, label: str, name: str, case: Path, models: list[Path], platform: str | None,
                stub_for: str | None) -> Path:
    repo = work / label / name
    for model in models:
        _copy_model(model, repo / (name if model == case else model.name), platform, stub_for)
    return repo


def run_refused(directory: Path, platform: str | None, gpus: int | None, work: Path, stub_for: str | None = None,
                autofill: bool = True) -> Tally:
    tally = Tally()
    for name, case, models in refused_cases(directory):
        repo = _repository(work, f"refused-{directory.name}", name, case, models, platform, stub_for)
        getattr(tally, _verdict(case, repo, gpus, autofill)).append(name)
    return tally


def _has_model_file(model: Path) -> bool:
    return any(p.is_file() or p.is_dir() for v in model.iterdir() if v.is_dir() for p in v.iterdir())


def run_valid(cases: list[tuple[str, Path, list[Path]]], gpus: int | None, work: Path, label: str,
              stub_for: str | None = None) -> tuple[int, list[str], list[str]]:
    """(models checked, false alarms as 'path: code message', and errors on models the checkout
    ships without the model file test.sh copies in (or without a label file it copies): what the
    server loads is not all there, so those are not checkable and not counted as alarms)."""
    alarms, unverifiable, checked = [], [], 0
    for i, (name, case, models) in enumerate(cases):
        repo = _repository(work, f"{label}-{i}", name, case, models, None, stub_for)
        report = _check(repo, gpus)
        checked += len(models)
        no_file = {m.name for m in models if not _has_model_file(m)}
        for f in report.errors:
            if f.model in no_file or (f.code == "TG208" and f.model == name):
                unverifiable.append(f"{case}: {f.model}")
            else:
                alarms.append(f"{case}: {f.code} {f.message}")
    return checked, alarms, unverifiable


def valid_cases(configs: list[Path]) -> list[tuple[str, Path, list[Path]]]:
    """Each loadable config's directory as a one-model case; a folder of several models (an
    ensemble with its steps) as one case."""
    return [(c.parent.name, c.parent, [c.parent]) for c in configs]


def success_cases(directory: Path) -> list[tuple[str, Path, list[Path]]]:
    out = []
    for case in sorted(p for p in directory.iterdir() if p.is_dir()):
        members = [p for p in sorted(case.iterdir()) if p.is_dir() and p.name != "1" and _is_model_dir(p)]
        out.append((case.name, case, members or [case]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-repo", type=Path, default=Path("/tmp/triton-server"),
                        help="a checkout of triton-inference-server/server (default /tmp/triton-server)")
    parser.add_argument("--platform", default="onnxruntime_onnx", help="platform set on noautofill_platform cases")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs on the target host (default: NVML's count)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list the missed cases")
    args = parser.parse_args()
    qa = args.server_repo / "qa" / "L0_model_config"
    if not qa.is_dir():
        print(f"no Triton server checkout at {args.server_repo} (qa/L0_model_config not found): figures not taken.\n"
              "Fetch it with: git clone --depth 1 https://github.com/triton-inference-server/server "
              f"{args.server_repo}")
        return 0
    rows: list[tuple[str, Tally]] = []
    with tempfile.TemporaryDirectory(prefix="tritongen-conformance-") as tmp:
        work = Path(tmp)
        # test.sh runs these with --strict-model-config=true: no auto-complete (check --no-autofill)
        rows.append((f"noautofill_platform ({args.platform})",
                     run_refused(qa / "noautofill_platform", args.platform, args.gpus, work, autofill=False)))
        for backend in sorted(p for p in (qa / "autofill_noplatform").iterdir() if p.is_dir()):
            rows.append((f"autofill_noplatform/{backend.name}", run_refused(backend, None, args.gpus, work, backend.name)))
        rows.append(("special_cases", run_refused(qa / "special_cases", None, args.gpus, work)))
        valid = sorted((args.server_repo / "docs" / "examples").rglob("config.pbtxt")) + \
            sorted((args.server_repo / "deploy").rglob("config.pbtxt"))
        n_valid, alarms, no_file = run_valid(valid_cases(valid), args.gpus, work, "valid")
        python_models = sorted((args.server_repo / "qa" / "python_models").rglob("config.pbtxt"))
        n_python, python_alarms, python_no_file = run_valid(valid_cases(python_models), args.gpus, work, "python-models")
        success_rows = []
        for backend in sorted(p for p in (qa / "autofill_noplatform_success").iterdir() if p.is_dir()):
            success_rows.append((backend.name, *run_valid(success_cases(backend), args.gpus, work, f"success-{backend.name}",
                                                          backend.name)))

    print(f"tritongen check against {qa} (GPUs on the target: {args.gpus if args.gpus is not None else 'from NVML'})")
    print("Refused configs: each must get at least one error.")
    print(f"{'directory':42} {'applies':>7} {'cases':>5} {'caught':>6} {'missed':>6} {'recall':>7}")
    for name, t in rows:
        applies = "no" if name.split("/")[-1] in NEEDS_MODEL else "yes"
        recall = f"{len(t.caught) / t.decided:.0%}" if t.decided else "-"
        print(f"{name:42} {applies:>7} {t.decided:>5} {len(t.caught):>6} {len(t.missed):>6} {recall:>7}")
        if args.verbose and t.missed:
            print(f"    missed: {', '.join(t.missed)}")
    print("(applies: no = the server refuses these by reading the model file's own tensors or running the model's "
          "auto_complete_config, which check does not do; a stub model file stands in)")
    print("\nLoadable configs: each error is a false alarm.")
    print(f"{'source':42} {'models':>7} {'false alarms':>12} {'incomplete':>10}")
    print(f"{'docs/examples, deploy':42} {n_valid:>7} {len(alarms):>12} {len(no_file):>10}")
    print(f"{'qa/python_models (each alone)':42} {n_python:>7} {len(python_alarms):>12} {len(python_no_file):>10}")
    alarms += python_alarms
    no_file += python_no_file
    for backend, checked, balarms, bno_file in success_rows:
        print(f"{'autofill_noplatform_success/' + backend:42} {checked:>7} {len(balarms):>12} {len(bno_file):>10}")
        alarms += balarms
        no_file += bno_file
    print("(incomplete: errors on models the checkout ships without the model (or label) file the tests copy in "
          "from elsewhere, or an ensemble checked without its steps; check then says what is missing, as the server would)")
    for line in alarms:
        print(f"    false alarm: {line}")
    if args.verbose:
        for line in no_file:
            print(f"    incomplete: {line}")
    return 0


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("check_conformance"):
        code = main()
    sys.exit(code)
