"""Architecture: inline validation and Hugging Face config.json parsing per family."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tritongen.core.architecture import Architecture, architecture_from_hf
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
