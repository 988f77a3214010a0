"""KV-cache arithmetic, checked against numbers worked out by hand from the published configs.
A config.json that cannot be read, and the `kv` command's output: test_kv_command.py."""

from __future__ import annotations

import pytest

from tests.helpers import ARCHITECTURES
from tritongen.core.architecture import Architecture
from tritongen.core.kv import (
    KVShape,
    kv_budget_bytes,
    kv_bytes_for_sequence,
    kv_footprint,
    kv_shape,
    kv_summary,
    max_batch_size_that_fits,
    max_concurrent_sequences,
    weight_bytes,
)
from tritongen.errors import BadInput, Infeasible
from tritongen.hfconfig import load_architecture

MIB = 1 << 20
GIB = 1 << 30


def arch(name: str) -> Architecture:
    return load_architecture(ARCHITECTURES / f"{name}.json")


# Every example file, at its native dtype (kv_dtype="auto"), arithmetic written out by hand.
# MHA/GQA/MQA: 2 (K and V) x layers x kv_heads x head_dim x bytes.  MLA: layers x (512 + 64) x bytes.
NATIVE = {
    "llama-2-7b": 2 * 32 * 32 * 128 * 2,  # fp16, MHA                       = 524288
    "llama-2-70b": 2 * 80 * 8 * 128 * 2,  # fp16, GQA 64q/8kv               = 327680
    "llama-3-8b": 2 * 32 * 8 * 128 * 2,  # bf16, GQA 32q/8kv               = 131072
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,  # bf16                          = 327680
    "mistral-7b-v0.1": 2 * 32 * 8 * 128 * 2,  # bf16 (window caps tokens, not bytes/token) = 131072
    "mixtral-8x7b": 2 * 32 * 8 * 128 * 2,  # bf16, experts do not touch KV  = 131072
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,  # bf16, head_dim 3584/28 = 128    = 57344
    "qwen2-72b": 2 * 80 * 8 * 128 * 2,  # bf16                              = 327680
    "gemma-7b": 2 * 28 * 16 * 256 * 2,  # bf16, explicit head_dim 256 (3072/16 would be 192) = 458752
    "gemma-2-9b": 2 * 42 * 8 * 256 * 4,  # float32 as published             = 688128
    "falcon-7b": 2 * 32 * 1 * 64 * 2,  # bf16, multi_query: 1 kv head, 4544/71 = 64 = 8192
    "falcon-40b": 2 * 60 * 8 * 64 * 2,  # bf16, new_decoder_architecture, num_kv_heads 8 = 122880
    "gpt2": 2 * 12 * 12 * 64 * 4,  # no torch_dtype -> fp32, 768/12 = 64  = 73728
    "pythia-1.4b": 2 * 24 * 16 * 128 * 2,  # fp16, 2048/16 = 128           = 196608
    "phi-2": 2 * 32 * 32 * 80 * 2,  # fp16, num_key_value_heads null -> MHA, 2560/32 = 80 = 327680
    "phi-3-mini": 2 * 32 * 32 * 96 * 2,  # bf16, 3072/32 = 96             = 393216
    "deepseek-v2-lite": 27 * (512 + 64) * 2,  # bf16 MLA latent, no K/V pair = 31104
    "deepseek-v3": 61 * (512 + 64) * 2,  # bf16 MLA latent                  = 70272
    "tinyllm": 2 * 2 * 2 * 16 * 4,  # fp32, 64/4 = 16                        = 512
    # Mixed-layer families: the attention layers only, per token below any window or chunk.
    "gemma-3-27b-it": 2 * 62 * 16 * 128 * 2,  # bf16, 10 full + 52 sliding      = 507904
    "llama-4-scout-17b-16e-instruct": 2 * 48 * 8 * 128 * 2,  # 12 full + 36 chunked = 196608
    "gpt-oss-20b": 2 * 24 * 8 * 64 * 2,  # no torch_dtype published: bf16 (see arch) = 49152
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,  # bf16, explicit head_dim 128         = 147456
    "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2,  # bf16 MoE: experts do not touch KV = 98304
    "qwen3-next-80b-a3b-instruct": 2 * 12 * 2 * 256 * 2,  # 12 of 48 layers attend = 24576
    "jamba-1.5-mini": 2 * 4 * 8 * 128 * 2,  # 4 of 32 layers attend (4096/32 = 128) = 16384
    "nemotron-h-8b-base-8k": 2 * 4 * 8 * 128 * 2,  # 4 of 52 layers attend   = 16384
}

