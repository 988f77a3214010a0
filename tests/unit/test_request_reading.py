"""The one reader of a request (sidecar/reading.py) and each path's wire parsing (sidecar/protocol.py):
what a request states over HTTP (JSON and binary infer, generate) and gRPC (typed and raw contents),
the rules that turn it into a reading (class, tenant, priority, prompt, budget), and the priority rule
that nginx's lane must agree with. The same request over every path: tests/unit/test_request_table.py."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from sidecar import protocol, reading
from sidecar.nginx_front import FrontAddresses, NginxInstall, render_config
from sidecar.reading import BadRequest, Stated
from tests.sidecar_rigs import policy_doc
from tritongen.core.sidecar_policy.kv_cost import KVCost
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy
from tritongen.core.sidecar_policy.sections import ClassPolicy, ModelPolicy

KV = KVCost(bytes_per_token=512, bytes_per_token_source="analytic", block_tokens=16, max_context=256,
            default_max_tokens=16)
CLASS = "traffic_class"


def bytes_tensor(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def facts(stated: Stated) -> tuple[list[int | None], tuple[int | None, ...]]:
    """(prompt bytes, budget) the reader takes from what a request stated."""
    seqs = reading.sequences(stated.prompts, reading.budget(stated, KV.max_tokens_input), None)
    return list(seqs.prompt_bytes), tuple(seqs.max_tokens)


# ------------------------------------------------------------------------------------------------
# the wire: what each form states


def test_http_infer_json_states_and_the_priority_rewrite() -> None:
    doc = {"id": "r1", "inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [["héllo"]]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [[7]]},
    ], "parameters": {"traffic_class": "batch"}}
    body = protocol.parse_infer(json.dumps(doc).encode(), None)
    stated = protocol.infer_stated(body, KV, CLASS)
    assert facts(stated) == ([6], (7,)) and stated.class_parameter == "batch" and not stated.names_priority
    out, length = protocol.infer_with_priority(body, 3)
    assert length is None
    rewritten = json.loads(out)
    assert rewritten["parameters"] == {"traffic_class": "batch", "priority": 3}
    assert rewritten["id"] == "r1" and rewritten["inputs"] == doc["inputs"]
    assert protocol.infer_stated(body, None, CLASS) == Stated(class_parameter="batch")  # classic: no tensor read


def test_http_infer_binary_states_every_tensor_and_the_rewrite_keeps_their_bytes() -> None:
    text = bytes_tensor(b"abc", b"defgh")
    mt = struct.pack("<2i", 5, 9)
    header = json.dumps({"inputs": [
        {"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(text)}},
        {"name": "max_tokens", "shape": [2, 1], "datatype": "INT32", "parameters": {"binary_data_size": len(mt)}},
    ]}).encode()
    body = protocol.parse_infer(header + text + mt, str(len(header)))
    assert facts(protocol.infer_stated(body, KV, CLASS)) == ([3, 5], (5, 9))
    out, length = protocol.infer_with_priority(body, 1)
    assert length is not None and out[int(length):] == text + mt  # tensor bytes untouched
    assert json.loads(out[: int(length)])["parameters"]["priority"] == 1


def test_http_infer_reads_a_binary_sampling_parameters_tensor_as_grpc_does() -> None:
    """Issue 45: HTTP infer ignored it, so the same request cost the default over HTTP and 40 over gRPC."""
    text, sampling = bytes_tensor(b"hello"), bytes_tensor(b'{"max_tokens": 40, "temperature": 0}')
    header = json.dumps({"inputs": [
        {"name": "text_input", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(text)}},
        {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(sampling)}},
    ], "parameters": {"max_tokens": 3}}).encode()
    body = protocol.parse_infer(header + text + sampling, str(len(header)))
    assert facts(protocol.infer_stated(body, KV, CLASS)) == ([5], (40,))


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
    with pytest.raises(BadRequest, match=message):
        protocol.parse_infer(body, length)


def test_tensor_data_that_cannot_be_read_is_malformed() -> None:
    with pytest.raises(BadRequest, match="length prefix"):
        protocol.decode_bytes_elements(b"\x01\x00")
    with pytest.raises(BadRequest, match="runs past"):
        protocol.decode_bytes_elements(struct.pack("<I", 10) + b"abc")
    with pytest.raises(BadRequest, match="not a whole number of elements"):
        protocol.decode_elements(b"\x01\x00\x00", "INT32", "max_tokens")
    with pytest.raises(BadRequest, match="input 'max_tokens' has datatype BOOL; a number is expected"):
        protocol.decode_elements(b"\x01", "BOOL", "max_tokens")
    assert protocol.decode_elements(struct.pack("<2f", 4.0, 4.5), "FP32", "max_tokens") == [4.0, 4.5]


def test_generate_states_class_priority_and_every_budget_source() -> None:
    doc = protocol.parse_generate(
        b'{"text_input": "hello", "max_tokens": 4, "parameters": {"traffic_class": "interactive"}}')
    stated = protocol.generate_stated(doc, KV, CLASS)
    assert facts(stated) == ([5], (4,)) and stated.class_parameter == "interactive"
    assert json.loads(protocol.with_priority(doc, 1))["parameters"]["priority"] == 1
    params = protocol.generate_stated(protocol.parse_generate(b'{"text_input": "hi", "parameters": {"max_tokens": 9}}'),
                                      KV, CLASS)
    assert facts(params) == ([2], (9,))
    for sampling in (b'"{\\"max_tokens\\": 11}"', b'{"max_tokens": 11}'):  # a JSON string, or an object
        doc = protocol.parse_generate(b'{"text_input": "hi", "sampling_parameters": %s}' % sampling)
        assert facts(protocol.generate_stated(doc, KV, CLASS)) == ([2], (11,))
    with pytest.raises(BadRequest, match="must be a string"):
        protocol.generate_stated(protocol.parse_generate(b'{"parameters": {"traffic_class": 3}}'), KV, CLASS)
    assert protocol.generate_stated(protocol.parse_generate(b'{"parameters": {"priority": 1}}'), None, CLASS) == \
        Stated(names_priority=True)


def test_grpc_states_from_typed_and_raw_contents() -> None:
    request = pb.ModelInferRequest(model_name="tinyllm")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(b"hello!")
    request.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1]).contents.int_contents.append(12)
    assert facts(protocol.grpc_stated(request, KV, CLASS)) == ([6], (12,))

    raw = pb.ModelInferRequest(model_name="tinyllm")
    raw.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    raw.inputs.add(name="max_tokens", datatype="INT64", shape=[1, 1])
    raw.raw_input_contents.append(bytes_tensor(b"abcd"))
    raw.raw_input_contents.append(struct.pack("<q", 33))
    raw.parameters["traffic_class"].string_param = "batch"
    stated = protocol.grpc_stated(raw, KV, CLASS)
    assert facts(stated) == ([4], (33,)) and stated.class_parameter == "batch"
    protocol.grpc_set_priority(raw, 3)
    assert raw.parameters["priority"].uint64_param == 3 and protocol.grpc_stated(raw, None, CLASS).names_priority
    raw.parameters["traffic_class"].int64_param = 1
    with pytest.raises(BadRequest, match="must be a string"):
        protocol.grpc_stated(raw, KV, CLASS)

    short = pb.ModelInferRequest(model_name="tinyllm")
    short.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    short.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    short.raw_input_contents.append(bytes_tensor(b"abcd"))
    with pytest.raises(BadRequest, match="raw_input_contents has no entry for input 'max_tokens'"):
        protocol.grpc_stated(short, KV, CLASS)


def test_grpc_request_parameters_of_every_kind_state_the_budget() -> None:
    """gRPC took only int64 and uint64 max_tokens parameters; HTTP took numeric strings too."""
    for kind, value in (("int64_param", 21), ("uint64_param", 21), ("string_param", "21"), ("double_param", 21.0)):
        request = pb.ModelInferRequest(model_name="tinyllm")
        request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
        setattr(request.parameters["max_tokens"], kind, value)
        assert facts(protocol.grpc_stated(request, KV, CLASS)) == ([2], (21,)), kind
    request.parameters["max_tokens"].bool_param = True
    with pytest.raises(BadRequest, match="parameter 'max_tokens' must hold integers"):
        facts(protocol.grpc_stated(request, KV, CLASS))


# ------------------------------------------------------------------------------------------------
# the rules


@pytest.mark.parametrize(("value", "count"), [
    (0, 0), (7, 7), (7.0, 7), ("12", 12), (" 12 ", 12), (b"12", 12), (10**12, 10**12),
])
def test_a_budget_is_a_whole_count_of_zero_or_more(value: Any, count: int) -> None:
    """Zero is a prompt-only request; a count past the context is the price's to refuse
    (exceeds_context), not the reader's; numeric strings are vLLM's own client's."""
    for stated in (Stated(budget_tensor=(value,)), Stated(budget_parameter=value),
                   Stated(sampling=json.dumps({"max_tokens": value.decode() if isinstance(value, bytes) else value}))):
        assert reading.budget(stated, "max_tokens") == (count,)


