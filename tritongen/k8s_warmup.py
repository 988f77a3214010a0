"""The self-check requests of a Kubernetes pod: one real inference per model entry, built from the
plan's tensors, which selfcheck.py sends before the pod may take traffic (`tritongen.k8s`)."""

from __future__ import annotations

import math
from typing import Any

from tritongen.core.plan import DeploymentPlan, ModelEntryPlan


def _sample_value(data_type: str, name: str) -> object:
    kind = data_type.removeprefix("TYPE_")
    if kind == "STRING":
        return '{"max_tokens": 1}' if name == "sampling_parameters" else "warm-up"
    if kind == "BOOL":
        return name == "stream"
    if kind.startswith(("INT", "UINT")):
        return 1
    return 0.0


def _wire_type(data_type: str) -> str:
    kind = data_type.removeprefix("TYPE_")
    return "BYTES" if kind == "STRING" else kind


def warmup_request(entry: ModelEntryPlan) -> dict[str, Any]:
    """The self-check request for one model entry (JSON the selfcheck script sends as is).

    Unary models: /v2/models/M/infer with every required input, batch 1, variable dims as 1.
    Decoupled models: /v2/models/M/generate_stream with required inputs plus a one-token budget
    where the model takes one (`max_tokens`, vLLM's `sampling_parameters`).
    """
    if entry.decoupled:
        body: dict[str, Any] = {}
        for tensor in entry.inputs:
            if tensor.optional and tensor.name not in ("max_tokens", "sampling_parameters"):
                continue
            body[tensor.name] = _sample_value(tensor.data_type, tensor.name)
        return {"model": entry.name, "path": f"/v2/models/{entry.name}/generate_stream", "body": body, "stream": True}
    inputs = []
    for tensor in entry.inputs:
        if tensor.optional:
            continue
        dims = [1 if d == -1 else d for d in tensor.dims]
        shape = ([1] if entry.max_batch_size > 0 else []) + dims
        count = math.prod(shape)
        inputs.append({
            "name": tensor.name, "datatype": _wire_type(tensor.data_type), "shape": shape,
            "data": [_sample_value(tensor.data_type, tensor.name)] * count,
        })
    return {"model": entry.name, "path": f"/v2/models/{entry.name}/infer", "body": {"inputs": inputs}, "stream": False}


def warmup_requests(plan: DeploymentPlan) -> list[dict[str, Any]]:
    return [warmup_request(entry) for entry in plan.entries]
