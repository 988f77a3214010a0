"""Validate a TensorRT-LLM LLM-API model.yaml (or the LLM() arguments a spec states) against the
key table of one release (`core.trtllm_args`), the way TensorRT-LLM's own parser would: pydantic
models built from the table, with upstream's lax coercion ("64" is an int, "yes" a bool) and
unknown keys refused. Each problem names the dotted key, what is wrong and the fix (the closest
key for a misspelling, the section a key belongs in, the allowed values of an enum).

Pure: a mapping in, problems out. Line numbers are the caller's (it has the YAML node tree).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tritongen.core.trtllm_args import LLM_ARGS, MODEL_YAML_KEYS, RELEASE, TRITON_CONFIG, Key

ProblemKind = Literal["unknown", "type", "range", "choice", "missing"]


@dataclass(frozen=True)
class ArgProblem:
    """One thing the release's parser (or model.py) would refuse, at a dotted key path."""

    kind: ProblemKind
    path: tuple[str | int, ...]
    message: str
    fix: str

    @property
    def key(self) -> str:
        return ".".join(str(p) for p in self.path) or "(top level)"


_SCALARS: dict[str, object] = {"str": str, "int": int, "float": float, "bool": bool, "any": Any}


def _annotation(key: Key) -> object:
    if key.kind == "section":
        kind: object = _section_model(key.name, key.keys)
    elif key.kind == "mapping":
        kind = dict[str, Any]
    elif key.kind == "list_int":
        kind = Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1)]
    elif key.kind == "enum":
        kind = Literal[key.choices]  # type: ignore[valid-type]
    else:
        kind = _SCALARS[key.kind]
    bounds = {name: getattr(key, name) for name in ("ge", "gt", "le") if getattr(key, name) is not None}
    if bounds:
        kind = Annotated[kind, Field(**bounds)]  # type: ignore[valid-type]
    return kind | None if key.nullable and key.kind != "any" else kind  # type: ignore[operator]


def _section_model(name: str, keys: Sequence[Key]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for key in keys:
        fields[key.name] = (_annotation(key), ... if key.required else None)
    return create_model(f"Section_{name}", __config__=ConfigDict(extra="forbid"), **fields)


@functools.cache
def _model_yaml_model() -> type[BaseModel]:
    return _section_model("model_yaml", MODEL_YAML_KEYS)


@functools.cache
def _llm_args_model() -> type[BaseModel]:
    return _section_model("llm_args", tuple(k for k in LLM_ARGS if k.name != "model"))


def check_model_yaml(data: Mapping[str, Any]) -> list[ArgProblem]:
    """Problems of a whole model.yaml: LLM() arguments and the model's triton_config."""
    return _problems(_model_yaml_model(), data, MODEL_YAML_KEYS)


def check_llm_args(data: Mapping[str, Any]) -> list[ArgProblem]:
    """Problems of LLM() arguments stated without `model` (a spec's `llm_args`, which names the
    model in `hf_model`); triton_config is not an LLM() argument and is refused here."""
    return _problems(_llm_args_model(), data, LLM_ARGS)


def _problems(model: type[BaseModel], data: Mapping[str, Any], keys: Sequence[Key]) -> list[ArgProblem]:
    try:
        model.model_validate(dict(data))
    except ValidationError as err:
        return [_problem(error, keys) for error in err.errors()]
    return []


def _problem(error: Mapping[str, Any], top: Sequence[Key]) -> ArgProblem:
    path = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("function-", "literal["))))
    dotted = ".".join(str(p) for p in path)
    key = _key_at(top, path)
    kind = str(error["type"])
    value = error.get("input")
    if kind == "extra_forbidden":
        return ArgProblem("unknown", path, f"`{dotted}` is not a key of model.yaml in TensorRT-LLM {RELEASE}",
                          _unknown_fix(top, path))
    if kind == "missing":
        return ArgProblem("missing", path, f"`{dotted}` is required ({key.doc if key else 'no default'})",
                          f"add `{dotted}`" + (": the Hugging Face model id or local path the engine loads"
                                               if path == ("model",) else ""))
    if kind == "literal_error" and key is not None:
        close = difflib.get_close_matches(str(value).upper(), [c.upper() for c in key.choices], n=1, cutoff=0.5)
        near = [c for c in key.choices if close and c.upper() == close[0]]
        hint = f"did you mean {near[0]!r}? " if near else ""
        return ArgProblem("choice", path, f"`{dotted}` is {value!r}, not one of {list(key.choices)}",
                          f"{hint}set `{dotted}` to one of {', '.join(key.choices)} (spelt exactly so)")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "too_short") and key is not None:
        where = "TensorRT-LLM's parser" if key.bound == "upstream" else "the engine"
        return ArgProblem("range", path, f"`{dotted}` is {value!r}: {error['msg'].lower()} ({where} refuses it)",
                          f"set `{dotted}` {_range_text(key)}")
    want = key.kind if key is not None else "a different type"
    if key is not None and key.kind in ("section", "mapping"):
        want = "a mapping of keys"
    return ArgProblem("type", path, f"`{dotted}` is {value!r} ({type(value).__name__}), not {_kind_text(want)}",
                      f"write `{dotted}` as {_kind_text(want)}" + (f" (default {key.default!r})"
                                                                     if key is not None and key.default is not None
                                                                     else ""))


def _range_text(key: Key) -> str:
    parts = []
    if key.ge is not None:
        parts.append(f">= {key.ge:g}")
    if key.gt is not None:
        parts.append(f"> {key.gt:g}")
    if key.le is not None:
        parts.append(f"<= {key.le:g}")
    if key.kind == "list_int":
        parts.append("as a non-empty list of positive integers")
    return " and ".join(parts)


def _kind_text(kind: str) -> str:
    return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
            "list_int": "a list of integers", "enum": "one of its values"}.get(kind, kind)


def _key_at(top: Sequence[Key], path: Sequence[str | int]) -> Key | None:
    keys: Sequence[Key] = top
    found: Key | None = None
    for part in path:
        if isinstance(part, int):
            continue
        found = next((k for k in keys if k.name == part), None)
        if found is None:
            return None
        keys = found.keys
    return found


def all_paths(keys: Sequence[Key] = MODEL_YAML_KEYS, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every dotted key the table lists, sections' own keys included."""
    out: list[tuple[str, ...]] = []
    for key in keys:
        out.append(prefix + (key.name,))
        out.extend(all_paths(key.keys, prefix + (key.name,)))
    return out


def _unknown_fix(top: Sequence[Key], path: tuple[str | int, ...]) -> str:
    """The section where a key of that name lives; else the closest key in the same section."""
    name = str(path[-1])
    parent = _key_at(top, path[:-1]) if len(path) > 1 else None
    siblings = [k.name for k in (parent.keys if parent is not None else top)]
    elsewhere = [".".join(p) for p in all_paths(top) if p[-1] == name and p != path]
    if elsewhere:  # the exact name in another section says more than a near one here
        return f"`{name}` is the key `{elsewhere[0]}`, not one of this section: move it there"
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    here = ".".join(str(p) for p in path[:-1])
    if close:
        return f"did you mean `{(here + '.') if here else ''}{close[0]}`? rename it"
    if name == TRITON_CONFIG:
        return f"{TRITON_CONFIG} is the Triton model's section of model.yaml, not an LLM() argument: remove it"
    return (f"remove it (TensorRT-LLM {RELEASE}'s LLM() does not take it and refuses to start), or check it "
            "against the release the server runs")
