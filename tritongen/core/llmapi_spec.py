"""What a spec model served by TensorRT-LLM's LLM-API model (`backend: llmapi`) must state, checked
when the spec loads (`core.spec.ModelSpec` calls `llmapi_spec_problem`), so a render never writes a
model.yaml the engine or model.py would refuse.

The LLM-API model (TensorRT-LLM's `triton_backend/all_models/llmapi/tensorrt_llm`) is a Python-backend
model: model.py reads `text_input` and answers in `text_output` by name, takes LLM() arguments from
`1/model.yaml`, and runs on GPUs only. Which LLM() arguments exist is the key table's
(`core.trtllm_args`); which of them tritongen derives from the spec is `DERIVED_LLM_ARGS`.
"""

from __future__ import annotations

from typing import Any

from tritongen.core.trtllm_args import RELEASE
from tritongen.core.trtllm_args_check import check_llm_args

LLMAPI = "llmapi"

DERIVED_LLM_ARGS = (
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_seq_len", "max_batch_size",
    "max_num_tokens", "kv_cache_config.free_gpu_memory_fraction", "kv_cache_config.max_tokens",
    "kv_cache_config.tokens_per_block", "kv_cache_config.dtype", "scheduler_config.capacity_scheduler_policy",
)
"""LLM() arguments render writes from the spec (hf_model, tensor_parallel, max_context, the KV plan,
kv_dtype, engine:); stating one in `llm_args` too is refused, as vLLM's `engine_args` are."""

# What each engine.kv_policy is in TensorRT-LLM's CapacitySchedulerPolicy (and back, for the engine model).
KV_POLICY_TO_CAPACITY = {"reserve_wait": "GUARANTEED_NO_EVICT", "grow_preempt": "MAX_UTILIZATION"}
KV_DTYPE_TO_TRTLLM = {"auto": None, "fp8": "fp8"}


def derived_in(llm_args: dict[str, Any]) -> list[str]:
    """The keys of `llm_args` (dotted) that render derives from the spec."""
    found = []
    for dotted in DERIVED_LLM_ARGS:
        head, _, tail = dotted.partition(".")
        value = llm_args.get(head)
        if (not tail and head in llm_args) or (tail and isinstance(value, dict) and tail in value):
            found.append(dotted)
    return found


def llmapi_spec_problem(model: Any, where: str) -> str | None:
    """Why a spec model (a `ModelSpec`) with backend llmapi cannot be rendered, or None."""
    if not model.hf_model:
        return f"{where}: backend llmapi needs `hf_model` (the model id or path LLM() loads: model.yaml's `model`)"
    if model.kind != "llm":
        return f"{where}: backend llmapi serves LLMs; set kind: llm"
    if model.lanes is not None:
        return (f"{where}: lanes are not rendered for backend llmapi (each lane would be a second engine with its "
                "own weights); remove `lanes`")
    engine = model.engine
    if engine is not None and engine.render_parameters:
        return (f"{where}: engine.render_parameters writes config parameters for Python backends that read them; "
                "the LLM-API model reads 1/model.yaml, which render writes from the spec: remove render_parameters")
    if engine is not None and engine.kv_policy is not None and engine.kv_policy not in KV_POLICY_TO_CAPACITY:
        return (f"{where}: engine.kv_policy {engine.kv_policy} is not a TensorRT-LLM capacity policy; use "
                + " or ".join(f"{p} ({c})" for p, c in KV_POLICY_TO_CAPACITY.items()))
    if model.kv_dtype not in KV_DTYPE_TO_TRTLLM:
        return (f"{where}: kv_dtype {model.kv_dtype} cannot be stated in TensorRT-LLM's kv_cache_config.dtype; use "
                "auto (the model's dtype) or fp8")
    names = {(t.name, t.data_type) for t in model.inputs} | {(t.name, t.data_type) for t in model.outputs}
    for name in ("text_input", "text_output"):
        if (name, "STRING") not in names:
            return (f"{where}: the LLM-API model's model.py reads `text_input` and answers in `text_output` (both "
                    f"STRING); declare {name} with data_type STRING")
    clash = derived_in(model.llm_args)
    if clash:
        return (f"{where}: llm_args {clash} are derived by tritongen from the spec (hf_model, tensor_parallel, "
                "max_context, the KV plan, kv_dtype, engine:); remove them from llm_args and change those fields")
    problems = check_llm_args(model.llm_args)
    if problems:
        listed = "; ".join(f"llm_args.{p.key}: {p.message} ({p.fix})" for p in problems)
        return f"{where}: {listed} [TensorRT-LLM {RELEASE} LLM() arguments]"
    return None
