"""Hugging Face `config.json` (a parsed dict) to an `Architecture`, family by family.

Parsing is pure (a dict in, a frozen model out); reading the file is `tritongen.hfconfig`'s job,
so `core/` stays free of I/O. The result is built through `Architecture`'s validators, so a family
rule here cannot produce a model the type would refuse.

Why a parser per family instead of `transformers.AutoConfig`: tritongen must not pull in
transformers/torch, and the handful of keys that matter for memory have drifted between families
(`n_layer` vs `num_hidden_layers`, Falcon's `multi_query`, Gemma's explicit `head_dim`, DeepSeek's
latent attention, Qwen2's `use_sliding_window`), so the rules are written down here, once.

A config whose layer pattern cannot be read is a `BadInput` naming the keys it has: reading it as
"every layer is full attention" would overstate some models and understate none, but it would be a
silent guess, and the planner sizes real pools from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tritongen.core.architecture import (
    Architecture,
    AttentionKind,
    GatedDeltaNetState,
    LayerType,
    Mamba1State,
    Mamba2State,
    ModelDtype,
)
from tritongen.errors import BadInput


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


# Family defaults for keys a published config leaves out, as the family's transformers config
# class fills them. Gemma 3 (configuration_gemma3.py, Gemma3TextConfig): max_position_embeddings
# 131072, sliding_window 4096, sliding_window_pattern 6; google/gemma-3-27b-it's text_config states
# none of max_position_embeddings or the pattern.
_GEMMA3_DEFAULT_WINDOW = 4096
_FAMILY_POSITIONS = {"gemma3": 131072, "gemma3_text": 131072}
# openai/gpt-oss-* publish no torch_dtype: the experts are MXFP4 and every other tensor, attention
# included (quantization_config.modules_to_not_convert), is stored in bfloat16. vLLM reads the
# dtype from the safetensors header when the config has none (vllm/config/model.py, _find_dtype)
# and never keeps an "auto" model in float32, so the KV cache is bfloat16, not transformers' fp32.
_FAMILY_DTYPES: dict[str, ModelDtype] = {"gpt_oss": "bf16"}


def _dtype_name(raw: Any, key: str, source: str) -> ModelDtype:
    if not isinstance(raw, str):
        raise BadInput(f"{source}: `{key}` must be a string such as \"bfloat16\", got {raw!r}.")
    name = raw.removeprefix("torch.").lower()
    if name not in _HF_DTYPES:
        known = ", ".join(sorted({k for k in _HF_DTYPES if "_" not in k}))
        raise BadInput(
            f"{source}: `{key}` is {raw!r}, which tritongen does not know; use one of {known}."
        )
    return _HF_DTYPES[name]


def _parse_dtype(config: dict[str, Any], source: str, family: str = "unknown") -> ModelDtype:
    """`torch_dtype` (or the newer `dtype`) mapped to tritongen's names.

    Missing means fp32: transformers instantiates a model in float32 unless told otherwise, and
    configs without the key (GPT-2, early checkpoints) ship float32 weights. Families whose
    checkpoints are stored otherwise without saying so are in `_FAMILY_DTYPES`.
    """
    for key in ("torch_dtype", "dtype"):
        raw = config.get(key)
        if raw is None or (isinstance(raw, str) and raw.removeprefix("torch.").lower() == "auto"):
            continue
        return _dtype_name(raw, key, source)
    return _FAMILY_DTYPES.get(family, "fp32")


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


# HF names of layer kinds (`layer_types`, and Jamba's / Nemotron-H's `layers_block_type`) -> ours.
_HF_LAYER_TYPES: dict[str, LayerType] = {
    "full_attention": "full_attention",
    "attention": "full_attention",  # Jamba's layers_block_type
    "sliding_attention": "sliding_attention",
    "chunked_attention": "chunked_attention",
    "linear_attention": "linear_attention",  # Nemotron-H's Mamba2 in newer configs: see _MAMBA_FAMILIES
    "mamba": "mamba",
    "mlp": "mlp",
    "moe": "mlp",  # an MoE block holds no per-sequence cache either
}
# Families whose `linear_attention` layers are Mamba mixers (transformers' NemotronHConfig renames
# them so); elsewhere linear_attention is Gated DeltaNet.
_MAMBA_FAMILIES = ("jamba", "nemotron_h")
# Nemotron-H's hybrid_override_pattern (transformers NemotronHConfig._pattern_to_list).
_NEMOTRON_PATTERN: dict[str, LayerType] = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "mlp"}
# Keys that say "this model has recurrent layers": seen without a readable pattern, they make the
# config a BadInput rather than a model read as all attention.
_HYBRID_KEYS = (
    "hybrid_override_pattern", "layers_block_type", "attn_layer_period", "attn_layer_offset",
    "full_attention_interval", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_heads",
    "mamba_num_heads", "mamba_head_dim", "mamba_d_head", "mamba_d_ssm", "ssm_state_size",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
_PATTERN_KEYS = (
    "`layer_types`, `hybrid_override_pattern`, `attn_layer_period`/`attn_layer_offset` (Jamba) or "
    "`full_attention_interval` (Qwen3-Next)"
)


def _found(config: dict[str, Any], keys: tuple[str, ...]) -> str:
    present = [f"`{k}`" for k in keys if k in config]
    return ", ".join(present) if present else "none of them"


def _listed_kinds(config: dict[str, Any], family: str, n: int, source: str) -> tuple[str, tuple[LayerType, ...]] | None:
    """An explicit per-layer list (`layer_types` or `layers_block_type`), checked entry by entry."""
    for key in ("layer_types", "layers_block_type"):
        raw = config.get(key)
        if raw is None:
            continue
        if not isinstance(raw, list) or not raw:
            raise BadInput(f"{source}: `{key}` must be a list of layer kinds, one per decoder layer, got {raw!r}.")
        if len(raw) != n:
            raise BadInput(
                f"{source}: `{key}` lists {len(raw)} layers but `num_hidden_layers` is {n}; the list needs "
                "one entry per decoder layer. Fix whichever of the two is wrong."
            )
        bad = sorted({repr(t) for t in raw if not isinstance(t, str) or t not in _HF_LAYER_TYPES})
        if bad:
            raise BadInput(
                f"{source}: `{key}` has layer kind(s) {', '.join(bad)} that tritongen cannot size; known "
                f"kinds: {', '.join(_HF_LAYER_TYPES)}."
            )
        kinds = [_HF_LAYER_TYPES[t] for t in raw]
        if family in _MAMBA_FAMILIES:
            kinds = ["mamba" if k == "linear_attention" else k for k in kinds]
        return key, tuple(kinds)  # type: ignore[arg-type]
    return None


def _period_kinds(
    config: dict[str, Any], n: int, source: str, key: str, default: int | None, every: LayerType, other: LayerType
) -> tuple[LayerType, ...]:
    """Layer i is `every` when (i + 1) % period == 0, else `other` (transformers' rule for Gemma 3's
    sliding_window_pattern, Qwen3-Next's full_attention_interval, Llama 4's no_rope_layer_interval)."""
    period = _int_key(config, (key,), source, required=False) or default
    if period is None:
        raise BadInput(f"{source}: missing `{key}`; it says which layers are {every}.")
    return tuple(every if (i + 1) % period == 0 else other for i in range(n))


def _llama4_kinds(config: dict[str, Any], n: int, source: str) -> tuple[LayerType, ...]:
    """Llama 4: NoPE layers attend globally, the RoPE layers attend within their chunk.

    transformers' Llama4TextConfig: `no_rope_layers[i]` is 1 for a RoPE (chunked) layer, 0 for a NoPE
    (full) one; an empty or missing list is derived as a NoPE layer every `no_rope_layer_interval`
    (default 4) layers. vLLM's llama4.py uses ChunkedLocalAttention on exactly the RoPE layers.
    """
    listed = config.get("no_rope_layers")
    if listed:
        if not isinstance(listed, list) or len(listed) < n or any(v not in (0, 1) or isinstance(v, bool) for v in listed):
            raise BadInput(
                f"{source}: `no_rope_layers` must list 0 (NoPE, full attention) or 1 (RoPE, chunked) for each of the "
                f"{n} layers, got {listed!r}; fix it or remove it to use `no_rope_layer_interval`."
            )
        return tuple("chunked_attention" if v else "full_attention" for v in listed[:n])
    key = "no_rope_layer_interval" if "no_rope_layer_interval" in config else "nope_layer_interval"
    return _period_kinds(config, n, source, key, 4, "full_attention", "chunked_attention")


def _pattern_kinds(config: dict[str, Any], family: str, n: int, source: str) -> tuple[LayerType, ...] | None:
    """Each layer's kind from the keys each family publishes; None for the classic families, whose
    windows `_classic_window` reads."""
    listed = _listed_kinds(config, family, n, source)
    if listed is not None:
        return listed[1]
    pattern = config.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - set(_NEMOTRON_PATTERN):
            raise BadInput(
                f"{source}: `hybrid_override_pattern` must be one character per layer ({n}, as "
                f"`num_hidden_layers` says) from M (Mamba2), * (attention), - (MLP), E (MoE); got {pattern!r}."
            )
        return tuple(_NEMOTRON_PATTERN[c] for c in pattern)
    if family == "jamba" or "attn_layer_period" in config:
        # transformers JambaConfig.layers_block_type: attention where i % period == offset.
        period = _int_key(config, ("attn_layer_period",), source, required=False)
        offset = config.get("attn_layer_offset")
        if period is None or isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
            raise BadInput(
                f"{source}: cannot tell Jamba's attention layers from its Mamba layers: `attn_layer_period` is "
                f"{config.get('attn_layer_period')!r} and `attn_layer_offset` is {offset!r} (found: "
                f"{_found(config, _HYBRID_KEYS)}); give a period and an offset in [0, period), or `layer_types`."
            )
        return tuple("full_attention" if i % period == offset else "mamba" for i in range(n))
    if family == "qwen3_next" or "full_attention_interval" in config:
        # transformers Qwen3NextConfig: a full-attention layer every `full_attention_interval`
        # (default 4) layers, Gated DeltaNet between them.
        return _period_kinds(config, n, source, "full_attention_interval", 4, "full_attention", "linear_attention")
    if config.get("attention_chunk_size") is not None:
        if family.startswith("llama4") or "no_rope_layers" in config or "no_rope_layer_interval" in config:
            return _llama4_kinds(config, n, source)
        raise BadInput(
            f"{source}: `attention_chunk_size` is set but nothing says which layers are chunked (found: "
            f"{_found(config, ('no_rope_layers', 'no_rope_layer_interval', 'nope_layer_interval'))}); add "
            "`layer_types` with chunked_attention and full_attention entries."
        )
    if config.get("sliding_window") is not None and (
        "sliding_window_pattern" in config or family in ("gemma3", "gemma3_text")
    ):
        # transformers Gemma3TextConfig (and Cohere2): a full layer every `sliding_window_pattern`
        # layers (Gemma 3's default 6), sliding ones between; Gemma 3's published configs omit it.
        return _period_kinds(config, n, source, "sliding_window_pattern", 6, "full_attention", "sliding_attention")
    if any(key in config for key in _HYBRID_KEYS):
        raise BadInput(
            f"{source}: this config describes recurrent layers ({_found(config, _HYBRID_KEYS)}) but not which "
            f"layers they are; tritongen reads the pattern from {_PATTERN_KEYS}. Add `layer_types` (one kind "
            "per layer) rather than sizing every layer as full attention."
        )
    return None


def _classic_window(config: dict[str, Any], family: str, num_layers: int, source: str) -> tuple[int | None, int | None]:
    """(sliding_window, sliding_window_layers) of the classic families (no per-layer list)."""
    window = _int_key(config, ("sliding_window",), source, required=False)
    if window is None:
        return None, None
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
    return window, num_layers


def _needed(config: dict[str, Any], keys: tuple[str, ...], what: str, source: str) -> list[int]:
    values = [_int_key(config, (k,), source, required=False) for k in keys]
    missing = [f"`{k}`" for k, v in zip(keys, values) if v is None]
    if missing:
        raise BadInput(
            f"{source}: the {what} layers' state cannot be sized: missing {', '.join(missing)} (found: "
            f"{_found(config, _HYBRID_KEYS)}); copy them from the model's config.json."
        )
    return values  # type: ignore[return-value]


def _recurrent_state(
    config: dict[str, Any], family: str, kinds: tuple[LayerType, ...], hidden: int, source: str
) -> Mamba1State | Mamba2State | GatedDeltaNetState | None:
    """The fixed state's shape, from the keys vLLM's model files size it with (see tritongen.core.kv)."""
    if "linear_attention" in kinds:
        heads_k, heads_v, dim_k, dim_v, kernel = _needed(
            config, ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim", "linear_conv_kernel_dim"), "linear-attention", source)
        return GatedDeltaNetState(kind="gated_delta_net", num_k_heads=heads_k, num_v_heads=heads_v,
                                  head_k_dim=dim_k, head_v_dim=dim_v, conv_kernel=kernel)
    if "mamba" not in kinds:
        return None
    if family == "jamba" or "mamba_d_state" in config:
        d_state, d_conv, expand = _needed(config, ("mamba_d_state", "mamba_d_conv", "mamba_expand"), "Mamba", source)
        return Mamba1State(kind="mamba1", intermediate_size=expand * hidden, state_size=d_state, conv_kernel=d_conv)
    heads, head_dim, groups, d_state, kernel = _needed(
        config, ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel"), "Mamba2", source)
    ssm_dtype: ModelDtype | None = None
    if family == "nemotron_h":
        # vLLM's NemotronHForCausalLMConfig (vllm/model_executor/models/config.py) sets the SSM
        # state's dtype from the config's `mamba_ssm_cache_dtype`, float32 when absent.
        raw = config.get("mamba_ssm_cache_dtype") or "float32"
        ssm_dtype = _dtype_name(raw, "mamba_ssm_cache_dtype", source)
    return Mamba2State(kind="mamba2", num_heads=heads, head_dim=head_dim, n_groups=groups, state_size=d_state,
                       conv_kernel=kernel, ssm_dtype=ssm_dtype)


def _layer_fields(config: dict[str, Any], family: str, n: int, hidden: int, source: str) -> dict[str, Any]:
    """Architecture fields that describe the layers: the classic window pair, or `layer_types` with
    the window, chunk and state its kinds need."""
    kinds = _pattern_kinds(config, family, n, source)
    if kinds is None:
        window, window_layers = _classic_window(config, family, n, source)
        return {"sliding_window": window, "sliding_window_layers": window_layers}
    fields: dict[str, Any] = {"layer_types": kinds}
    if "sliding_attention" in kinds:
        fields["sliding_window"] = _int_key(config, ("sliding_window",), source, required=False) or (
            _GEMMA3_DEFAULT_WINDOW if family in ("gemma3", "gemma3_text") else None
        )
        if fields["sliding_window"] is None:
            raise BadInput(f"{source}: the layers list sliding_attention layers but `sliding_window` is not set.")
    if "chunked_attention" in kinds:
        fields["attention_chunk_size"] = _int_key(config, ("attention_chunk_size",), source, required=False)
        if fields["attention_chunk_size"] is None:
            raise BadInput(f"{source}: the layers list chunked_attention layers but `attention_chunk_size` is not set.")
    fields["state"] = _recurrent_state(config, family, kinds, hidden, source)
    return fields


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
    standard key names; and the mixed-layer families: Gemma 3 (`sliding_window_pattern`), Llama 4
    (`attention_chunk_size` with `no_rope_layers` / `no_rope_layer_interval`), GPT-OSS and any
    config with a `layer_types` list, Qwen3 / Qwen3-MoE (all full attention), Qwen3-Next
    (`full_attention_interval` + `linear_*` keys), Jamba (`attn_layer_period`/`attn_layer_offset`
    + `mamba_*` keys) and Nemotron-H (`hybrid_override_pattern` + Mamba2 keys). Multimodal
    wrappers that nest the language model under `text_config` are unwrapped. Every failure is a
    `BadInput` naming the key, `source` and the fix; a config that has recurrent-layer keys but no
    readable layer pattern is one too, never a model read as all full attention.

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

    dtype = _parse_dtype(config, source, family)
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

    # Nemotron-H's published configs (trust_remote_code era) name it attention_head_dim.
    head_dim = _int_key(config, ("head_dim", "attention_head_dim"), source, required=False)
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

    layer_fields = _layer_fields(config, family, layers, hidden, source)

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
            **layer_fields,
            max_position_embeddings=_int_key(config, _POSITION_KEYS, source, required=False)
            or _FAMILY_POSITIONS.get(family),
            vocab_size=_int_key(config, ("vocab_size",), source, required=False),
            num_parameters=_int_key(config, ("num_parameters",), source, required=False),
        )
    except ValidationError as err:
        raise BadInput(_explain(err, source)) from None
