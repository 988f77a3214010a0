"""Which way gRPC streams go (sidecar/stream_path.py), the nginx location that carries them, and the
decision socket's side of a carried stream (sidecar/decisions.py, op `grpc_stream`): attributed to
the policy's streaming model, priced with no KV, refused as gRPC refuses, counted from nginx's
`stream` message, and handed to the Python relay (`pass`) when the policy relays streams."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sidecar.cost import carried_stream_cost
from sidecar.decisions import PASS
from sidecar.nginx_front import FrontAddresses, NginxInstall, render_config
from sidecar.stream_path import CARRIED, RELAY, stream_path
from tests.sidecar_rigs import NginxSide, decision_server, policy_doc
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def streaming_policy(kv_policy: str | None = "grow_preempt", grpc_streams: str | None = None,
                     models: int = 1, **over: Any) -> SidecarPolicy:
    doc = policy_doc(**over)
    llm = doc["models"][0]
    llm["streaming"] = True
    if kv_policy is not None:
        llm["kv"]["kv_policy"] = kv_policy
    if grpc_streams is not None:
        llm["grpc_streams"] = grpc_streams
    if models == 2:
        doc["models"].append({**llm, "name": "llm2"})
    return parse_policy(doc)


@pytest.mark.parametrize(("kv_policy", "mode"), [
    ("grow_preempt", CARRIED), ("reserve_wait", CARRIED),  # engines that queue when their KV is full
    ("reserve_kill", RELAY), ("grow_kill", RELAY), (None, RELAY),  # kill, or not known: each request reserves
])
def test_streams_are_carried_where_the_engine_queues(kv_policy: str | None, mode: str) -> None:
    path = stream_path(streaming_policy(kv_policy), native_front=True)
    assert path.mode == mode and (path.model == "llm") == (mode == CARRIED)
    assert "llm" in path.why and (kv_policy or "not known") in path.why


def test_the_policy_overrides_either_way_and_the_relay_is_all_there_is_without_nginx() -> None:
    assert stream_path(streaming_policy("grow_kill", "carried"), native_front=True).mode == CARRIED
    assert stream_path(streaming_policy("grow_preempt", "relay"), native_front=True).mode == RELAY
    python = stream_path(streaming_policy("grow_preempt"), native_front=False)
    assert python.mode == RELAY and "Python front" in python.why


def test_with_several_streaming_models_or_none_streams_are_relayed() -> None:
    several = stream_path(streaming_policy(models=2), native_front=True)
    assert several.mode == RELAY and "llm, llm2" in several.why
    assert stream_path(parse_policy(policy_doc()), native_front=True).mode == RELAY  # llm does not stream


def render(policy: SidecarPolicy, tmp_path: Path) -> str:
    install = NginxInstall(Path("/usr/sbin/nginx"), ())
    return render_config(install, tmp_path, FrontAddresses("127.0.0.1:9000", "127.0.0.1:8000", "127.0.0.1:1",
                                                           "127.0.0.1:9001", "127.0.0.1:8001", "127.0.0.1:2"), policy)


def test_nginx_carries_streams_to_triton_only_when_they_take_that_way(tmp_path: Path) -> None:
    carried = render(streaming_policy("grow_preempt"), tmp_path)
    block = carried[carried.index(f"location = {STREAM}"):]
    block = block[:block.index("\n        }\n")]  # to the location's own closing brace
    assert "grpc_pass grpc://triton_grpc" in block and 'stream("http_x_traffic_class", "http_x_tenant")' in block
    assert "stream_body()" in carried
    assert f"location = {STREAM}" not in render(streaming_policy("grow_kill"), tmp_path)


def test_a_carried_stream_holds_a_slot_but_no_kv() -> None:
    model = streaming_policy("reserve_wait").model_named("llm")
    assert model is not None
    cost = carried_stream_cost(model)
    assert cost.kv_bytes == 0 and cost.prefill_bytes == 0 and cost.tokens == 100  # an unknown prompt: a full context


def run(test: Any, policy: SidecarPolicy) -> None:
    async def main() -> None:
        server, state, metrics = await decision_server(policy)
        await test(server, state, metrics)

    asyncio.run(main())


def sample(metrics: Any, series: str) -> float:
    text = metrics.exposition().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " "))


def test_a_carried_stream_is_admitted_counted_and_released() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx, events = NginxSide(server), NginxSide(server)
        rid = nginx.carried("", "grpc_stream", b"", klass="interactive", tenant="acme")
        assert state.inflight == 1 and state.reserved_bytes == 0  # a slot of llm, no KV
        assert sample(metrics, 'sidecar_grpc_streams_total{path="carried"}') == 1
        events.send(f"first\t{rid}\nstream\t{rid}\t3\t2\t1\nend\t{rid}\t200\t9\tok\t0\n".encode())
        assert state.inflight == 0 and server.status() == {"in_flight": 0, "carried": 1}
        assert sample(metrics, 'sidecar_carried_stream_requests_total{model="llm",outcome="ended"}') == 1
        assert sample(metrics, 'sidecar_carried_stream_requests_total{model="llm",outcome="error"}') == 1
        assert sample(metrics, 'sidecar_carried_stream_requests_total{model="llm",outcome="unfinished"}') == 1
        assert sample(metrics, 'sidecar_time_to_first_token_seconds_count{class="interactive",model="llm"}') == 1
        assert sample(metrics, 'sidecar_requests_admitted_total{class="interactive",model="llm"}') == 1

    run(test, streaming_policy())


def test_a_stream_that_finds_no_room_is_refused_as_grpc_refuses() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        first = NginxSide(server)
        rid = first.carried("", "grpc_stream", b"", tenant="solo", klass="normal")
        second = NginxSide(server)
        second.admit("", "grpc_stream", b"", tenant="solo", klass="normal")
        (kind, code, retry, _), body = second.answer()  # type: ignore[misc]
        assert (kind, code) == ("refuse", "8") and retry.isdigit()  # RESOURCE_EXHAUSTED, Retry-After
        assert b"queue_full" in body and b"solo" in body
        second.admit("", "grpc_stream", b"", klass="platinum")
        (kind, code, _, _), body = second.answer()  # type: ignore[misc]
        assert (kind, code) == ("refuse", "3") and b"unknown traffic class" in body  # INVALID_ARGUMENT
        server.end(rid, 200, 0, "ok", b"")
        assert state.inflight == 0

    doc = streaming_policy().model_dump(mode="json", exclude_none=True)
    doc["tenants"] = [{"name": "solo", "max_inflight": 1}]
    for klass in doc["classes"]:
        klass["queue_cap"] = 0
        klass["budget_fraction"] = 1.0
    run(test, parse_policy(doc))


def test_while_streams_are_relayed_nginx_is_told_to_pass_the_call_on() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        nginx.admit("", "grpc_stream", b"")
        assert bytes(nginx.transport.data) == PASS and state.inflight == 0

    run(test, streaming_policy("grow_kill"))


def test_a_stream_that_names_no_class_is_relayed_where_its_class_could_be_in_its_requests() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        nginx.admit("", "grpc_stream", b"", tenant="acme")  # no class metadata: the relay reads each request's
        assert bytes(nginx.transport.data) == PASS and state.inflight == 0

    run(test, streaming_policy())
    assert "names no class is relayed" in stream_path(streaming_policy(), native_front=True).why

    one_class = streaming_policy().model_dump(mode="json", exclude_none=True)
    one_class["classes"] = [c for c in one_class["classes"] if c["name"] == "normal"]

    async def carried(server: Any, state: Any, metrics: Any) -> None:
        NginxSide(server).carried("", "grpc_stream", b"")  # one class: there is nothing to read
        assert state.inflight == 1

    run(carried, parse_policy(one_class))
