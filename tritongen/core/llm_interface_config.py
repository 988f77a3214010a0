"""The LLM interface of a model config as Triton serves it: snake_case JSON from the HTTP endpoint,
camelCase from protobuf's MessageToDict, or tritonclient.grpc's wrapped form; all read by the one
detection (`llm_interface.detect_interface`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tritongen.core.llm_interface import GENERIC_TEXT_INPUTS, LLMInterface, TensorInfo, detect_interface


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


def served_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config itself, out of tritonclient.grpc's {"config": ...} wrapper where it is in one."""
    if "config" in config and isinstance(config["config"], Mapping):
        return config["config"]
    return config


def config_tensors(config: Mapping[str, Any], key: str) -> list[TensorInfo]:
    """The config's "input" or "output" entries (`key`), in any of the forms `interface_from_config` reads."""
    return _tensors(served_config(config).get(key))


def config_decoupled(config: Mapping[str, Any]) -> bool:
    """Whether the config's transaction policy is decoupled (many responses per request)."""
    config = served_config(config)
    policy = _get(config, "model_transaction_policy", "modelTransactionPolicy", {}) or {}
    return bool(policy.get("decoupled", False))


def interface_from_config(config: Mapping[str, Any], *, model: str | None = None,
                          text_inputs: Sequence[str] = GENERIC_TEXT_INPUTS) -> LLMInterface:
    """`detect_interface` on a model config as Triton's GET /v2/models/<model>/config returns it
    (snake_case JSON), or as `google.protobuf.json_format.MessageToDict(ModelConfig)` writes it
    (camelCase, int64 dims as strings, defaults left out), or tritonclient.grpc's
    `get_model_config(as_json=True)` (the same, wrapped in {"config": ...}).

    `model`: the name to report, where the config has none (a config.pbtxt may leave it to the
    directory name). `text_inputs`: as `detect_interface`'s."""
    config = served_config(config)
    return detect_interface(
        model=model or str(config.get("name") or "<unnamed>"),
        backend=config.get("backend") or None,
        platform=config.get("platform") or None,
        inputs=_tensors(config.get("input")),
        outputs=_tensors(config.get("output")),
        max_batch_size=int(_get(config, "max_batch_size", "maxBatchSize", 0) or 0),
        decoupled=config_decoupled(config),
        parameters=_string_parameters(config.get("parameters")),
        text_inputs=text_inputs,
    )
