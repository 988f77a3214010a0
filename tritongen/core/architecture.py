"""The attention shape of a transformer, as far as KV-cache and weight memory care.

`Architecture` is the one type the KV math (`tritongen.core.kv`) reads. It can be written inline
in a deployment spec, or parsed from a Hugging Face `config.json` dict by `architecture_from_hf`.
Parsing is pure (a dict in, a frozen model out); reading the file is `tritongen.hfconfig`'s job,
so `core/` stays free of I/O.

Why a parser per family instead of `transformers.AutoConfig`: tritongen must not pull in
transformers/torch, and the handful of keys that matter for memory have drifted between families
(`n_layer` vs `num_hidden_layers`, Falcon's `multi_query`, Gemma's explicit `head_dim`, DeepSeek's
latent attention, Qwen2's `use_sliding_window`), so the rules are written down here, once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tritongen.errors import BadInput

ModelDtype = Literal["fp32", "fp16", "bf16", "fp8", "int8"]
AttentionKind = Literal["mha", "gqa", "mqa", "mla"]

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
"""Bytes per element of each dtype tritongen knows; the KV math and weight math share it."""


class Architecture(BaseModel):
    """Memory-relevant shape of a decoder-only transformer (frozen; safe to share and hash)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        # one field inline, and the stored model is always explicit.
        if isinstance(data, dict):
            if data.get("sliding_window") is not None and data.get("sliding_window_layers") is None:
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
        return self

    @property
    def stored_weight_dtype(self) -> ModelDtype:
        """The dtype weight memory should be computed in (quantized checkpoints differ)."""
        return self.weight_dtype or self.dtype


# --------------------------------------------------------------------------------------------
# Hugging Face config.json parsing

_HF_DTYPES: dict[str, ModelDtype] = {
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "float8_e5m2fnuz": "fp8",
    "fp8": "fp8",
    "int8": "int8",
}

# Key names in order of preference; older families (GPT-2, Falcon's RefinedWeb) use the n_* names.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def _int_key(config: dict[str, Any], keys: tuple[str, ...], source: str, *, required: bool) -> int | None:
    """First present, non-null key among `keys` as a positive int; wrong types are named."""
    for key in keys:
        if key in config and config[key] is not None:
            value = config[key]
            # bool is an int subclass; `true` for a layer count is a broken file, not 1.
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInput(
                    f"{source}: `{key}` must be a whole number, got {value!r} "
                    f"({type(value).__name__}); fix the value in the config."
                )
            if value <= 0:
                raise BadInput(f"{source}: `{key}` must be positive, got {value}; fix the value in the config.")
            return value
    if required:
        alternatives = " (or " + ", ".join(f"`{k}`" for k in keys[1:]) + ")" if len(keys) > 1 else ""
        raise BadInput(
            f"{source}: missing `{keys[0]}`{alternatives}; is this a Hugging Face model config?"
        )
    return None


