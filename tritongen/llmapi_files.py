"""Read TensorRT-LLM's LLM-API model.yaml from a model directory: which folders are that model, the
file's data and the YAML node tree its findings take line numbers from. The checking itself is
pure (`core.llmapi_rules`); this module only reads the disk.

A folder is the LLM-API model when its config says `backend: "python"` and a version directory
holds a model.yaml that has a `triton_config` section, or a model.py that imports tensorrt_llm
(then a model.yaml without triton_config is a finding, not a different model). Another Python
model's unrelated model.yaml is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tritongen.core.config_rules.catalogue import RULES
from tritongen.core.findings import Finding
from tritongen.core.llmapi_rules import model_yaml_findings, triton_config_findings
from tritongen.core.triton_releases import Release, trtllm_note
from tritongen.core.trtllm_args import MODEL_YAML, RELEASE, TRITON_CONFIG
from tritongen.errors import BadInput

MODEL_CODE = "model.py"


@dataclass(frozen=True)
class ModelYaml:
    """One model.yaml as read: its path, its data (None when it is not a YAML mapping, with `error`
    saying why) and the composed node tree for line numbers."""

    path: Path
    data: dict[str, Any] | None
    root: yaml.Node | None
    error: str | None = None
    error_line: int | None = None


def read_model_yaml(path: Path) -> ModelYaml:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        return ModelYaml(path, None, None, f"cannot be read: {err}")
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        return ModelYaml(path, None, None, f"is not valid YAML: {getattr(err, 'problem', None) or err}",
                         mark.line + 1 if mark else None)
    if not isinstance(data, dict):
        return ModelYaml(path, None, root, f"is not a YAML mapping of LLM() arguments (got {type(data).__name__})")
    return ModelYaml(path, data, root)


def _imports_tensorrt_llm(code: Path) -> bool:
    try:
        text = code.read_text(errors="replace")
    except OSError:
        return False
    return "tensorrt_llm" in text and "LLM" in text


def llmapi_model_yaml(model_dir: Path, versions: list[int] | None = None, backend: str = "python") -> ModelYaml | None:
    """The model.yaml of the LLM-API model in `model_dir` (the highest version of `versions`, or of
    the numeric folders), or None when the folder is not that model."""
    if backend != "python" or not model_dir.is_dir():
        return None
    if versions is None:
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    for version in sorted(versions, reverse=True):
        folder = model_dir / str(version)
        path = folder / MODEL_YAML
        if not path.is_file():
            continue
        found = read_model_yaml(path)
        if (found.data is not None and TRITON_CONFIG in found.data) or _imports_tensorrt_llm(folder / MODEL_CODE):
            return found
    return None


def llmapi_args(model_dir: Path, backend: str | None) -> dict[str, Any] | None:
    """model.yaml's data for the engine model, or None when `model_dir` is not the LLM-API model;
    a model.yaml that does not parse is an error here (the engine would not start)."""
    found = llmapi_model_yaml(model_dir, backend=backend or "python")
    if found is None:
        return None
    if found.data is None:
        raise BadInput(f"{found.path}: {found.error}")
    return found.data


def key_line(root: yaml.Node | None, path: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest key along `path` that the file has (a missing key: its section's
    line; a missing top-level key: None, the whole file)."""
    node, line = root, None
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            break
        pair = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if pair is None:
            break
        line, node = pair[0].start_mark.line + 1, pair[1]
    return line


def llmapi_findings(name: str, model_dir: Path, config: Any, config_path: str, versions: list[int],
                    autofill: bool = True, release: Release | None = None) -> list[Finding]:
    """check's findings on the LLM-API model in `model_dir` (none when it is another model):
    model.yaml against the key table, and its triton_config against config.pbtxt (`config`, a
    parsed ModelConfig); a TG412 note when the named Triton `release` ships another TensorRT-LLM
    than the table's. None (no release named) checks against the table's release without a note:
    the embedded 24.10's TensorRT-LLM 0.14 predates the LLM-API Triton model, so it is no default."""
    found = llmapi_model_yaml(model_dir, versions, config.backend or "python")
    if found is None:
        return []
    path = str(found.path)
    note = trtllm_note(name, path, release, RELEASE) if release is not None else None
    notes = [note] if note is not None else []
    if found.data is None:
        return notes + [Finding(RULES["TG401"].severity, "TG401", name, "", f"model '{name}': {MODEL_YAML} {found.error}",
                        f"write {MODEL_YAML} as a YAML mapping of LLM() arguments with a {TRITON_CONFIG} section "
                        "(TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml is the template)",
                        path=path, line=found.error_line)]

    def line(loc: tuple[Any, ...]) -> int | None:
        return key_line(found.root, loc)

    return notes + model_yaml_findings(name, path, found.data, line) + triton_config_findings(
        name, path, found.data, line, config_path=config_path, max_batch_size=int(config.max_batch_size),
        states_decoupled=config.HasField("model_transaction_policy"),
        decoupled=bool(config.model_transaction_policy.decoupled), autofill=autofill)