# The same, with a 2-byte (fp16) cache for every model.
FP16 = {
    **{k: v for k, v in NATIVE.items() if k not in ("gemma-2-9b", "gpt2", "tinyllm")},
    "gemma-2-9b": 2 * 42 * 8 * 256 * 2,  # 344064
    "gpt2": 2 * 12 * 12 * 64 * 2,  # 36864
    "tinyllm": 2 * 2 * 2 * 16 * 2,  # 256
}


def test_every_example_file_is_covered() -> None:
    assert sorted(p.stem for p in ARCHITECTURES.glob("*.json")) == sorted(NATIVE)


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_native_kv_bytes_per_token(name: str) -> None:
    shape = kv_shape(arch(name))
    assert shape.kv_bytes_per_token == NATIVE[name]


@pytest.mark.parametrize("name", sorted(FP16))
def test_fp16_kv_bytes_per_token(name: str) -> None:
    shape = kv_shape(arch(name), kv_dtype="fp16")
    assert shape.kv_bytes_per_token == FP16[name]
    assert shape.kv_dtype == "fp16" and shape.kv_dtype_bytes == 2


def test_literal_values_of_the_hand_arithmetic() -> None:
    # Guard against a typo in the expressions above making both sides wrong together.
    assert NATIVE["llama-2-7b"] == 524288
    assert NATIVE["llama-3-8b"] == 131072
    assert NATIVE["qwen2.5-7b"] == 57344
    assert NATIVE["falcon-7b"] == 8192
    assert NATIVE["deepseek-v3"] == 70272
    assert NATIVE["deepseek-v2-lite"] == 31104
    assert NATIVE["gemma-2-9b"] == 688128


def test_shape_fields_for_gqa_and_mla() -> None:
    s = kv_shape(arch("llama-3-8b"))
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.kv_tensors, s.kv_dtype, s.kv_dtype_bytes) == (
        32, 8, 128, 2, "bf16", 2,
    )
    assert s.attention == "gqa" and s.latent_dim is None and s.tensor_parallel == 1
    m = kv_shape(arch("deepseek-v3"))
    assert (m.num_kv_heads, m.head_dim, m.kv_tensors, m.latent_dim, m.attention) == (1, 576, 1, 576, "mla")


# ---- tensor parallelism ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "heads_per_rank", "expected"),
    [
        (1, 8, 2 * 80 * 8 * 128 * 2),
        (2, 4, 2 * 80 * 4 * 128 * 2),
        (8, 1, 2 * 80 * 1 * 128 * 2),  # 40960: one kv head per rank
        (16, 1, 2 * 80 * 1 * 128 * 2),  # tp > kv heads: replicated, still one per rank
    ],
)
def test_tp_splits_kv_heads_llama_70b(tp: int, heads_per_rank: int, expected: int) -> None:
    s = kv_shape(arch("llama-3.1-70b"), tensor_parallel=tp)
    assert s.num_kv_heads == heads_per_rank
    assert s.kv_bytes_per_token == expected
    assert s.tensor_parallel == tp


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_mla_latent_is_not_split_by_tp(tp: int) -> None:
    assert kv_shape(arch("deepseek-v3"), tensor_parallel=tp).kv_bytes_per_token == 61 * 576 * 2


