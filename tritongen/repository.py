"""Walk a Triton model repository and check it the way tritonserver would load it.

Layout the server expects (and what is checked):

    ROOT/<model>/config.pbtxt       parsed through Triton's schema (TG203); missing -> TG201/TG202
    ROOT/<model>/<version>/...      numeric directories; none -> TG204 (the server loads nothing)
    ROOT/<model>/<version>/model.py python backend: the model file must exist (TG207; the server
                                    hangs on a load without it)

Decisions, each from what tritonserver 2.51 did on this project's machine:
- No config.pbtxt is a *warning* (TG201) when a `model.<backend>` file lets the server infer the
  backend: it auto-completes the config and loads the model (a python model then has
  max_batch_size 0 and only the inputs its `auto_complete_config` declares). Without such a file
  it is an error (TG202: "Could not determine backend").
- Directories whose name starts with "." are skipped; files at the root (e.g. server_flags.txt)
  and unknown files inside model directories are ignored, as the server ignores them.
- Only the versions the version policy selects are checked for model files.

`check_repository` returns a `CheckReport`; it raises `BadInput` only when ROOT itself is unusable.
Deployment-spec rules (memory feasibility, KV budget) plug in through `extra_rules`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc.model_config_pb2 import ModelConfig

from tritongen.core.config_rules import RULES, check_cross_model, check_model_config, is_ensemble
from tritongen.core.findings import Finding, count_errors, count_warnings, sort_findings
from tritongen.core.triton_releases import Release, release_field_findings, resolve
from tritongen.errors import BadInput
from tritongen.llmapi_files import llmapi_findings
from tritongen.pbtxt import ConfigSyntaxError, field_line, field_lines, parse_model_config
from tritongen.shared.nvml import gpu_count

CONFIG_NAME = "config.pbtxt"
PYTHON_DEFAULT_MODEL_FILE = "model.py"
MODEL_DIR_VARIABLE = "$$TRITON_MODEL_DIRECTORY"

ExtraRule = Callable[[dict[str, ModelConfig]], list[Finding]]


def detect_gpu_count() -> int | None:
    """How many GPUs NVML reports here; None when it cannot tell (no library, no driver)."""
    return gpu_count()


@dataclass(frozen=True)
class CheckReport:
    """What `check_repository` found. `ok` is True when there is no error finding."""

    root: Path
    models: tuple[str, ...]
    findings: tuple[Finding, ...]
    gpu_available: bool
    configs: Mapping[str, ModelConfig] = field(default_factory=dict, compare=False, repr=False)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def error_count(self) -> int:
        return count_errors(self.findings)

    @property
    def warning_count(self) -> int:
        return count_warnings(self.findings)

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def summary(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "models": len(self.models),
            "model_names": list(self.models),
            "errors": self.error_count,
            "warnings": self.warning_count,
            "ok": self.ok,
            "gpu_available": self.gpu_available,
        }


@dataclass
class _Model:
    name: str
    directory: Path
    config_path: Path
    display_path: str
    text: str | None = None
    config: ModelConfig | None = None
    versions: list[int] = field(default_factory=list)
    selected: list[int] = field(default_factory=list)


def check_repository(
    root: Path,
    *,
    gpu_available: bool | None = None,
    gpu_count: int | None = None,
    gpu_count_source: str | None = None,
    gpu_probe: Callable[[], int | None] = detect_gpu_count,
    autofill: bool = True,
    extra_rules: Sequence[ExtraRule] = (),
    release: Release | None = None,
) -> CheckReport:
    """Check every model directory under `root`.

    The serving host's GPUs: `gpu_count` when given (from the spec or the user, named by
    `gpu_count_source`), else `gpu_probe`'s count (NVML by default; None = cannot tell) unless
    `gpu_available` says whether there are any. Instance-group ids are checked against the count
    when it is known. `autofill=False` is a server started with --disable-auto-complete-config (or
    --strict-model-config=true): fields a model file would fill are then simply missing. Each
    callable in `extra_rules` gets the parsed configs by model name and returns more findings
    (located here when they name a model and no path). `release` is the Triton release the
    repository runs on (default: the embedded one): fields newer than it are TG214, and a field it
    knows that the rules do not model is a TG215 note (core.triton_releases); a named release also
    says which TensorRT-LLM it ships against model.yaml's key table (TG412).
    """
    target = release or resolve(None)
    root = Path(root)
    if not root.exists():
        raise BadInput(f"model repository {root} does not exist")
    if not root.is_dir():
        raise BadInput(f"model repository {root} is not a directory")
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as err:
        raise BadInput(f"model repository {root} cannot be read: {err.strerror or err}") from None
    if gpu_count is None and gpu_available is None:
        gpu_count = gpu_probe()
        gpu_count_source = gpu_count_source or "this host (NVML)"
    gpu = bool(gpu_available) if gpu_available is not None else (gpu_count or 0) > 0

    findings: list[Finding] = []
    models: list[_Model] = []
    for entry in entries:
        if entry.name.startswith(".") or not _is_dir(entry):
            continue
        directory = root / entry.name
        model = _Model(
            name=entry.name,
            directory=directory,
            config_path=directory / CONFIG_NAME,
            display_path=str(directory / CONFIG_NAME),
        )
        models.append(model)
        findings.extend(_load_model(model))

    if not models:
        findings.append(
            Finding(
                "warning", "TG200", "", "",
                f"repository {root} holds no model directory",
                "put each model in ROOT/<model>/ with a config.pbtxt and a numeric version directory",
                path=str(root),
            )
        )

    parsed = {m.name: m.config for m in models if m.config is not None}
    by_name = {m.name: m for m in models}
    for model in models:
        if model.config is None:
            continue
        model_file = _inferable_backend(model, model.selected or model.versions[-1:])
        for finding in check_model_config(model.config, model=model.name, gpu_available=gpu, gpu_count=gpu_count,
                                          gpu_count_source=gpu_count_source or "the serving host",
                                          model_file=model_file,
                                          autofill_source=_autofill_source(model, model_file) if autofill else None):
            findings.append(_locate(finding, model))
        findings.extend(_file_rules(model))
        for finding in release_field_findings(model.name, field_lines(model.text or ""), target):
            findings.append(_locate(finding, model))
        findings.extend(llmapi_findings(model.name, model.directory, model.config, model.display_path,
                                        model.selected or model.versions[-1:], autofill, release))
    # Models that exist but could not be parsed (or have no config) still count as present.
    known: dict[str, ModelConfig] = {name: ModelConfig(name=name) for name in by_name}
    known.update(parsed)
    for finding in check_cross_model(known):
        findings.append(_locate(finding, by_name[finding.model]) if finding.model in by_name else finding)
    findings.extend(_ensemble_versions(models, by_name))
    for rule in extra_rules:
        for finding in rule(dict(parsed)):
            model = by_name.get(finding.model)
            findings.append(_locate(finding, model) if model is not None and finding.path is None else finding)

    return CheckReport(
        root=root,
        models=tuple(m.name for m in models),
        findings=tuple(sort_findings(findings)),
        gpu_available=gpu,
        configs=parsed,
    )


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks, as the server does
    except OSError:
        return False


def _locate(finding: Finding, model: _Model) -> Finding:
    if finding.path is not None:
        return finding
    line = field_line(model.text, finding.field) if model.text and finding.field else None
    return finding.located(model.display_path if model.text is not None else str(model.directory), line)


def _finding(model: _Model, code: str, field_: str, message: str, fix: str, *, path: str | None = None,
             line: int | None = None) -> Finding:
    return Finding(
        RULES[code].severity, code, model.name, field_, f"model '{model.name}': {message}", fix,
        path=path if path is not None else str(model.directory), line=line,
    )


def _load_model(model: _Model) -> list[Finding]:
    """Read versions and config.pbtxt; findings for what keeps the server from even trying."""
    out: list[Finding] = []
    try:
        children = sorted(os.scandir(model.directory), key=lambda e: e.name)
    except OSError as err:
        return [_finding(model, "TG212", "", f"directory {model.directory} cannot be read: {err.strerror}",
                         "fix the directory's permissions")]
    for child in children:
        if not _is_dir(child):
            continue
        if child.name.isdigit():
            model.versions.append(int(child.name))
        elif not child.name.startswith((".", "_")) and child.name != "warmup":
            out.append(_finding(
                model, "TG205", "",
                f"directory '{child.name}' is not a version number, so the server ignores it",
                f"rename it to a number (e.g. {model.directory / '1'}) if it holds a version, or move it out",
                path=str(model.directory / child.name),
            ))
    model.versions.sort()

    if model.config_path.is_file():
        try:
            model.text = model.config_path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            out.append(_finding(model, "TG203", "", f"{CONFIG_NAME} is not UTF-8 text ({err.reason} at byte "
                                f"{err.start})", "save the file as UTF-8", path=model.display_path))
            return out
        except OSError as err:
            out.append(_finding(model, "TG212", "", f"{CONFIG_NAME} cannot be read: {err.strerror}",
                                "fix the file's permissions", path=model.display_path))
            return out
        try:
            model.config = parse_model_config(model.text, model.display_path)
        except ConfigSyntaxError as err:
            out.append(_finding(
                model, "TG203", "",
                f"{CONFIG_NAME} does not parse against Triton's ModelConfig schema: {err.reason} "
                f"(line {err.line}, column {err.column})",
                "fix the field name, value or braces at that position (see the ModelConfig proto "
                "for valid fields)",
                path=model.display_path, line=err.line,
            ))
            model.text = None
            return out
    else:
        inferable = _inferable_backend(model, model.versions[-1:] if model.versions else [])
        if inferable:
            out.append(_finding(
                model, "TG201", "",
                f"no {CONFIG_NAME}; the server will auto-complete one from '{inferable}' (for python: "
                "max_batch_size 0 and only the inputs/outputs auto_complete_config declares)",
                f"commit an explicit {model.config_path} so batching, inputs and instances are reviewed",
            ))
        else:
            out.append(_finding(
                model, "TG202", "",
                f"no {CONFIG_NAME} and no model.<backend> file in the latest version directory, so the "
                "server cannot determine the backend",
                f"add {model.config_path} with backend: \"...\" (or a model.<backend> file)",
            ))

    policy_config = model.config or ModelConfig()
    model.selected = _selected_versions(policy_config, model.versions)
    if not model.versions:
        out.append(_finding(
            model, "TG204", "",
            f"no numeric version directory in {model.directory}, so the server loads no version",
            f"create {model.directory / '1'} holding the model files",
        ))
    return out


def _selected_versions(config: ModelConfig, versions: list[int]) -> list[int]:
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return list(versions)
    if which == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in versions if v in wanted]
    count = policy.latest.num_versions if which == "latest" else 1
    return versions[-count:] if count > 0 else []


# Model files whose backend auto-completes a config's missing inputs, outputs and batching from the
# file itself (TensorRT, ONNX Runtime, TensorFlow and OpenVINO read the model; the Python backend
# runs the model's `auto_complete_config`; PyTorch's libtorch fills no tensors).
AUTOCOMPLETING_FILES = {".plan": "TensorRT", ".onnx": "ONNX Runtime", ".savedmodel": "TensorFlow",
                        ".graphdef": "TensorFlow", ".xml": "OpenVINO"}


def _autofill_source(model: _Model, found: str | None) -> str | None:
    """What the server's auto-complete would read for this model, if anything; `found` is the
    model file `_inferable_backend` found."""
    config = model.config or ModelConfig()
    if found is None and config.backend == "python" and model.selected:
        found = f"{model.selected[-1]}/{config.default_model_filename or PYTHON_DEFAULT_MODEL_FILE}"
    if found is None:
        return None
    suffix = Path(found).suffix
    if suffix in AUTOCOMPLETING_FILES:
        return f"{found} ({AUTOCOMPLETING_FILES[suffix]})"
    if suffix == ".py":
        try:
            code = (model.directory / found).read_text(errors="replace")
        except OSError:
            return None
        return f"{found}'s auto_complete_config" if "def auto_complete_config" in code else None
    return None


def _inferable_backend(model: _Model, versions: Sequence[int]) -> str | None:
    """The `model.<backend>` entry the server would infer the backend from, if any."""
    for version in versions:
        vdir = model.directory / str(version)
        try:
            names = sorted(os.listdir(vdir))
        except OSError:
            continue
        for name in names:
            if name.startswith("model.") and len(name) > len("model."):
                return f"{version}/{name}"
    return None


def _file_rules(model: _Model) -> list[Finding]:
    """Rules that need the files next to the config."""
    config = model.config
    assert config is not None
    out: list[Finding] = []

    def add(code: str, field_: str, message: str, fix: str) -> None:
        line = field_line(model.text or "", field_) if field_ else None
        out.append(_finding(model, code, field_, message, fix, path=model.display_path, line=line))

    if config.version_policy.WhichOneof("policy_choice") == "specific" and model.versions:
        wanted = list(config.version_policy.specific.versions)
        missing = [v for v in wanted if v not in model.versions]
        if wanted and missing:
            code = "TG206" if len(missing) == len(wanted) else "TG213"
            add(
                code, "version_policy.specific.versions",
                f"version_policy.specific.versions is {wanted} but version directories {missing} do not "
                f"exist (present: {model.versions})",
                f"create {', '.join(str(model.directory / str(v)) for v in missing)} or list only present "
                "versions",
            )

    backend = config.backend
    if not backend and not config.platform:
        inferable = _inferable_backend(model, model.selected or model.versions[-1:])
        if inferable is None and model.versions:
            add(
                "TG202", "backend",
                "backend and platform are both empty and no model.<backend> file exists in the version "
                "directories, so the server cannot determine the backend",
                "set backend: \"python\" (or the backend that runs the model)",
            )
        elif inferable and inferable.endswith("/model.py"):
            backend = "python"

    if backend == "python" and not is_ensemble(config):  # an ensemble with a backend is TG152
        filename = config.default_model_filename or PYTHON_DEFAULT_MODEL_FILE
        for version in model.selected:
            if not (model.directory / str(version) / filename).is_file():
                add(
                    "TG207", "default_model_filename" if config.default_model_filename else "backend",
                    f"python backend but {model.directory / str(version) / filename} does not exist "
                    f"(default_model_filename '{config.default_model_filename or ''}'); the server hangs "
                    "loading version " + str(version),
                    f"add {filename} to {model.directory / str(version)}"
                    + ("" if config.default_model_filename else ", or set default_model_filename")
                    + (" (TensorRT-LLM's LLM-API model: copy model.py and helpers.py from its "
                       "triton_backend/all_models/llmapi/tensorrt_llm/1/)"
                       if (model.directory / str(version) / "model.yaml").is_file() else ""),
                )
        env = config.parameters.get("EXECUTION_ENV_PATH")
        if env is not None and env.string_value:
            raw = env.string_value
            resolved = raw.replace(MODEL_DIR_VARIABLE, str(model.directory))
            if (MODEL_DIR_VARIABLE in raw or os.path.isabs(resolved)) and not Path(resolved).exists():
                add(
                    "TG209", "parameters",
                    f"parameters EXECUTION_ENV_PATH is '{raw}' but {resolved} does not exist",
                    "pack the environment (conda-pack) to that path, or fix the parameter",
                )

    for i, output in enumerate(config.output):
        if output.label_filename and not (model.directory / output.label_filename).is_file():
            add(
                "TG208", f"output[{i}].label_filename",
                f"output '{output.name}' label_filename is '{output.label_filename}' but "
                f"{model.directory / output.label_filename} does not exist",
                f"add {model.directory / output.label_filename} or remove label_filename",
            )

    if not is_ensemble(config):
        for i, warm in enumerate(config.model_warmup):
            for name in sorted(warm.inputs):
                data_file = warm.inputs[name].input_data_file
                if data_file and not (model.directory / "warmup" / data_file).is_file():
                    add(
                        "TG210", f"model_warmup[{i}].inputs",
                        f"model_warmup[{i}] input '{name}' reads input_data_file '{data_file}' but "
                        f"{model.directory / 'warmup' / data_file} does not exist",
                        f"add {model.directory / 'warmup' / data_file} or use zero_data: true",
                    )
    return out


def _ensemble_versions(models: Sequence[_Model], by_name: Mapping[str, _Model]) -> list[Finding]:
    out: list[Finding] = []
    for model in models:
        config = model.config
        if config is None or not is_ensemble(config):
            continue
        for i, step in enumerate(config.ensemble_scheduling.step):
            target = by_name.get(step.model_name)
            if target is None or step.model_version == -1 or not target.versions:
                continue
            if step.model_version not in target.selected:
                field_ = f"ensemble_scheduling.step[{i}].model_version"
                unset = " (model_version is not set, which means version 0, not latest)" if step.model_version == 0 else ""
                out.append(_finding(
                    model, "TG211", field_,
                    f"ensemble_scheduling.step[{i}] asks for model '{step.model_name}' version "
                    f"{step.model_version}{unset}, but the versions that will be loaded are {target.selected} "
                    f"(on disk: {target.versions})",
                    "set model_version: -1 (the latest loaded version) or a loaded version, or change "
                    "the step model's version_policy",
                    path=model.display_path, line=field_line(model.text or "", field_),
                ))
    return out
