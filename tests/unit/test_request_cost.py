"""What a request costs, since those numbers are what admission decides by: the cost model
(sidecar/cost.py: KV blocks, hybrids, defaults, prefill peaks). What is read from requests is
tests/unit/test_request_reading.py's, the same reading on every path tests/unit/test_request_table.py's.
"""

from __future__ import annotations

import pytest

from sidecar.admission_types import Cost
from sidecar.cost import LLMFacts, cost_for, kv_bytes_for, llm_cost, prefill_peak_bytes, sequence_tokens
from tests.sidecar_rigs import policy_doc
from tritongen.core.sidecar_policy.kv_cost import CappedKV, KVCost, PrefillPoint
from tritongen.core.sidecar_policy.schema import parse_policy


# ------------------------------------------------------------------------------------------------
# the cost model


KV = KVCost(bytes_per_token=512, bytes_per_token_source="analytic", block_tokens=16, max_context=256,
            default_max_tokens=16)


def test_llm_cost_rounds_to_blocks() -> None:
    cost = llm_cost(KV, LLMFacts(prompt_bytes=[20], max_tokens=[40]))
    assert cost.tokens == 60 and cost.prompt_tokens == 20
    assert cost.kv_bytes == 4 * 16 * 512  # ceil(60 / 16) = 4 blocks
    assert cost.prefill_bytes == 0 and cost.sequences == 1
    assert kv_bytes_for(KV, 64) == 4 * 16 * 512 and kv_bytes_for(KV, 65) == 5 * 16 * 512


def test_llm_cost_of_a_hybrid_is_its_footprint_at_its_own_length() -> None:
    # 10 B/token on the growing layers, 5 B/token on layers capped at 32 tokens, 1000 B of state.
    hybrid = KV.model_copy(update={"bytes_per_token": 10.0, "state_bytes": 1000,
                                   "capped": [CappedKV(cap_tokens=32, bytes_per_token=5.0)]})
    # 20 + 40 = 60 tokens -> 4 blocks of 16 = 64: 10 x 64 + 5 x min(64, 32) + 1000 = 1800
    assert llm_cost(hybrid, LLMFacts(prompt_bytes=[20], max_tokens=[40])).kv_bytes == 640 + 160 + 1000 == 1800
    # 1 token still holds one block and the whole state: 10 x 16 + 5 x 16 + 1000
    assert kv_bytes_for(hybrid, 1) == 1240 and kv_bytes_for(hybrid, 0) == 0
    # A policy written before hybrids (no capped, no state) charges bytes per token x length as before.
    assert KV.capped == [] and KV.state_bytes == 0 and kv_bytes_for(KV, 64) == 64 * 512
    with pytest.raises(ValueError, match="a sequence would cost nothing"):
        KVCost(bytes_per_token=0, bytes_per_token_source="analytic", max_context=16)


def test_llm_cost_defaults_and_clamps() -> None:
    assert sequence_tokens(KV, 10, None) == (10, 26)  # default_max_tokens 16
    assert sequence_tokens(KV, 250, 100) == (250, 256)  # clamped to max_context
    assert sequence_tokens(KV, None, 5) == (256, 256)  # unknown prompt: the worst case
    no_default = KV.model_copy(update={"default_max_tokens": None})
    assert sequence_tokens(no_default, 56, None) == (56, 256)
    bpe = KV.model_copy(update={"prompt_bytes_per_token": 4.0})
    assert sequence_tokens(bpe, 40, 0) == (10, 10)


def test_llm_cost_of_a_batch_adds_sequences() -> None:
    cost = llm_cost(KV, LLMFacts(prompt_bytes=[16, 32], max_tokens=[16]))
    assert cost.sequences == 2 and cost.tokens == 32 + 48
    assert cost.prompt_lengths == (16, 32)
    assert cost.kv_bytes == (2 + 3) * 16 * 512
    with pytest.raises(ValueError, match="2 prompts but 3 max_tokens"):
        LLMFacts(prompt_bytes=[1, 2], max_tokens=[1, 2, 3])


def test_prompt_lengths_are_the_stated_prompts_in_tokens() -> None:
    bpe = KV.model_copy(update={"prompt_bytes_per_token": 4.0})
    assert llm_cost(bpe, LLMFacts(prompt_bytes=[40, 1], max_tokens=[0])).prompt_lengths == (10, 1)
    assert llm_cost(KV, LLMFacts(prompt_bytes=[9999], max_tokens=[])).prompt_lengths == (256,)  # clamped
    unknown = llm_cost(KV, LLMFacts(prompt_bytes=[None, 8], max_tokens=[]))
    assert unknown.prompt_lengths == (8,) and unknown.prompt_tokens == 256 + 8  # charged, not measured


def test_prefill_peak_interpolation() -> None:
    points = [PrefillPoint(prompt_tokens=16, peak_bytes=1000), PrefillPoint(prompt_tokens=64, peak_bytes=5000)]
    assert prefill_peak_bytes(points, 0) == 0
    assert prefill_peak_bytes(points, 8) == 1000  # below the first point: its peak
    assert prefill_peak_bytes(points, 40) == 3000  # linear in between
    assert prefill_peak_bytes(points, 128) == 20000  # above: grows with the square
    assert prefill_peak_bytes([], 100) == 0
    kv = KV.model_copy(update={"prefill_peak": points})
    assert llm_cost(kv, LLMFacts([64], [1])).prefill_bytes == 5000


def test_cost_for_classic_and_llm_without_facts() -> None:
    policy = parse_policy(policy_doc())
    assert cost_for(policy.model_named("cls"), None) == Cost(request_bytes=100)  # type: ignore[arg-type]
    llm = cost_for(policy.model_named("llm"), None)  # type: ignore[arg-type]
    assert llm.kv_bytes == 100 * 10 and llm.tokens == 100  # a full context