def test_tp_must_divide_attention_heads() -> None:
    with pytest.raises(BadInput) as err:
        kv_shape(arch("llama-3-8b"), tensor_parallel=3)
    assert "3" in str(err.value) and "32 attention heads" in str(err.value)


def test_tp_must_divide_or_replicate_kv_heads() -> None:
    # Qwen2.5-7B: 28 heads (7 divides them) but 4 kv heads cannot be replicated over 7 ranks.
    with pytest.raises(BadInput) as err:
        kv_shape(arch("qwen2.5-7b"), tensor_parallel=7)
    assert "7" in str(err.value) and "4 key/value heads" in str(err.value)


def test_tp_must_be_positive() -> None:
    with pytest.raises(BadInput):
        kv_shape(arch("llama-3-8b"), tensor_parallel=0)


# ---- KV dtype ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp8", "int8", "fp8_e4m3"])
def test_one_byte_kv(dtype: str) -> None:
    s = kv_shape(arch("llama-3-8b"), kv_dtype=dtype)
    assert s.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1  # 65536
    assert s.kv_dtype_bytes == 1
    assert kv_shape(arch("deepseek-v3"), kv_dtype=dtype).kv_bytes_per_token == 61 * 576 * 1  # 35136


def test_fp32_kv_and_auto_follows_model_dtype() -> None:
    assert kv_shape(arch("llama-3-8b"), kv_dtype="fp32").kv_bytes_per_token == 2 * 32 * 8 * 128 * 4
    assert kv_shape(arch("gpt2")).kv_dtype == "fp32"
    assert kv_shape(arch("llama-2-7b")).kv_dtype == "fp16"


def test_unknown_kv_dtype() -> None:
    with pytest.raises(BadInput, match="fp4"):
        kv_shape(arch("llama-3-8b"), kv_dtype="fp4")


def test_kvshape_rejects_inconsistent_totals() -> None:
    with pytest.raises(ValueError, match="must equal"):
        KVShape(
            kv_bytes_per_token=1, num_layers=2, num_kv_heads=2, head_dim=16, kv_tensors=2,
            kv_dtype="fp32", kv_dtype_bytes=4, tensor_parallel=1, attention="gqa",
        )


# ---- bytes per sequence (sliding windows) ------------------------------------------------------


def test_mistral_window_caps_long_sequences() -> None:
    a = arch("mistral-7b-v0.1")
    s = kv_shape(a)
    assert (a.sliding_window, a.sliding_window_layers) == (4096, 32)
    # All 32 layers keep at most 4096 tokens: 8192 tokens cost the same as 4096.
    assert kv_bytes_for_sequence(a, s, 8192) == 4096 * 131072  # 536870912, not 1073741824
    assert kv_bytes_for_sequence(a, s, 4096) == 4096 * 131072
    assert kv_bytes_for_sequence(a, s, 2048) == 2048 * 131072
    assert kv_bytes_for_sequence(a, s, 0) == 0


def test_mixtral_null_window_keeps_everything() -> None:
    a = arch("mixtral-8x7b")
    assert a.sliding_window is None
    assert kv_bytes_for_sequence(a, kv_shape(a), 8192) == 8192 * 131072


def test_gemma2_alternating_window() -> None:
    a = arch("gemma-2-9b")
    assert (a.sliding_window, a.sliding_window_layers) == (4096, 21)  # 42 layers, even ones local
    s = kv_shape(a, kv_dtype="bf16")
    per_layer_token = 2 * 8 * 256 * 2  # 8192 bytes per layer per token
    # 21 global layers keep 8192 tokens, 21 local layers keep 4096.
    expected = per_layer_token * (21 * 8192 + 21 * 4096)
    assert expected == 2_113_929_216
    assert kv_bytes_for_sequence(a, s, 8192) == expected
    # Below the window every layer keeps every token.
    assert kv_bytes_for_sequence(a, s, 1000) == 1000 * s.kv_bytes_per_token


