"""Names of the LLM engines' own Prometheus metrics on Triton's endpoint, in one place.

The profiler reads them to measure the KV pool, the sidecar to see the pool's live usage, doctor
to see an engine drowning. Names are the engines' own:
- vLLM's own Prometheus names (vllm/v1/metrics/loggers.py; v0 in vllm/engine/metrics.py), which a
  Python backend that wraps vLLM's engine, or a newer vLLM backend, may export: gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (v0:
  `vllm:gpu_cache_usage_perc`, a 0..1 fraction of the KV blocks in use), the counter
  `vllm:num_preemptions_total`, and histograms `vllm:time_to_first_token_seconds`,
  `vllm:request_queue_time_seconds`, `vllm:e2e_request_latency_seconds`. vLLM labels them
  `model_name`; Triton's vllm_backend labels what it exports `model` and `version`.
- Triton's vllm_backend itself (src/utils/metrics.py, 25.x) exports only the token counters and the
  histograms (time to first token, time per output token, end-to-end latency, prompt and
  generation tokens, n): no gauges of the queue or the KV cache, and no preemption counter.
- TensorRT-LLM backend (inflight_batcher_llm custom metrics, README "Triton Metrics"):
  `nv_trt_llm_kv_cache_block_metrics` with `kv_cache_block_type` = max | free | used | tokens_per |
  fraction, and `nv_trt_llm_request_metrics` with `request_type` = active | max | scheduled |
  context | waiting, labelled `model`.
- tinyllm (this repository's example engine): `tinyllm_*` gauges and counters.
"""

from __future__ import annotations

VLLM_USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the newer name, the older one
# The prompt tokens the engine counted: Triton's vLLM backend reports it (REPORT_CUSTOM_METRICS). The
# profile reads bytes per token from it, the sidecar learns its prompt ratio from it.
PROMPT_TOKENS_COUNTER = "vllm:prompt_tokens_total"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")  # counter; older exporters drop _total
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram (seconds)
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"  # histogram (seconds), vLLM's own exporter only
VLLM_E2E = "vllm:e2e_request_latency_seconds"  # histogram (seconds)
VLLM_MODEL_LABELS = ("model", "model_name")  # Triton's vllm_backend, vLLM's own exporter

TRTLLM_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
TRTLLM_BLOCK_TYPE = "kv_cache_block_type"
TRTLLM_REQUESTS = "nv_trt_llm_request_metrics"
TRTLLM_REQUEST_TYPE = "request_type"

TINYLLM_PREFIX = "tinyllm_"

# what an engine that runs out of KV memory says (tinyllm, the stand-ins, PyTorch, vLLM, TRT-LLM)
OOM_MARKERS = ("out of memory", "outofmemory", "kv cache is full", "no free blocks", "insufficient kv")


def is_out_of_memory(message: str) -> bool:
    """An engine's error text that means "killed: no KV memory left" (not a malformed request)."""
    text = message.lower()
    return any(marker in text for marker in OOM_MARKERS)