def _bool_key(config: dict[str, Any], key: str, source: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadInput(f"{source}: `{key}` must be true or false, got {value!r}; fix the value in the config.")
    return value


def _parse_dtype(config: dict[str, Any], source: str) -> ModelDtype:
    """`torch_dtype` (or the newer `dtype`) mapped to tritongen's names.

    Missing means fp32: transformers instantiates a model in float32 unless told otherwise, and
    configs without the key (GPT-2, early checkpoints) ship float32 weights.
    """
    for key in ("torch_dtype", "dtype"):
        raw = config.get(key)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise BadInput(f"{source}: `{key}` must be a string such as \"bfloat16\", got {raw!r}.")
        name = raw.removeprefix("torch.").lower()
        if name == "auto":
            continue
        if name not in _HF_DTYPES:
            known = ", ".join(sorted({k for k in _HF_DTYPES if "_" not in k}))
            raise BadInput(
                f"{source}: `{key}` is {raw!r}, which tritongen does not know; use one of {known}."
            )
        return _HF_DTYPES[name]
    return "fp32"


def _parse_weight_dtype(config: dict[str, Any], dtype: ModelDtype) -> ModelDtype | None:
    """Stored weight dtype from `quantization_config`, when it is one tritongen can count.

    Only 8-bit schemes are recognised; 4-bit (AWQ/GPTQ) cannot be expressed in ModelDtype and is
    left as None (weights then count at `dtype`, an overestimate, which is the safe side).
    """
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method", "")).lower()
    found: ModelDtype | None = None
    if method in ("fp8", "fbgemm_fp8"):
        found = "fp8"
    elif method == "bitsandbytes" and quant.get("load_in_8bit") is True:
        found = "int8"
    elif method in ("gptq", "awq") and quant.get("bits") == 8:
        found = "int8"
    return found if found != dtype else None


def _window(config: dict[str, Any], family: str, num_layers: int, source: str) -> tuple[int | None, int | None]:
    """(sliding_window, sliding_window_layers) following each family's published semantics."""
    window = _int_key(config, ("sliding_window",), source, required=False)
    if window is None:
        return None, None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        # Newer transformers configs spell out every layer; trust them over family rules.
        count = sum(1 for t in layer_types if t == "sliding_attention")
        return (window, count) if count else (None, None)
    if family.startswith("qwen") or "use_sliding_window" in config:
        # Qwen2/2.5/3 publish a window but only use it when use_sliding_window is true, and then
        # only on layers at index >= max_window_layers.
        if not _bool_key(config, "use_sliding_window", source, default=False):
            return None, None
        first = _int_key(config, ("max_window_layers",), source, required=False) or 0
        count = max(0, num_layers - first)
        return (window, count) if count else (None, None)
    if family == "gemma2":
        # Even-indexed layers are local (windowed), odd ones global: ceil(n / 2) windowed.
        return window, (num_layers + 1) // 2
    pattern = _int_key(config, ("sliding_window_pattern",), source, required=False)
    if pattern is not None:
        # Gemma 3 / Cohere 2: every `pattern`-th layer is global, the others are local.
        return window, num_layers - num_layers // pattern
    return window, num_layers


def _attention_kind(heads: int, kv_heads: int) -> AttentionKind:
    if kv_heads == heads:
        return "mha"
    if kv_heads == 1:
        return "mqa"
    return "gqa"


def _explain(err: ValidationError, source: str) -> str:
    """One readable line per pydantic error, prefixed with the source."""
    parts = []
    for item in err.errors():
        msg = str(item.get("msg", "")).removeprefix("Value error, ")
        loc = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{loc}: {msg}" if loc else msg)
    return f"{source}: " + "; ".join(parts)


def architecture_from_hf(config: dict[str, Any], source: str = "config.json") -> Architecture:
    """Parse a Hugging Face `config.json` dict into an `Architecture`.

    Covers Llama 1/2/3, Mistral, Mixtral, Qwen2/2.5, Gemma/Gemma 2, Falcon (old and new key
    names), GPT-2, GPT-NeoX/Pythia, Phi/Phi-3, DeepSeek V2/V3 and anything else that uses the
    standard key names. Multimodal wrappers that nest the language model under `text_config`
    are unwrapped. Every failure is a `BadInput` naming the key, `source` and the fix.

    Defaults, chosen to match what transformers itself would do with the same file:
    - no `num_key_value_heads` (or null, as phi-2 publishes): multi-head attention;
    - Falcon without `new_decoder_architecture`: `multi_query` defaults to true (FalconConfig);
    - no `torch_dtype`/`dtype` (GPT-2 and other early checkpoints): fp32, the dtype
      transformers instantiates in and the dtype those checkpoints are stored in;
    - no `model_type`: family "unknown";
    - `num_parameters` stays None, since config.json does not carry it.
    """
    if not isinstance(config, dict):
        raise BadInput(f"{source}: expected a JSON object, got {type(config).__name__}.")

    family_raw = config.get("model_type")
    if family_raw is not None and not isinstance(family_raw, str):
        raise BadInput(f"{source}: `model_type` must be a string, got {family_raw!r}.")

    text = config.get("text_config")
    if isinstance(text, dict) and not any(k in config for k in _LAYER_KEYS):
        inner = {**text}
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if key in config and key not in inner:
                inner[key] = config[key]
        return architecture_from_hf(inner, source=f"{source} (text_config)")

    family = (family_raw or "unknown").lower()

    layers = _int_key(config, _LAYER_KEYS, source, required=True)
    heads = _int_key(config, _HEAD_KEYS, source, required=True)
    hidden = _int_key(config, _HIDDEN_KEYS, source, required=True)
    assert layers is not None and heads is not None and hidden is not None

    dtype = _parse_dtype(config, source)
    weight_dtype = _parse_weight_dtype(config, dtype)

    kv_lora_rank = _int_key(config, ("kv_lora_rank",), source, required=False)
    qk_rope = _int_key(config, ("qk_rope_head_dim",), source, required=False)

    # Key/value heads. Missing (or null, as phi-2 publishes) means multi-head attention.
    if family in ("falcon", "refinedweb", "refinedwebmodel"):
        # FalconConfig: new_decoder_architecture uses num_kv_heads (old name n_head_kv);
        # otherwise multi_query (default true in FalconConfig) means one kv head.
        if _bool_key(config, "new_decoder_architecture", source, default=False) or family == "refinedweb":
            kv_heads = _int_key(config, ("num_kv_heads", "n_head_kv"), source, required=False) or heads
        elif _bool_key(config, "multi_query", source, default=True):
            kv_heads = 1
        else:
            kv_heads = heads
    else:
        kv_heads = _int_key(
            config, ("num_key_value_heads", "num_kv_heads", "n_head_kv"), source, required=False
        ) or (1 if config.get("multi_query") is True else heads)

    head_dim = _int_key(config, ("head_dim",), source, required=False)
    if kv_lora_rank is not None:
        attention: AttentionKind = "mla"
        if head_dim is None:
            # MLA's query/key head: the non-rotary part plus the rotary part. It does not enter
            # the KV math (the latent does); it is recorded for completeness.
            nope = _int_key(config, ("qk_nope_head_dim",), source, required=False)
            head_dim = (nope or 0) + (qk_rope or 0) or None
    else:
        attention = _attention_kind(heads, kv_heads)
    if head_dim is None:
        if hidden % heads != 0:
            raise BadInput(
                f"{source}: hidden size {hidden} is not divisible by {heads} attention heads, so "
                "the head size cannot be derived; add `head_dim` to the config."
            )
        head_dim = hidden // heads

    window, window_layers = _window(config, family, layers, source)

    try:
        return Architecture(
            family=family,
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            weight_dtype=weight_dtype,
            attention=attention,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope if attention == "mla" else None,
            sliding_window=window,
            sliding_window_layers=window_layers,
            max_position_embeddings=_int_key(config, _POSITION_KEYS, source, required=False),
            vocab_size=_int_key(config, ("vocab_size",), source, required=False),
            num_parameters=_int_key(config, ("num_parameters",), source, required=False),
        )
    except ValidationError as err:
        raise BadInput(_explain(err, source)) from None
