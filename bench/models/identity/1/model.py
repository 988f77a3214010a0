"""Triton Python-backend model `identity`: OUTPUT0 is INPUT0, nothing computed (bench/bench_sidecar.py).

The nvidia-pytriton wheel ships only the Python backend (no `identity` backend), so this is the
cheapest model it can serve: one execute() per request (max_batch_size 0), each answered with the
input tensor it came with, in the order the requests came.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return out
