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
  A chunked-attention layer (Llama 4) attends within its chunk, so it holds at most one chunk:
  at its fullest, `min(tokens, chunk)` tokens, which is what must stay free for it.
- Linear-attention and state-space layers hold a fixed state per sequence, whatever its length,
  sized as vLLM sizes it (vllm/model_executor/layers/mamba/mamba_utils.py,
  MambaStateShapeCalculator and MambaStateDtypeCalculator), per rank:
    Mamba (Jamba, vllm/model_executor/models/jamba.py): conv (d_inner/tp) x (kernel - 1) and
      SSM (d_inner/tp) x d_state, d_inner = mamba_expand x hidden_size;
    Mamba2 (Nemotron-H, vllm/model_executor/models/nemotron_h.py): conv ((d_inner + 2 x groups'
      x d_state)/tp) x (kernel - 1), groups' = groups rounded up to tp when tp does not divide
      them, and SSM (heads/tp) x head_dim x d_state, d_inner = heads x head_dim;
    Gated DeltaNet (Qwen3-Next, vllm/model_executor/models/qwen3_next.py): conv ((2 x k_heads x
      k_dim + v_heads x v_dim)/tp) x (kernel - 1) and SSM (v_heads/tp) x v_dim x k_dim.
  Both states take the model's dtype (vLLM's `mamba_cache_dtype` "auto"), the SSM state its own
  when the architecture says (`state.ssm_dtype`; Nemotron-H's is fp32, vLLM's
  NemotronHForCausalLMConfig). `--kv-dtype` does not touch them: vLLM's kv_cache_dtype is the
  attention layers' alone. Speculative-decoding slots (`num_spec`) are not counted, and neither is
  vLLM's padding of a Mamba page up to the attention page size (a hybrid-allocator detail the
  safety pad covers).
