"""A stand-in for Triton's vLLM backend: a Python-based backend named "vllm" with the real
backend's interface and vLLM's scheduling (paged KV blocks, recompute preemption), whose costs are
sleeps (see ../../standin_engine.py and ../../README.md).

Serve it by putting this directory at `<backend-directory>/vllm/` (tritongen:
`ServerOptions(python_backends={"vllm": <this directory>})`); a model whose config says
`backend: "vllm"` then runs this file in the Python backend's stub. Per model, `1/model.json`
holds vLLM engine arguments and `1/standin.json` the costs.

Interface (as the real backend; `auto_complete_config` adds what the config does not list):
  inputs   text_input STRING [1]; optional: image STRING [-1] (ignored), stream BOOL [1],
           sampling_parameters STRING [1] (JSON), exclude_input_in_output BOOL [1],
           return_finish_reason / return_cumulative_logprob / return_logprobs /
           return_num_input_tokens / return_num_output_tokens BOOL [1],
           embedding_request STRING [1] (refused: this stand-in only generates)
  outputs  text_output STRING [-1], finish_reason STRING [-1], cumulative_logprob FP32 [-1],
           logprobs STRING [-1], num_input_tokens UINT32 [1], num_output_tokens UINT32 [-1]
  max_batch_size 0, decoupled. The sampling parameters are the `sampling_parameters` JSON, or the
  request's parameters when that input is absent; only `max_tokens` (default 16) is honoured.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from standin_engine import GrowPreempt  # noqa: E402
from vllm_interface import INPUTS, OPTIONAL_BOOLS, auto_complete, optional  # noqa: E402
from standin_triton import (  # noqa: E402
    BadRequest,
    MetricPublisher,
    ResponseSink,
    model_version_dir,
    require_decoupled,
    scalar,
    send_error,
    start_engine,
)

ENGINE_ARGS_FILE = "model.json"
VLLM_DEFAULT_MAX_TOKENS = 16  # vLLM SamplingParams.max_tokens
DEFAULT_NUM_BLOCKS = 256  # no GPU to size the KV cache from: set num_gpu_blocks_override

# the upstream interface (tritongen/triton_backends/vllm/vllm_interface.py, linked beside this file),
# and the embedding switch this stand-in refuses, last as the upstream lists it
INPUTS = [*INPUTS, optional("embedding_request", "TYPE_STRING", [1])]

# metric name -> (kind, EngineStats attribute, description); labels model and version
METRICS = {
    "vllm:num_requests_running": ("gauge", "running", "Number of requests currently running on GPU."),
    "vllm:num_requests_waiting": ("gauge", "waiting", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("gauge", "memory_usage", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:num_preemptions_total": ("counter", "preemptions_total", "Cumulative number of preemption from the engine."),
    "vllm:prompt_tokens_total": ("counter", "prompt_tokens_total", "Number of prefill tokens processed."),
    "vllm:generation_tokens_total": ("counter", "generation_tokens_total", "Number of generation tokens processed."),
}

# The vLLM backend's own histograms (its src/utils/metrics.py: names, bucket bounds in seconds), observed
# per request from its arrival at execute: the first token, and the last.
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (
        "Histogram of time to first token in seconds.",
        [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
    ),
    "vllm:e2e_request_latency_seconds": (
        "Histogram of end to end request latency in seconds.",
        [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
    ),
}


class LatencyHistograms:
    """The two histograms, kept alive with their families (the Python backend requires it)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.families = {}
        self.metrics = {}
        for name, (description, buckets) in HISTOGRAMS.items():
            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.HISTOGRAM)
            self.families[name] = family
            self.metrics[name] = family.Metric(labels=labels, buckets=buckets)

    def first_token(self, seconds: float) -> None:
        self.metrics["vllm:time_to_first_token_seconds"].observe(seconds)

    def finished(self, seconds: float) -> None:
        self.metrics["vllm:e2e_request_latency_seconds"].observe(seconds)

    def close(self) -> None:
        self.metrics.clear()
        self.families.clear()