@pytest.mark.parametrize(("value", "message"), [
    (-1, "must be 0 or more tokens, got -1"), ("-5", "must be 0 or more tokens, got -5"),
    (7.5, "must hold integers"), ("lots", "must hold integers"), (True, "must hold integers"),
    ([3], "must hold integers"), ({"n": 3}, "must hold integers"), ("1e3", "must hold integers"),
    (float("inf"), "must hold integers"), ("9" * 5000, "must hold integers"),  # absurd: JSON's Infinity, 5000 digits
])
def test_anything_else_is_refused_naming_where_it_was(value: Any, message: str) -> None:
    """Before issue 45, HTTP dropped a negative or a word in the parameters (the default price) while
    its tensor refused it and gRPC priced it: now one answer, a 400, on every source."""
    for stated, where in ((Stated(budget_tensor=(value,)), "input 'max_tokens'"),
                          (Stated(budget_parameter=value), "parameter 'max_tokens'"),
                          (Stated(sampling={"max_tokens": value}), "sampling_parameters.max_tokens")):
        with pytest.raises(BadRequest, match=re.escape(f"{where} {message}")):
            reading.budget(stated, "max_tokens")


def test_the_budget_comes_from_the_first_source_a_backend_reads() -> None:
    """The tensor, else sampling_parameters (which hides the request parameters, as vLLM's backend
    reads only one of them), else the request parameters, else nothing: the model's default."""
    budget = reading.budget
    assert budget(Stated(budget_tensor=(5,), sampling='{"max_tokens": 6}', budget_parameter=7), "max_tokens") == (5,)
    assert budget(Stated(sampling='{"max_tokens": 6}', budget_parameter=7), "max_tokens") == (6,)
    assert budget(Stated(sampling='{"temperature": 0}', budget_parameter=7), "max_tokens") == ()
    assert budget(Stated(sampling='{"max_tokens": null}'), "max_tokens") == ()
    assert budget(Stated(budget_parameter=7), "max_tokens") == (7,)
    assert budget(Stated(), "max_tokens") == ()
    with pytest.raises(BadRequest, match="sampling_parameters is not valid JSON"):
        budget(Stated(sampling="{nope"), "max_tokens")
    with pytest.raises(BadRequest, match="sampling_parameters must be a JSON object"):
        budget(Stated(sampling="[1, 2]"), "max_tokens")


