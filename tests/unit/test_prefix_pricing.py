"""The sidecar prices what an engine that reserves and reuses prefix blocks will really hold (issue
44): a prompt block that several requests in flight begin with is reserved once, while any of them
holds it (sidecar/prefix_blocks.py, cost.py, the ledger). Hand-worked cases: which blocks are
shared, what each request is charged, and when a shared block's bytes leave the pool."""

from __future__ import annotations

from sidecar import reading
from sidecar.admission_types import Action, Request
from sidecar.cost import LLMFacts, cost_for, llm_cost
from sidecar.prefix_blocks import block_keys
from tests.sidecar_rigs import admission_state, policy_doc
from tritongen.core.sidecar_policy.kv_cost import KVCost
from tritongen.core.sidecar_policy.schema import parse_policy

SYSTEM = b"S" * 160  # a system prompt of 160 bytes: 10 blocks of 16 tokens at 1 byte per token
CACHING = KVCost(bytes_per_token=10, bytes_per_token_source="analytic", block_tokens=16, max_context=1024,
                 kv_policy="reserve_wait", prefix_caching=True)


def test_blocks_are_keyed_by_everything_before_them_and_the_last_token_is_never_shared() -> None:
    a, b = block_keys(SYSTEM + b"question one", 172, 16), block_keys(SYSTEM + b"another question", 176, 16)
    assert len(a) == 10 and a == b  # (172 - 1) // 16 = 10 whole blocks, all in the system prompt
    assert block_keys(b"x" + SYSTEM[1:] + b"question one", 172, 16)[0] != a[0]  # a different start shares nothing
    assert block_keys(b"y" * 33, 33, 16) == block_keys(b"y" * 40, 40, 16)[:2]
    assert len(block_keys(b"z" * 32, 32, 16)) == 1  # the block holding the last token is computed again
    assert block_keys(b"", 0, 16) == () and block_keys(b"abc", 3, 16) == ()
    # at the prompt's own bytes per token (4 here): blocks of 64 bytes
    assert len(block_keys(b"w" * 400, 100, 16)) == 6


def test_a_request_is_charged_its_own_blocks_and_the_shared_ones_are_named() -> None:
    facts = reading.sequences([SYSTEM + b"question one"], (40,), None, CACHING)
    cost = llm_cost(CACHING, facts)
    # 172 + 40 = 212 tokens -> 14 blocks of 16 x 10 bytes; 10 of them shared
    assert cost.kv_bytes == (14 - 10) * 160 and len(cost.shared_keys) == 10 and cost.shared_block_bytes == 160
    plain = CACHING.model_copy(update={"prefix_caching": False})
    assert llm_cost(plain, reading.sequences([SYSTEM + b"question one"], (40,), None, plain)).kv_bytes == 14 * 160
    preempts = CACHING.model_copy(update={"kv_policy": "grow_preempt"})  # nothing reserved: nothing to share
    assert llm_cost(preempts, reading.sequences([SYSTEM + b"q"], (4,), None, preempts)).shared_keys == ()


def _state_and_requests(n: int):
    doc = policy_doc()
    doc["models"][0].update({"memory_quota_bytes": 4000, "max_inflight": 50,
                             "kv": CACHING.model_dump(mode="json", exclude_none=True)})
    state, _ = admission_state(models=doc["models"])
    model = parse_policy(doc).models[0]
    requests = [Request(f"chat-{i}", "llm", "normal",
                        cost_for(model, reading.sequences([SYSTEM + f"question {i:03d}".encode()], (40,), None, model.kv)))
                for i in range(n)]
    return state, requests


def test_requests_that_share_a_system_prompt_fit_where_their_whole_prompts_would_not() -> None:
    state, requests = _state_and_requests(6)
    # each: 14 blocks x 160 = 2,240 bytes whole; own 4 x 160 = 640, and the 10 shared blocks (1,600) once
    decisions = [state.submit(r) for r in requests]
    admitted = [d for d in decisions if d.action is Action.ADMIT]
    assert len(admitted) == 3  # 1,600 + 3 x 640 = 3,520 <= 4,000; a fourth would need 4,160
    assert decisions[3].action is Action.QUEUE and decisions[3].limit == "model_memory_quota:llm"
    assert state.reserved_scope("pool:llm") == 1600 + 3 * 640
    # without the sharing, one request of 2,240 bytes fits the 4,000-byte quota


def test_a_shared_block_leaves_the_pool_with_its_last_holder() -> None:
    state, requests = _state_and_requests(2)
    for r in requests:
        assert state.submit(r).admitted
    assert state.reserved_scope("pool:llm") == 1600 + 2 * 640
    state.release(requests[0].id)
    assert state.reserved_scope("pool:llm") == 1600 + 640  # the other still begins with the system prompt
    state.release(requests[1].id)
    assert state.reserved_scope("pool:llm") == 0


def test_prompts_of_one_request_that_share_blocks_hold_them_once() -> None:
    facts = LLMFacts(prompt_bytes=[172, 172], max_tokens=[40],
                     prefix_keys=[block_keys(SYSTEM + b"question one", 172, 16), block_keys(SYSTEM + b"question two", 172, 16)])
    cost = llm_cost(CACHING, facts)
    assert cost.kv_bytes == 2 * 4 * 160 and len(cost.shared_keys) == 10
