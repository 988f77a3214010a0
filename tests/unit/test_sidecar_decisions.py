"""The decision socket's protocol (sidecar/decisions.py) without a listener: the protocol object nginx's
connection would get is fed the bytes nginx sends and its answers are read back (tests/sidecar_rigs.py
NginxSide), over a DecisionServer that was never started, on a real admission state. What it
accepts, what it answers to what it cannot read (and that no reservation is left behind), admit /
queue / refuse / release round trips, an end of an id it does not hold, and a client gone while
queued or as it was granted; and the one classification of how a request ended that the socket's
`end`, the relays and the lane share (sidecar/accounting.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from sidecar.accounting import CLIENT_CLOSED, DOWN, ENDED, UNSENT, outcome
from sidecar.decisions import MAX_BEFORE_S, before_sidecar_s
from tests.sidecar_rigs import NginxSide, decision_server, policy_doc
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy


def test_the_time_a_request_spent_in_nginx_is_read_from_its_start() -> None:
    assert before_sidecar_s("1000.250", 1000.5) == 0.25


def test_a_start_that_cannot_be_a_wait_counts_as_none() -> None:
    """A start in the future (nginx's cached clock, a clock step), one further back than any class
    may wait, or a field that is not a number: the request is judged as arriving now."""
    assert before_sidecar_s("1001.0", 1000.0) == 0.0
    assert before_sidecar_s("0", MAX_BEFORE_S + 1.0) == 0.0
    assert before_sidecar_s("", 1000.0) == 0.0
    assert before_sidecar_s("soon", 1000.0) == 0.0


# ------------------------------------------------------------------------------------------------
# the one classification of ends


@pytest.mark.parametrize(("how", "status", "error", "named"), [
    (ENDED, 200, None, "ok"),
    (ENDED, 399, None, "ok"),  # every status below 400 is ok: nginx's lane tallies only the others
    (ENDED, 200, b'{"error": "model failed"}', "upstream_error"),  # an error event in a stream of 200
    (ENDED, 500, b"", "upstream_error"),
    (ENDED, 404, None, "upstream_error"),
    (ENDED, 500, b"out of memory: 16 of 1920 tokens are free", "oom"),
    (ENDED, CLIENT_CLOSED, None, "client_disconnect"),
    (DOWN, 503, None, "upstream_failed"),
    (UNSENT, CLIENT_CLOSED, None, "client_disconnect"),
])
def test_one_classification_names_every_end(how: str, status: int, error: bytes | None, named: str) -> None:
    assert outcome(how, status, error) == named


# ------------------------------------------------------------------------------------------------
# the protocol, against a real admission state


def classic_policy(max_inflight: int = 1) -> SidecarPolicy:
    """`cls` takes one interactive request at a time: the next one queues (`llm` as in policy_doc)."""
    doc = policy_doc()
    doc["models"][1].update(max_inflight=max_inflight, priority_levels=3, default_priority=1)
    return parse_policy(doc)


INFER = json.dumps({"inputs": []}).encode()
Test = Callable[[Any, Any, Any], Awaitable[None]]


def run(test: Test, policy: SidecarPolicy | None = None) -> None:
    async def main() -> None:
        server, state, metrics = await decision_server(policy or classic_policy())
        await test(server, state, metrics)

    asyncio.run(main())


def sample(metrics: Any, series: str) -> float:
    text = metrics.exposition().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " "))


def finished(metrics: Any, outcome_name: str, model: str = "cls", klass: str = "interactive") -> float:
    return sample(metrics, f'sidecar_requests_finished_total{{class="{klass}",model="{model}",outcome="{outcome_name}"}}')


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_an_admit_is_granted_and_its_reported_end_releases_it() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        nginx.admit("llm", "generate_stream", b'{"text_input": "hello", "max_tokens": 5}', klass="normal",
                    tenant="acme")
        (kind, rid, length, size), body = nginx.answer()  # type: ignore[misc]
        assert (kind, length, size, body) == ("admit", "", "0", b"")  # the body goes as it came
        assert state.inflight == 1 and state.reserved_bytes == 100 and server.status() == {"in_flight": 1, "carried": 0}
        events = NginxSide(server)  # nginx's background sender: first tokens and ends, on a kept connection
        nginx.send(f"ok\t{rid}\n".encode())
        events.send(f"first\t{rid}\n".encode() + f"end\t{rid}\t200\t6\tok\t0\n".encode())
        assert nginx.answer() is None and events.answer() is None  # neither is answered
        assert state.inflight == 0 and state.reserved_bytes == 0 and server.status() == {"in_flight": 0, "carried": 1}
        assert finished(metrics, "ok", "llm", "normal") == 1
        assert sample(metrics, 'sidecar_tenant_requests_admitted_total{tenant="other"}') == 1  # acme is not listed
        assert sample(metrics, 'sidecar_time_to_first_token_seconds_count{class="normal",model="llm"}') == 1

    run(test)


def test_a_class_whose_priority_must_be_written_gets_the_rewritten_body() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        text = b"\x03\x00\x00\x00abc"
        head = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1],
                                       "parameters": {"binary_data_size": len(text)}}]}).encode()
        nginx.admit("cls", "infer", head + text, klass="batch", header_length=str(len(head)))
        (kind, rid, length, _), body = nginx.answer()  # type: ignore[misc]
        assert kind == "admit" and body[int(length):] == text  # the binary tensor untouched
        assert json.loads(body[:int(length)])["parameters"] == {"priority": 3}
        nginx.send(f"ok\t{rid}\nend\t{rid}\t200\t0\tok\t0\n".encode())
        request = pb.ModelInferRequest(model_name="cls")
        nginx.admit("cls", "grpc_infer", request.SerializeToString(), klass="normal")
        (kind, rid, _, _), body = nginx.answer()  # type: ignore[misc]
        assert kind == "admit" and pb.ModelInferRequest.FromString(body).parameters["priority"].uint64_param == 2
        nginx.send(f"ok\t{rid}\nend\t{rid}\t500\t0\tok\t5\nboom!".encode())
        assert state.inflight == 0 and finished(metrics, "upstream_error", klass="normal") == 1

    run(test)


def test_refusals_are_answered_as_nginx_writes_them_and_hold_nothing() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        nginx.admit("llm", "generate", b'{"text_input": "hi", "max_tokens": 500}')
        (kind, status, retry, _), body = nginx.answer()  # type: ignore[misc]
        assert (kind, status, retry) == ("refuse", "400", "") and json.loads(body)["reason"] == "exceeds_context"
        nginx.admit("llm", "generate_stream", b"{nope")
        (kind, status, _, _), body = nginx.answer()  # type: ignore[misc]
        assert (kind, status, json.loads(body)["reason"]) == ("refuse", "400", "malformed_request")
        nginx.admit("llm", "grpc_infer", b"\xff\xff not a protobuf")
        (kind, code, _, _), body = nginx.answer()  # type: ignore[misc]
        assert (kind, code) == ("refuse", "3") and body.startswith(b"malformed request: ")  # INVALID_ARGUMENT
        nginx.admit("cls", "infer", INFER, klass="platinum")
        (kind, status, _, _), body = nginx.answer()  # type: ignore[misc]
        assert status == "400" and "unknown traffic class 'platinum'" in json.loads(body)["error"]
        rid = nginx.carried("cls", "infer", INFER, tenant="acme", klass="interactive")  # room: admitted
        nginx.admit("cls", "infer", INFER, tenant="acme", klass="normal")  # full, and no queue: refused at once
        (kind, status, retry, _), body = nginx.answer()  # type: ignore[misc]
        assert (kind, status) == ("refuse", "429") and retry.isdigit()
        assert json.loads(body)["reason"] == "queue_full" and json.loads(body)["tenant"] == "acme"
        server.end(rid, 200, 0, ENDED, b"")
        assert state.inflight == 0 and state.reserved_bytes == 0 and state.waiting == 0
        assert sample(metrics, 'sidecar_requests_rejected_total{class="normal",model="cls",reason="queue_full"}') == 1

    doc = classic_policy().model_dump(mode="json", exclude_none=True)
    for klass in doc["classes"]:
        klass["queue_cap"] = 0
    run(test, parse_policy(doc))


async def one_carried_one_queued(server: Any, state: Any) -> tuple[NginxSide, NginxSide, int]:
    """cls's one request granted on a first connection, the next one queued on a second: (first,
    second, the first's id)."""
    first, second = NginxSide(server), NginxSide(server)
    rid = first.carried("cls", "infer", INFER, klass="interactive")
    second.admit("cls", "infer", INFER, klass="interactive")
    await turns()
    assert second.answer() is None and state.waiting == 1  # nginx holds the client meanwhile
    return first, second, rid


def test_a_queued_admit_waits_in_nginx_and_is_granted_when_room_frees() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        first, second, rid = await one_carried_one_queued(server, state)
        first.send(f"end\t{rid}\t200\t0\tok\t0\n".encode())  # on any connection
        await turns()
        (kind, granted, _, _), _ = second.answer()  # type: ignore[misc]
        assert kind == "admit" and state.waiting == 0 and state.inflight == 1
        second.send(f"ok\t{granted}\nend\t{granted}\t200\t0\tok\t0\n".encode())
        assert state.inflight == 0 and finished(metrics, "ok") == 2
        assert sample(metrics, 'sidecar_queue_wait_seconds_count{class="interactive"}') == 2

    run(test)


def test_a_client_gone_while_queued_leaves_the_queue_and_one_gone_as_granted_gives_it_back() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        _, second, rid = await one_carried_one_queued(server, state)
        second.transport.close()  # the client left: nginx closes the socket it waits on
        await turns()
        assert state.waiting == 0 and state.inflight == 1
        server.end(rid, 200, 0, ENDED, b"")
        assert state.inflight == 0 and state.reserved_bytes == 0 and not server.held

        third = NginxSide(server)
        third.admit("cls", "infer", INFER, klass="interactive")
        assert third.answer() is not None and state.inflight == 1  # granted, not yet confirmed by nginx
        third.transport.close()  # the client left before nginx read the grant: nothing went upstream
        await turns()
        assert state.inflight == 0 and state.reserved_bytes == 0 and state.lingering == 0 and not server.held
        assert finished(metrics, "client_disconnect") == 1 and server.status()["carried"] == 1

    run(test)


def test_an_end_of_an_id_not_held_changes_nothing() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        rid = nginx.carried("cls", "infer", INFER, klass="interactive")
        nginx.send(f"end\t{rid}\t200\t0\tok\t0\n".encode())
        before = metrics.exposition()
        nginx.send(f"end\t{rid}\t200\t0\tok\t0\nend\t999\t500\t0\tdown\t0\nfirst\t998\n".encode())
        assert metrics.exposition() == before and state.inflight == 0 and server.status()["carried"] == 1
        assert not nginx.transport.closed

    run(test)


def test_nginx_restarting_releases_what_it_held() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        NginxSide(server).carried("llm", "generate_stream", b'{"text_input": "hello", "max_tokens": 5}',
                                  klass="interactive")
        server.release_all("front_restarted")
        assert state.inflight == 0 and not server.held and state.lingering == 1  # it went upstream: it lingers
        assert finished(metrics, "front_restarted", "llm") == 1

    run(test)


# Messages the socket cannot read. Each: what nginx sent (after one granted, confirmed request whose
# id is {rid}), whether the connection stays open, what is answered, and how that request ends.
MALFORMED = [
    ("hello\n", False, None, None),  # an unknown kind: where the next message starts is unknown
    ("admit\tcls\tinfer\t\t\t\t\tlots\n", False, None, None),  # a length that is not a number
    ("end\t{rid}\t200\t0\tok\t-5\n", False, None, "error"),  # ... whose id can be read: released
    ("admit\tcls\tinfer\t\t\t0\n", True, ("refuse", "500", "front_protocol"), None),  # 6 fields of 8
    ("admit\tcls\tdelete\t\t\t\t\t0\n", True, ("refuse", "500", "front_protocol"), None),  # an unknown op
    ("admit\tcls\tgrpc_infer\tx\t\t0\n", True, ("refuse", "13", None), None),  # gRPC: INTERNAL
    ("first\tsoon\n", True, None, None),
    ("end\tsoon\t200\t0\tok\t0\n", True, None, None),  # no id: nothing it could release
    ("end\t{rid}\tfine\t0\tok\t0\n", True, None, "error"),  # a status that is not a number: released
    ("end\t{rid}\t200\t0\tmaybe\t0\n", True, None, "error"),  # an unknown how: released
    ("end\t{rid}\t200\t0\n", True, None, "error"),  # too few fields
]


@pytest.mark.parametrize(("message", "open_after", "answered", "ended"), MALFORMED)
def test_a_message_the_socket_cannot_read_is_said_and_leaks_nothing(
        message: str, open_after: bool, answered: tuple[str, str, str | None] | None, ended: str | None,
        caplog: pytest.LogCaptureFixture) -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        rid = nginx.carried("cls", "infer", INFER, klass="interactive")
        with caplog.at_level(logging.ERROR, logger="tritongen.sidecar"):
            nginx.send(message.format(rid=rid).encode())
        await turns()
        assert "the native front sent a message the sidecar cannot" in caplog.text
        assert nginx.transport.closed is not open_after
        reply = nginx.answer()
        if answered is None:
            assert reply is None
        else:
            assert reply is not None
            (kind, status, _, _), body = reply
            assert (kind, status) == answered[:2]
            assert answered[2] is None or json.loads(body)["reason"] == answered[2]
        if ended is not None:
            assert finished(metrics, ended) == 1 and not server.held
        else:
            assert server.held  # the granted request is still carried: its real end releases it
            server.end(rid, 200, 0, ENDED, b"")
        assert state.inflight == 0 and state.reserved_bytes == 0
        if open_after:  # the connection goes on: the next message is read
            rid = nginx.carried("cls", "infer", INFER, klass="interactive")
            nginx.send(f"end\t{rid}\t200\t0\tok\t0\n".encode())
            assert state.inflight == 0

    run(test)


def test_messages_may_arrive_in_any_pieces() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        body = b'{"text_input": "two\\nlines", "max_tokens": 5}'
        message = f"admit\tllm\tgenerate\tinteractive\t\t\t\t{len(body)}\n".encode() + body
        for i in range(len(message)):
            nginx.send(message[i:i + 1])
        (kind, rid, _, _), _ = nginx.answer()  # type: ignore[misc]
        assert kind == "admit"
        end = f"ok\t{rid}\nend\t{rid}\t200\t1\tok\t7\nan\nerror".encode()
        nginx.send(end[:9])
        nginx.send(end[9:-3])
        assert server.held
        nginx.send(end[-3:])
        assert not server.held and finished(metrics, "upstream_error", "llm") == 1  # the error text, 200 or not

    run(test)


def test_without_a_grpc_upstream_a_grpc_decision_closes_the_connection() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        server.grpc = None
        nginx = NginxSide(server)
        nginx.admit("cls", "grpc_infer", pb.ModelInferRequest(model_name="cls").SerializeToString())
        await turns()
        assert nginx.transport.closed and nginx.answer() is None and state.inflight == 0

    run(test)


def stream_policy() -> SidecarPolicy:
    """`llm` streams and its engine queues: nginx carries its gRPC streams (sidecar/stream_path.py)."""
    doc = policy_doc()
    doc["models"][0].update(streaming=True, grpc_streams="carried")
    return parse_policy(doc)


def test_each_request_inside_a_carried_stream_is_a_request_on_the_dashboard() -> None:
    """A stream holds one slot, but each request nginx saw end inside it is admitted, ended with its
    own outcome and duration; the requests the stream cut short are counted at its end, and the
    stream itself is not counted as one more."""
    duration = 'sidecar_request_duration_seconds_count{class="normal",model="llm"}'
    admitted = 'sidecar_requests_admitted_total{class="normal",model="llm"}'

    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx, events = NginxSide(server), NginxSide(server)
        rid = nginx.carried("", "grpc_stream", b"", klass="normal")
        oom = b"out of memory: 16 of 1920 tokens are free"
        events.send(f"first\t{rid}\nreq\t{rid}\t120000\t40000\t0\n".encode() + f"req\t{rid}\t80000\t30000\t0\n".encode()
                    + f"req\t{rid}\t5000\t5000\t{len(oom)}\n".encode() + oom)
        assert state.inflight == 1 and sample(metrics, duration) == 3  # counted as they end, the slot still held
        # first tokens: the stream's (its first request's), then the second's; the third failed
        ttft = 'sidecar_time_to_first_token_seconds'
        assert sample(metrics, ttft + '_count{class="normal",model="llm"}') == 2
        assert sample(metrics, ttft + '_sum{class="normal",model="llm"}') >= 0.03
        events.send(f"stream\t{rid}\t4\t3\t1\nend\t{rid}\t499\t40\tok\t0\n".encode())
        assert state.inflight == 0
        assert sample(metrics, duration) == sample(metrics, admitted) == 4
        assert finished(metrics, "ok", "llm", "normal") == 2 and finished(metrics, "oom", "llm", "normal") == 1
        assert finished(metrics, "client_disconnect", "llm", "normal") == 1  # the one the stream cut short
        sums = sample(metrics, 'sidecar_request_duration_seconds_sum{class="normal",model="llm"}')
        assert sums >= 0.205

    run(test, stream_policy())


def test_a_stream_in_which_nginx_saw_no_request_end_counts_once() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        rid = nginx.carried("", "grpc_stream", b"", klass="normal")
        nginx.send(f"stream\t{rid}\t0\t0\t0\nend\t{rid}\t200\t0\tok\t0\n".encode())
        assert state.inflight == 0
        assert sample(metrics, 'sidecar_request_duration_seconds_count{class="normal",model="llm"}') == 1
        assert finished(metrics, "ok", "llm", "normal") == 1

    run(test, stream_policy())


def test_a_request_end_that_cannot_be_read_is_skipped_and_leaks_nothing() -> None:
    async def test(server: Any, state: Any, metrics: Any) -> None:
        nginx = NginxSide(server)
        rid = nginx.carried("", "grpc_stream", b"", klass="normal")
        nginx.send(f"req\t{rid}\tsoon\t0\t0\nreq\t{rid}\t1\t1\textra\t0\n".encode() + f"end\t{rid}\t200\t0\tok\t0\n".encode())
        assert state.inflight == 0 and not server.held

    run(test, stream_policy())
