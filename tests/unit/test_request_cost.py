"""What a request costs, since those numbers are what admission decides by: the cost model
(sidecar/cost.py: KV blocks, hybrids, defaults, prefill peaks) and the facts read from requests
(sidecar/protocol.py: HTTP infer and generate bodies, gRPC requests, class and tenant).
"""

from __future__ import annotations

import json
import struct

import pytest

from sidecar import protocol
from sidecar.admission_types import Cost
from sidecar.cost import LLMFacts, cost_for, kv_bytes_for, llm_cost, prefill_peak_bytes, sequence_tokens
from tests.sidecar_rigs import policy_doc
from tritongen.core.sidecar_policy.kv_cost import CappedKV, KVCost, PrefillPoint
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy


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


# ------------------------------------------------------------------------------------------------
# reading requests


def bytes_tensor(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def test_http_infer_json_facts_and_priority_rewrite() -> None:
    doc = {"id": "r1", "inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [["héllo"]]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [[7]]},
    ], "parameters": {"traffic_class": "batch"}}
    body = protocol.parse_infer(json.dumps(doc).encode(), None)
    facts = protocol.infer_llm_facts(body, KV)
    assert list(facts.prompt_bytes) == [6] and list(facts.max_tokens) == [7]
    assert protocol.infer_class(body, "traffic_class") == "batch"
    out, length = protocol.infer_with_priority(body, 3)
    assert length is None
    rewritten = json.loads(out)
    assert rewritten["parameters"] == {"traffic_class": "batch", "priority": 3}
    assert rewritten["id"] == "r1" and rewritten["inputs"] == doc["inputs"]


def test_http_infer_binary_facts_and_rewrite_keep_tensor_bytes() -> None:
    text = bytes_tensor(b"abc", b"defgh")
    mt = struct.pack("<2i", 5, 9)
    header = json.dumps({"inputs": [
        {"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(text)}},
        {"name": "max_tokens", "shape": [2, 1], "datatype": "INT32", "parameters": {"binary_data_size": len(mt)}},
    ]}).encode()
    body = protocol.parse_infer(header + text + mt, str(len(header)))
    facts = protocol.infer_llm_facts(body, KV)
    assert list(facts.prompt_bytes) == [3, 5] and list(facts.max_tokens) == [5, 9]
    out, length = protocol.infer_with_priority(body, 1)
    assert length is not None and out[int(length):] == text + mt  # tensor bytes untouched
    assert json.loads(out[: int(length)])["parameters"]["priority"] == 1


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"{not json", None, "not valid"),
        (b"[1, 2]", None, "must be an object"),
        (b'{"inputs": 3}', None, "needs `inputs`"),
        (b'{"inputs": []}', "x", "is not a number"),
        (b'{"inputs": []}', "999", "outside the body"),
        (b'{"inputs": [{"name": "a", "parameters": {"binary_data_size": 10}}]}', None, "binary data"),
        (b'{"inputs": [], "parameters": 5}', None, "must be a JSON object"),
    ],
)
def test_http_infer_malformed(body: bytes, length: str | None, message: str) -> None:
    with pytest.raises(protocol.BadRequest, match=message):
        protocol.parse_infer(body, length)


def test_bytes_tensor_truncated_is_malformed() -> None:
    with pytest.raises(protocol.BadRequest, match="length prefix"):
        protocol.decode_bytes_elements(b"\x01\x00")
    with pytest.raises(protocol.BadRequest, match="runs past"):
        protocol.decode_bytes_elements(struct.pack("<I", 10) + b"abc")


def test_generate_facts_class_and_priority() -> None:
    doc = protocol.parse_generate(b'{"text_input": "hello", "max_tokens": 4, "parameters": {"traffic_class": "interactive"}}')
    facts = protocol.generate_llm_facts(doc, KV)
    assert list(facts.prompt_bytes) == [5] and list(facts.max_tokens) == [4]
    assert protocol.generate_class(doc, "traffic_class") == "interactive"
    assert json.loads(protocol.generate_with_priority(doc, 1))["parameters"]["priority"] == 1
    doc2 = protocol.parse_generate(b'{"text_input": "hi", "parameters": {"max_tokens": 9}}')
    assert list(protocol.generate_llm_facts(doc2, KV).max_tokens) == [9]
    doc3 = protocol.parse_generate(b'{"text_input": "hi", "sampling_parameters": "{\\"max_tokens\\": 11}"}')
    assert list(protocol.generate_llm_facts(doc3, KV).max_tokens) == [11]
    with pytest.raises(protocol.BadRequest, match="must hold integers"):
        protocol.generate_llm_facts(protocol.parse_generate(b'{"text_input": "x", "max_tokens": "many"}'), KV)
    with pytest.raises(protocol.BadRequest, match="must be a string"):
        protocol.generate_class(protocol.parse_generate(b'{"parameters": {"traffic_class": 3}}'), "traffic_class")


def test_grpc_facts_from_contents_and_raw() -> None:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="tinyllm")
    t = request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(b"hello!")
    m = request.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1])
    m.contents.int_contents.append(12)
    facts = protocol.grpc_llm_facts(request, KV)
    assert list(facts.prompt_bytes) == [6] and list(facts.max_tokens) == [12]

    raw = pb.ModelInferRequest(model_name="tinyllm")
    raw.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    raw.inputs.add(name="max_tokens", datatype="INT64", shape=[1, 1])
    raw.raw_input_contents.append(bytes_tensor(b"abcd"))
    raw.raw_input_contents.append(struct.pack("<q", 33))
    raw.parameters["traffic_class"].string_param = "batch"
    facts = protocol.grpc_llm_facts(raw, KV)
    assert list(facts.prompt_bytes) == [4] and list(facts.max_tokens) == [33]
    assert protocol.grpc_class(raw, "traffic_class") == "batch"
    protocol.grpc_set_priority(raw, 3)
    assert raw.parameters["priority"].uint64_param == 3
    raw.parameters["traffic_class"].int64_param = 1
    with pytest.raises(protocol.BadRequest, match="must be a string"):
        protocol.grpc_class(raw, "traffic_class")


def test_resolve_class() -> None:
    policy: SidecarPolicy = parse_policy(policy_doc())
    assert protocol.resolve_class(policy, None, None).name == "normal"
    assert protocol.resolve_class(policy, "batch", "interactive").name == "batch"  # the header wins
    assert protocol.resolve_class(policy, None, "interactive").name == "interactive"
    with pytest.raises(protocol.BadRequest, match="unknown traffic class 'vip'; known classes: interactive, normal, batch"):
        protocol.resolve_class(policy, "vip", None)


def test_resolve_tenant() -> None:
    assert protocol.resolve_tenant(None) == "default"
    assert protocol.resolve_tenant("  ") == "default"
    assert protocol.resolve_tenant(" acme-eu.1 ") == "acme-eu.1"
    for bad in ("a b", "-x", "x" * 129, "ten\u00e4nt", "a/b"):
        with pytest.raises(protocol.BadRequest, match="is not a tenant name"):
            protocol.resolve_tenant(bad)
