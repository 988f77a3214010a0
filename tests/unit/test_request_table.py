"""The same request over every path gets the same reading and the same price (issue 45).

Each case is one logical request (model, class, tenant, the client's priority, prompt, budget and
where the budget is put); each path encodes it as its clients would and reads it with the sidecar's
own code, without a listener:

- the Python front: HTTP `infer` (JSON, and binary tensors), `generate`, `generate_stream`
  (`HttpProxy.prepare`, what its aiohttp handler admits); gRPC `ModelInfer` (typed contents, and raw)
  (`GrpcProxy._parsed`, what its handler admits); a gRPC `ModelStreamInfer` relayed to a Triton of
  the test's own (sidecar/grpc_stream.py), priced by what admission reserved while it ran;
- the decision socket, fed nginx's `admit` messages for each of those ops (sidecar/decisions.py),
  priced by what admission holds for the grant;
- nginx's lane, for the requests it may carry: its (model, class) key, priced by the slot admission
  reserves for it.

Every path must give the reading the case expects and the price `cost_for` gives that reading (the
function admission charges), and must write into the request the priority the reading names. The
refusals are the same on every path too: a negative budget and a word are a 400 naming where they
were, a budget past the context is `exceeds_context`.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from multidict import CIMultiDict
from tritonclient.grpc import service_pb2 as pb

from sidecar import reading
from sidecar.admission_types import Cost, EXCEEDS_CONTEXT
from sidecar.cost import LLMFacts, cost_for
from sidecar.http_proxy import Answer
from sidecar.reading import Reading
from tests.sidecar_rigs import NginxSide, decision_server, policy_doc, relay_stream
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy


def table_policy() -> SidecarPolicy:
    doc = policy_doc()
    llm, cls = doc["models"]
    llm.update(priority_levels=3, default_priority=2, max_inflight=50, memory_quota_bytes=100_000)
    cls.update(max_inflight=50)
    return parse_policy(doc)


@dataclass(frozen=True)
class Case:
    """One logical request, and what reading it must give."""

    name: str
    model: str
    expected: Reading | str  # a reading, or the refusal's reason and a part of its message
    prompt: str | None = None
    budget: tuple[str, Any] | None = None  # ("tensor" | "sampling" | "parameter", value)
    klass: tuple[str, str] | None = None  # ("header" | "parameter", name)
    tenant: str | None = None
    priority: int | None = None  # the client's own


def llm(klass: str, tenant: str, priority: int | None, prompt: int, budget: tuple[int, ...]) -> Reading:
    return Reading("llm", klass, tenant, priority, LLMFacts((prompt,), budget))


CASES = [
    Case("tensor budget, class header, tenant", "llm", llm("interactive", "acme", 1, 11, (7,)),
         prompt="hello there", budget=("tensor", 7), klass=("header", "interactive"), tenant="acme"),
    Case("sampling_parameters budget, class parameter", "llm", llm("batch", "default", 3, 5, (9,)),
         prompt="hello", budget=("sampling", 9), klass=("parameter", "batch")),
    Case("a numeric string in the request parameters", "llm", llm("normal", "default", None, 2, (12,)),
         prompt="hi", budget=("parameter", "12")),
    Case("no budget: the model's default", "llm", llm("normal", "default", None, 2, ()), prompt="hi"),
    Case("zero tokens", "llm", llm("normal", "default", None, 2, (0,)), prompt="hi", budget=("tensor", 0)),
    Case("the client's own priority is replaced", "llm", llm("normal", "default", 2, 2, (4,)), prompt="hi",
         budget=("tensor", 4), priority=1),
    Case("a classic request the lane carries", "cls", Reading("cls", "normal", "default", None, None)),
    Case("a classic request of another class", "cls", Reading("cls", "batch", "default", None, None),
         klass=("header", "batch")),
    Case("a classic request of a tenant", "cls", Reading("cls", "normal", "acme", None, None), tenant="acme"),
    Case("a negative budget", "llm", "malformed: input 'max_tokens' must be 0 or more tokens, got -1", prompt="hi",
         budget=("tensor", -1)),
    Case("a word for a budget", "llm", "malformed: parameter 'max_tokens' must hold integers", prompt="hi",
         budget=("parameter", "lots")),
    Case("a negative count in sampling_parameters", "llm", "malformed: sampling_parameters.max_tokens must be 0 or more",
         prompt="hi", budget=("sampling", -3)),
    Case("a budget past the context", "llm", f"{EXCEEDS_CONTEXT}: max_tokens 100 leaves no room", prompt="hi",
         budget=("tensor", 100)),
]


# ------------------------------------------------------------------------------------------------
# encodings: the case as each kind of client sends it


def headers_of(case: Case, policy: SidecarPolicy) -> dict[str, str]:
    out = {}
    if case.klass and case.klass[0] == "header":
        out[policy.class_header] = case.klass[1]
    if case.tenant:
        out[policy.tenant_header] = case.tenant
    return out


def parameters_of(case: Case, policy: SidecarPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if case.klass and case.klass[0] == "parameter":
        out[policy.class_parameter] = case.klass[1]
    if case.priority is not None:
        out["priority"] = case.priority
    if case.budget and case.budget[0] == "parameter":
        out["max_tokens"] = case.budget[1]
    return out


def sampling_of(case: Case) -> str | None:
    return json.dumps({"max_tokens": case.budget[1], "temperature": 0}) if case.budget and case.budget[0] == "sampling" \
        else None


def tensor_budget(case: Case) -> int | None:
    return case.budget[1] if case.budget and case.budget[0] == "tensor" else None


def bytes_tensor(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def http_infer(case: Case, policy: SidecarPolicy, binary: bool) -> tuple[dict[str, str], bytes]:
    """An HTTP infer: its tensors in JSON `data`, or as binary data after the JSON part."""
    tensors: list[tuple[str, str, bytes, Any]] = []  # name, datatype, binary form, JSON form
    if case.prompt is not None:
        tensors.append(("text_input", "BYTES", bytes_tensor(case.prompt.encode()), case.prompt))
    if tensor_budget(case) is not None:
        tensors.append(("max_tokens", "INT32", struct.pack("<i", tensor_budget(case)), tensor_budget(case)))
    if sampling_of(case) is not None:
        tensors.append(("sampling_parameters", "BYTES", bytes_tensor(sampling_of(case).encode()), sampling_of(case)))
    inputs, data = [], b""
    for name, datatype, raw, value in tensors:
        tensor: dict[str, Any] = {"name": name, "shape": [1], "datatype": datatype}
        if binary:
            tensor["parameters"] = {"binary_data_size": len(raw)}
            data += raw
        else:
            tensor["data"] = [value]
        inputs.append(tensor)
    head = json.dumps({"inputs": inputs, "parameters": parameters_of(case, policy)}).encode()
    headers = headers_of(case, policy)
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
    return headers, head + data


def http_generate(case: Case, policy: SidecarPolicy) -> tuple[dict[str, str], bytes]:
    doc: dict[str, Any] = {"parameters": parameters_of(case, policy)}
    if case.prompt is not None:
        doc["text_input"] = case.prompt
    if tensor_budget(case) is not None:
        doc["max_tokens"] = tensor_budget(case)
    if sampling_of(case) is not None:
        doc["sampling_parameters"] = sampling_of(case)
    return headers_of(case, policy), json.dumps(doc).encode()


def grpc_infer(case: Case, policy: SidecarPolicy, raw: bool) -> tuple[tuple[tuple[str, str], ...], bytes]:
    """A gRPC ModelInferRequest: typed contents, or raw_input_contents; and its metadata."""
    request = pb.ModelInferRequest(model_name=case.model, id="client-1")
    tensors: list[tuple[str, str, bytes, Callable[[Any], None]]] = []
    if case.prompt is not None:
        prompt = case.prompt.encode()
        tensors.append(("text_input", "BYTES", bytes_tensor(prompt), lambda c: c.bytes_contents.append(prompt)))
    budget = tensor_budget(case)
    if budget is not None:
        tensors.append(("max_tokens", "INT32", struct.pack("<i", budget), lambda c: c.int_contents.append(budget)))
    sampling = sampling_of(case)
    if sampling is not None:
        tensors.append(("sampling_parameters", "BYTES", bytes_tensor(sampling.encode()),
                        lambda c: c.bytes_contents.append(sampling.encode())))
    for name, datatype, data, fill in tensors:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if raw:
            request.raw_input_contents.append(data)
        else:
            fill(tensor.contents)
    for key, value in parameters_of(case, policy).items():
        if isinstance(value, str):
            request.parameters[key].string_param = value
        else:
            request.parameters[key].int64_param = value
    return tuple(headers_of(case, policy).items()), request.SerializeToString()


# ------------------------------------------------------------------------------------------------
# paths: each reads the case its own way and says (reading, price, priority written) or the refusal


@dataclass(frozen=True)
class Read:
    reading: Reading
    price: Cost
    written: int | None  # the priority the request goes upstream with


Result = Read | str  # a reading, or "reason: message" of a refusal
Path = Callable[[Case, SidecarPolicy], Awaitable[Result | None]]  # None: the path does not take the case


def json_priority(body: bytes, header_length: str | None = None) -> int | None:
    head = body[: int(header_length)] if header_length else body
    return (json.loads(head).get("parameters") or {}).get("priority")


def grpc_priority(raw: bytes) -> int | None:
    request = pb.ModelInferRequest.FromString(raw)
    return request.parameters["priority"].int64_param or request.parameters["priority"].uint64_param \
        if "priority" in request.parameters else None


def refused_http(answer: Answer) -> str:
    body = json.loads(answer.body)
    return f"{body['reason'].replace('malformed_request', 'malformed')}: {body['error'].removeprefix('malformed request: ')}"


def never(cost: Cost) -> str | None:
    return None if cost.never is None else f"{cost.never[0]}: {cost.never[1]}"


def front_http(op: str, binary: bool = False) -> Path:
    async def path(case: Case, policy: SidecarPolicy) -> Result | None:
        if op != "infer" and case.model != "llm":
            return None
        headers, body = http_infer(case, policy, binary) if op == "infer" else http_generate(case, policy)
        server, _, _ = await decision_server(policy)
        prepared = server.proxy.prepare(op, case.model, CIMultiDict(headers), body)
        if isinstance(prepared, Answer):
            return refused_http(prepared)
        written = json_priority(prepared.body, prepared.headers.get("Inference-Header-Content-Length"))
        return never(prepared.cost) or Read(prepared.reading, prepared.cost, written)

    return path


def front_grpc(raw: bool) -> Path:
    async def path(case: Case, policy: SidecarPolicy) -> Result | None:
        metadata, body = grpc_infer(case, policy, raw)
        server, _, _ = await decision_server(policy)
        parsed = server.grpc._parsed(body, metadata)
        if isinstance(parsed, Answer):
            return "malformed: " + parsed.body.decode().removeprefix("malformed request: ")
        request, found, cost = parsed
        return never(cost) or Read(found, cost, grpc_priority(request.SerializeToString()))

    return path


async def front_grpc_stream(case: Case, policy: SidecarPolicy) -> Result | None:
    metadata, body = grpc_infer(case, policy, raw=False)
    server, state, _ = await decision_server(policy)
    proxy = server.grpc
    readings: list[Reading] = []
    prepare = proxy.prepare

    def recorded(request: Any, metadata: Any) -> Any:  # the relay's own call, its answer kept
        found, cost = prepare(request, metadata)
        readings.append(found)
        return found, cost

    proxy.prepare = recorded  # type: ignore[method-assign]
    held: list[Cost] = []
    upstream, client = await relay_stream(
        proxy, [body], metadata, on_write=lambda request: held.extend(r.request.cost for r in
                                                                      state.ledger.reservations.values()))
    assert state.inflight == 0 and state.reserved_bytes == 0  # the stream's end released it
    errors = [reply.error_message for reply in client.written if reply.error_message]
    if errors:  # a success is answered by Triton's empty final response, which the client did not ask for
        code, _, message = errors[0].partition(": ")
        if code == "malformed request":
            return "malformed: " + message
        body_json = json.loads(message)
        return f"{body_json['reason']}: {body_json['error'].split('): ', 1)[1]}"
    (request,) = upstream.sent
    return Read(readings[0], held[0], grpc_priority(request.SerializeToString()))


def decided(op: str, binary: bool = False) -> Path:
    """The decision socket: nginx's admit message for the op, the grant's price, the body it says to send."""

    async def path(case: Case, policy: SidecarPolicy) -> Result | None:
        if op not in ("infer", "grpc_infer") and case.model != "llm":
            return None
        server, state, _ = await decision_server(policy)
        if op == "grpc_infer":
            metadata, body = grpc_infer(case, policy, raw=True)
            headers = dict(metadata)
            owner, name = server.grpc, "prepare_carried"
        else:
            headers, body = http_infer(case, policy, binary) if op == "infer" else http_generate(case, policy)
            owner, name = server.proxy, "prepare"
        prepare = getattr(owner, name)
        readings: list[Reading] = []

        def recorded(*args: Any) -> Any:
            found = prepare(*args)
            if not isinstance(found, Answer):
                readings.append(found.reading)
            return found

        setattr(owner, name, recorded)
        nginx = NginxSide(server)
        nginx.admit(case.model, op, body, klass=headers.get(policy.class_header, ""),
                    tenant=headers.get(policy.tenant_header, ""),
                    header_length=headers.get("Inference-Header-Content-Length", ""))
        answer = nginx.answer()
        assert answer is not None, "an admit is answered at once (nothing queues in this table)"
        (kind, *fields), rewritten = answer
        if kind == "refuse":
            if op == "grpc_infer":
                message = rewritten.decode()
                if message.startswith("malformed request: "):
                    return "malformed: " + message.removeprefix("malformed request: ")
                refused = json.loads(message)
            else:
                refused = json.loads(rewritten)
                if refused["reason"] == "malformed_request":
                    return "malformed: " + refused["error"].removeprefix("malformed request: ")
            return f"{refused['reason']}: {refused['error'].split('): ', 1)[1]}"
        rid, header_length = int(fields[0]), fields[1]
        price = server.held[rid][1].cost
        sent = rewritten or body
        written = grpc_priority(sent) if op == "grpc_infer" else json_priority(
            sent, header_length or headers.get("Inference-Header-Content-Length"))
        nginx.send(f"ok\t{rid}\n".encode() + f"end\t{rid}\t200\t1\tok\t0\n".encode())
        assert not server.held and state.inflight == 0 and state.reserved_bytes == 0
        return Read(readings[0], price, written)

    return path


async def lane(case: Case, policy: SidecarPolicy) -> Result | None:
    """nginx's lane: only a request naming no tenant and no priority, of a pair the lane carries; its
    reading is its key, its price the slot admission reserves for it."""
    from sidecar.lane import lane_keys

    klass = case.klass[1] if case.klass else policy.default_class
    if case.tenant or case.priority is not None or (case.model, klass) not in lane_keys(policy):
        return None
    _, state, _ = await decision_server(policy)
    assert state.take_lane_slot(("lane", 1), case.model, klass)
    price = state.ledger.reservations[("lane", 1)].request.cost
    state.return_lane_slot(("lane", 1))
    return Read(reading.lane_reading(case.model, klass), price, None)


PATHS: dict[str, Path] = {
    "http infer json": front_http("infer"),
    "http infer binary": front_http("infer", binary=True),
    "http generate": front_http("generate"),
    "http generate_stream": front_http("generate_stream"),
    "grpc infer": front_grpc(raw=False),
    "grpc infer raw": front_grpc(raw=True),
    "grpc stream": front_grpc_stream,
    "decision infer json": decided("infer"),
    "decision infer binary": decided("infer", binary=True),
    "decision generate_stream": decided("generate_stream"),
    "decision grpc infer": decided("grpc_infer"),
    "lane": lane,
}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_same_request_reads_and_prices_alike_on_every_path(case: Case) -> None:
    policy = table_policy()

    async def every_path() -> dict[str, Result]:
        results = {}
        for name, path in PATHS.items():
            found = await path(case, policy)
            if found is not None:
                results[name] = found
        return results

    results = asyncio.run(every_path())
    assert {"http infer json", "grpc infer", "grpc stream", "decision infer json", "decision grpc infer"} <= set(results)
    if isinstance(case.expected, str):
        for name, found in results.items():
            assert isinstance(found, str) and found.startswith(case.expected), (name, found)
        return
    expected = case.expected
    model = policy.model_named(case.model)
    assert model is not None
    price = cost_for(model, expected.llm)
    for name, found in results.items():
        assert found == Read(expected, price, expected.priority), name
    lane_taken = "lane" in results
    assert lane_taken is (case.model == "cls" and case.tenant is None), "the lane takes the plain classic requests"


def test_the_table_prices_what_the_rules_say() -> None:
    """The expected prices themselves, by hand: 10 bytes per token, blocks of one, a 100-token context."""
    policy = table_policy()
    llm_model = policy.model_named("llm")
    assert llm_model is not None
    by_name = {c.name: c for c in CASES}

    def price(name: str) -> Cost:
        expected = by_name[name].expected
        assert isinstance(expected, Reading)
        return cost_for(llm_model, expected.llm)

    assert price("tensor budget, class header, tenant").kv_bytes == (11 + 7) * 10
    assert price("a numeric string in the request parameters").kv_bytes == (2 + 12) * 10
    assert price("no budget: the model's default").kv_bytes == 100 * 10  # no default_max_tokens: up to the context
    assert price("zero tokens").kv_bytes == 2 * 10
