"""`check`'s findings on TensorRT-LLM's LLM-API model.yaml: the key table's problems (TG402-TG406,
TG409) and triton_config against config.pbtxt (TG407, TG408).

How the server treats triton_config (model.py of triton_backend/all_models/llmapi, with the
Python backend's `pb_utils.ModelConfig`): `auto_complete_config` calls
`set_model_transaction_policy(decoupled=...)`, which raises when config.pbtxt already states a
different `decoupled`, and `set_max_batch_size(n)`, which raises when config.pbtxt's max_batch_size
is larger and silently replaces a smaller one. A raise there fails the load. With auto-complete off
(`--disable-auto-complete-config`), triton_config is never applied: config.pbtxt alone counts, and
model.py still streams by triton_config's `decoupled`.

Pure: the parsed data, config facts and a line lookup in; findings out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tritongen.core.config_rules.catalogue import RULES
from tritongen.core.findings import Finding
from tritongen.core.trtllm_args import TRITON_CONFIG
from tritongen.core.trtllm_args_check import ArgProblem, check_model_yaml

LineOf = Callable[[tuple[Any, ...]], "int | None"]

PROBLEM_CODES = {"unknown": "TG402", "type": "TG403", "range": "TG404", "choice": "TG405", "missing": "TG406"}
IGNORED_TRITON_KEY = "TG409"  # model.py reads only its own triton_config keys and ignores the rest


def _finding(code: str, model: str, field: str, message: str, fix: str, path: str, line: int | None) -> Finding:
    return Finding(RULES[code].severity, code, model, field, f"model '{model}': {message}", fix, path=path, line=line)


def _code(problem: ArgProblem) -> str:
    if problem.kind == "unknown" and problem.path[:1] == (TRITON_CONFIG,):
        return IGNORED_TRITON_KEY
    return PROBLEM_CODES[problem.kind]


def model_yaml_findings(model: str, path: str, data: Mapping[str, Any], line_of: LineOf) -> list[Finding]:
    """The key table's verdict on a model.yaml, one finding per problem at its key's line."""
    out = []
    for problem in check_model_yaml(data):
        code = _code(problem)
        message = problem.message
        if code == IGNORED_TRITON_KEY:
            message = f"`{problem.key}` is not a triton_config key model.py reads, so it has no effect"
        out.append(_finding(code, model, problem.key, f"model.yaml: {message}", problem.fix, path,
                            line_of(problem.path)))
    return out


def triton_config_findings(
    model: str,
    path: str,
    data: Mapping[str, Any],
    line_of: LineOf,
    *,
    config_path: str,
    max_batch_size: int,
    states_decoupled: bool,
    decoupled: bool,
    autofill: bool = True,
) -> list[Finding]:
    """triton_config against config.pbtxt (`max_batch_size`; `decoupled` when config.pbtxt has a
    model_transaction_policy, `states_decoupled`)."""
    section = data.get(TRITON_CONFIG)
    if not isinstance(section, Mapping):
        return []  # missing or mistyped: model_yaml_findings says so
    out = []
    wanted = section.get("decoupled")
    if isinstance(wanted, bool) and states_decoupled and wanted != decoupled:
        out.append(_finding(
            "TG407", model, f"{TRITON_CONFIG}.decoupled",
            f"model.yaml sets {TRITON_CONFIG}.decoupled {str(wanted).lower()} but {config_path} states "
            f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}; model.py's auto_complete_config "
            "refuses to change it and the model does not load",
            f"make them agree: set {TRITON_CONFIG}.decoupled: {str(decoupled).lower()}, or remove "
            "model_transaction_policy from config.pbtxt (upstream's config.pbtxt leaves it to model.yaml)",
            path, line_of((TRITON_CONFIG, "decoupled"))))
    elif isinstance(wanted, bool) and not autofill and wanted != decoupled:
        out.append(_finding(
            "TG407", model, f"{TRITON_CONFIG}.decoupled",
            f"model.yaml sets {TRITON_CONFIG}.decoupled {str(wanted).lower()}, but with auto-complete off the server "
            f"takes decoupled {str(decoupled).lower()} from {config_path}, while model.py streams by model.yaml's",
            f"state model_transaction_policy {{ decoupled: {str(wanted).lower()} }} in config.pbtxt",
            path, line_of((TRITON_CONFIG, "decoupled"))))
    batch = section.get("max_batch_size")
    if isinstance(batch, int) and not isinstance(batch, bool) and max_batch_size != batch:
        where = line_of((TRITON_CONFIG, "max_batch_size"))
        if max_batch_size > batch:
            out.append(_finding(
                "TG407", model, f"{TRITON_CONFIG}.max_batch_size",
                f"{config_path} states max_batch_size {max_batch_size}, above model.yaml's {TRITON_CONFIG}."
                f"max_batch_size {batch}; model.py's auto_complete_config refuses it and the model does not load",
                f"set max_batch_size: {batch} in config.pbtxt, or remove it there (model.yaml sets it)",
                path, where))
        elif max_batch_size and autofill:
            out.append(_finding(
                "TG408", model, f"{TRITON_CONFIG}.max_batch_size",
                f"{config_path} states max_batch_size {max_batch_size}, but model.yaml's {TRITON_CONFIG}."
                f"max_batch_size {batch} replaces it when the model loads",
                "remove max_batch_size from config.pbtxt (model.yaml sets it), or make them agree",
                path, where))
    return out