def test_qwen2_window_ignored_unless_enabled() -> None:
    a = arch("qwen2.5-7b")
    assert a.sliding_window is None  # published 131072 but use_sliding_window is false
    assert kv_bytes_for_sequence(a, kv_shape(a), 32768) == 32768 * 57344


def test_sequence_bytes_reject_mismatched_shape() -> None:
    with pytest.raises(BadInput, match="layers"):
        kv_bytes_for_sequence(arch("llama-3-8b"), kv_shape(arch("tinyllm")), 10)


# ---- mixed-layer families: growing, capped and fixed parts, exact per sequence ----------------
#
# Per attention layer and token: 2 (K and V) x kv heads x head_dim x 2 bytes (bf16).
#   Gemma 3 27B: 2 x 16 x 128 x 2 = 8192 B; layers 5, 11, ..., 59 full (10), 52 sliding at 1024.
#   Llama 4 Scout: 2 x 8 x 128 x 2 = 4096 B; every 4th layer NoPE/full (12), 36 chunked at 8192.
#   GPT-OSS 20B: 2 x 8 x 64 x 2 = 2048 B; alternating, 12 full + 12 sliding at 128.
#   Qwen3 8B: 2 x 8 x 128 x 2 = 4096 B x 36 layers, all full; Qwen3-30B-A3B: 2 x 4 x 128 x 2 = 2048 x 48.
#   Qwen3-Next 80B: 2 x 2 x 256 x 2 = 2048 B on 12 full layers (every 4th); 36 Gated DeltaNet layers,
#     each conv (2 x 16 x 128 + 32 x 128 = 8192 channels) x 3 x 2 B = 49152 B
#     + recurrent 32 x 128 x 128 x 2 B = 1048576 B -> 36 x 1097728 = 39518208 B per sequence.
#   Jamba 1.5 Mini: 2 x 8 x 128 x 2 = 4096 B on layers 4, 12, 20, 28; 28 Mamba layers, d_inner
#     2 x 4096 = 8192: conv 8192 x 3 x 2 B = 49152 + SSM 8192 x 16 x 2 B = 262144 -> 28 x 311296 = 8716288 B.
#   Nemotron-H 8B: 2 x 8 x 128 x 2 = 4096 B on 4 layers ('*'); 24 Mamba2 layers ('M'), 24 MLP ('-'):
#     conv (128 x 64 + 2 x 8 x 128 = 10240) x 3 x 2 B = 61440 + SSM 128 x 64 x 128 x 4 B (fp32) = 4194304
#     -> 24 x 4255744 = 102137856 B per sequence.
HYBRID = {
    "gemma-3-27b-it": dict(
        growing=10 * 8192, capped=[("sliding_attention", 52, 1024, 52 * 8192)], state=0,
        per_sequence={
            512: 512 * 62 * 8192,  # below the window: every layer holds every token = 260046848
            8192: 8192 * 10 * 8192 + 1024 * 52 * 8192,  # = 671088640 + 436207616 = 1107296256
            131072: 131072 * 10 * 8192 + 1024 * 52 * 8192,  # max_position_embeddings (family default) = 11173625856
        },
    ),
    "llama-4-scout-17b-16e-instruct": dict(
        growing=12 * 4096, capped=[("chunked_attention", 36, 8192, 36 * 4096)], state=0,
        per_sequence={
            4096: 4096 * 48 * 4096,  # within one chunk = 805306368
            32768: 32768 * 12 * 4096 + 8192 * 36 * 4096,  # = 1610612736 + 1207959552 = 2818572288
            10485760: 10485760 * 12 * 4096 + 8192 * 36 * 4096,  # max: 515396075520 + 1207959552
        },
    ),
    "gpt-oss-20b": dict(
        growing=12 * 2048, capped=[("sliding_attention", 12, 128, 12 * 2048)], state=0,
        per_sequence={
            100: 100 * 24 * 2048,  # below the 128-token window = 4915200
            4096: 4096 * 12 * 2048 + 128 * 12 * 2048,  # = 100663296 + 3145728 = 103809024
            131072: 131072 * 12 * 2048 + 128 * 12 * 2048,  # max = 3224371200
        },
    ),
    "qwen3-8b": dict(
        growing=36 * 4096, capped=[], state=0,
        per_sequence={1024: 1024 * 147456, 32768: 32768 * 147456, 40960: 40960 * 147456},  # no window at all
    ),
    "qwen3-30b-a3b": dict(
        growing=48 * 2048, capped=[], state=0,
        per_sequence={1024: 1024 * 98304, 32768: 32768 * 98304, 40960: 40960 * 98304},
    ),
    "qwen3-next-80b-a3b-instruct": dict(
        growing=12 * 2048, capped=[], state=36 * (8192 * 3 * 2 + 32 * 128 * 128 * 2),
        per_sequence={
            1024: 1024 * 24576 + 39518208,  # the state outweighs the short sequence: 64684032
            32768: 32768 * 24576 + 39518208,  # = 844824576
            262144: 262144 * 24576 + 39518208,  # max = 6481969152
        },
    ),
    "jamba-1.5-mini": dict(
        growing=4 * 4096, capped=[], state=28 * (8192 * 3 * 2 + 8192 * 16 * 2),
        per_sequence={
            1024: 1024 * 16384 + 8716288,  # = 25493504
            65536: 65536 * 16384 + 8716288,  # = 1082458112
            262144: 262144 * 16384 + 8716288,  # max = 4303683584
        },
    ),
    "nemotron-h-8b-base-8k": dict(
        growing=4 * 4096, capped=[], state=24 * (10240 * 3 * 2 + 128 * 64 * 128 * 4),
        per_sequence={
            512: 512 * 16384 + 102137856,  # = 110526464
            4096: 4096 * 16384 + 102137856,  # = 169246720
            8192: 8192 * 16384 + 102137856,  # max = 236355584
        },
    ),
}


