"""`reserve_llm`: a user's own LLM engine on the plain Python backend, written naively: it reserves
a request's whole budget (prompt + max_tokens) when the request starts and kills a request that
does not fit with an "out of memory" error. Its costs are sleeps (see standin_engine.py, linked
beside this file, and examples/llm_standins/README.md); it exports no metrics.

Interface (config.pbtxt): decoupled, max_batch_size 0
  input  text_input  STRING [1]
  input  max_tokens  INT32  [1]  optional; default: parameter default_max_tokens
  input  stream      BOOL   [1]  optional; true: one response per token, else one final response
  output text_output STRING [-1]
Parameters (config.pbtxt `parameters`, string values): pool_tokens (1920), max_active (48),
default_max_tokens (32). Costs: 1/standin.json.
"""

from __future__ import annotations

import json
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from standin_engine import ReserveKill  # noqa: E402
from standin_triton import (  # noqa: E402
    BadRequest, ResponseSink, as_bytes, int_parameters, require_decoupled, scalar, send_error, start_engine,
)

DEFAULTS = {"pool_tokens": 1920, "max_active": 48, "default_max_tokens": 32}


class _Sink(ResponseSink):
    oom_code = "INTERNAL"  # a hand-written engine's "out of memory" is an internal error


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        require_decoupled(model_config, "reserve_llm")
        self.params = int_parameters(model_config, DEFAULTS, "reserve_llm")
        policy = ReserveKill(pool_tokens=self.params["pool_tokens"])
        self.engine = start_engine(args, policy, self.params["max_active"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = as_bytes(scalar(request, "text_input", required=True))
                max_tokens = scalar(request, "max_tokens")
                stream = scalar(request, "stream")
            except BadRequest as err:
                send_error(sender, str(err), "INVALID_ARG")
                continue
            max_tokens = self.params["default_max_tokens"] if max_tokens is None else int(max_tokens)
            self.engine.submit(prompt, max_tokens, _Sink(sender, bool(stream)))
        return None

    def finalize(self):
        self.engine.stop()