def test_sequences_take_one_budget_each_one_for_all_or_the_largest() -> None:
    assert tuple(reading.sequences([b"a", b"bb"], (3, 4), None).max_tokens) == (3, 4)
    assert tuple(reading.sequences([b"a", b"bb"], (3,), None).max_tokens) == (3,)
    assert tuple(reading.sequences([b"a", b"bb"], (3, 9, 4), None).max_tokens) == (9,)
    unknown = reading.sequences([], (), None)  # no readable prompt: one sequence of unknown length
    assert tuple(unknown.prompt_bytes) == (None,)
    counted = reading.sequences([b"one two", None], (), lambda text: len(text.split()))
    assert tuple(counted.prompt_tokens or ()) == (2, None)
    broken = reading.sequences([b"x"], (), lambda text: 1 // 0)  # a tokenizer that fails: the ratio estimates
    assert broken.prompt_tokens is None


def test_resolve_class() -> None:
    policy: SidecarPolicy = parse_policy(policy_doc())
    assert reading.resolve_class(policy, None, None).name == "normal"
    assert reading.resolve_class(policy, "batch", "interactive").name == "batch"  # the header wins
    assert reading.resolve_class(policy, None, "interactive").name == "interactive"
    with pytest.raises(BadRequest, match="unknown traffic class 'vip'; known classes: interactive, normal, batch"):
        reading.resolve_class(policy, "vip", None)


def test_resolve_tenant() -> None:
    assert reading.resolve_tenant(None) == "default"
    assert reading.resolve_tenant("  ") == "default"
    assert reading.resolve_tenant(" acme-eu.1 ") == "acme-eu.1"
    for bad in ("a b", "-x", "x" * 129, "ten\u00e4nt", "a/b"):
        with pytest.raises(BadRequest, match="is not a tenant name"):
            reading.resolve_tenant(bad)


# ------------------------------------------------------------------------------------------------
# the priority rule, written once, and nginx's lane


# (the model's priority levels, its default level, the class's level, the client names one) -> written
PRIORITY_CASES = [
    (0, 0, 1, False, None),  # no levels: the priority is not Triton's to read; nothing written
    (0, 0, 1, True, None),  # ... not even over the client's
    (3, 2, 2, False, None),  # the class is at the default level: Triton gives it anyway
    (3, 2, 1, False, 1),  # another level: written
    (3, 2, 3, False, 3),
    (3, 2, 2, True, 2),  # the client named its own: the class's level replaces it
]


@pytest.mark.parametrize(("levels", "default", "level", "names", "written"), PRIORITY_CASES)
def test_the_priority_rule(levels: int, default: int, level: int, names: bool, written: int | None) -> None:
    model = ModelPolicy(name="m", kind="classic", devices=["gpu0"], priority_levels=levels, default_priority=default)
    klass = ClassPolicy(name="c", kind="normal", priority=level, p99_ms=100, max_queue_wait_ms=50, budget_fraction=1.0)
    assert reading.priority_to_write(model, klass, names) == written


def lua_source() -> str:
    return (Path(reading.__file__).parent / "tritongen_lane.lua").read_text()


def lua_code(text: str) -> str:
    """The Lua without its comments (`--` to the end of a line; the lane has no `--` in a string)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_nginx_lane_is_told_the_priority_parameter_by_the_python_rule(tmp_path: Path) -> None:
    """The lane keeps no copy of the rule: it hands every request naming the parameter to Python, and
    carries only the (model, class) pairs Python grants (lane_keys, from the same rule). The name it
    searches for is rendered from sidecar/reading.py, and nowhere written in the Lua itself."""
    install = NginxInstall(Path("/usr/sbin/nginx"), (Path("/m/lua.so"),))
    text = render_config(install, tmp_path, FrontAddresses("127.0.0.1:9000", "127.0.0.1:8000", "127.0.0.1:1"),
                         parse_policy(policy_doc()))
    assert f'priority_parameter = "{reading.PRIORITY}"' in text
    code = lua_code(lua_source())
    assert reading.PRIORITY not in code.replace("priority_parameter", "").replace("priority_json", "").replace(
        "priority_raw", "")
    assert "find(body, priority_json, 1, true)" in code  # HTTP: in the JSON part (checked `at <= head`)
    assert "find(body, priority_raw, rest, true)" in code  # gRPC: anywhere after the model's name


def http_json_part(parameters: dict[str, Any], inputs: list[dict[str, Any]] | None = None) -> bytes:
    return json.dumps({"inputs": inputs or [], "parameters": parameters}).encode()


def grpc_body(parameters: dict[str, Any]) -> bytes:
    request = pb.ModelInferRequest(model_name="cls")
    for key, value in parameters.items():
        if isinstance(value, str):
            request.parameters[key].string_param = value
        else:
            request.parameters[key].int64_param = value
    return request.SerializeToString()


# Requests both must agree on: wherever Python reads a priority of the client's (which its rule may
# rewrite), nginx's search finds the name and hands the request to Python. nginx may hand on more
# (a tensor called `priority_hint`): Python then decides a request the lane could have carried.
LANE_CASES = [
    ({}, False),
    ({"priority": 1}, True),
    ({"traffic_class": "batch", "priority": 0}, True),
    ({"traffic_class": "priority"}, False),  # a class named so: nginx hands it on, Python reads no priority
    ({"priority_hint": 2}, False),
]


@pytest.mark.parametrize(("parameters", "names"), LANE_CASES)
def test_nginx_hands_python_every_request_naming_a_priority(parameters: dict[str, Any], names: bool) -> None:
    found_json = f'"{reading.PRIORITY}"'.encode()  # what the lane searches, as configured
    found_raw = reading.PRIORITY.encode()
    head = http_json_part(parameters)
    http = protocol.infer_stated(protocol.parse_infer(head, None), None, CLASS)
    assert http.names_priority is names
    grpc_raw = grpc_body(parameters)
    grpc = protocol.grpc_stated(pb.ModelInferRequest.FromString(grpc_raw), None, CLASS)
    assert grpc.names_priority is names
    if names:  # Python reads one: the lane must not take it
        assert found_json in head and found_raw in grpc_raw[len(b"\x0a\x03cls"):]
