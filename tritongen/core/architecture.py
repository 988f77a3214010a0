"""The attention shape of a transformer, as far as KV-cache and weight memory care.

`Architecture` is the one type the KV math (`tritongen.core.kv`) reads. It can be written inline
in a deployment spec, or parsed from a Hugging Face `config.json` dict by
`tritongen.core.hf_architecture.architecture_from_hf`; either way its validators are the one place
that says which combinations of fields make a model.

Models of 2025-26 mix layer kinds, and a per-token figure alone misstates their memory: a
sliding-window layer stops growing at its window, a chunked-attention layer (Llama 4) holds at
most one chunk, a linear-attention or state-space layer (Qwen3-Next's Gated DeltaNet, Jamba's and
Nemotron-H's Mamba) holds a fixed state per sequence whatever its length, and an MLP-only layer
holds nothing. `layer_types` records each layer's kind; the window, the chunk and the recurrent
state's shape are fields of the model (one of each per model, as every family has).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tritongen.core.strict import Strict

ModelDtype = Literal["fp32", "fp16", "bf16", "fp8", "int8"]
AttentionKind = Literal["mha", "gqa", "mqa", "mla"]

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
"""Bytes per element of each dtype tritongen knows; the KV math and weight math share it."""

LayerType = Literal[
    "full_attention", "sliding_attention", "chunked_attention", "linear_attention", "mamba", "mlp"
]
"""What one decoder layer keeps per sequence:
full_attention     every token's key and value (or MLA latent): grows with the sequence;
sliding_attention  the last `sliding_window` tokens;
chunked_attention  the tokens of the current `attention_chunk_size` chunk (Llama 4), at most one chunk;
linear_attention   a fixed recurrent state (Qwen3-Next's Gated DeltaNet; `state` gives its shape);
mamba              a fixed convolution + SSM state (Jamba's Mamba, Nemotron-H's Mamba2; `state`);
mlp                nothing: an MLP or MoE block without a token mixer (Nemotron-H's `-` and `E`)."""

LAYER_TYPES: tuple[str, ...] = (
    "full_attention", "sliding_attention", "chunked_attention", "linear_attention", "mamba", "mlp"
)
ATTENTION_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention")
"""Layer kinds that cache keys and values per token (the KV-cache proper)."""


class _State(Strict):

    conv_kernel: int = Field(
        gt=1, description="Width of the causal convolution before the mixer; its state keeps kernel - 1 steps."
    )
    ssm_dtype: ModelDtype | None = Field(
        default=None,
        description="Dtype of the recurrent (SSM) state when it differs from the model's (vLLM's "
        "`mamba_ssm_cache_dtype`; Nemotron-H keeps it in fp32). None: the model's dtype, which is "
        "also the convolution state's dtype.",
    )


class Mamba1State(_State):
    """Jamba's Mamba layer: conv state (d_inner, kernel - 1), SSM state (d_inner, d_state)."""

    kind: Literal["mamba1"] = Field(description="Mamba (selective scan), as Jamba uses it.")
    intermediate_size: int = Field(gt=0, description="d_inner: `mamba_expand` x hidden_size.")
    state_size: int = Field(gt=0, description="d_state (`mamba_d_state`): SSM state per channel.")


class Mamba2State(_State):
    """Nemotron-H's Mamba2 layer: conv state over d_inner + 2 x groups x d_state channels, SSM state
    (heads, head_dim, d_state)."""

    kind: Literal["mamba2"] = Field(description="Mamba2 (state-space duality), as Nemotron-H uses it.")
    num_heads: int = Field(gt=0, description="SSM heads (`mamba_num_heads`).")
    head_dim: int = Field(gt=0, description="Channels per SSM head (`mamba_head_dim`); d_inner = heads x head_dim.")
    n_groups: int = Field(gt=0, description="Groups sharing B and C (`n_groups`).")
    state_size: int = Field(gt=0, description="d_state (`ssm_state_size`).")


class GatedDeltaNetState(_State):
    """Qwen3-Next's Gated DeltaNet (linear attention): conv state over the q, k, v channels,
    recurrent state (value heads, value dim, key dim)."""

    kind: Literal["gated_delta_net"] = Field(description="Gated DeltaNet linear attention (Qwen3-Next).")
    num_k_heads: int = Field(gt=0, description="Key heads (`linear_num_key_heads`).")
    num_v_heads: int = Field(gt=0, description="Value heads (`linear_num_value_heads`).")
    head_k_dim: int = Field(gt=0, description="Key head width (`linear_key_head_dim`).")
    head_v_dim: int = Field(gt=0, description="Value head width (`linear_value_head_dim`).")


RecurrentState = Annotated[Mamba1State | Mamba2State | GatedDeltaNetState, Field(discriminator="kind")]

_STATE_LAYER = {"mamba1": "mamba", "mamba2": "mamba", "gated_delta_net": "linear_attention"}


class Architecture(Strict):
    """Memory-relevant shape of a decoder-only transformer (frozen; safe to share and hash)."""


    family: str = Field(
        min_length=1,
        description="Hugging Face `model_type` (e.g. `llama`, `qwen2`, `deepseek_v3`); "
        "informational, the KV math never branches on it.",
    )
    num_layers: int = Field(gt=0, description="Decoder layers; each holds its own KV cache.")
    hidden_size: int = Field(gt=0, description="Model width (`hidden_size`, `n_embd`).")
    num_attention_heads: int = Field(
        gt=0, description="Query heads. Tensor parallelism must divide this number."
    )
    num_kv_heads: int = Field(
        gt=0,
        description="Key/value heads before tensor parallelism: equal to the query heads for "
        "MHA, fewer for GQA, 1 for MQA. For MLA this is what the config says but the cache "
        "holds one shared latent instead.",
    )
    head_dim: int = Field(
        gt=0,
        description="Elements per key (and value) head. Usually hidden_size / heads, but "
        "Gemma and others set it explicitly, and it need not match that quotient.",
    )
    dtype: ModelDtype = Field(
        description="The model's dtype (Hugging Face `torch_dtype`): what activations and an "
        "`auto` KV cache use, and the stored weight dtype unless `weight_dtype` says otherwise."
    )
    weight_dtype: ModelDtype | None = Field(
        default=None,
        description="Dtype of the stored weights when the checkpoint is quantized to something "
        "other than `dtype` (e.g. DeepSeek V3 ships fp8 weights with bf16 `torch_dtype`). "
        "None: the weights are stored in `dtype`.",
    )
    attention: AttentionKind = Field(
        description="`mha` (kv heads = heads), `gqa` (heads divisible by kv heads), `mqa` "
        "(one kv head), `mla` (DeepSeek's compressed latent; needs kv_lora_rank and "
        "qk_rope_head_dim)."
    )
    kv_lora_rank: int | None = Field(
        default=None,
        gt=0,
        description="MLA only: width of the compressed KV latent cached per token per layer.",
    )
    qk_rope_head_dim: int | None = Field(
        default=None,
        gt=0,
        description="MLA only: the decoupled RoPE key width cached next to the latent.",
    )
    sliding_window: int | None = Field(
        default=None,
        gt=0,
        description="Tokens a sliding-window layer attends to (and so keeps in its cache). "
        "None: every layer keeps the whole sequence.",
    )
    sliding_window_layers: int | None = Field(
        default=None,
        ge=0,
        description="How many layers use the window; the rest keep every token. Gemma 2 "
        "alternates local and global layers (half of them), Mistral v0.1 windows all. Left "
        "out while `sliding_window` is set, it means all layers.",
    )
    layer_types: tuple[LayerType, ...] | None = Field(
        default=None,
        description="Each decoder layer's kind, in order (see `LayerType`). None: every layer is full "
        "attention except `sliding_window_layers` windowed ones, the form of classic families.",
    )
    attention_chunk_size: int | None = Field(
        default=None,
        gt=0,
        description="Tokens per chunk of the chunked_attention layers (Llama 4's local layers): a "
        "token attends to the earlier tokens of its own chunk, so such a layer holds at most one chunk.",
    )
    state: RecurrentState | None = Field(
        default=None,
        description="Shape of the fixed per-sequence state of the linear_attention or mamba layers "
        "(`kind`: mamba1, mamba2 or gated_delta_net).",
    )
    max_position_embeddings: int | None = Field(
        default=None, gt=0, description="Longest context the model was built for, in tokens."
    )
    vocab_size: int | None = Field(default=None, gt=0, description="Vocabulary size.")
    num_parameters: int | None = Field(
        default=None,
        gt=0,
        description="Total parameter count, for weight memory. Hugging Face configs do not "
        "carry it; give it inline (e.g. from the safetensors index) when weights matter.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_window_layers(cls, data: Any) -> Any:
        # A window with no layer count means "every layer": the common case (Mistral v0.1) stays
        # one field inline, and the stored model is always explicit. With `layer_types` the count
        # is the list's, so the two can never disagree unless a spec writes both.
        if isinstance(data, dict):
            kinds = data.get("layer_types")
            if isinstance(kinds, (list, tuple)) and data.get("sliding_window_layers") is None:
                data = {**data, "sliding_window_layers": sum(1 for k in kinds if k == "sliding_attention")}
            elif data.get("sliding_window") is not None and data.get("sliding_window_layers") is None:
                layers = data.get("num_layers")
                if isinstance(layers, int) and not isinstance(layers, bool):
                    data = {**data, "sliding_window_layers": layers}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> Architecture:
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if kv > heads:
            raise ValueError(
                f"num_kv_heads ({kv}) is larger than num_attention_heads ({heads}); "
                "a model cannot have more key/value heads than query heads. Swap or fix them."
            )
        if self.attention == "mha" and kv != heads:
            raise ValueError(
                f"attention 'mha' needs num_kv_heads == num_attention_heads, got {kv} and "
                f"{heads}; use attention 'gqa' (or 'mqa' when num_kv_heads is 1) or fix the counts."
            )
        if self.attention == "gqa":
            if heads % kv != 0:
                raise ValueError(
                    f"attention 'gqa' needs num_attention_heads ({heads}) divisible by "
                    f"num_kv_heads ({kv}); each kv head serves a whole group of query heads. "
                    "Check both values against the model's config.json."
                )
        if self.attention == "mqa" and kv != 1:
            raise ValueError(
                f"attention 'mqa' means one key/value head, got num_kv_heads {kv}; set "
                "num_kv_heads to 1 or use attention 'gqa'."
            )
        if self.attention == "mla":
            missing = [
                name for name in ("kv_lora_rank", "qk_rope_head_dim") if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"attention 'mla' caches a latent of kv_lora_rank + qk_rope_head_dim "
                    f"elements, but {' and '.join(missing)} is not set (kv_lora_rank="
                    f"{self.kv_lora_rank}, qk_rope_head_dim={self.qk_rope_head_dim}); copy both "
                    "from the model's config.json."
                )
        elif self.kv_lora_rank is not None:
            raise ValueError(
                f"kv_lora_rank ({self.kv_lora_rank}) only applies to attention 'mla', but "
                f"attention is '{self.attention}'; set attention 'mla' or drop kv_lora_rank."
            )
        if self.sliding_window_layers is not None:
            if self.sliding_window is None and self.sliding_window_layers > 0:
                raise ValueError(
                    f"sliding_window_layers ({self.sliding_window_layers}) is set but "
                    "sliding_window is not; give the window size in tokens or drop "
                    "sliding_window_layers."
                )
            if self.sliding_window_layers > self.num_layers:
                raise ValueError(
                    f"sliding_window_layers ({self.sliding_window_layers}) exceeds num_layers "
                    f"({self.num_layers}); at most every layer can use the window."
                )
        self._check_layer_types()
        return self

    def _check_layer_types(self) -> None:
        """Every kind `layer_types` names has the field that sizes it, and no such field dangles."""
        if self.layer_types is None:
            for name in ("attention_chunk_size", "state"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} is set but layer_types is not, so no layer is known to use it; list "
                        "each layer's kind in layer_types (e.g. chunked_attention, mamba)."
                    )
            return
        kinds = self.layer_types
        if len(kinds) != self.num_layers:
            raise ValueError(
                f"layer_types lists {len(kinds)} layers but num_layers is {self.num_layers}; give "
                "exactly one kind per decoder layer."
            )
        count = {kind: kinds.count(kind) for kind in LAYER_TYPES}
        windowed = count["sliding_attention"]
        if self.sliding_window_layers != windowed:
            raise ValueError(
                f"sliding_window_layers ({self.sliding_window_layers}) disagrees with the "
                f"{windowed} sliding_attention layers of layer_types; drop sliding_window_layers "
                "(layer_types says it)."
            )
        if windowed and self.sliding_window is None:
            raise ValueError(
                f"layer_types has {windowed} sliding_attention layers but sliding_window is not "
                "set; give the window in tokens."
            )
        if self.sliding_window is not None and not windowed:
            raise ValueError(
                f"sliding_window ({self.sliding_window}) is set but no layer of layer_types is "
                "sliding_attention; drop sliding_window or mark the windowed layers."
            )
        chunked = count["chunked_attention"]
        if chunked and self.attention_chunk_size is None:
            raise ValueError(
                f"layer_types has {chunked} chunked_attention layers but attention_chunk_size is "
                "not set; give the chunk in tokens."
            )
        if self.attention_chunk_size is not None and not chunked:
            raise ValueError(
                f"attention_chunk_size ({self.attention_chunk_size}) is set but no layer of "
                "layer_types is chunked_attention; drop it or mark the chunked layers."
            )
        recurrent = {k: count[k] for k in ("linear_attention", "mamba") if count[k]}
        wanted = _STATE_LAYER[self.state.kind] if self.state is not None else None
        if recurrent and self.state is None:
            names = " and ".join(f"{n} {k}" for k, n in recurrent.items())
            raise ValueError(
                f"layer_types has {names} layers but `state` is not set; give the recurrent "
                "state's shape (kind mamba1, mamba2 or gated_delta_net)."
            )
        if self.state is not None and set(recurrent) != {wanted}:
            raise ValueError(
                f"state kind {self.state.kind!r} sizes {wanted} layers, but layer_types has "
                f"{recurrent or 'no recurrent layers'}; make the layer kinds and the state agree."
            )

    @property
    def kinds(self) -> tuple[LayerType, ...]:
        """Each layer's kind; for the classic form, the windowed layers first (order is immaterial
        to memory)."""
        if self.layer_types is not None:
            return self.layer_types
        windowed = (self.sliding_window_layers or 0) if self.sliding_window is not None else 0
        return ("sliding_attention",) * windowed + ("full_attention",) * (self.num_layers - windowed)

    def layer_count(self, kind: str) -> int:
        """How many layers are of `kind`."""
        return self.kinds.count(kind)  # type: ignore[arg-type]

    @property
    def attention_layers(self) -> int:
        """Layers that cache keys and values per token (full, sliding and chunked attention)."""
        return sum(self.layer_count(kind) for kind in ATTENTION_LAYER_TYPES)

    @property
    def stored_weight_dtype(self) -> ModelDtype:
        """The dtype weight memory should be computed in (quantized checkpoints differ)."""
        return self.weight_dtype or self.dtype
