"""Triton Python-backend model `scorer`: a classic model whose instances share one device.

A stand-in for a real accelerator model, written so that tritongen is tried on something it did
not shape: its interface (`x` FP32 [24] in; `score` FP32 [2] and `label` INT32 [1] out) is not the
ranker's, and each execution has two parts, as a GPU model's has:

* a **host part** (`host_ms` + `host_per_row_ms` x rows): pre/post-processing that runs in each
  instance's own process, so it overlaps across instances;
* a **device part** (`device_ms` + `device_per_row_ms` x rows): it holds an exclusive lock on a
  file shared by every instance of every model on the same server that names the same
  `device_lock` (default: one per server process), so instances take turns, as kernels queued on
  one GPU do. N instances therefore deliver at most 1 / device-part executions per second,
  whatever N is.

Both parts sleep rather than spin, so the 2-core host's CPU is not what saturates.
"""

import fcntl
import json
import os
import tempfile
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(params: dict, key: str, default: float) -> float:
    value = params.get(key, {}).get("string_value", "")
    return float(value) if value else default


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.host_ms = _param(params, "host_ms", 3.0)
        self.host_per_row_ms = _param(params, "host_per_row_ms", 0.02)
        self.device_ms = _param(params, "device_ms", 1.0)
        self.device_per_row_ms = _param(params, "device_per_row_ms", 0.5)
        name = params.get("device_lock", {}).get("string_value", "") or f"server-{os.getppid()}"
        self.lock_path = os.path.join(tempfile.gettempdir(), f"tritongen-scorer-device-{name}.lock")
        self.lock = open(self.lock_path, "a+")
        rng = np.random.default_rng(3)
        self.weights = rng.standard_normal((24, 2)).astype(np.float32)

    def execute(self, requests):
        batches = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        rows = sum(int(b.shape[0]) for b in batches)
        time.sleep((self.host_ms + self.host_per_row_ms * rows) / 1000.0)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            time.sleep((self.device_ms + self.device_per_row_ms * rows) / 1000.0)
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        responses = []
        for x in batches:
            score = (x.astype(np.float32) @ self.weights).astype(np.float32)
            label = np.argmax(score, axis=1).astype(np.int32).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("score", score), pb_utils.Tensor("label", label)]))
        return responses

    def finalize(self):
        self.lock.close()
