"""Triton Python-backend model `ranker`: a batched numpy MLP whose execute() costs
`overhead_ms + n * per_item_ms` for the n rows it received (summed over all requests of the call).

Tensors: input `FEATURES` TYPE_FP32 dims [32] (with max_batch_size > 0 a request is [n, 32]);
output `SCORES` TYPE_FP32 dims [1] (shape [n, 1] then). With max_batch_size 0 the model accepts any
shape ending in 32 (dims [32] or [-1, 32]) and answers the same leading shape ending in 1.

Parameters (config.pbtxt `parameters { key: ... value { string_value: ... } }`), all optional:
  seed         int    7     seed of the weight generator (see ranker_net.RankerNet.from_seed)
  overhead_ms  float  4.0   fixed cost of one execute()
  per_item_ms  float  0.25  cost of each row in that execute()
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ranker_net import INPUT_DIM, RankerNet  # noqa: E402

DEFAULTS = {"seed": 7, "overhead_ms": 4.0, "per_item_ms": 0.25}


def _parameters(model_config: dict) -> dict:
    raw = model_config.get("parameters") or {}
    out = dict(DEFAULTS)
    for key, default in DEFAULTS.items():
        entry = raw.get(key)
        if entry is None:
            continue
        text = entry.get("string_value", "") if isinstance(entry, dict) else str(entry)
        if text.strip() == "":
            continue
        try:
            out[key] = int(text) if isinstance(default, int) else float(text)
        except ValueError as err:
            raise pb_utils.TritonModelException(
                f"ranker: parameter {key!r} must be {'an integer' if isinstance(default, int) else 'a number'}, got {text!r}"
            ) from err
        if out[key] < 0:
            raise pb_utils.TritonModelException(f"ranker: parameter {key!r} must be >= 0, got {text!r}")
    return out


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        params = _parameters(self.model_config)
        self.seed = int(params["seed"])
        self.overhead_s = float(params["overhead_ms"]) / 1000.0
        self.per_item_s = float(params["per_item_ms"]) / 1000.0
        self.net = RankerNet.from_seed(self.seed)
        pb_utils.Logger.log_info(
            f"ranker: seed={self.seed} overhead_ms={params['overhead_ms']} "
            f"per_item_ms={params['per_item_ms']} max_batch_size={self.model_config.get('max_batch_size', 0)}"
        )

    def execute(self, requests):
        start = time.perf_counter()
        responses = []
        items = 0
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "FEATURES")
            if tensor is None:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("input FEATURES is missing", pb_utils.TritonError.INVALID_ARG)
                    )
                )
                continue
            features = tensor.as_numpy()
            if features.ndim == 0 or features.shape[-1] != INPUT_DIM:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"FEATURES must end in a dimension of {INPUT_DIM}, got shape {list(features.shape)}",
                            pb_utils.TritonError.INVALID_ARG,
                        )
                    )
                )
                continue
            scores = self.net.scores(features)
            items += int(np.prod(features.shape[:-1], dtype=np.int64))  # rows; 1 for a [32] tensor
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SCORES", scores)]))
        # Fixed overhead plus per-item cost: sleep only what the real math has not used up.
        remaining = self.overhead_s + items * self.per_item_s - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        return responses

    def finalize(self):
        pass
