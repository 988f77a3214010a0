"""The max_tokens a request asks of a model, read back where its backend reads it (a tensor, vLLM's
sampling_parameters JSON, or the request parameters), for a cost estimate before it is sent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tritongen.core.llm_interface import LLMInterface, int_or_none


def _elements(value: Any) -> list[Any]:
    """The elements of a tensor value: a numpy array (anything with tolist()), a nested list, a scalar."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(_elements(v))
        return out
    return [value]


def _parameter_value(value: Any) -> Any:
    """A request parameter's value: plain (HTTP JSON), or gRPC's InferParameter as a dict
    ({'int64_param': 5}, or MessageToDict's {'int64Param': '5'})."""
    if isinstance(value, Mapping) and len(value) == 1:
        (key, inner), = value.items()
        if str(key).endswith(("_param", "Param")):
            return inner
    return value


def _require_int(value: Any, where: str) -> int:
    found = int_or_none(value)
    if found is None:
        raise ValueError(f"{where} must be an integer, got {value!r}")
    return found


def max_tokens_of(interface: LLMInterface, tensors: Mapping[str, Any], parameters: Mapping[str, Any] | None) -> int | None:
    """The max_tokens a request asks of `interface`'s model, read where that backend reads it; for a
    cost estimate before the request is sent.

    `tensors`: input name -> value (numpy array, nested list or scalar; BYTES as bytes or str).
    `parameters`: the request parameters. Where the backend reads it: the max_tokens tensor; for
    vLLM the `sampling_parameters` JSON when that tensor is sent (the request parameters are then
    ignored, as the backend does), else the request parameters. Several batch rows: the largest.
    Not sent: the backend's default (`interface.default_max_tokens`, None when unknown). A value
    that is there but not an integer, or sampling_parameters that are not a JSON object, raise
    ValueError."""
    if interface.max_tokens_input is not None and interface.max_tokens_input in tensors:
        values = _elements(tensors[interface.max_tokens_input])
        if values:
            return max(_require_int(v, f"input {interface.max_tokens_input!r}") for v in values)
    if interface.sampling_parameters_input is not None and interface.sampling_parameters_input in tensors:
        values = _elements(tensors[interface.sampling_parameters_input])
        if values:
            text = values[0].decode("utf-8", "replace") if isinstance(values[0], bytes) else values[0]
            try:
                doc = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                doc = None
            if not isinstance(doc, dict):
                raise ValueError(f"input {interface.sampling_parameters_input!r} is not a JSON object: {values[0]!r}")
            if "max_tokens" in doc and doc["max_tokens"] is not None:
                return _require_int(doc["max_tokens"], f"{interface.sampling_parameters_input}.max_tokens")
            return interface.default_max_tokens
    if interface.max_tokens_input is None and parameters and parameters.get("max_tokens") is not None:
        return _require_int(_parameter_value(parameters["max_tokens"]), "request parameter 'max_tokens'")
    return interface.default_max_tokens
