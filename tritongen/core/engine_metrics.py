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
- Any other engine, such as a user's own Python backend: tritongen's convention below, the
  `llm_engine_*` names (`model_repository/tinyllm` is an example that follows it).

tritongen's convention for a Python backend's engine. Export these with
`pb_utils.MetricFamily` (Triton serves them on its /metrics endpoint), each labelled with
`model=<the model's name>`; other labels (`version`, `instance`, ...) are free, and readers sum a
model's series over them. Export what the engine knows; readers use what is there:

    gauges
    llm_engine_kv_blocks_used        KV cache blocks held by sequences now
    llm_engine_kv_blocks_total       KV cache blocks in the pool (used / total: the KV usage)
    llm_engine_kv_bytes_per_token    KV cache bytes one token takes (all layers)
    llm_engine_kv_block_tokens       tokens one KV cache block holds
    llm_engine_running_sequences     sequences in the running batch
    llm_engine_waiting_sequences     requests accepted but waiting for a batch slot
    counters
    llm_engine_oom_errors_total      requests the engine failed because its KV pool ran out
    llm_engine_generated_tokens_total  tokens generated
    llm_engine_decode_steps_total    batched decode steps run (generated tokens / decode steps:
                                     the mean decode batch)

`tritongen doctor` reads the running, waiting, KV and out-of-memory ones (DR108-DR112), the
dashboard draws them, `tritongen profile` measures the KV pool from the `kv_*` gauges and the
generated tokens, and the sidecar's `triton_metrics` headroom source reads the `kv_*` gauges. The
profiler and the sidecar match the `kv_*` gauges by suffix (`<prefix>_kv_blocks_used` for any
prefix); doctor and the dashboard need the `llm_engine_` prefix.
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

PY_ENGINE_PREFIX = "llm_engine_"
PY_ENGINE_FAMILY = f"Python backend ({PY_ENGINE_PREFIX}*)"  # how reports name the family: "<family> engine: ..."
PY_KV_BLOCKS_USED = f"{PY_ENGINE_PREFIX}kv_blocks_used"
PY_KV_BLOCKS_TOTAL = f"{PY_ENGINE_PREFIX}kv_blocks_total"
PY_KV_BYTES_PER_TOKEN = f"{PY_ENGINE_PREFIX}kv_bytes_per_token"
PY_KV_BLOCK_TOKENS = f"{PY_ENGINE_PREFIX}kv_block_tokens"
PY_RUNNING = f"{PY_ENGINE_PREFIX}running_sequences"
PY_WAITING = f"{PY_ENGINE_PREFIX}waiting_sequences"
PY_OOM_ERRORS = f"{PY_ENGINE_PREFIX}oom_errors_total"
PY_GENERATED_TOKENS = f"{PY_ENGINE_PREFIX}generated_tokens_total"
PY_DECODE_STEPS = f"{PY_ENGINE_PREFIX}decode_steps_total"
PY_ENGINE_METRICS = (PY_KV_BLOCKS_USED, PY_KV_BLOCKS_TOTAL, PY_KV_BYTES_PER_TOKEN, PY_KV_BLOCK_TOKENS, PY_RUNNING,
                     PY_WAITING, PY_OOM_ERRORS, PY_GENERATED_TOKENS, PY_DECODE_STEPS)

# what an engine that runs out of KV memory says (the example tinyllm, the stand-ins, PyTorch, vLLM, TRT-LLM)
OOM_MARKERS = ("out of memory", "outofmemory", "kv cache is full", "no free blocks", "insufficient kv")


def is_out_of_memory(message: str) -> bool:
    """An engine's error text that means "killed: no KV memory left" (not a malformed request)."""
    text = message.lower()
    return any(marker in text for marker in OOM_MARKERS)
