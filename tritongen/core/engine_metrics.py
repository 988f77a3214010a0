"""Names of the LLM engines' own Prometheus metrics on Triton's endpoint, in one place.

The profiler reads them to measure the KV pool, the sidecar to see the pool's live usage, doctor
to see an engine drowning. Names are the backends' own:
- vLLM backend (src/utils/metrics.py): `vllm:kv_cache_usage_perc` (older releases
  `vllm:gpu_cache_usage_perc`), a 0..1 fraction of the KV blocks in use, labelled `model`;
- TensorRT-LLM backend (inflight_batcher_llm custom metrics): `nv_trt_llm_kv_cache_block_metrics`
  with `kv_cache_block_type` = max | free | used | tokens_per | fraction, labelled `model`.
"""

from __future__ import annotations

VLLM_USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the newer name, the older one
TRTLLM_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
TRTLLM_BLOCK_TYPE = "kv_cache_block_type"
