"""Read a deployment spec from YAML: one readable message per problem, naming the field and its line.

pydantic reports a location such as ('models', 1, 'max_context'); we map it back to the YAML line
through the composed node tree, so the user sees `spec.yaml:14: models[1].max_context: ...`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tritongen.core.architecture import Architecture
from tritongen.core.spec import DeploymentSpec
from tritongen.errors import BadInput
from tritongen.hfconfig import load_architecture


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec with every model's architecture resolved (config.json files read)."""

    spec: DeploymentSpec
    path: Path
    architectures: dict[str, Architecture]


def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest node along `loc` that exists in the YAML tree."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
                return key.start_mark.line + 1 if key is not None else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _describe(error: dict[str, Any]) -> str:
    msg = str(error["msg"])
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error["type"] == "extra_forbidden":
        return "unknown key; check the spelling (`tritongen schema` lists the allowed keys)"
    if error["type"] == "missing":
        return "required field is missing"
    value = error.get("input")
    if error["type"] not in ("model_type",) and not isinstance(value, (dict, list)):
        return f"{msg} (got {value!r})"
    return msg


def validation_message(err: ValidationError, source: str, root: yaml.Node | None) -> str:
    lines = []
    for error in err.errors():
        loc = tuple(error["loc"])
        line = line_of(root, loc)
        where = f"{source}:{line}" if line else source
        lines.append(f"{where}: {format_loc(loc)}: {_describe(error)}")
    count = len(lines)
    head = f"{source}: {count} problem{'s' if count > 1 else ''} in the deployment spec:\n  "
    return head + "\n  ".join(lines)


def parse_spec_text(text: str, source: str = "spec.yaml") -> tuple[DeploymentSpec, yaml.Node | None]:
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(err, "problem", None) or str(err)
        raise BadInput(f"{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a deployment spec is a YAML mapping (name, hardware, models, ...), got {type(data).__name__}")
    try:
        return DeploymentSpec.model_validate(data), root
    except ValidationError as err:
        raise BadInput(validation_message(err, source, root)) from None


def load_spec(path: Path) -> LoadedSpec:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such spec file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"{path}: cannot read: {err}") from None
    spec, root = parse_spec_text(text, str(path))
    architectures: dict[str, Architecture] = {}
    for index, model in enumerate(spec.models):
        if model.architecture is not None:
            architectures[model.name] = model.architecture
        elif model.architecture_config is not None:
            config_path = model.architecture_config
            if not config_path.is_absolute():
                config_path = path.parent / config_path
            try:
                architectures[model.name] = load_architecture(config_path)
            except BadInput as err:
                line = line_of(root, ("models", index, "architecture_config"))
                raise BadInput(f"{path}:{line}: models[{index}].architecture_config: {err}") from None
    spec = _resolve_tokenizers(spec, root, path)
    return LoadedSpec(spec=spec, path=path, architectures=architectures)


def _resolve_tokenizers(spec: DeploymentSpec, root: Any, path: Path) -> DeploymentSpec:
    """Each model's `tokenizer` made absolute (relative paths are the spec's), and checked to exist:
    the sidecar opens it wherever the policy goes."""
    models = []
    for index, model in enumerate(spec.models):
        if model.tokenizer is not None:
            found = model.tokenizer if model.tokenizer.is_absolute() else (path.parent / model.tokenizer).resolve()
            if not found.is_file():
                line = line_of(root, ("models", index, "tokenizer"))
                raise BadInput(f"{path}:{line}: models[{index}].tokenizer: {found} is not a file; give the path of "
                               "the model's tokenizer.json (relative to the spec)")
            model = model.model_copy(update={"tokenizer": found})
        models.append(model)
    return spec.model_copy(update={"models": models})


def schema_json() -> str:
    return json.dumps(DeploymentSpec.model_json_schema(), indent=2, sort_keys=True)
