"""KV-cache and memory arithmetic: pure functions over frozen types, no I/O.

The planner, the checker and the sidecar all size the KV cache with these functions, so a
number printed by `tritongen kv` is the number the planner budgets and the sidecar admits by.

Conventions (the same ones vLLM's `kv_cache_interface.py` uses):
- MHA/GQA/MQA cache a key and a value per kv head per layer:
  `2 x layers x kv_heads_per_rank x head_dim x dtype_bytes` per token.
- With tensor parallelism each rank holds `max(1, kv_heads // tp)` heads: when tp exceeds the kv
  head count vLLM replicates heads rather than splitting them, so a rank never holds less than
  one head (Llama-3-70B has 8 kv heads: tp=8 and tp=16 both give 1 per rank).
- MLA (DeepSeek V2/V3) caches one latent of `kv_lora_rank + qk_rope_head_dim` elements per
  layer, not a key and a value, and every rank keeps the whole latent, so TP does not shrink it.
- fp8/int8 KV is one byte per element; the per-head scale factors are ignored (a few bytes per
  block, far below the safety pad).
- A sliding window caps how many tokens a windowed layer keeps; bytes per token are unchanged.
- Memory is counted per token, not per paged block: an engine with 16-token blocks can waste up
  to 15 tokens per sequence, which belongs in the safety pad.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tritongen.core.architecture import DTYPE_BYTES, Architecture
from tritongen.errors import BadInput, Infeasible

KVDtype = Literal["auto", "fp32", "fp16", "bf16", "fp8", "int8"]
KV_DTYPES: tuple[str, ...] = ("auto", "fp32", "fp16", "bf16", "fp8", "int8")

# vLLM spells fp8 KV variants out; they are one byte each like tritongen's "fp8".
_KV_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

_MIB = 1 << 20


def _mib(n: float) -> str:
    return f"{n / _MIB:,.1f} MiB"


class KVShape(BaseModel):
    """KV-cache footprint of one token on one tensor-parallel rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_bytes_per_token: int = Field(
        ge=0, description="Bytes one token adds to the cache on one rank, all layers together."
    )
    num_layers: int = Field(gt=0, description="Layers that hold a cache.")
    num_kv_heads: int = Field(
        gt=0, description="Heads cached per rank, after TP split or replication; 1 for MLA."
    )
    head_dim: int = Field(gt=0, description="Elements per cached head; the latent width for MLA.")
    kv_tensors: int = Field(
        ge=1, le=2, description="2 (a key and a value) for MHA/GQA/MQA, 1 (one latent) for MLA."
    )
    kv_dtype: str = Field(description="Resolved cache dtype (never `auto`).")
    kv_dtype_bytes: int = Field(gt=0, description="Bytes per cached element.")
    tensor_parallel: int = Field(gt=0, description="Tensor-parallel ranks the model spans.")
    attention: str = Field(description="Attention kind of the model: mha, gqa, mqa or mla.")
    latent_dim: int | None = Field(
        default=None, description="MLA: kv_lora_rank + qk_rope_head_dim; None otherwise."
    )

    @model_validator(mode="after")
    def _product(self) -> KVShape:
        # One formula for every kind keeps printed fields and the total from disagreeing.
        expected = (
            self.kv_tensors * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes
        )
        if self.kv_bytes_per_token != expected:
            raise ValueError(
                f"kv_bytes_per_token ({self.kv_bytes_per_token}) must equal kv_tensors x "
                f"num_layers x num_kv_heads x head_dim x kv_dtype_bytes ({expected})."
            )
        return self


def resolve_kv_dtype(arch: Architecture, kv_dtype: str = "auto") -> str:
    """`auto` means the model's own dtype, as vLLM's `kv_cache_dtype="auto"` does."""
    name = _KV_DTYPE_ALIASES.get(kv_dtype, kv_dtype)
    if name == "auto":
        return arch.dtype
    if name not in DTYPE_BYTES:
        raise BadInput(
            f"unknown KV-cache dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}."
        )
    return name