def _int_arg(args: dict, key: str, default: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise pb_utils.TritonModelException(f"{ENGINE_ARGS_FILE}: {key} must be an integer, got {value!r}") from err


def _true(value) -> bool:
    return str(value).lower() == "true"


def read_engine_args(path: str) -> tuple[GrowPreempt, int, dict]:
    """(policy, max_num_seqs, engine args as read) from vLLM EngineArgs names in model.json."""
    try:
        with open(path, encoding="utf-8") as handle:
            args = json.load(handle)
    except (OSError, ValueError) as err:
        raise pb_utils.TritonModelException(f"'{ENGINE_ARGS_FILE}' holding the engine args could not be read: {err}") from err
    if not isinstance(args, dict):
        raise pb_utils.TritonModelException(f"{path}: expected a JSON object of vLLM engine args")
    max_model_len = _int_arg(args, "max_model_len", 2048)
    try:
        policy = GrowPreempt(
            num_blocks=_int_arg(args, "num_gpu_blocks_override", DEFAULT_NUM_BLOCKS),
            block_size=_int_arg(args, "block_size", 16),
            max_num_batched_tokens=_int_arg(args, "max_num_batched_tokens", max(max_model_len, 2048)),
            max_model_len=max_model_len,
        )
    except ValueError as err:
        raise pb_utils.TritonModelException(f"{path}: {err}") from err
    return policy, _int_arg(args, "max_num_seqs", 256), args


class _VllmSink(ResponseSink):
    """The real backend's responses: text deltas when streaming, the additional outputs on request."""

    def __init__(self, sender, stream: bool, prefix: str, prompt_tokens: int, max_tokens: int,
                 wanted: dict[str, bool], latency: LatencyHistograms | None = None) -> None:
        super().__init__(sender, stream)
        self.arrived = time.monotonic()
        self.latency = latency
        self.max_tokens = max_tokens
        self.prefix = prefix  # the prompt, prepended to the first response when not excluded
        self.prompt_tokens = prompt_tokens
        self.wanted = wanted
        self.sent_tokens = 0

    def token(self, text: str, index: int, final: bool) -> None:
        if self.latency is not None and index == 0:
            self.latency.first_token(time.monotonic() - self.arrived)
        super().token(text, index, final)
        if self.latency is not None and final:
            self.latency.finished(time.monotonic() - self.arrived)

    def tensors(self, text: str, tokens: int, first: bool) -> list:
        self.sent_tokens += tokens
        text = (self.prefix + text) if first else text
        out = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        finished = self.sent_tokens >= self.max_tokens
        extra = {
            "return_finish_reason": ("finish_reason", np.array([b"length" if finished else b"None"], dtype=np.object_)),
            "return_cumulative_logprob": ("cumulative_logprob", np.zeros([1], dtype=np.float32)),
            "return_logprobs": ("logprobs", np.array([b"null"], dtype=np.object_)),
            "return_num_input_tokens": ("num_input_tokens", np.array([self.prompt_tokens], dtype=np.uint32)),
            "return_num_output_tokens": ("num_output_tokens", np.array([tokens], dtype=np.uint32)),
        }
        for flag, (name, value) in extra.items():
            if self.wanted.get(flag):
                out.append(pb_utils.Tensor(name, value))
        return out


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        return auto_complete(auto_complete_model_config, inputs=INPUTS)

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        require_decoupled(self.model_config, "the vllm backend")
        policy, max_num_seqs, engine_args = read_engine_args(os.path.join(model_version_dir(args), ENGINE_ARGS_FILE))
        if _true(engine_args.get("enable_chunked_prefill", False)):
            pb_utils.Logger.log_warn("[vllm stand-in] enable_chunked_prefill is ignored: every prefill runs whole")
        params = self.model_config.get("parameters", {})
        report = _true(params.get("REPORT_CUSTOM_METRICS", {}).get("string_value", ""))
        self.metrics = None
        self.latency = None
        if report and not _true(engine_args.get("disable_log_stats", False)):
            labels = {"model": args["model_name"], "version": args["model_version"]}
            try:
                self.metrics = MetricPublisher(METRICS, labels)
                self.latency = LatencyHistograms(labels)
            except pb_utils.TritonModelException as err:  # metrics disabled on the server
                pb_utils.Logger.log_info(f"[vllm stand-in] metrics not supported: {err}")
        on_step = self.metrics.publish if self.metrics is not None else None
        self.engine = start_engine(args, policy, max_num_seqs, on_step=on_step)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt, max_tokens, sink = self._parse(request, sender)
            except BadRequest as err:
                send_error(sender, f"Error generating stream: {err}", "INVALID_ARG")
                continue
            self.engine.submit(prompt, max_tokens, sink)
        return None

    def _parse(self, request, sender):
        if pb_utils.get_input_tensor_by_name(request, "embedding_request") is not None:
            raise BadRequest("this model does not support 'embed' requests")
        text = scalar(request, "text_input", required=True)
        prompt = text if isinstance(text, bytes) else str(text).encode("utf-8")
        flags = {name: bool(value) for name in OPTIONAL_BOOLS if (value := scalar(request, name)) is not None}
        stream = flags.get("stream", False)
        if "exclude_input_in_output" in flags:
            prepend = not flags["exclude_input_in_output"]
        else:
            prepend = not stream
        if prepend and stream:
            raise BadRequest("when streaming, exclude_input_in_output = False is not allowed")
        raw = scalar(request, "sampling_parameters")
        if raw is None:
            raw = request.parameters()  # as the real backend: the request's own parameters
        try:
            params = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else (raw or "{}"))
        except ValueError as err:
            raise BadRequest(f"sampling parameters are not JSON: {err}") from err
        if not isinstance(params, dict):
            raise BadRequest("sampling parameters must be a JSON object")
        max_tokens = params.get("max_tokens")
        try:
            max_tokens = VLLM_DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
        except (TypeError, ValueError) as err:
            raise BadRequest(f"max_tokens must be an integer, got {max_tokens!r}") from err
        prefix = prompt.decode("utf-8", errors="replace") if prepend else ""
        sink = _VllmSink(sender, stream, prefix, self.engine.cfg.costs.tokens(prompt), max_tokens, flags, self.latency)
        return prompt, max_tokens, sink

    def finalize(self):
        self.engine.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.latency is not None:
            self.latency.close()
