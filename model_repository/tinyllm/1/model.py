"""Triton Python-backend model `tinyllm`: a small numpy decoder-only transformer served like an LLM
engine (decoupled streaming, continuous batching, paged KV cache, custom metrics).

The engine itself lives in `tinyllm_engine.py` beside this file (importable without Triton); this
file adapts Triton requests to it. `execute()` only hands each request, with its response sender,
to the engine thread and returns None at once; the engine streams one response per generated
token and ends each request with TRITONSERVER_RESPONSE_COMPLETE_FINAL.

Tensors (names of Triton's generate extension, so /v2/models/<m>/generate_stream works):
  input  text_input  TYPE_STRING dims [1]
  input  max_tokens  TYPE_INT32  dims [1]   optional; default: parameter default_max_tokens
  output text_output TYPE_STRING dims [1]   one response per token, carrying that token's text
With max_batch_size > 0 each request's tensors carry a leading batch dimension of 1.
The config must say `model_transaction_policy { decoupled: true }`.

Parameters (config.pbtxt `parameters { key: ... value { string_value: ... } }`), all optional:
see tinyllm_engine.EngineConfig (num_layers 2, hidden_size 64, num_heads 4, num_kv_heads 2,
vocab_size 256, max_context 256, seed 11, kv_block_tokens 16, kv_pool_blocks 64, max_num_seqs 8,
default_max_tokens 16, intermediate_size 0 = 4 x hidden_size, head_dim 0 = hidden_size / num_heads).
Keys it does not know are ignored.

Metrics (on the server's /metrics; labels model, version, instance): tritongen's `llm_engine_*`
convention for a Python backend's engine (meanings in tritongen/core/engine_metrics.py), which
doctor, the dashboard, the profiler and the sidecar read:
  gauges   llm_engine_kv_blocks_used, llm_engine_kv_blocks_total, llm_engine_kv_bytes_per_token,
           llm_engine_kv_block_tokens, llm_engine_running_sequences, llm_engine_waiting_sequences
  counters llm_engine_oom_errors_total, llm_engine_generated_tokens_total,
           llm_engine_decode_steps_total (generated tokens / decode steps = mean decode batch)
The names are spelled out here because the model runs in Triton's Python stub, without tritongen;
tests/unit/test_engine_metrics_convention.py holds them to tritongen's.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tinyllm_engine import Engine, EngineConfig, EngineStats, TokenSink, encode  # noqa: E402

# metric name -> (kind, EngineStats field, description)
METRICS = {
    "llm_engine_kv_blocks_used": ("gauge", "kv_blocks_used", "KV cache blocks held by sequences"),
    "llm_engine_kv_blocks_total": ("gauge", "kv_blocks_total", "KV cache blocks in the pool"),
    "llm_engine_kv_bytes_per_token": ("gauge", "kv_bytes_per_token", "KV cache bytes per token"),
    "llm_engine_kv_block_tokens": ("gauge", "kv_block_tokens", "Tokens per KV cache block"),
    "llm_engine_running_sequences": ("gauge", "running_sequences", "Sequences in the running batch"),
    "llm_engine_waiting_sequences": ("gauge", "waiting_sequences", "Requests waiting for a batch slot"),
    "llm_engine_oom_errors_total": ("counter", "oom_errors_total", "Requests failed: KV cache pool exhausted"),
    "llm_engine_generated_tokens_total": ("counter", "generated_tokens_total", "Tokens generated"),
    "llm_engine_decode_steps_total": ("counter", "decode_steps_total", "Batched decode steps run"),
}

# How often (in generated tokens) a sequence asks the server whether its client cancelled;
# each check is a round trip to the server process.
CANCEL_CHECK_EVERY = 8

_ERROR_CODES = {
    "invalid": "INVALID_ARG",
    "oom": "UNAVAILABLE",
    "unavailable": "UNAVAILABLE",
    "internal": "INTERNAL",
}


class _BadRequest(Exception):
    pass


class _TritonSink(TokenSink):
    """Streams a sequence's tokens through its response sender."""

    def __init__(self, sender, out_shape: tuple[int, ...]) -> None:
        self.sender = sender
        self.out_shape = out_shape
        self._calls = 0

    def token(self, text: str, token_id: int, final: bool) -> None:
        out = np.array([text.encode("utf-8")], dtype=np.object_).reshape(self.out_shape)
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", out)])
        self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finish(self) -> None:
        self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def error(self, message: str, kind: str = "internal") -> None:
        code = getattr(pb_utils.TritonError, _ERROR_CODES.get(kind, "INTERNAL"))
        self.sender.send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def cancelled(self) -> bool:
        self._calls += 1
        if self._calls % CANCEL_CHECK_EVERY:
            return False
        return bool(self.sender.is_cancelled())