def kv_shape(arch: Architecture, kv_dtype: str = "auto", tensor_parallel: int = 1) -> KVShape:
    """Per-rank KV bytes per token for `arch` at `kv_dtype` split over `tensor_parallel` ranks.

    The divisibility checks mirror what vLLM enforces at startup, so a shape that passes here is
    one the engine will accept.
    """
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise BadInput(f"tensor parallel size must be a whole number >= 1, got {tensor_parallel!r}.")
    tp = tensor_parallel
    heads, kv_heads = arch.num_attention_heads, arch.num_kv_heads
    if heads % tp != 0:
        raise BadInput(
            f"tensor parallel size {tp} does not divide the {heads} attention heads of "
            f"{arch.family}; choose a tp that divides {heads}."
        )
    dtype = resolve_kv_dtype(arch, kv_dtype)
    nbytes = DTYPE_BYTES[dtype]

    if arch.attention == "mla":
        assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
        latent = arch.kv_lora_rank + arch.qk_rope_head_dim
        return KVShape(
            kv_bytes_per_token=arch.num_layers * latent * nbytes,
            num_layers=arch.num_layers,
            num_kv_heads=1,
            head_dim=latent,
            kv_tensors=1,
            kv_dtype=dtype,
            kv_dtype_bytes=nbytes,
            tensor_parallel=tp,
            attention=arch.attention,
            latent_dim=latent,
        )

    if kv_heads >= tp and kv_heads % tp != 0:
        raise BadInput(
            f"tensor parallel size {tp} does not divide the {kv_heads} key/value heads of "
            f"{arch.family}; choose a tp that divides {kv_heads} (or a multiple of it)."
        )
    if kv_heads < tp and tp % kv_heads != 0:
        raise BadInput(
            f"tensor parallel size {tp} is larger than the {kv_heads} key/value heads of "
            f"{arch.family} and not a multiple of it, so heads cannot be replicated evenly; "
            f"choose a tp that is a multiple of {kv_heads}."
        )
    per_rank = max(1, kv_heads // tp)
    return KVShape(
        kv_bytes_per_token=2 * arch.num_layers * per_rank * arch.head_dim * nbytes,
        num_layers=arch.num_layers,
        num_kv_heads=per_rank,
        head_dim=arch.head_dim,
        kv_tensors=2,
        kv_dtype=dtype,
        kv_dtype_bytes=nbytes,
        tensor_parallel=tp,
        attention=arch.attention,
        latent_dim=None,
    )


def kv_bytes_for_sequence(arch: Architecture, shape: KVShape, tokens: int) -> int:
    """Per-rank KV bytes one sequence of `tokens` tokens holds.

    Windowed layers keep at most `sliding_window` tokens, so long sequences on Mistral v0.1 or
    Gemma 2 cost less than `tokens x kv_bytes_per_token`.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise BadInput(f"sequence length must be a whole number of tokens >= 0, got {tokens!r}.")
    if shape.num_layers != arch.num_layers:
        raise BadInput(
            f"KV shape has {shape.num_layers} layers but the architecture has {arch.num_layers}; "
            "compute the shape from the same architecture with kv_shape()."
        )
    per_layer = shape.kv_bytes_per_token // shape.num_layers
    window_layers = arch.sliding_window_layers or 0
    if arch.sliding_window is None:
        window_layers = 0
    full_layers = arch.num_layers - window_layers
    windowed_tokens = min(tokens, arch.sliding_window) if arch.sliding_window is not None else tokens
    return per_layer * (full_layers * tokens + window_layers * windowed_tokens)


def weight_bytes(num_parameters: int, dtype: str) -> int:
    """Bytes of weights stored at `dtype` (embeddings and all; no optimizer, no activations)."""
    if isinstance(num_parameters, bool) or not isinstance(num_parameters, int) or num_parameters < 0:
        raise BadInput(f"parameter count must be a whole number >= 0, got {num_parameters!r}.")
    if dtype not in DTYPE_BYTES:
        raise BadInput(f"unknown weight dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}.")
    return num_parameters * DTYPE_BYTES[dtype]


def _check_bytes(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(f"{name} must be a whole number of bytes >= 0, got {value!r}.")


def kv_budget_bytes(
    device_bytes: int,
    utilization_cap: float,
    weights_bytes: int,
    reserve_bytes: int,
    pad_bytes: int,
) -> int:
    """Bytes left for the KV cache: `device x cap - weights - reserve - pad`.

    The cap applies to the *whole* device (as vLLM's gpu_memory_utilization does), not to what is
    left after weights (as TensorRT-LLM's kv_cache_free_gpu_mem_fraction does); callers
    translating to TRT-LLM must convert.
    """
    for name, value in (
        ("device memory", device_bytes),
        ("weights", weights_bytes),
        ("reserve", reserve_bytes),
        ("pad", pad_bytes),
    ):
        _check_bytes(name, value)
    if not 0.0 < utilization_cap <= 1.0:
        raise BadInput(f"utilization cap must be in (0, 1], got {utilization_cap!r}; e.g. 0.9.")
    usable = int(device_bytes * utilization_cap)
    budget = usable - weights_bytes - reserve_bytes - pad_bytes
    if budget <= 0:
        raise Infeasible(
            f"no memory left for the KV cache: short by {_mib(-budget)} "
            f"(device {_mib(device_bytes)} x cap {utilization_cap:g} = {_mib(usable)}, "
            f"minus weights {_mib(weights_bytes)}, reserve {_mib(reserve_bytes)}, "
            f"pad {_mib(pad_bytes)} = {_mib(budget)}). Use more tensor parallelism or a bigger "
            "GPU, quantized weights, a higher utilization cap, or a smaller reserve/pad."
        )
    return budget


def max_concurrent_sequences(
    budget_bytes: int, arch: Architecture, shape: KVShape, context_tokens: int
) -> int:
    """How many sequences of `context_tokens` fit in `budget_bytes` at once (floor)."""
    _check_bytes("KV budget", budget_bytes)
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 1:
        raise BadInput(f"context length must be a whole number of tokens >= 1, got {context_tokens!r}.")
    per_sequence = kv_bytes_for_sequence(arch, shape, context_tokens)
    if per_sequence == 0:
        raise BadInput("a sequence costs 0 KV bytes; the architecture has no cache to size.")
    return budget_bytes // per_sequence


def max_batch_size_that_fits(
    budget_bytes: int,
    arch: Architecture,
    shape: KVShape,
    context_tokens: int,
    upper: int = 64,
    lower: int = 1,
) -> int:
    """Largest batch size in [lower, upper] whose sequences all fit at full context.

    Raises Infeasible (not 0) below `lower`, because a config with no room for even the minimum
    batch would load and then fail with an out-of-memory error at the first long request.
    """
    if lower < 1 or upper < lower:
        raise BadInput(f"batch bounds must satisfy 1 <= lower <= upper, got lower={lower}, upper={upper}.")
    fits = max_concurrent_sequences(budget_bytes, arch, shape, context_tokens)
    if fits < lower:
        per_sequence = kv_bytes_for_sequence(arch, shape, context_tokens)
        needed = lower * per_sequence
        what = "one sequence" if lower == 1 else f"{lower} sequences"
        fixes = ["a shorter context"]
        if shape.kv_dtype_bytes > 1:
            fixes.append("fp8 KV cache (kv_dtype fp8)")
        if shape.attention == "mla":
            fixes.append("more tensor parallelism (frees weight memory; the MLA latent is not split)")
        else:
            fixes.append("more tensor parallelism")
        fixes.append("a smaller safety pad or reserve")
        raise Infeasible(
            f"KV budget {_mib(budget_bytes)} is {_mib(needed - budget_bytes)} short of {what} "
            f"at {context_tokens} tokens ({_mib(per_sequence)} per sequence, "
            f"{shape.kv_bytes_per_token} bytes/token on {arch.family}). Try "
            + ", ".join(fixes)
            + "."
        )
    return min(upper, fits)