def test_literal_values_of_the_hybrid_arithmetic() -> None:
    assert HYBRID["gemma-3-27b-it"]["per_sequence"][8192] == 1_107_296_256
    assert HYBRID["llama-4-scout-17b-16e-instruct"]["per_sequence"][32768] == 2_818_572_288
    assert HYBRID["gpt-oss-20b"]["per_sequence"][4096] == 103_809_024
    assert HYBRID["qwen3-next-80b-a3b-instruct"]["state"] == 39_518_208
    assert HYBRID["jamba-1.5-mini"]["state"] == 8_716_288
    assert HYBRID["nemotron-h-8b-base-8k"]["state"] == 102_137_856
    assert HYBRID["nemotron-h-8b-base-8k"]["per_sequence"][8192] == 236_355_584


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_hybrid_summary_by_hand(name: str) -> None:
    a = arch(name)
    want = HYBRID[name]
    shape = kv_shape(a)
    lengths = sorted(want["per_sequence"])
    assert lengths[-1] == a.max_position_embeddings  # the longest case is the model's own maximum
    for tokens in lengths:
        out = kv_summary(a, shape, tokens)
        assert out["growing_bytes_per_token"] == want["growing"]
        assert [(c["kind"], c["layers"], c["cap_tokens"], c["bytes_per_token"]) for c in out["capped"]] == want["capped"]
        assert out["state_bytes_per_sequence"] == want["state"]
        assert out["kv_bytes_per_sequence"] == want["per_sequence"][tokens]
        assert kv_bytes_for_sequence(a, shape, tokens) == want["per_sequence"][tokens]


def test_summary_of_a_classic_model_is_uniform() -> None:
    a = arch("llama-3-8b")
    out = kv_summary(a, kv_shape(a), 1000)
    assert out["capped"] == [] and out["state_bytes_per_sequence"] == 0 and "state" not in out
    assert out["growing_bytes_per_token"] == out["kv_bytes_per_token"] == out["all_full_bytes_per_token"] == 131072
    assert out["kv_bytes_per_sequence"] == 1000 * 131072
    assert kv_footprint(a, kv_shape(a)).uniform