def _single(request, name: str, required: bool):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise _BadRequest(f"input {name} is missing")
        return None
    flat = tensor.as_numpy().reshape(-1)
    if flat.size != 1:
        raise _BadRequest(
            f"input {name} must hold exactly one value per request (batch of 1), got shape "
            f"{list(tensor.as_numpy().shape)}"
        )
    return flat[0]


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(
                "tinyllm streams one response per token: its config needs "
                "model_transaction_policy { decoupled: true }"
            )
        try:
            self.cfg = EngineConfig.from_parameters(self.model_config.get("parameters"))
        except ValueError as err:
            raise pb_utils.TritonModelException(str(err)) from err
        self.batched = int(self.model_config.get("max_batch_size", 0)) > 0
        self.out_shape = (1, 1) if self.batched else (1,)
        labels = {
            "model": args.get("model_name", "tinyllm"),
            "version": str(args.get("model_version", "")),
            "instance": args.get("model_instance_name", ""),
        }
        self._families = {}
        self._metrics = {}
        self._published: dict[str, int] = {}
        try:
            for name, (kind, _field, description) in METRICS.items():
                family = pb_utils.MetricFamily(
                    name=name,
                    description=description,
                    kind=pb_utils.MetricFamily.GAUGE if kind == "gauge" else pb_utils.MetricFamily.COUNTER,
                )
                self._families[name] = family
                self._metrics[name] = family.Metric(labels=labels)
        except Exception as err:  # metrics disabled on the server: serve without them
            pb_utils.Logger.log_warn(f"tinyllm: custom metrics unavailable ({err}); serving without them")
            self._metrics, self._families = {}, {}
        self.engine = Engine(self.cfg, on_step=self._publish)
        self._publish(self.engine.stats())
        self.engine.start()
        cfg = self.cfg
        pb_utils.Logger.log_info(
            f"tinyllm {labels['instance']}: layers={cfg.num_layers} hidden={cfg.hidden_size} "
            f"heads={cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim} max_context={cfg.max_context} "
            f"kv_pool={cfg.kv_pool_blocks}x{cfg.kv_block_tokens} tokens ({self.engine.pool.nbytes} bytes, "
            f"{cfg.kv_bytes_per_token} B/token) max_num_seqs={cfg.max_num_seqs} "
            f"weights={self.engine.model.weight_bytes} bytes batched={self.batched}"
        )

    def _publish(self, stats: EngineStats) -> None:
        """Push changed values to the server (each update is a round trip to it)."""
        for name, (kind, field_name, _description) in METRICS.items():
            metric = self._metrics.get(name)
            if metric is None:
                continue
            value = int(getattr(stats, field_name))
            last = self._published.get(name)
            if value == last:
                continue
            if kind == "gauge":
                metric.set(value)
            else:
                metric.increment(value - (last or 0))
            self._published[name] = value

    def execute(self, requests):
        for request in requests:
            sink = _TritonSink(request.get_response_sender(), self.out_shape)
            try:
                text = _single(request, "text_input", required=True)
                max_tokens = _single(request, "max_tokens", required=False)
                prompt = text if isinstance(text, bytes) else str(text).encode("utf-8")
                max_tokens = None if max_tokens is None else int(max_tokens)
            except _BadRequest as err:
                sink.error(str(err), "invalid")
                continue
            self.engine.submit(encode(prompt), max_tokens, sink)
        return None

    def finalize(self):
        self.engine.stop()
        self._metrics.clear()  # metrics before their families (Python backend rule)
        self._families.clear()
