"""Decisions for requests nginx carries: the Python end of sidecar/tritongen_decide.lua.

Why: relaying a request through Python costs CPU per byte and per token, which on a host shared
with the engine is taken from the engine (docs/sidecar.md, the native front). nginx carries a model
request's bytes both ways and asks here once before it goes upstream; a queued request waits in
nginx on its connection (a client that goes away closes it and leaves the queue). nginx then reports
its first token and end, and the reservation goes back through the same admission context
(`AdmissionController.admit`) and metrics as the Python path's.

The wire, on a Unix socket only nginx and this process know (`\t`-separated lines, each body
length-prefixed so no JSON parser is needed in Lua):
  nginx -> here  `admit\tMODEL\tOP\tCLASS\tTENANT\tHEADER_LENGTH\tSTART\tN\n` + N body bytes
                 (HEADER_LENGTH: an infer's Inference-Header-Content-Length, or empty; START: when
                 nginx accepted the request, Unix seconds: the time it spent before reaching here,
                 queued in nginx and in this socket's backlog under a burst, counts against its
                 class's wait and in its time to first token)
  here -> nginx  `admit\tID\tHEADER_LENGTH\tN\n` + N bytes of rewritten body (N = 0: unchanged;
                 HEADER_LENGTH: the rewritten JSON part's length when binary tensors follow it)
                 `refuse\tSTATUS\tRETRY_AFTER\tN\n` + N bytes of JSON (for OP `grpc_infer`, a gRPC
                 ModelInfer whose body is its protobuf unframed: STATUS is the gRPC code's number and
                 the N bytes its status message)
                 `pass\t\t\t0\n`: not carried this way (OP `grpc_stream` while streams are relayed):
                 nginx hands the call to the Python listener
  nginx -> here  `ok\tID\n` on the same connection once it read a grant (a connection that closes
                 before it: the client left, the grant goes back),
                 `first\tID\n`, `end\tID\tSTATUS\tEVENTS\tHOW\tN\n` + N bytes of the engine's error
                 (HOW: "ok", or "down" when nginx could not reach Triton); no answer. As each request
                 inside a carried stream ends, `req\tID\tMICROSECONDS\tFIRST\tN\n` + N bytes of its
                 error response's text (N = 0: it ended well): its span and its time to first response
                 (microseconds) as nginx could time them. Before a
                 carried stream's end, `stream\tID\tREQUESTS\tFINALS\tERRORS\n`: the requests its
                 response frames named, how many ended (final flag or error response), how many with an error.
OP `grpc_stream` (a gRPC ModelStreamInfer as it opens, sidecar/stream_path.py) has no model and no
body: the sidecar attributes the stream to the policy's streaming model and admits a slot of it.

A message the sidecar cannot read is logged and answered where nginx waits for an answer (an admit:
a refusal with status 500 saying so, gRPC INTERNAL); an `end` whose id can be read releases its
reservation whatever else it got wrong. Only a line whose length field cannot be read (so where the
next message starts is unknown) closes the connection, which nginx's client sees as the sidecar
being unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import protocol
from sidecar.accounting import CLIENT_CLOSED, DOWN, ENDED, ERROR, UNSENT
from sidecar.controller import AdmissionController, Rejected, Ticket
from sidecar.grpc_proxy import GrpcProxy
from sidecar.http_proxy import Answer, HttpProxy, Prepared
from sidecar.nginx_front import WORKER_CONNECTIONS
from sidecar.stream_path import CARRIED, relayed_for_its_class, stream_path
from sidecar.upstream import UpstreamHealth

log = logging.getLogger("tritongen.sidecar")

GRPC_INFER = "grpc_infer"  # the op nginx names a gRPC ModelInfer by (its body: the request's protobuf, unframed)
GRPC_STREAM = "grpc_stream"  # a gRPC ModelStreamInfer as it opens (no model, no body: sidecar/stream_path.py)
OPS = frozenset({"infer", "generate", "generate_stream", GRPC_INFER, GRPC_STREAM})
FIELDS = {"admit": 8, "ok": 2, "first": 2, "end": 6, "stream": 5, "req": 5}  # each message's tab-separated fields
WITH_BODY = frozenset({"admit", "end", "req"})  # the messages whose last field is the length of a body that follows
PASS = b"pass\t\t\t0\n"  # "not carried this way": nginx hands the call to the Python listener
_GRPC_INTERNAL = 13


class Unreadable(ValueError):
    """A message from nginx the sidecar cannot read; str() says what is wrong with it."""


# nginx's clock and ours are the same host's; a start further back than this is not a wait but a
# clock step (NTP) or a corrupt field, and counts as none. Longer than any class's budget.
MAX_BEFORE_S = 3600.0


def before_sidecar_s(start: str, now: float) -> float:
    """Seconds between nginx accepting the request (`start`, Unix seconds) and now; 0 when unknown."""
    try:
        waited = now - float(start)
    except ValueError:
        return 0.0
    return waited if 0.0 < waited < MAX_BEFORE_S else 0.0


class DecisionServer:
    """The decision socket. `held` maps the id of each admitted request nginx carries to its open
    admission context, until nginx reports its end."""

    def __init__(self, path: Path, proxy: HttpProxy, grpc: GrpcProxy | None, controller: AdmissionController,
                 health: UpstreamHealth) -> None:
        self.path = path
        self.proxy = proxy
        self.grpc = grpc
        self.controller = controller
        self.health = health
        self.held: dict[int, tuple[Any, Ticket]] = {}
        # (model, class) of a request the lane could have carried (a unary infer naming no tenant and
        # no priority): nginx found no free slot, so the lane's control plane should look now.
        self.lane_overflow: Callable[[tuple[str, str]], None] = lambda key: None
        self.carried = 0  # admitted and reported ended by nginx
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        loop = asyncio.get_running_loop()
        # A burst opens one connection per request before nginx's keep-alive pool has any: asyncio's
        # default backlog (100) overflowed under 200 at once and nginx's connect failed with EAGAIN
        # ("resource temporarily unavailable", a 503). Room for every connection nginx may hold (the
        # kernel caps it at net.core.somaxconn).
        self._server = await loop.create_unix_server(lambda: _Connection(self), path=str(self.path),
                                                     backlog=WORKER_CONNECTIONS)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.release_all("cancelled")

    def release_all(self, outcome: str) -> None:
        """nginx went away (a crash, a restart, the sidecar's stop): its requests' ends will never
        be reported, so every reservation it held goes back now, lingering as a cut request's does."""
        held, self.held = self.held, {}
        for admission, ticket in held.values():
            ticket.abandoned(outcome)
            _run_now(admission.__aexit__(None, None, None))
        if held:
            log.warning("the native front's %d request(s) in flight were released (%s)", len(held), outcome)

    def status(self) -> dict[str, int]:
        return {"in_flight": len(self.held), "carried": self.carried}

    def handle(self, conn: _Connection, fields: list[str], body: bytes) -> None:
        """One whole message from nginx (its fields and body). Raises `Unreadable` for one that
        cannot be read, after answering or releasing what it could (see the module docstring)."""
        kind = fields[0]
        if kind == "ok":
            conn.unconfirmed = None
        elif kind == "admit":
            if len(fields) != FIELDS["admit"] or fields[2] not in OPS:
                what = (f"{len(fields)} fields, {FIELDS['admit']} expected" if len(fields) != FIELDS["admit"]
                        else f"op {fields[2]!r}, none of {sorted(OPS)}")
                error = f"the native front sent a decision the sidecar cannot read ({what})"
                grpc_op = len(fields) > 2 and fields[2] == GRPC_INFER
                conn.answer(_refusal(Answer(_GRPC_INTERNAL, error.encode(), []) if grpc_op
                                     else Answer.json(500, {"error": error, "reason": "front_protocol"})))
                raise Unreadable(f"admit: {what}")
            self.decide(conn, fields, body)
        elif kind == "first":
            self.first(*_numbers(fields, "id"))
        elif kind == "req":
            self.inner_request(*_numbers(fields, "id", "microseconds", "first response microseconds"), body)
        elif kind == "stream":
            self.stream_requests(*_numbers(fields, "id", "requests", "finals", "errors"))
        else:  # "end": its reservation goes back whatever else in it cannot be read
            rid = _number(fields, 1, "end", "id")
            try:
                if len(fields) != FIELDS["end"] or fields[4] not in (ENDED, DOWN):
                    raise Unreadable(f"end {rid}: {len(fields)} fields, how {fields[4:5]}")
                self.end(rid, _number(fields, 2, "end", "status"), _number(fields, 3, "end", "events"), fields[4], body)
            except Unreadable:
                self.end(rid, 0, 0, ERROR, body)
                raise

    def decide(self, conn: _Connection, fields: list[str], body: bytes) -> None:
        """One decision: answered now (admitted, or refused), or once the queue grants or refuses it."""
        _, model, op, klass, tenant, header_length, start, _size = fields
        before_s = before_sidecar_s(start, time.time())
        self.controller.metrics.front_wait.observe(before_s)
        policy = self.proxy.policy()
        refused: Callable[[Rejected], Answer]
        if op in (GRPC_INFER, GRPC_STREAM):
            metadata = tuple((k, v) for k, v in ((policy.class_header, klass), (policy.tenant_header, tenant)) if v)
            if self.grpc is None:
                conn.close()  # nginx serves gRPC only where the sidecar has a gRPC upstream
                return
            if op == GRPC_STREAM:
                path = stream_path(policy, native_front=True)
                if path.mode != CARRIED or path.model is None or relayed_for_its_class(policy, klass):
                    conn.answer(PASS)  # streams are relayed (a reload), or this one's class is in its requests
                    return
                prepared = self.grpc.prepare_stream(path.model, metadata)
            else:
                prepared = self.grpc.prepare_carried(body, metadata)
            refused = self.grpc.refused_carried
        else:
            headers = {}
            if klass:
                headers[policy.class_header] = klass
            if tenant:
                headers[policy.tenant_header] = tenant
            if header_length:
                headers[protocol.HEADER_LENGTH] = header_length
            prepared = self.proxy.prepare(op, model, headers, body)
            refused = HttpProxy.refused
        if isinstance(prepared, Answer):
            conn.answer(_refusal(prepared))
            return
        reading = prepared.reading  # the one reader's: the model, class and tenant admission judges
        if op in ("infer", GRPC_INFER) and not tenant and reading.priority is None:
            self.lane_overflow((reading.model, reading.klass))
        admission = self.controller.admit(reading.model, reading.klass, prepared.cost, reading.tenant, before_s)
        entering = admission.__aenter__()
        try:
            suspended = entering.send(None)  # in the common case it returns (or refuses) without waiting
        except StopIteration as done:
            self._granted(conn, admission, done.value, prepared, body, op)
            return
        except Rejected as rejected:
            conn.answer(_refusal(refused(rejected)))
            return
        waiting = asyncio.ensure_future(_rest_of(entering, suspended))  # queued: nginx holds the request meanwhile

        def settled(task: asyncio.Future[Ticket]) -> None:
            conn.waiting = None
            if task.cancelled():
                return  # the client left while queued: the queue dropped it
            error = task.exception()
            if isinstance(error, Rejected):
                conn.answer(_refusal(refused(error)))
            elif error is not None:
                log.error("a queued decision failed: %r", error)
                conn.close()
            else:
                self._granted(conn, admission, task.result(), prepared, body, op)
            conn.resume()

        conn.waiting = waiting
        waiting.add_done_callback(settled)

    def _granted(self, conn: _Connection, admission: Any, ticket: Ticket, prepared: Prepared, body: bytes,
                 op: str) -> None:
        ticket.started()
        if op == GRPC_STREAM:  # counted once, as it goes upstream
            self.controller.metrics.grpc_streams.labels(CARRIED).inc()
        self.held[ticket.id] = (admission, ticket)
        if conn.transport is None:  # granted as nginx's socket closed: the client left, nothing went upstream
            self.end(ticket.id, CLIENT_CLOSED, 0, UNSENT, b"")
            return
        conn.unconfirmed = ticket.id
        rewritten = prepared.body if prepared.body is not body else b""
        length = prepared.headers.get(protocol.HEADER_LENGTH, "") if rewritten else ""
        conn.answer(f"admit\t{ticket.id}\t{length}\t{len(rewritten)}\n".encode() + rewritten)

    def first(self, rid: int) -> None:
        held = self.held.get(rid)
        if held is not None:
            held[1].first_token()

    def inner_request(self, rid: int, microseconds: int, first_us: int, error: bytes) -> None:
        """A request inside a carried stream ended, as nginx read it from the response frames:
        counted as a request of its own (`_Admission.inner_request_ended`)."""
        held = self.held.get(rid)
        if held is not None:
            held[0].inner_request_ended(max(0, microseconds) / 1e6, max(0, first_us) / 1e6, error or None)

    def stream_requests(self, rid: int, requests: int, finals: int, errors: int) -> None:
        """How the requests inside a carried stream ended, as nginx read them from its response
        frames (sent just before the stream's end): `requests` seen, `finals` of them ended (final
        flag, or an error response), `errors` with an error response."""
        held = self.held.get(rid)
        if held is None:
            return
        held[0].inner_requests_seen(requests)
        model = self.controller.accounting.label(held[1].model)
        counter = self.controller.metrics.stream_requests
        for outcome, n in (("ended", finals - errors), ("error", errors), ("unfinished", requests - finals)):
            if n > 0:
                counter.labels(model, outcome).inc(n)

    def end(self, rid: int, status: int, events: int, how: str, error: bytes) -> None:
        """nginx reported the end of a request it carried (`how`: accounting's words, or ERROR for an
        end the sidecar could not read); an id it does not hold (already released) is ignored."""
        held = self.held.pop(rid, None)
        if held is None:
            return
        admission, ticket = held
        ticket.streamed(events)
        if how == ERROR:
            ticket.abandoned(ERROR)
        else:
            if how == DOWN:
                self.health.mark_down("the native front could not reach Triton")
            ticket.ended(how, status, error or None)
        if how != UNSENT:
            self.carried += 1
        _run_now(admission.__aexit__(None, None, None))


class _Connection(asyncio.Protocol):
    """One connection from nginx: its messages parsed as they come (no stream reader, no task per
    message: this is the sidecar's per-request cost). nginx sends the next message on a connection
    only after the answer to an `admit`; the background sender's connection carries only `first`
    and `end`."""

    def __init__(self, server: DecisionServer) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiting: asyncio.Future[Ticket] | None = None  # a queued admit
        self.unconfirmed: int | None = None  # a grant written here that nginx has not said it read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.resume()

    def resume(self) -> None:
        """Handle every whole message buffered, unless an admit waits for its grant."""
        buffer = self.buffer
        while self.waiting is None and self.transport is not None:
            at = buffer.find(b"\n")
            if at < 0:
                return
            fields = buffer[:at].decode("utf-8", errors="replace").split("\t")
            try:
                size = _body_size(fields)
            except Unreadable as err:  # where the next message starts is unknown: nothing more can be read
                log.error("the native front sent a message the sidecar cannot frame (%s); closing its connection", err)
                if fields[0] == "end" and len(fields) > 1 and fields[1].isdigit():
                    self.server.end(int(fields[1]), 0, 0, ERROR, b"")  # its reservation goes back all the same
                self.close()
                return
            if len(buffer) < at + 1 + size:
                return
            body = bytes(buffer[at + 1:at + 1 + size])
            del buffer[:at + 1 + size]
            try:
                self.server.handle(self, fields, body)
            except Unreadable as err:
                log.error("the native front sent a message the sidecar cannot read (%s); skipped", err)

    def answer(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        """Close nginx's connection; nothing more is read from it or written to it (the queue and an
        unconfirmed grant are let go when the transport says it is lost)."""
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiting is not None:
            self.waiting.cancel()  # the client left while queued (nginx closed its socket)
        if self.unconfirmed is not None:  # the client left as it was granted: nothing went upstream
            self.server.end(self.unconfirmed, CLIENT_CLOSED, 0, UNSENT, b"")
            self.unconfirmed = None


class _Resumed:
    """The rest of a coroutine that suspended on `pending` (a future), as an awaitable a task can
    drive: what asyncio's Task does for a coroutine it started, for one started by hand."""

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro, self.pending = coro, pending

    def __await__(self) -> Any:
        pending = self.pending
        while True:
            try:
                yield pending
            except BaseException as exc:  # the task was cancelled: the coroutine's own cleanup runs
                try:
                    pending = self.coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                pending = self.coro.send(None)
            except StopIteration as done:
                return done.value


async def _rest_of(coro: Any, pending: Any) -> Any:
    return await _Resumed(coro, pending)


def _run_now(coro: Any) -> Any:
    """Run a coroutine that never waits (the admission context's exit) to its end, here and now."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the admission context's exit waited; it must not")


def _body_size(fields: list[str]) -> int:
    """The length of the body after a message's line: the last field of an admit and an end, none
    for the others. `Unreadable` when the line cannot be framed (an unknown kind, a bad length)."""
    kind = fields[0]
    if kind not in FIELDS:
        raise Unreadable(f"unknown message {kind[:40]!r}")
    if kind not in WITH_BODY:
        return 0
    size = fields[-1]
    if not size.isdigit():
        raise Unreadable(f"{kind}'s body length {size[:40]!r} is not a number")
    return int(size)


def _number(fields: list[str], at: int, kind: str, name: str) -> int:
    try:
        return int(fields[at])
    except (IndexError, ValueError):
        raise Unreadable(f"{kind}'s {name} {fields[at:at + 1]} is not a number") from None


def _numbers(fields: list[str], *names: str) -> list[int]:
    """A message's numeric fields after its kind, named for the error; `Unreadable` for a wrong count."""
    kind = fields[0]
    if len(fields) != FIELDS[kind]:
        raise Unreadable(f"{kind}: {len(fields)} fields, {FIELDS[kind]} expected")
    return [_number(fields, at, kind, name) for at, name in enumerate(names, 1)]


def _refusal(answer: Answer) -> bytes:
    retry = next((v for k, v in answer.headers if k.lower() == "retry-after"), "")
    return f"refuse\t{answer.status}\t{retry}\t{len(answer.body)}\n".encode() + answer.body