def test_state_layers_and_all_full_comparison() -> None:
    a = arch("nemotron-h-8b-base-8k")
    out = kv_summary(a, kv_shape(a))
    assert out["layers"] == {"mamba": 24, "mlp": 24, "full_attention": 4}
    assert out["state"] == {"kind": "mamba2", "layers": 24, "conv_bytes_per_layer": 61440,
                            "ssm_bytes_per_layer": 4194304}
    # Read as 52 full-attention layers, a token would cost 52 x 4096 = 212992 B.
    assert out["all_full_bytes_per_token"] == 52 * 4096
    assert kv_bytes_for_sequence(a, kv_shape(a), 0) == 0  # an empty sequence holds no state yet


def test_kv_dtype_shrinks_attention_not_state() -> None:
    # vLLM's kv_cache_dtype is the attention layers'; the Mamba state keeps mamba_cache_dtype (auto).
    a = arch("jamba-1.5-mini")
    fp8 = kv_summary(a, kv_shape(a, kv_dtype="fp8"), 1024)
    assert fp8["growing_bytes_per_token"] == 4 * 2 * 8 * 128 * 1  # 8192
    assert fp8["state_bytes_per_sequence"] == 8_716_288
    assert fp8["kv_bytes_per_sequence"] == 1024 * 8192 + 8_716_288


