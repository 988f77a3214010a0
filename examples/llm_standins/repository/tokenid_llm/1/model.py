"""`tokenid_llm`: an LLM engine that takes token ids and answers with ids, the shape of TensorRT-LLM's
raw model and of Python backends that leave tokenizing to the client, written for tritongen's tests
from that shape (no one real model's code). Pure numpy; the engine is the stand-ins' own
(standin_engine.py, linked beside this file): each id is one prompt token (standin.json
bytes_per_token 1), steps cost what standin.json says, and the pool reserves prompt + budget up
front, killing what does not fit (ReserveKill).

Interface (config.pbtxt): decoupled, max_batch_size 0
  input  token_ids          INT64 [-1]  the prompt's ids (at least one)
  input  input_lengths      INT32 [1]   how many ids token_ids holds; a request whose count differs is refused
  input  request_output_len INT32 [1]   the budget: how many ids to generate (1 or more)
  input  streaming          BOOL  [1]   optional; true: one response per id, else one final response of all
  output output_ids         INT64 [-1]  the generated ids only (never the prompt's)
Parameters (config.pbtxt `parameters`, string values): pool_tokens (2048), max_active (32).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from standin_engine import ReserveKill  # noqa: E402
from standin_triton import (  # noqa: E402
    BadRequest, ResponseSink, int_parameters, require_decoupled, scalar, send_error, start_engine,
)

DEFAULTS = {"pool_tokens": 2048, "max_active": 32}
FIRST_GENERATED_ID = 300  # the ids it generates: 300, 301, ... (any ids would do; tests count them)


class _IdSink(ResponseSink):
    """Sends generated ids: one per response when streaming, else all of them in the final one."""

    oom_code = "INTERNAL"

    def __init__(self, sender, stream: bool) -> None:
        super().__init__(sender, stream)
        self.sent = 0

    def tensors(self, text: str, tokens: int, first: bool) -> list:
        ids = np.arange(self.sent, self.sent + tokens, dtype=np.int64) % 1000 + FIRST_GENERATED_ID
        self.sent += tokens
        return [pb_utils.Tensor("output_ids", ids)]


def read_request(request) -> tuple[int, int, bool]:
    """(prompt ids, budget, stream) of one request; BadRequest names the input and the fix."""
    tensor = pb_utils.get_input_tensor_by_name(request, "token_ids")
    if tensor is None:
        raise BadRequest("input token_ids is missing: send the prompt's ids")
    ids = tensor.as_numpy().reshape(-1)
    if ids.size == 0:
        raise BadRequest("input token_ids is empty: send at least one id")
    length = scalar(request, "input_lengths", required=True)
    if int(length) != ids.size:
        raise BadRequest(f"input_lengths is {int(length)} but token_ids holds {ids.size} ids: send their count")
    budget = int(scalar(request, "request_output_len", required=True))
    if budget < 1:
        raise BadRequest(f"request_output_len must be 1 or more, got {budget}")
    return int(ids.size), budget, bool(scalar(request, "streaming"))


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        require_decoupled(model_config, "tokenid_llm")
        self.params = int_parameters(model_config, DEFAULTS, "tokenid_llm")
        self.engine = start_engine(args, ReserveKill(pool_tokens=self.params["pool_tokens"]), self.params["max_active"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt_ids, budget, stream = read_request(request)
            except BadRequest as err:
                send_error(sender, str(err), "INVALID_ARG")
                continue
            self.engine.submit(b"\0" * prompt_ids, budget, _IdSink(sender, stream))  # one "byte" per id
        return None

    def finalize(self):
        self.engine.stop()
