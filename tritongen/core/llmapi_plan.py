"""TensorRT-LLM's LLM-API model.yaml from the plan: each LLM() argument with the reason it holds
its value, so the rendered file says why (as vLLM's model.json is explained in config.pbtxt).

The KV pool comes from the same budget as vLLM's `gpu_memory_utilization` (quota - weights -
framework reserve - pad, `core.kv_plan`), stated twice because TensorRT-LLM takes the smaller of
the two (KvCacheConfig):
- `max_tokens`: the budget in tokens (whole blocks). It holds whatever else is on the GPU.
- `free_gpu_memory_fraction`: the same budget as a share of what the PyTorch flow sees free when it
  sizes the pool, (device - peak in use) x fraction, the peak being this engine's weights and
  activations (tritongen's reserve) plus what the other models placed on the GPU hold (their
  quotas). Without it the default 0.9 would take most of the headroom the plan keeps.

Pure: the spec, the KV plan and the placement in; a nested mapping and the reasons out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritongen.core.kv_plan import KVPlan, typical_sequences
from tritongen.core.llmapi_spec import KV_DTYPE_TO_TRTLLM, KV_POLICY_TO_CAPACITY
from tritongen.core.spec import MIB, ModelSpec
from tritongen.errors import BadInput
from tritongen.core.trtllm_args import (
    DEFAULT_BLOCK_REUSE,
    DEFAULT_CAPACITY_POLICY,
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    RELEASE,
    TRITON_CONFIG,
)


class LLMApiFile:
    """model.yaml being built: values (nested once, as model.yaml is) and why each holds its value."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.why: dict[str, str] = {}

    def put(self, dotted: str, value: Any, why: str) -> None:
        head, _, tail = dotted.partition(".")
        if tail:
            self.data.setdefault(head, {})[tail] = value
        else:
            self.data[head] = value
        self.why[dotted] = why


def free_fraction(kv: KVPlan, others_bytes: int, device_bytes: int) -> tuple[float, int]:
    """free_gpu_memory_fraction that makes the PyTorch flow's pool the KV budget, and the memory it
    is a share of: the device less this engine's weights and reserve and the other models' quotas."""
    free = device_bytes - kv.weights_bytes - kv.reserve_bytes - others_bytes
    if free <= 0:
        return 0.0, free
    return min(1.0, round(kv.budget_bytes / free, 4)), free