- MLP-only layers (Nemotron-H's `-`, `E`) hold nothing. An MoE model's attention is sized like any
  other; its weights count in full (every expert is resident), from `num_parameters`.
- Memory is counted per token, not per paged block: an engine with 16-token blocks can waste up
  to 15 tokens per sequence, which belongs in the safety pad.

`kv_shape` is the per-token figure of the attention layers; `kv_footprint` adds how each layer
kind grows, so `kv_bytes_for_sequence` (and everything sized from it: the plan, the simulated
pool, the sidecar's reservations) is exact at every length.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tritongen.core.strict import Strict
from tritongen.core.architecture import (
    DTYPE_BYTES,
    Architecture,
    GatedDeltaNetState,
    Mamba1State,
    Mamba2State,
)
from tritongen.errors import BadInput, Infeasible

KVDtype = Literal["auto", "fp32", "fp16", "bf16", "fp8", "int8"]
KV_DTYPES: tuple[str, ...] = ("auto", "fp32", "fp16", "bf16", "fp8", "int8")

# vLLM spells fp8 KV variants out; they are one byte each like tritongen's "fp8".
_KV_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

_MIB = 1 << 20


def _mib(n: float) -> str:
    return f"{n / _MIB:,.1f} MiB"


class KVShape(Strict):
    """KV-cache footprint of one token on one tensor-parallel rank."""

    kv_bytes_per_token: int = Field(
        ge=0,
        description="Bytes one token adds to the cache on one rank, all attention layers together "
        "(below any window or chunk; `kv_footprint` says how each layer kind grows past it).",
    )
    num_layers: int = Field(
        ge=0, description="Layers that hold a KV cache (full, sliding and chunked attention)."
    )
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

    layers = arch.attention_layers
    if arch.attention == "mla":
        assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
        latent = arch.kv_lora_rank + arch.qk_rope_head_dim
        return KVShape(
            kv_bytes_per_token=layers * latent * nbytes,
            num_layers=layers,
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
        kv_bytes_per_token=2 * layers * per_rank * arch.head_dim * nbytes,
        num_layers=layers,
        num_kv_heads=per_rank,
        head_dim=arch.head_dim,
        kv_tensors=2,
        kv_dtype=dtype,
        kv_dtype_bytes=nbytes,
        tensor_parallel=tp,
        attention=arch.attention,
        latent_dim=None,
    )


class CappedLayers(Strict):
    """Layers of one kind whose cache stops growing at a cap (a window, or one chunk)."""

    kind: Literal["sliding_attention", "chunked_attention"] = Field(description="The layer kind.")
    layers: int = Field(gt=0, description="How many layers of this kind.")
    cap_tokens: int = Field(gt=0, description="Tokens each of them keeps at most (window or chunk).")
    bytes_per_token: int = Field(ge=0, description="Bytes one token adds to all of them, per rank.")


class KVFootprint(Strict):
    """What one sequence holds on one rank, by layer kind: the figure at any length is
    `growing x tokens + sum(capped x min(tokens, cap)) + state` (see `bytes_at`)."""

    growing_layers: int = Field(ge=0, description="Full-attention (or MLA) layers: keep every token.")
    growing_bytes_per_token: int = Field(ge=0, description="Bytes one token adds to those layers.")
    capped: tuple[CappedLayers, ...] = Field(default=(), description="Windowed and chunked layers.")
    state_kind: str | None = Field(default=None, description="mamba1, mamba2 or gated_delta_net; None: no state.")
    state_layers: int = Field(default=0, ge=0, description="Linear-attention or Mamba layers.")
    state_conv_bytes: int = Field(default=0, ge=0, description="One such layer's convolution state.")
    state_ssm_bytes: int = Field(default=0, ge=0, description="One such layer's recurrent (SSM) state.")
    all_full_bytes_per_token: int = Field(
        ge=0,
        description="What a token would cost if every decoder layer were full attention: the "
        "per-token figure a calculator that ignores layer kinds uses, kept for comparison.",
    )

    @property
    def state_bytes(self) -> int:
        """Fixed bytes per sequence, whatever its length."""
        return self.state_layers * (self.state_conv_bytes + self.state_ssm_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes a token adds while every cap is still above the length (KVShape's figure)."""
        return self.growing_bytes_per_token + sum(c.bytes_per_token for c in self.capped)

    @property
    def uniform(self) -> bool:
        """True when bytes_at is tokens x kv_bytes_per_token (no cap, no state): a classic model."""
        return not self.capped and not self.state_layers

    def bytes_at(self, tokens: int) -> int:
        """Bytes one sequence of `tokens` tokens holds at its fullest (a chunked layer's peak is a
        whole chunk once the sequence reaches one). An empty sequence holds nothing."""
        if tokens <= 0:
            return 0
        capped = sum(c.bytes_per_token * min(tokens, c.cap_tokens) for c in self.capped)
        return self.growing_bytes_per_token * tokens + capped + self.state_bytes

    def describe(self, tokens: int) -> str:
        """One line: how `bytes_at(tokens)` is made up, for plan notes and messages."""
        parts = [f"{self.growing_layers} full-attention layers {self.growing_bytes_per_token:,} B/token x {tokens}"]
        for c in self.capped:
            what = "window" if c.kind == "sliding_attention" else "chunk"
            parts.append(f"{c.layers} {c.kind.replace('_', '-')} layers {c.bytes_per_token:,} B/token x "
                         f"{min(tokens, c.cap_tokens)} ({what} {c.cap_tokens})")
        if self.state_layers:
            parts.append(f"{self.state_layers} {self.state_kind} layers' fixed state {self.state_bytes:,} B")
        return " + ".join(parts) + f" = {self.bytes_at(tokens) / _MIB:,.2f} MiB"


def _divide(total: int, tp: int, what: str, arch: Architecture) -> int:
    if total % tp != 0:
        raise BadInput(
            f"tensor parallel size {tp} does not divide the {total} {what} of {arch.family}'s "
            "recurrent state (vLLM splits them evenly across ranks); choose a tp that divides it."
        )
    return total // tp


def state_elements(arch: Architecture, tensor_parallel: int = 1) -> tuple[int, int]:
    """(conv, ssm) elements one recurrent layer keeps per sequence on one rank, as vLLM's
    MambaStateShapeCalculator sizes them (module docstring); (0, 0) without a state."""
    state, tp = arch.state, tensor_parallel
    kernel = state.conv_kernel - 1 if state is not None else 0
    if isinstance(state, Mamba1State):
        channels = _divide(state.intermediate_size, tp, "Mamba channels", arch)
        return channels * kernel, channels * state.state_size
    if isinstance(state, Mamba2State):
        groups = state.n_groups if state.n_groups % tp == 0 else tp  # groups replicated to the heads' shards
        conv_dim = state.num_heads * state.head_dim + 2 * groups * state.state_size
        heads = _divide(state.num_heads, tp, "Mamba2 heads", arch)
        return _divide(conv_dim, tp, "Mamba2 conv channels", arch) * kernel, heads * state.head_dim * state.state_size
    if isinstance(state, GatedDeltaNetState):
        conv_dim = 2 * state.num_k_heads * state.head_k_dim + state.num_v_heads * state.head_v_dim
        heads = _divide(state.num_v_heads, tp, "linear-attention value heads", arch)
        return _divide(conv_dim, tp, "linear-attention conv channels", arch) * kernel, heads * state.head_v_dim * state.head_k_dim
    return 0, 0


def kv_footprint(arch: Architecture, shape: KVShape) -> KVFootprint:
    """How one sequence's cache grows on each kind of layer of `arch`, at `shape`'s dtype and TP."""
    if shape.num_layers != arch.attention_layers:
        raise BadInput(
            f"KV shape has {shape.num_layers} attention layers but the architecture has "
            f"{arch.attention_layers}; compute the shape from the same architecture with kv_shape()."
        )
    per_layer = shape.kv_bytes_per_token // shape.num_layers if shape.num_layers else (
        shape.kv_tensors * shape.num_kv_heads * shape.head_dim * shape.kv_dtype_bytes
    )
    capped = []
    for kind, cap in (("sliding_attention", arch.sliding_window), ("chunked_attention", arch.attention_chunk_size)):
        count = arch.layer_count(kind)
        if count and cap is not None:
            capped.append(CappedLayers(kind=kind, layers=count, cap_tokens=cap, bytes_per_token=count * per_layer))
    conv, ssm = state_elements(arch, shape.tensor_parallel)
    state_layers = arch.layer_count("linear_attention") + arch.layer_count("mamba")
    state_dtype = DTYPE_BYTES[arch.dtype]
    ssm_dtype = DTYPE_BYTES[arch.state.ssm_dtype or arch.dtype] if arch.state is not None else state_dtype
    growing = arch.layer_count("full_attention")
    return KVFootprint(
        growing_layers=growing,
        growing_bytes_per_token=growing * per_layer,
        capped=tuple(capped),
        state_kind=arch.state.kind if arch.state is not None else None,
        state_layers=state_layers,
        state_conv_bytes=conv * state_dtype,
        state_ssm_bytes=ssm * ssm_dtype,
        all_full_bytes_per_token=arch.num_layers * per_layer,
    )


def kv_bytes_for_sequence(arch: Architecture, shape: KVShape, tokens: int) -> int:
    """Per-rank bytes one sequence of `tokens` tokens holds, every layer kind counted as it grows.

    Windowed layers keep at most `sliding_window` tokens, chunked ones one chunk, and recurrent
    layers a fixed state, so long sequences on Mistral v0.1, Gemma 2/3, GPT-OSS, Llama 4, or a
    hybrid cost less than `tokens x kv_bytes_per_token` and a short one on a hybrid costs more.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise BadInput(f"sequence length must be a whole number of tokens >= 0, got {tokens!r}.")
    return kv_footprint(arch, shape).bytes_at(tokens)


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


def kv_summary(arch: Architecture, shape: KVShape, context_tokens: int | None = None) -> dict[str, object]:
    """What `tritongen kv --json` prints: the per-token figure of the attention layers, how each
    layer kind grows (growing bytes/token, capped layers with their caps, fixed state bytes) and,
    with `context_tokens`, the exact bytes one sequence of that length holds. Pure."""
    fp = kv_footprint(arch, shape)
    out: dict[str, object] = {
        "family": arch.family,
        "attention": shape.attention,
        "num_layers": shape.num_layers,
        "model_layers": arch.num_layers,
        "layers": {kind: arch.layer_count(kind) for kind in dict.fromkeys(arch.kinds)},
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "kv_dtype": shape.kv_dtype,
        "kv_dtype_bytes": shape.kv_dtype_bytes,
        "tensor_parallel": shape.tensor_parallel,
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "growing_bytes_per_token": fp.growing_bytes_per_token,
        "capped": [c.model_dump() for c in fp.capped],
        "state_bytes_per_sequence": fp.state_bytes,
        "all_full_bytes_per_token": fp.all_full_bytes_per_token,
    }
    if shape.latent_dim is not None:
        out["latent_dim"] = shape.latent_dim
    if arch.sliding_window is not None:
        out["sliding_window"] = arch.sliding_window
        out["sliding_window_layers"] = arch.sliding_window_layers
    if arch.attention_chunk_size is not None:
        out["attention_chunk_size"] = arch.attention_chunk_size
    if fp.state_layers:
        out["state"] = {
            "kind": fp.state_kind,
            "layers": fp.state_layers,
            "conv_bytes_per_layer": fp.state_conv_bytes,
            "ssm_bytes_per_layer": fp.state_ssm_bytes,
        }
    if context_tokens is not None:
        out["context_tokens"] = context_tokens
        out["kv_bytes_per_sequence"] = kv_bytes_for_sequence(arch, shape, context_tokens)
    return out
