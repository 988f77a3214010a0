"""Architecture: inline validation and Hugging Face config.json parsing per family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tritongen.core.architecture import (
    Architecture,
    GatedDeltaNetState,
    Mamba1State,
    Mamba2State,
)
from tritongen.core.hf_architecture import architecture_from_hf
from tritongen.errors import BadInput

BASE: dict[str, Any] = dict(
    family="llama", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
    dtype="fp32", attention="gqa",
)


def build(**over: Any) -> Architecture:
    return Architecture(**{**BASE, **over})


# ---- inline model ------------------------------------------------------------------------------


def test_inline_ok_and_frozen() -> None:
    a = build()
    with pytest.raises(ValidationError):
        a.num_layers = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        build(num_experts=8)


def test_gqa_needs_divisible_heads() -> None:
    with pytest.raises(ValidationError) as err:
        build(num_attention_heads=6, num_kv_heads=4)
    assert "num_attention_heads (6) divisible by num_kv_heads (4)" in str(err.value)


def test_mha_needs_equal_heads() -> None:
    with pytest.raises(ValidationError, match=r"got 2 and 4; use attention 'gqa'"):
        build(attention="mha")


def test_mqa_needs_one_kv_head() -> None:
    with pytest.raises(ValidationError, match="num_kv_heads 2"):
        build(attention="mqa")


def test_more_kv_heads_than_heads() -> None:
    with pytest.raises(ValidationError, match=r"num_kv_heads \(8\) is larger than num_attention_heads \(4\)"):
        build(num_kv_heads=8)


def test_mla_needs_latent_fields() -> None:
    with pytest.raises(ValidationError, match="qk_rope_head_dim is not set"):
        build(attention="mla", kv_lora_rank=512)
    ok = build(attention="mla", kv_lora_rank=512, qk_rope_head_dim=64)
    assert ok.kv_lora_rank == 512
    with pytest.raises(ValidationError, match="only applies to attention 'mla'"):
        build(kv_lora_rank=512)


def test_window_defaults_to_all_layers_and_is_bounded() -> None:
    assert build(sliding_window=128).sliding_window_layers == 2
    assert build(sliding_window=128, sliding_window_layers=1).sliding_window_layers == 1
    with pytest.raises(ValidationError, match=r"sliding_window_layers \(3\) exceeds num_layers \(2\)"):
        build(sliding_window=128, sliding_window_layers=3)
    with pytest.raises(ValidationError, match="sliding_window is not"):
        build(sliding_window_layers=1)


def test_positive_counts() -> None:
    with pytest.raises(ValidationError):
        build(num_layers=0)


# ---- Hugging Face parsing ----------------------------------------------------------------------


def test_llama1_without_kv_heads_is_mha() -> None:
    a = architecture_from_hf(
        {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "max_sequence_length": 2048, "torch_dtype": "float16"}
    )
    assert (a.attention, a.num_kv_heads, a.head_dim, a.dtype, a.max_position_embeddings) == (
        "mha", 32, 128, "fp16", 2048,
    )


def test_falcon_old_key_names() -> None:
    # tiiuae/falcon-7b before the transformers port: RefinedWebModel, n_head/n_layer, multi_query.
    a = architecture_from_hf(
        {"model_type": "RefinedWebModel", "n_layer": 32, "n_head": 71, "hidden_size": 4544, "multi_query": True,
         "torch_dtype": "bfloat16"}
    )
    assert (a.family, a.num_layers, a.num_kv_heads, a.head_dim, a.attention) == ("refinedwebmodel", 32, 1, 64, "mqa")
    # tiiuae/falcon-40b before the port: RefinedWeb with n_head_kv.
    b = architecture_from_hf(
        {"model_type": "RefinedWeb", "n_layer": 60, "n_head": 128, "n_head_kv": 8, "hidden_size": 8192}
    )
    assert (b.num_kv_heads, b.attention) == (8, "gqa")


def test_falcon_multi_query_defaults_true() -> None:
    # FalconConfig's default is multi_query=True; a config that omits it has one kv head.
    a = architecture_from_hf({"model_type": "falcon", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    assert a.num_kv_heads == 1
    b = architecture_from_hf(
        {"model_type": "falcon", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "multi_query": False}
    )
    assert b.num_kv_heads == 4


def test_gpt2_names_and_fp32_default() -> None:
    a = architecture_from_hf({"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024})
    assert (a.num_layers, a.hidden_size, a.head_dim, a.dtype, a.max_position_embeddings) == (12, 768, 64, "fp32", 1024)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("bfloat16", "bf16"), ("float32", "fp32"), ("float16", "fp16"), ("torch.bfloat16", "bf16"),
     ("float8_e4m3fn", "fp8"), ("int8", "int8")],
)
def test_dtype_mapping(raw: str, expected: str) -> None:
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "torch_dtype": raw}
    assert architecture_from_hf(cfg).dtype == expected
    cfg2 = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "dtype": raw}
    assert architecture_from_hf(cfg2).dtype == expected


def test_unknown_dtype() -> None:
    with pytest.raises(BadInput, match=r"config.json: `torch_dtype` is 'float4'"):
        architecture_from_hf({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "torch_dtype": "float4"})


def test_fp8_quantized_weights() -> None:
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8"}}
    a = architecture_from_hf(cfg)
    assert (a.dtype, a.weight_dtype, a.stored_weight_dtype) == ("bf16", "fp8", "fp8")


def test_qwen2_window_layers_when_enabled() -> None:
    cfg = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
           "num_key_value_heads": 4, "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 20}
    a = architecture_from_hf(cfg)
    assert (a.sliding_window, a.sliding_window_layers) == (4096, 8)  # layers 20..27


def test_qwen3_style_disabled_window() -> None:
    cfg = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 4096, "use_sliding_window": False}
    assert architecture_from_hf(cfg).sliding_window is None


def test_sliding_window_pattern() -> None:
    # Gemma 3 1B: 26 layers, every 6th global -> 26 - 4 = 22 local layers.
    cfg = {"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152, "num_attention_heads": 4,
           "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512, "sliding_window_pattern": 6}
    a = architecture_from_hf(cfg)
    assert (a.sliding_window, a.sliding_window_layers, a.attention) == (512, 22, "mqa")


def test_layer_types_list_wins() -> None:
    cfg = {"model_type": "x", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
           "sliding_window": 512,
           "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}
    assert architecture_from_hf(cfg).sliding_window_layers == 3


def test_text_config_is_unwrapped() -> None:
    cfg = {"model_type": "gemma3", "torch_dtype": "bfloat16",
           "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 48, "hidden_size": 3840,
                           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256}}
    a = architecture_from_hf(cfg)
    assert (a.family, a.num_layers, a.dtype) == ("gemma3_text", 48, "bf16")


def test_inconsistent_heads_become_bad_input() -> None:
    with pytest.raises(BadInput) as err:
        architecture_from_hf(
            {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3},
            source="m/config.json",
        )
    msg = str(err.value)
    assert msg.startswith("m/config.json: ")
    assert "num_attention_heads (4) divisible by num_kv_heads (3)" in msg


def test_head_dim_underivable() -> None:
    with pytest.raises(BadInput, match="hidden size 100 is not divisible by 3 attention heads.*add `head_dim`"):
        architecture_from_hf({"num_hidden_layers": 2, "hidden_size": 100, "num_attention_heads": 3})


def test_mla_missing_rope_dim() -> None:
    with pytest.raises(BadInput, match="qk_rope_head_dim"):
        architecture_from_hf(
            {"model_type": "deepseek_v2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "kv_lora_rank": 32}
        )


def test_bool_is_not_a_count() -> None:
    with pytest.raises(BadInput, match="`num_attention_heads` must be a whole number, got True"):
        architecture_from_hf({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": True})


def test_unknown_model_without_fields() -> None:
    with pytest.raises(BadInput, match=r"missing `num_hidden_layers`.*is this a Hugging Face model config\?"):
        architecture_from_hf({"model_type": "mystery", "foo": 1})


# ---- mixed-layer families ----------------------------------------------------------------------

ARCH_DIR = Path(__file__).resolve().parents[2] / "examples" / "architectures"


def published(name: str) -> dict[str, Any]:
    return json.loads((ARCH_DIR / f"{name}.json").read_text())


def parsed(name: str) -> Architecture:
    return architecture_from_hf(published(name), source=f"{name}.json")


def test_gemma3_pattern_and_family_defaults() -> None:
    # google/gemma-3-27b-it's text_config states neither sliding_window_pattern nor
    # max_position_embeddings: Gemma3TextConfig's 6 and 131072 apply; every 6th layer is global.
    a = parsed("gemma-3-27b-it")
    assert (a.family, a.num_layers, a.sliding_window, a.max_position_embeddings) == ("gemma3_text", 62, 1024, 131072)
    assert [i for i, k in enumerate(a.kinds) if k == "full_attention"] == list(range(5, 62, 6))
    assert a.sliding_window_layers == 52 and a.attention_layers == 62


def test_llama4_chunked_layers_from_the_nope_interval() -> None:
    # Scout's no_rope_layers is empty: Llama4TextConfig derives a NoPE (global) layer every 4th.
    a = parsed("llama-4-scout-17b-16e-instruct")
    assert a.attention_chunk_size == 8192 and a.max_position_embeddings == 10485760
    assert [i for i, k in enumerate(a.kinds) if k == "full_attention"] == list(range(3, 48, 4))
    assert a.layer_count("chunked_attention") == 36 and a.sliding_window is None
    listed = {**published("llama-4-scout-17b-16e-instruct")["text_config"], "no_rope_layers": [1, 0] * 24}
    b = architecture_from_hf(listed)
    assert b.kinds[:4] == ("chunked_attention", "full_attention", "chunked_attention", "full_attention")
    other = {**listed, "no_rope_layers": [], "no_rope_layer_interval": 2}
    assert architecture_from_hf(other).layer_count("full_attention") == 24


def test_gpt_oss_layer_types_and_dtype() -> None:
    a = parsed("gpt-oss-20b")
    assert a.kinds[:2] == ("sliding_attention", "full_attention") and a.sliding_window == 128
    assert a.dtype == "bf16"  # no torch_dtype published; the attention tensors are bf16


def test_qwen3_and_qwen3_moe_are_all_full() -> None:
    for name, layers in (("qwen3-8b", 36), ("qwen3-30b-a3b", 48)):
        a = parsed(name)
        assert a.layer_types is None and a.sliding_window is None and a.attention_layers == layers


def test_qwen3_next_linear_attention_state() -> None:
    a = parsed("qwen3-next-80b-a3b-instruct")
    assert [i for i, k in enumerate(a.kinds) if k == "full_attention"] == list(range(3, 48, 4))
    assert a.state == GatedDeltaNetState(kind="gated_delta_net", num_k_heads=16, num_v_heads=32, head_k_dim=128,
                                         head_v_dim=128, conv_kernel=4)


def test_jamba_attention_period_and_mamba_state() -> None:
    a = parsed("jamba-1.5-mini")
    assert [i for i, k in enumerate(a.kinds) if k == "full_attention"] == [4, 12, 20, 28]
    assert a.state == Mamba1State(kind="mamba1", intermediate_size=2 * 4096, state_size=16, conv_kernel=4)
    # Its layers_block_type spelled out reads the same.
    spelled = {**published("jamba-1.5-mini"), "layers_block_type": ["attention" if i % 8 == 4 else "mamba"
                                                                    for i in range(32)]}
    assert architecture_from_hf(spelled).kinds == a.kinds


def test_nemotron_h_pattern_and_fp32_ssm_state() -> None:
    a = parsed("nemotron-h-8b-base-8k")
    assert (a.layer_count("full_attention"), a.layer_count("mamba"), a.layer_count("mlp")) == (4, 24, 24)
    assert a.state == Mamba2State(kind="mamba2", num_heads=128, head_dim=64, n_groups=8, state_size=128,
                                  conv_kernel=4, ssm_dtype="fp32")
    bf16 = architecture_from_hf({**published("nemotron-h-8b-base-8k"), "mamba_ssm_cache_dtype": "bfloat16"})
    assert bf16.state is not None and bf16.state.ssm_dtype == "bf16"
    # transformers' newer NemotronHConfig names the Mamba layers linear_attention.
    listed = {**published("nemotron-h-8b-base-8k")}
    pattern = listed.pop("hybrid_override_pattern")
    listed["layers_block_type"] = [{"M": "linear_attention", "*": "full_attention", "-": "mlp"}[c] for c in pattern]
    assert architecture_from_hf(listed).kinds == a.kinds


@pytest.mark.parametrize("name", ["gemma-3-27b-it", "llama-4-scout-17b-16e-instruct", "gpt-oss-20b",
                                  "qwen3-next-80b-a3b-instruct", "jamba-1.5-mini", "nemotron-h-8b-base-8k"])
def test_hybrid_round_trips_inline(name: str) -> None:
    # What the parser builds, a spec can write inline (and old inline specs need none of it).
    a = parsed(name)
    assert Architecture.model_validate(json.loads(a.model_dump_json())) == a


def test_inline_hybrid_spec() -> None:
    a = build(num_layers=4, layer_types=["mamba", "full_attention", "mlp", "mamba"],
              state={"kind": "mamba1", "intermediate_size": 128, "state_size": 16, "conv_kernel": 4})
    assert a.attention_layers == 1 and a.layer_count("mamba") == 2
    b = build(num_layers=2, layer_types=["chunked_attention", "full_attention"], attention_chunk_size=64)
    assert b.kinds == ("chunked_attention", "full_attention")


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (dict(layer_types=["full_attention"]), r"layer_types lists 1 layers but num_layers is 2"),
        (dict(layer_types=["sliding_attention", "full_attention"]), "but sliding_window is not"),
        (dict(layer_types=["full_attention"] * 2, sliding_window=64), "no layer of layer_types is sliding_attention"),
        (dict(layer_types=["chunked_attention", "full_attention"]), "attention_chunk_size is not set"),
        (dict(layer_types=["mamba", "full_attention"]), r"1 mamba layers but `state` is not set"),
        (dict(layer_types=["linear_attention", "full_attention"],
              state={"kind": "mamba2", "num_heads": 4, "head_dim": 4, "n_groups": 1, "state_size": 4, "conv_kernel": 4}),
         "state kind 'mamba2' sizes mamba layers"),
        (dict(attention_chunk_size=64), "attention_chunk_size is set but layer_types is not"),
        (dict(layer_types=["full_attention", "attention"]), "layer_types"),
    ],
)
def test_inline_layer_pattern_errors(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build(**over)


def _gpt_oss(**over: Any) -> dict[str, Any]:
    return {**published("gpt-oss-20b"), **over}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_gpt_oss(layer_types=["sliding_attention", "full_attention"] * 11),
         r"gpt-oss.json: `layer_types` lists 22 layers but `num_hidden_layers` is 24"),
        (_gpt_oss(layer_types=["sliding_attention", "global_attention"] * 12),
         r"`layer_types` has layer kind\(s\) 'global_attention' that tritongen cannot size"),
        (_gpt_oss(layer_types="sliding_attention"), r"`layer_types` must be a list of layer kinds"),
        ({**published("nemotron-h-8b-base-8k"), "hybrid_override_pattern": "M-M*"},
         r"`hybrid_override_pattern` must be one character per layer \(52"),
        ({**published("nemotron-h-8b-base-8k"), "hybrid_override_pattern": "X" * 52},
         r"`hybrid_override_pattern` must be one character"),
        ({k: v for k, v in published("jamba-1.5-mini").items() if k != "attn_layer_offset"},
         r"cannot tell Jamba's attention layers.*`attn_layer_offset` is None \(found: .*`attn_layer_period`.*`mamba_d_state`"),
        ({k: v for k, v in published("nemotron-h-8b-base-8k").items() if k != "ssm_state_size"},
         r"Mamba2 layers' state cannot be sized: missing `ssm_state_size` \(found: .*`mamba_num_heads`"),
        ({k: v for k, v in published("qwen3-next-80b-a3b-instruct").items() if k != "linear_key_head_dim"},
         r"missing `linear_key_head_dim`"),
    ],
)
def test_unreadable_layer_patterns_name_the_keys(config: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        architecture_from_hf(config, source="gpt-oss.json")


def test_recurrent_keys_without_a_pattern_are_refused() -> None:
    # A Falcon-H1-like config: Mamba keys, every layer hybrid, no per-layer list. Never "all attention".
    config = {"model_type": "falcon_h1", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_heads": 8}
    with pytest.raises(BadInput) as err:
        architecture_from_hf(config)
    msg = str(err.value)
    assert "`mamba_d_state`, `mamba_d_conv`, `mamba_expand`, `mamba_n_heads`" in msg
    assert "`layer_types`" in msg and "full attention" in msg


def test_chunk_without_a_rule_is_refused() -> None:
    config = {"model_type": "x", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "attention_chunk_size": 128}
    with pytest.raises(BadInput, match=r"`attention_chunk_size` is set but nothing says which layers are chunked"):
        architecture_from_hf(config)