def llmapi_model_yaml(model: ModelSpec, kv: KVPlan, device_bytes: int, others_bytes: int,
                      others: str) -> LLMApiFile:
    """model.yaml for a spec model with backend llmapi (the spec checked it: `core.llmapi_spec`).
    `device_bytes` is one of its GPUs; `others_bytes` what the other models placed there hold
    (`others` names them, for the reason)."""
    out = LLMApiFile()
    user = dict(model.llm_args)
    engine = model.engine
    out.put("model", model.hf_model, "the spec's hf_model: the checkpoint LLM() loads")
    out.put("backend", "pytorch", f"TensorRT-LLM {RELEASE}'s LLM-API model runs the PyTorch flow")
    out.put("tensor_parallel_size", model.tensor_parallel, "the spec's tensor_parallel: GPUs per engine")
    out.put("pipeline_parallel_size", 1, "the spec plans no pipeline stages")
    out.put("max_seq_len", model.max_context, "the spec's max_context: prompt + output tokens at most")
    seqs = typical_sequences(model, kv)
    typical = (model.typical_prompt_tokens or 0) + (model.typical_output_tokens or 0)
    why_seqs = (f"the KV pool ({kv.pool_blocks} blocks of {kv.block_tokens}) at the typical sequence of {typical} "
                f"tokens holds {seqs}" if typical else kv.sequence_note())
    if engine is not None and engine.max_num_seqs and engine.max_num_seqs < seqs:
        seqs, why_seqs = engine.max_num_seqs, f"the spec's engine.max_num_seqs (the pool would hold {seqs})"
    out.put("max_batch_size", seqs, why_seqs + "; the capacity policy decides what waits beyond it")
    if engine is not None and engine.max_batched_tokens:
        out.put("max_num_tokens", engine.max_batched_tokens, "the spec's engine.max_batched_tokens")
    else:
        out.put("max_num_tokens", model.max_context + seqs,  # type: ignore[operator]
                f"a prompt of max_context ({model.max_context}) beside one decode token of each of the "
                f"{seqs} running sequences fits one step, so no prompt waits for the decodes to drain")
    user_kv = dict(user.pop("kv_cache_config", None) or {})
    fraction, free = free_fraction(kv, others_bytes, device_bytes)
    beside = f" - other models' quotas {others_bytes / MIB:.0f} MiB ({others})" if others_bytes else ""
    out.put("kv_cache_config.free_gpu_memory_fraction", fraction,
            f"KV budget {kv.budget_bytes / MIB:.0f} MiB of the {free / MIB:.0f} MiB the engine finds free = GPU "
            f"{device_bytes / MIB:.0f} - weights {kv.weights_bytes / MIB:.0f} - reserve {kv.reserve_bytes / MIB:.0f}"
            f"{beside} (the budget vLLM's gpu_memory_utilization comes from)")
    stated = engine.kv_pool_tokens if engine is not None and engine.kv_pool_tokens else None
    out.put("kv_cache_config.max_tokens", stated or kv.pool_blocks * kv.block_tokens,
            "the spec's engine.kv_pool_tokens" if stated else
            f"the KV budget in whole blocks ({kv.pool_blocks} x {kv.block_tokens} tokens at {kv.kv_bytes_per_token} "
            "B/token); the engine takes the smaller of this and the fraction, whatever loads first")
    out.put("kv_cache_config.tokens_per_block", kv.block_tokens, "the block size the KV plan counts in")
    said = engine.prefix_caching if engine is not None else None
    if said is not None and "enable_block_reuse" in user_kv and user_kv["enable_block_reuse"] != said:
        raise BadInput(f"model {model.name!r}: engine.prefix_caching is {said} but llm_args.kv_cache_config."
                       f"enable_block_reuse is {user_kv['enable_block_reuse']}; state it once (engine.prefix_caching)")
    reuse = user_kv.pop("enable_block_reuse", DEFAULT_BLOCK_REUSE if said is None else said)
    out.put("kv_cache_config.enable_block_reuse", reuse,
            "the spec's llm_args" if "enable_block_reuse" in (model.llm_args.get("kv_cache_config") or {}) else
            "the spec's engine.prefix_caching" if said is not None else
            "TensorRT-LLM's default: prompts that share a prefix reuse its blocks (engine.prefix_caching: false "
            "turns it off)")
    dtype = KV_DTYPE_TO_TRTLLM[model.kv_dtype]
    if dtype is not None:
        out.put("kv_cache_config.dtype", dtype, f"the spec's kv_dtype {model.kv_dtype}")
    for key, value in user_kv.items():
        out.put(f"kv_cache_config.{key}", value, "the spec's llm_args")
    policy = engine.kv_policy if engine is not None else None
    user_scheduler = dict(user.pop("scheduler_config", None) or {})
    out.put("scheduler_config.capacity_scheduler_policy", KV_POLICY_TO_CAPACITY[policy] if policy else
            DEFAULT_CAPACITY_POLICY,
            f"the spec's engine.kv_policy {policy}" if policy else
            "TensorRT-LLM's default: a request starts only when its whole sequence's blocks are free, and waits "
            "otherwise (engine.kv_policy: grow_preempt for MAX_UTILIZATION)")
    for key, value in user_scheduler.items():
        out.put(f"scheduler_config.{key}", value, "the spec's llm_args")
    for key, value in user.items():
        out.put(key, value, "the spec's llm_args")
    out.put(f"{TRITON_CONFIG}.max_batch_size", 0, "the engine batches; Triton passes each request through")
    out.put(f"{TRITON_CONFIG}.decoupled", model.streaming,
            "the spec's streaming: tokens stream as they come" if model.streaming else
            "the spec's streaming is off: one response per request")
    return out


def kv_pool_bytes(data: Mapping[str, Any], kv: KVPlan, device_bytes: int, others_bytes: int) -> tuple[int, str]:
    """The KV memory a model.yaml lets the engine take on one GPU, and how: the smaller of
    kv_cache_config.max_tokens x bytes per token and free_gpu_memory_fraction (the release's
    default when unstated) x the memory it finds free (`free_fraction`'s), per rank."""
    section = data.get("kv_cache_config") or {}
    section = section if isinstance(section, Mapping) else {}
    fraction = section.get("free_gpu_memory_fraction")
    fraction = float(DEFAULT_FREE_GPU_MEMORY_FRACTION if fraction is None else fraction)
    _, free = free_fraction(kv, others_bytes, device_bytes)
    by_fraction = int(fraction * max(0, free))
    how = f"free_gpu_memory_fraction {fraction:g} x {max(0, free) / MIB:.0f} MiB free = {by_fraction / MIB:.0f} MiB"
    tokens = section.get("max_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens * kv.kv_bytes_per_token < by_fraction:
        by_tokens = tokens * kv.kv_bytes_per_token
        return by_tokens, f"kv_cache_config.max_tokens {tokens} x {kv.kv_bytes_per_token} B = {by_tokens / MIB:.0f} MiB"
    return by_fraction, how