@pytest.mark.parametrize(
    ("tp", "attention", "conv", "ssm"),
    [
        # tp 2: 4 kv heads a rank; n_groups 8 split: conv 10240 / 2 x 3 x 2 B; SSM 64 heads x 64 x 128 x 4 B.
        (2, 4 * 2 * 4 * 128 * 2, 10240 // 2 * 3 * 2, 64 * 64 * 128 * 4),
        # tp 16: 8 kv heads replicated to 1 a rank; 8 groups do not split over 16 ranks, so vLLM extends
        # them to 16: conv (8192 + 2 x 16 x 128) / 16 = 768 x 3 x 2 B; SSM 8 heads x 64 x 128 x 4 B.
        (16, 4 * 2 * 1 * 128 * 2, 768 * 3 * 2, 8 * 64 * 128 * 4),
    ],
)
def test_tp_splits_mamba2_state_as_vllm_does(tp: int, attention: int, conv: int, ssm: int) -> None:
    a = arch("nemotron-h-8b-base-8k")
    out = kv_summary(a, kv_shape(a, tensor_parallel=tp), 100)
    assert out["growing_bytes_per_token"] == attention
    assert out["state"]["conv_bytes_per_layer"] == conv and out["state"]["ssm_bytes_per_layer"] == ssm
    assert out["kv_bytes_per_sequence"] == 100 * attention + 24 * (conv + ssm)


def test_tp_must_divide_the_state() -> None:
    # Qwen3-Next at tp 16: 2 kv heads replicated to 1 a rank, 8192 conv channels / 16, 32 value heads / 16.
    a = arch("qwen3-next-80b-a3b-instruct")
    out = kv_summary(a, kv_shape(a, tensor_parallel=16))
    assert out["growing_bytes_per_token"] == 12 * 2 * 1 * 256 * 2
    assert out["state_bytes_per_sequence"] == 36 * (8192 // 16 * 3 * 2 + 2 * 128 * 128 * 2)
    # 24 value heads cannot be split over 16 ranks (vLLM's divide() refuses it too).
    data = a.model_dump()
    data["state"] = {**data["state"], "num_v_heads": 24}
    odd = type(a).model_validate(data)
    with pytest.raises(BadInput, match="tensor parallel size 16 does not divide the 24 linear-attention value heads"):
        kv_footprint(odd, kv_shape(odd, tensor_parallel=16))


def test_hybrid_concurrency_beats_the_all_full_arithmetic() -> None:
    # 40 GiB of KV at 32768 tokens on Llama 4 Scout: 2818572288 B a sequence -> 15 fit; read as 48
    # full layers (196608 B/token x 32768 = 6 GiB) only 6 would.
    a = arch("llama-4-scout-17b-16e-instruct")
    assert max_concurrent_sequences(40 * GIB, a, kv_shape(a), 32768) == 40 * GIB // 2_818_572_288 == 15
    assert 40 * GIB // (32768 * 196608) == 6


# ---- weights and budget ------------------------------------------------------------------------


def test_weight_bytes() -> None:
    assert weight_bytes(7_000_000_000, "bf16") == 14_000_000_000
    assert weight_bytes(7_000_000_000, "fp8") == 7_000_000_000
    assert weight_bytes(124_000_000, "fp32") == 496_000_000
    with pytest.raises(BadInput, match="int4"):
        weight_bytes(1, "int4")


def test_budget_arithmetic() -> None:
    # 80 GiB x 0.9 = 72 GiB; minus 16 weights, 2 reserve, 1 pad = 53 GiB.
    assert kv_budget_bytes(80 * GIB, 0.9, 16 * GIB, 2 * GIB, 1 * GIB) == 53 * GIB


def test_budget_infeasible_says_how_short() -> None:
    # 16384 MiB x 0.5 = 8192 MiB; 8192 - 8000 - 200 - 100 = -108 MiB.
    with pytest.raises(Infeasible) as err:
        kv_budget_bytes(16384 * MIB, 0.5, 8000 * MIB, 200 * MIB, 100 * MIB)
    msg = str(err.value)
    assert "short by 108.0 MiB" in msg
    for term in ("device 16,384.0 MiB", "cap 0.5", "weights 8,000.0 MiB", "reserve 200.0 MiB", "pad 100.0 MiB"):
        assert term in msg


def test_budget_rejects_bad_cap() -> None:
    with pytest.raises(BadInput, match="utilization cap"):
        kv_budget_bytes(GIB, 1.5, 0, 0, 0)


def test_concurrency_and_batch_size() -> None:
    a = arch("llama-2-7b")
    s = kv_shape(a)
    # One 4096-token sequence: 4096 x 524288 = 2 GiB; 53 GiB holds 26 of them.
    assert max_concurrent_sequences(53 * GIB, a, s, 4096) == 26
    assert max_batch_size_that_fits(53 * GIB, a, s, 4096) == 26
    assert max_batch_size_that_fits(53 * GIB, a, s, 4096, upper=16) == 16
    assert max_batch_size_that_fits(53 * GIB, a, s, 1024, upper=64) == 64  # 106 fit, capped


def test_batch_infeasible_for_one_sequence() -> None:
    a = arch("llama-2-7b")
    with pytest.raises(Infeasible) as err:
        max_batch_size_that_fits(1 * GIB, a, kv_shape(a), 4096)
    msg = str(err.value)
    assert "1,024.0 MiB short of one sequence at 4096 tokens" in msg  # needs 2048 MiB, has 1024
    assert "shorter context" in msg and "fp8" in msg and "tensor parallelism" in msg and "pad" in msg


def test_batch_infeasible_below_lower_bound() -> None:
    a = arch("llama-2-7b")
    with pytest.raises(Infeasible) as err:
        max_batch_size_that_fits(5 * GIB, a, kv_shape(a), 4096, lower=4)  # 2 fit, 4 needed: 8 - 5 GiB
    assert "3,072.0 MiB short of 4 sequences" in str(err.value)


def test_batch_infeasible_hints_fit_the_model() -> None:
    a = arch("deepseek-v3")
    with pytest.raises(Infeasible) as err:
        max_batch_size_that_fits(MIB, a, kv_shape(a, kv_dtype="fp8"), 163840)
    msg = str(err.value)
    assert "fp8 KV" not in msg  # already one byte
    assert "MLA latent is not split" in msg
