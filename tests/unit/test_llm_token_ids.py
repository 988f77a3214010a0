"""LLMs of token ids (tritongen/core/llm_token_ids.py): which configs are recognised by role, the
request built for them (ids, their length, the budget; numpy arrays and generate bodies), the ids
sent (a safe range, salted per request), the tokens counted from responses, and the sidecar's
reading of a token-id request on both wire paths (HTTP JSON and binary, generate, gRPC) and its price.

The configs are written from the shapes users serve (TensorRT-LLM's raw model's documented inputs;
a Hugging Face-style Python backend of the user's own), not copied from one sample model."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from sidecar import protocol, reading
from sidecar.cost import llm_cost
from tests.helpers import RAW_TRTLLM, config_tensors as tensors
from tritongen.client import TokenReader, numpy_inputs, response_tokens
from tritongen.core.llm_interface import UnknownInterface
from tritongen.core.llm_interface_config import interface_from_config
from tritongen.core.llm_token_ids import (
    TOKEN_ID_FIRST,
    TOKEN_ID_SPAN,
    ids_in,
    ids_of_text,
    prompt_ids,
    salted_ids,
)
from tritongen.core.prompts import prompt_of
from tritongen.core.sidecar_policy.kv_cost import KVCost

TEXT_AND_IDS = {  # a text model that also takes and returns ids: its STRING prompt by role wins
    "name": "both",
    "backend": "python",
    "max_batch_size": 0,
    "input": tensors("""
        prompt STRING [1]
        input_ids INT32 [-1] optional
        max_new_tokens INT32 [1] optional
    """),
    "output": tensors("""
        text_output STRING [-1]
        output_ids INT32 [-1]
    """),
}

HF_PYTHON = {  # a user's own Python backend around generate(): ids in, ids out, budget max_tokens
    "name": "hf_ids",
    "backend": "python",
    "max_batch_size": 0,
    "input": tensors("""
        prompt_token_ids INT64 [-1]
        max_tokens INT32 [1] optional
        stream BOOL [1] optional
    """),
    "output": tensors("""
        generated_ids INT64 [-1]
    """),
    "model_transaction_policy": {"decoupled": True},
}

KV = KVCost(bytes_per_token=512, bytes_per_token_source="analytic", block_tokens=16, max_context=256,
            default_max_tokens=16, prompt_input="input_ids", max_tokens_input="request_output_len",
            prompt_token_ids=True)
CLASS = "traffic_class"


# ------------------------------------------------------------------------------------------------
# detection


def test_tensorrt_llms_raw_model_is_recognised_by_its_roles() -> None:
    found = interface_from_config(RAW_TRTLLM)
    assert found.kind == "token_ids" and found.speaks_token_ids
    assert (found.text_input, found.prompt_datatype) == ("input_ids", "INT32")
    assert (found.prompt_length_input, found.prompt_length_datatype) == ("input_lengths", "INT32")
    assert (found.max_tokens_input, found.text_output, found.stream_input) == ("request_output_len", "output_ids", "streaming")
    assert found.batched and found.decoupled
    assert found.describe() == "TensorRT-LLM raw model (token ids) (input_ids, streaming, request_output_len)"


def test_a_python_backend_of_token_ids_is_recognised_with_the_generic_budget_name() -> None:
    found = interface_from_config(HF_PYTHON)
    assert found.kind == "token_ids" and found.prompt_datatype == "INT64" and not found.batched
    assert (found.text_input, found.max_tokens_input, found.text_output) == ("prompt_token_ids", "max_tokens", "generated_ids")
    assert found.prompt_length_input is None and found.stream_input == "stream"
    assert found.label == "token ids"  # not TensorRT-LLM for sharing one of its names: its backend says


def test_a_text_model_stays_text_even_with_token_id_tensors() -> None:
    found = interface_from_config(TEXT_AND_IDS)
    assert found.kind == "generic" and not found.speaks_token_ids
    assert (found.text_input, found.text_output, found.max_tokens_input) == ("prompt", "text_output", "max_new_tokens")


def test_token_ids_without_an_ids_output_are_one_line_naming_the_missing_output() -> None:
    config = {**HF_PYTHON, "output": tensors("logits FP32 [-1]")}
    with pytest.raises(UnknownInterface, match="takes token ids in prompt_token_ids but has no integer output") as err:
        interface_from_config(config)
    assert "\n" not in str(err.value) and "output_ids" in str(err.value)


def test_a_required_input_beside_the_ids_is_named() -> None:
    config = {**HF_PYTHON, "input": [*HF_PYTHON["input"], {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [-1]}]}
    with pytest.raises(UnknownInterface, match=r"cannot fill: attention_mask INT64 \[-1\]"):
        interface_from_config(config)


# ------------------------------------------------------------------------------------------------
# the request


def test_the_request_sends_the_ids_their_length_and_the_budget_with_a_batch_dimension() -> None:
    found = interface_from_config(RAW_TRTLLM)
    text = prompt_of(24, found.sizing_bytes_per_token(4.0), salt=7)
    assert len(text) == 24  # one character per token, whatever the text ratio
    arrays = numpy_inputs(found.request(text, 5))
    assert arrays["input_ids"].shape == (1, 24) and arrays["input_ids"].dtype == np.int32
    assert arrays["input_lengths"].tolist() == [[24]] and arrays["request_output_len"].tolist() == [[5]]
    assert arrays["streaming"].tolist() == [[True]]
    assert found.request_parameters(5) == {}


def test_without_a_batch_dimension_the_ids_are_one_row_and_given_ids_go_as_they_are() -> None:
    found = interface_from_config(HF_PYTHON)
    arrays = numpy_inputs(found.request([11, 12, 13], 2))
    assert arrays["prompt_token_ids"].shape == (3,) and arrays["prompt_token_ids"].dtype == np.int64
    assert arrays["prompt_token_ids"].tolist() == [11, 12, 13]
    with pytest.raises(ValueError, match="whole numbers of 0 or more"):
        found.request([1, -2], 2)
    with pytest.raises(ValueError, match="give the prompt as a string"):
        interface_from_config(TEXT_AND_IDS).request([1, 2], 2)


def test_the_generate_body_carries_the_ids_as_a_json_array() -> None:
    body = interface_from_config(RAW_TRTLLM).generate_body("abc", 4)
    assert body["input_ids"] == ids_of_text("abc") and body["input_lengths"] == 3
    assert body["request_output_len"] == 4 and body["streaming"] is True
    assert json.loads(json.dumps(body)) == body


def test_the_ids_sent_lie_in_the_safe_range_and_differ_per_request() -> None:
    ids = prompt_ids(prompt_of(300, 1.0, salt=12345))
    assert len(ids) == 300 and all(TOKEN_ID_FIRST <= i < TOKEN_ID_FIRST + TOKEN_ID_SPAN for i in ids)
    assert min(ids) > 2 and max(ids) < 1000
    a, b = salted_ids(ids, 1), salted_ids(ids, 2)
    assert len(a) == len(b) == 300 and a[:8] != b[:8] and a != ids
    assert all(TOKEN_ID_FIRST <= i < TOKEN_ID_FIRST + TOKEN_ID_SPAN for i in a + b)


def test_tokens_are_counted_from_the_ids_of_each_response() -> None:
    assert response_tokens(np.array([[7, 8, 9]], dtype=np.int32), token_ids=True) == 3
    assert response_tokens(np.array([b"some words"], dtype=np.object_), token_ids=False) == 1
    assert response_tokens(np.zeros((1, 0), dtype=np.int32), token_ids=True) == 0
    assert response_tokens(None, token_ids=True) == 0
    assert ids_in([[5, 6], [7]]) == 3 and ids_in(4) == 1 and ids_in(None) == 0


# ------------------------------------------------------------------------------------------------
# the sidecar's reading and price


def _facts(stated: reading.Stated) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    facts = reading.id_sequences(stated.prompt_ids, reading.budget(stated, KV.max_tokens_input))
    return tuple(facts.prompt_tokens or ()), tuple(facts.max_tokens)


def test_http_json_and_binary_infer_state_the_number_of_ids() -> None:
    doc = {"inputs": [
        {"name": "input_ids", "shape": [1, 5], "datatype": "INT32", "data": [[101, 102, 103, 104, 105]]},
        {"name": "input_lengths", "shape": [1, 1], "datatype": "INT32", "data": [[5]]},
        {"name": "request_output_len", "shape": [1, 1], "datatype": "INT32", "data": [[9]]},
    ]}
    assert _facts(protocol.infer_stated(protocol.parse_infer(json.dumps(doc).encode(), None), KV, CLASS)) == ((5,), (9,))

    ids, budget = struct.pack("<6q", *range(100, 106)), struct.pack("<2i", 3, 4)
    header = json.dumps({"inputs": [
        {"name": "input_ids", "shape": [2, 3], "datatype": "INT64", "parameters": {"binary_data_size": len(ids)}},
        {"name": "request_output_len", "shape": [2, 1], "datatype": "INT32", "parameters": {"binary_data_size": len(budget)}},
    ]}).encode()
    body = protocol.parse_infer(header + ids + budget, str(len(header)))
    assert _facts(protocol.infer_stated(body, KV, CLASS)) == ((3, 3), (3, 4))


def test_generate_states_a_json_array_of_ids() -> None:
    doc = protocol.parse_generate(json.dumps({"input_ids": [101, 102, 103, 104], "request_output_len": 6}).encode())
    stated = protocol.generate_stated(doc, KV, CLASS)
    assert stated.prompts == () and _facts(stated) == ((4,), (6,))


def test_grpc_states_the_ids_from_typed_and_raw_contents() -> None:
    typed = pb.ModelInferRequest(model_name="tensorrt_llm")
    typed.inputs.add(name="input_ids", datatype="INT32", shape=[1, 7]).contents.int_contents.extend(range(100, 107))
    typed.inputs.add(name="request_output_len", datatype="INT32", shape=[1, 1]).contents.int_contents.append(12)
    assert _facts(protocol.grpc_stated(typed, KV, CLASS)) == ((7,), (12,))

    raw = pb.ModelInferRequest(model_name="tensorrt_llm")
    raw.inputs.add(name="input_ids", datatype="INT64", shape=[1, 40])
    raw.inputs.add(name="request_output_len", datatype="INT32", shape=[1, 1])
    raw.raw_input_contents.append(struct.pack("<40q", *([150] * 40)))
    raw.raw_input_contents.append(struct.pack("<i", 20))
    assert _facts(protocol.grpc_stated(raw, KV, CLASS)) == ((40,), (20,))

    bad = pb.ModelInferRequest(model_name="tensorrt_llm")
    bad.inputs.add(name="input_ids", datatype="FP32", shape=[1, 2])
    bad.raw_input_contents.append(struct.pack("<2f", 1.0, 2.0))
    with pytest.raises(protocol.BadRequest, match="token ids are integers"):
        protocol.grpc_stated(bad, KV, CLASS)


def test_a_token_id_prompt_is_priced_by_its_ids_exactly() -> None:
    """40 ids + 20 tokens = 60 tokens, 4 blocks of 16: no bytes-per-token ratio anywhere."""
    cost = llm_cost(KV, reading.id_sequences((40,), (20,)))
    assert cost.prompt_tokens == 40 and cost.tokens == 60 and cost.kv_bytes == 4 * 16 * 512


def test_the_models_own_count_beats_one_token_a_response() -> None:
    """vLLM merges the tokens of several engine steps into one response when its backend falls behind;
    its `num_output_tokens` says how many each holds, and an empty text is still a token."""
    text = np.array([b" and then"], dtype=np.object_)
    assert response_tokens(text, token_ids=False, counted=np.array([3], dtype=np.uint32)) == 3
    assert response_tokens(np.array([b""], dtype=np.object_), token_ids=False) == 1
    assert response_tokens(None, token_ids=False, counted=np.array([2], dtype=np.uint32)) == 0  # an empty final
    reader = TokenReader("text_output", False, "num_output_tokens")
    assert reader.event_tokens({"text_output": " and then", "num_output_tokens": 3}) == 3
    assert reader.event_tokens({"text_output": ""}) == 1  # no count sent: one a response, as over gRPC
    assert reader.event_tokens({"model_name": "m"}) == 0  # the final response carries no output
    assert TokenReader("ids", True).event_tokens({"ids": [[5, 6]]}) == 2


def test_a_stream_load_reads_the_interfaces_count() -> None:
    from tritongen.core.llm_interface import detect_interface
    from tritongen.profiler.load import StreamLoad

    vllm = detect_interface(model="m", backend="vllm", platform=None, inputs=[], outputs=[], max_batch_size=0, decoupled=True)
    load = StreamLoad.of("127.0.0.1:1", "m", {}, vllm)
    assert load.reader == TokenReader("text_output", False, "num_output_tokens")
    assert load.prompt_input == "text_input" and StreamLoad.of("127.0.0.1:1", "m", {}, vllm, salted=False).prompt_input is None
