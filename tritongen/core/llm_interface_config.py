"""The LLM interface of a model config as Triton serves it: snake_case JSON from the HTTP endpoint,
camelCase from protobuf's MessageToDict, or tritonclient.grpc's wrapped form; all read by the one
detection (`llm_interface.detect_interface`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritongen.core.llm_interface import LLMInterface, TensorInfo, detect_interface


def _get(mapping: Mapping[str, Any], snake: str, camel: str, default: Any = None) -> Any:
    return mapping[snake] if snake in mapping else mapping.get(camel, default)


def _tensors(entries: Any) -> list[TensorInfo]:
    out = []
    for entry in entries or []:
        out.append(TensorInfo(
            name=str(entry["name"]),
            data_type=str(_get(entry, "data_type", "dataType", "TYPE_INVALID")),
            dims=[int(d) for d in entry.get("dims", [])],  # MessageToDict writes int64 dims as strings
            optional=bool(entry.get("optional", False)),
        ))
    return out


def _string_parameters(parameters: Any) -> dict[str, str]:
    out = {}
    for key, value in (parameters or {}).items():
        text = _get(value, "string_value", "stringValue") if isinstance(value, Mapping) else value
        if isinstance(text, str):
            out[str(key)] = text
    return out


def interface_from_config(config: Mapping[str, Any], *, model: str | None = None) -> LLMInterface:
    """`detect_interface` on a model config as Triton's GET /v2/models/<model>/config returns it
    (snake_case JSON), or as `google.protobuf.json_format.MessageToDict(ModelConfig)` writes it
    (camelCase, int64 dims as strings, defaults left out), or tritonclient.grpc's
    `get_model_config(as_json=True)` (the same, wrapped in {"config": ...}).

    `model`: the name to report, where the config has none (a config.pbtxt may leave it to the
    directory name)."""
    if "config" in config and isinstance(config["config"], Mapping):
        config = config["config"]
    policy = _get(config, "model_transaction_policy", "modelTransactionPolicy", {}) or {}
    return detect_interface(
        model=model or str(config.get("name") or "<unnamed>"),
        backend=config.get("backend") or None,
        platform=config.get("platform") or None,
        inputs=_tensors(config.get("input")),
        outputs=_tensors(config.get("output")),
        max_batch_size=int(_get(config, "max_batch_size", "maxBatchSize", 0) or 0),
        decoupled=bool(policy.get("decoupled", False)),
        parameters=_string_parameters(config.get("parameters")),
    )
