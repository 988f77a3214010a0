"""The `LLM()` arguments of one named TensorRT-LLM release, as a key table: what the LLM-API
Triton model (`triton_backend/all_models/llmapi/tensorrt_llm`) accepts in `1/model.yaml`.

Why a table and not the real parser: `tensorrt_llm.llmapi.TorchLlmArgs` imports torch, CUDA
bindings and the engine itself; it is not installable on a CPU host or in CI. So the keys, types,
ranges and enum values are written down here once, with the release and the source they were
read from, and `core.trtllm_args_check` validates a model.yaml against them the way TorchLlmArgs
does (pydantic, lax coercion, unknown keys refused: every upstream config class is a
`StrictBaseModel` with extra="forbid").

Source: `tensorrt_llm/llmapi/llm_args.py` (BaseLlmArgs, TorchLlmArgs, KvCacheConfig,
SchedulerConfig, CapacitySchedulerPolicy) of the 1.1 line, read from NVIDIA/TensorRT-LLM, and the
LLM-API reference (nvidia.github.io/TensorRT-LLM/1.1.0/llm-api/reference.html). TensorRT-LLM 1.1.0
is what Triton's `25.12-trtllm-python-py3` container ships (Triton's compatibility matrix). A key a
later release added is reported as unknown *to this release*; the message says so.

Bounds: `ge`/`gt`/`le` are upstream's where upstream states them (free_gpu_memory_fraction in
[0, 1], stream_interval > 0, max_gpu_total_bytes >= 0); the others (a parallel size or a batch of
at least 1) are marked `bound="engine"`: upstream's parser takes them and the engine then fails.

Sections whose own keys this table does not list (cuda_graph_config, speculative_config, ...) are
checked as mappings only: their keys are not validated, and the table says so (`opaque`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RELEASE = "1.1.0"
RELEASE_SOURCE = (
    "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs, KvCacheConfig, SchedulerConfig) of the "
    "1.1 line; the LLM-API reference nvidia.github.io/TensorRT-LLM/1.1.0/llm-api/reference.html"
)
RELEASE_CONTAINER = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"

# The LLM-API model's own sections of model.yaml (not LLM() arguments): model.py takes
# `triton_config` out before the rest goes to LLM(**args) (model.py `get_model_config(...,
# exclude_keys=["triton_config"])`), and reads max_batch_size and decoupled in auto_complete_config.
TRITON_CONFIG = "triton_config"
MODEL_YAML = "model.yaml"

Kind = Literal["str", "int", "float", "bool", "enum", "section", "mapping", "list_int", "any"]


@dataclass(frozen=True)
class Key:
    """One key of model.yaml. `kind` "section" has `keys` (validated); "mapping" is a section
    this table does not list (any keys). `nullable`: YAML null is accepted (Optional upstream)."""

    name: str
    kind: Kind
    doc: str
    default: object = None
    required: bool = False
    nullable: bool = True
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    bound: Literal["upstream", "engine"] = "upstream"
    keys: tuple["Key", ...] = ()

    def child(self, name: str) -> "Key | None":
        return next((k for k in self.keys if k.name == name), None)


def _k(name: str, kind: Kind, doc: str, **more: object) -> Key:
    return Key(name, kind, doc, **more)  # type: ignore[arg-type]


def _count(name: str, doc: str, default: object = None, *, nullable: bool = True) -> Key:
    """A count the engine needs to be at least 1 (upstream's parser does not bound it)."""
    return Key(name, "int", doc, default=default, nullable=nullable, ge=1, bound="engine")


CAPACITY_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")
"""`CapacitySchedulerPolicy`: GUARANTEED_NO_EVICT admits a request only when the KV blocks of its
whole sequence (prompt + max_tokens) are free and never evicts; MAX_UTILIZATION packs as many as
fit now and pauses (evicts) running requests when the pool runs dry; STATIC_BATCH admits a new
batch only when the running one has finished."""
DEFAULT_CAPACITY_POLICY = "GUARANTEED_NO_EVICT"
DEFAULT_TOKENS_PER_BLOCK = 32
DEFAULT_BLOCK_REUSE = True
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9

KV_CACHE_CONFIG = _k("kv_cache_config", "section", "KV cache config (KvCacheConfig).", nullable=False, keys=(
    _k("enable_block_reuse", "bool", "Reuse KV blocks of a shared prompt prefix across requests.",
       default=DEFAULT_BLOCK_REUSE, nullable=False),
    _count("max_tokens", "Tokens the KV cache holds at most; with free_gpu_memory_fraction, the smaller wins."),
    _k("max_attention_window", "list_int", "Attention window per layer (repeated over the layers)."),
    _k("sink_token_length", "int", "Sink tokens always kept in the attention window."),
    _k("free_gpu_memory_fraction", "float", "Share of the GPU memory free after the weights and a profiling pass "
       "that the KV cache takes; with max_tokens, the smaller wins.", default=DEFAULT_FREE_GPU_MEMORY_FRACTION,
       ge=0, le=1),
    _k("host_cache_size", "int", "Host (offload) cache size in bytes."),
    _k("onboard_blocks", "bool", "Onboard offloaded blocks.", default=True, nullable=False),
    _k("cross_kv_cache_fraction", "float", "Share of the KV cache for cross attention (encoder-decoder)."),
    _k("secondary_offload_min_priority", "int", "Only blocks above this priority are offloaded."),
    _k("event_buffer_max_size", "int", "KV event buffer size; 0 = no events.", default=0, nullable=False),
    _k("attention_dp_events_gather_period_ms", "int", "Attention-DP event gather period.", default=5,
       nullable=False),
    _k("enable_partial_reuse", "bool", "Reuse partially matched blocks.", default=True, nullable=False),
    _k("copy_on_partial_reuse", "bool", "Copy partially matched blocks in use before reuse.", default=True,
       nullable=False),
    _k("use_uvm", "bool", "Unified memory for the KV cache.", default=False, nullable=False),
    _k("max_gpu_total_bytes", "int", "KV bytes at most; 0 = no limit.", default=0, nullable=False, ge=0),
    _k("dtype", "str", "KV cache dtype ('auto' = the model's; 'fp8').", default="auto", nullable=False),
    _k("mamba_ssm_cache_dtype", "enum", "Mamba SSM cache dtype.", default="auto", nullable=False,
       choices=("auto", "float16", "bfloat16", "float32")),
    Key("tokens_per_block", "int", "Tokens per KV block.", default=DEFAULT_TOKENS_PER_BLOCK, nullable=False,
        ge=1, bound="engine"),
))

SCHEDULER_CONFIG = _k("scheduler_config", "section", "Scheduler config (SchedulerConfig).", nullable=False, keys=(
    _k("capacity_scheduler_policy", "enum", "What the scheduler does when the KV pool cannot take a request "
       "(CapacitySchedulerPolicy).", default=DEFAULT_CAPACITY_POLICY, nullable=False, choices=CAPACITY_POLICIES),
    _k("context_chunking_policy", "enum", "Context chunking policy.",
       choices=("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")),
    _k("dynamic_batch_config", "mapping", "Dynamic batch config (TensorRT backend)."),
))

TRITON_CONFIG_SECTION = _k(TRITON_CONFIG, "section", "The LLM-API model's Triton settings (read by model.py, "
                           "not passed to LLM()).", required=True, nullable=False, keys=(
    _k("max_batch_size", "int", "Triton's max_batch_size; model.py's auto_complete_config sets it (0: the engine "
       "batches).", required=True, nullable=False, ge=0),
    _k("decoupled", "bool", "Decoupled transaction policy (streaming needs true).", required=True, nullable=False),
    _k("cancellation_check_period_ms", "int", "How often model.py polls for cancelled requests.", gt=0),
))


def _opaque(name: str, doc: str) -> Key:
    return Key(name, "mapping", doc + " (its keys are not in this table)")


LLM_ARGS: tuple[Key, ...] = (
    # BaseLlmArgs
    _k("model", "str", "Hugging Face model id or local path.", required=True, nullable=False),
    _k("tokenizer", "str", "Tokenizer id or path (default: the model's)."),
    _k("tokenizer_mode", "enum", "Tokenizer mode.", default="auto", nullable=False, choices=("auto", "slow")),
    _k("skip_tokenizer_init", "bool", "Skip tokenizer initialisation.", default=False, nullable=False),
    _k("trust_remote_code", "bool", "Trust the model's remote code.", default=False, nullable=False),
    _count("tensor_parallel_size", "Tensor-parallel ranks.", 1, nullable=False),
    _k("dtype", "str", "Model dtype ('auto', 'float16', 'bfloat16', ...).", default="auto", nullable=False),
    _k("revision", "str", "Model revision."),
    _k("tokenizer_revision", "str", "Tokenizer revision."),
    _count("pipeline_parallel_size", "Pipeline-parallel stages.", 1, nullable=False),
    _count("context_parallel_size", "Context-parallel ranks.", 1, nullable=False),
    _k("gpus_per_node", "int", "GPUs per node (default: what CUDA sees)."),
    _k("moe_cluster_parallel_size", "int", "MoE cluster parallel size."),
    _k("moe_tensor_parallel_size", "int", "MoE tensor parallel size."),
    _k("moe_expert_parallel_size", "int", "MoE expert parallel size."),
    _k("enable_attention_dp", "bool", "Attention data parallel.", default=False, nullable=False),
    _k("enable_lm_head_tp_in_adp", "bool", "LM head TP in attention DP.", default=False, nullable=False),
    _opaque("cp_config", "Context parallel config"),
    _k("load_format", "str", "How to load the weights ('auto', 'dummy').", default="auto", nullable=False),
    _k("fail_fast_on_attention_window_too_large", "bool", "Fail when one sequence cannot fit the KV cache.",
       default=False, nullable=False),
    _k("enable_lora", "bool", "Enable LoRA.", default=False, nullable=False),
    _opaque("lora_config", "LoRA config"),
    KV_CACHE_CONFIG,
    _k("enable_chunked_prefill", "bool", "Split long prompts over several steps.", default=False, nullable=False),
    _k("guided_decoding_backend", "enum", "Guided decoding backend.", choices=("xgrammar", "llguidance")),
    _k("batched_logits_processor", "any", "Batched logits processor (a Python object)."),
    _k("iter_stats_max_iterations", "int", "Iterations of iteration stats kept."),
    _k("request_stats_max_iterations", "int", "Iterations of request stats kept."),
    _opaque("peft_cache_config", "PEFT cache config"),
    SCHEDULER_CONFIG,
    _opaque("cache_transceiver_config", "Cache transceiver config (disaggregated serving)"),
    _opaque("sparse_attention_config", "Sparse attention config"),
    _opaque("speculative_config", "Speculative decoding config"),
    _count("max_batch_size", "Requests the engine schedules at once."),
    _count("max_input_len", "Prompt tokens at most."),
    _count("max_seq_len", "Prompt + output tokens at most."),
    _count("max_beam_width", "Beam width at most."),
    _count("max_num_tokens", "Tokens one engine step takes (prefill and decode together).", DEFAULT_MAX_NUM_TOKENS),
    _k("gather_generation_logits", "bool", "Gather generation logits.", default=False, nullable=False),
    _k("num_postprocess_workers", "int", "Post-processing worker processes.", default=0, nullable=False, ge=0),
    _k("postprocess_tokenizer_dir", "str", "Tokenizer directory for post-processing."),
    _k("reasoning_parser", "str", "Reasoning content parser."),
    _k("decoding_config", "any", "Deprecated: use speculative_config."),
    _k("backend", "str", "The LLM backend ('pytorch' for the LLM-API model).", default="pytorch"),
    _k("return_perf_metrics", "bool", "Return per-request perf metrics.", default=False, nullable=False),
    _k("orchestrator_type", "enum", "Orchestrator (default MPI).", choices=("rpc", "ray")),
    # TorchLlmArgs
    _k("build_config", "any", "Deprecated (TensorRT engines only)."),
    _k("garbage_collection_gen0_threshold", "int", "Python GC generation-0 threshold.", default=20000,
       nullable=False),
    _opaque("cuda_graph_config", "CUDA graph config"),
    _opaque("attention_dp_config", "Attention DP config"),
    _k("disable_overlap_scheduler", "bool", "Disable the overlap scheduler.", default=False, nullable=False),
    _opaque("moe_config", "MoE config"),
    _k("attn_backend", "str", "Attention backend.", default="TRTLLM", nullable=False),
    _k("sampler_type", "str", "Sampler (TRTLLMSampler, TorchSampler, auto).", default="auto", nullable=False),
    _k("enable_iter_perf_stats", "bool", "Iteration perf stats.", default=False, nullable=False),
    _k("enable_iter_req_stats", "bool", "Per-request stats per iteration.", default=False, nullable=False),
    _k("print_iter_log", "bool", "Print iteration logs.", default=False, nullable=False),
    _k("perf_metrics_max_requests", "int", "Requests kept for perf metrics.", default=0, nullable=False),
    _k("batch_wait_timeout_ms", "float", "Wait up to this for max_batch_size requests.", default=0,
       nullable=False, ge=0),
    _k("batch_wait_timeout_iters", "int", "Iterations to wait for new requests.", default=0, nullable=False, ge=0),
    _k("batch_wait_max_tokens_ratio", "float", "Token accumulation threshold ratio.", default=0, nullable=False,
       ge=0),
    _opaque("torch_compile_config", "torch.compile config"),
    _k("enable_autotuner", "bool", "Autotuner.", default=True, nullable=False),
    _k("enable_layerwise_nvtx_marker", "bool", "Layerwise NVTX markers.", default=False, nullable=False),
    _k("enable_min_latency", "bool", "Min-latency mode.", default=False, nullable=False),
    _k("stream_interval", "int", "Iterations between streamed responses.", default=1, nullable=False, gt=0),
    _k("force_dynamic_quantization", "bool", "Force dynamic quantization.", default=False, nullable=False),
    _k("allreduce_strategy", "enum", "Allreduce strategy.", default="AUTO", choices=(
        "AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL", "NCCL_SYMMETRIC")),
    _k("checkpoint_loader", "any", "Custom checkpoint loader (a Python object)."),
    _k("checkpoint_format", "str", "Checkpoint format (default HF)."),
    _opaque("kv_connector_config", "KV cache connector config"),
    _k("mm_encoder_only", "bool", "Run only the vision encoder.", default=False, nullable=False),
    _k("ray_worker_extension_cls", "str", "Ray worker extension class."),
)
"""TorchLlmArgs' fields (BaseLlmArgs' first), in upstream order."""

MODEL_YAML_KEYS: tuple[Key, ...] = LLM_ARGS + (TRITON_CONFIG_SECTION,)
"""Every top-level key of the LLM-API model's model.yaml."""


def key_at(path: tuple[str, ...]) -> Key | None:
    """The table's key at a dotted path (("kv_cache_config", "max_tokens")), or None."""
    keys: tuple[Key, ...] = MODEL_YAML_KEYS
    found: Key | None = None
    for part in path:
        found = next((k for k in keys if k.name == part), None)
        if found is None:
            return None
        keys = found.keys
    return found


def default_of(*path: str) -> object:
    """The release's default of a key (one place for it: render and the engine model read it here)."""
    key = key_at(tuple(path))
    if key is None:
        raise KeyError(".".join(path))
    return key.default
