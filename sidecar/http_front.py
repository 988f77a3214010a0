"""The sidecar's public HTTP listener: a lean HTTP/1.1 server for the hot path, aiohttp for the rest.
One unit (about 600 lines): one asyncio server whose head parser, hot-path relay, backend pool and
tunnel share each client connection's state; not split because the one-nginx data-plane project
rewrites the sidecar's data path and replaces this front whole.

Why: per unary infer, aiohttp's server (request and response objects, routing, header multidicts,
its handler task) cost the sidecar about as much CPU as the upstream relay and admission together
(measured: a bare aiohttp relay used ~220-300 us of CPU per request, the same relay on an
`asyncio.Protocol` ~70-130 us), and per streamed event aiohttp's client and `StreamResponse` cost
more again. On a host where the model shares the CPU, or at thousands of
requests a second, that CPU is the sidecar's cost to the user.

What the front serves itself: `POST /v2/models/<m>[/versions/<v>]/{infer,generate,generate_stream}`
over HTTP/1.1 with a `Content-Length` body (what tritonclient, perf_analyzer and most HTTP clients
send), no `Content-Encoding`, no `Expect`, no `Upgrade`, within the policy's body and header limits,
on a plain-HTTP upstream. Unary requests go through `HttpProxy.unary`; a stream is prepared by
`HttpProxy.prepare` and admitted by the same controller, then Triton's response is relayed byte for
byte on a connection of the front's own (its chunked framing untouched, events counted as they
pass, an error event and the last chunk written if Triton goes away between two chunks). So the
answers are the aiohttp handler's.

Everything else goes to the aiohttp application (`HttpProxy.application`) listening on a Unix
socket only this process knows, byte for byte:
  * a request with a whole body (Content-Length, or none) is relayed on a kept-alive backend
    connection, and its response is relayed back as it comes (server-sent events included), its
    end found from its own framing (Content-Length, chunked, or the backend closing);
  * anything the front does not parse (a chunked request body, `Expect: 100-continue`, `Upgrade`,
    HTTP/1.0, a malformed or oversized head) turns the client connection into a tunnel to the
    backend for the rest of its life, so aiohttp answers it exactly as it did before the front.
A client that goes away cancels its request (as aiohttp's `handler_cancellation` does) and closes
its backend connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import unquote

from multidict import CIMultiDict

from sidecar.controller import Rejected, Ticket, upstream_outcome
from sidecar.http_proxy import _SSE_ERROR, Answer, HttpProxy, _Prepared
from sidecar.upstream_pool import ResponseFraming, UpstreamConnectionError

log = logging.getLogger("tritongen.sidecar.http")

_MODEL_OP = re.compile(rb"^/v2/models/([^/?#]+)(?:/versions/[^/?#]+)?/(infer|generate|generate_stream)(?:\?[^#]*)?$")
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te",
                  "trailer", "proxy-connection"})
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
HEAD_SLACK = 64  # bytes of request line and framing allowed beyond the policy's header limit


class _Kept(Protocol):
    """What `_Idle` keeps: either kind of connection the front holds open."""

    closed: bool
    idle_since: float

    def close(self) -> None: ...


C = TypeVar("C", bound=_Kept)
BACKEND_IDLE = 64  # kept-alive connections to the aiohttp backend
BACKEND_IDLE_S = 30.0  # an idle backend connection older than this is closed, not reused (aiohttp's
# keep-alive timeout is 75 s: one it is about to close must never carry a request)
STOP_GRACE_S = 5.0  # at stop, requests in flight get this long to finish


def _answer_bytes(answer: Answer, keep_alive: bool) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (answer.status, _REASONS.get(answer.status, "Status").encode())]
    for name, value in answer.headers:
        if name.lower() not in _HOP:
            out.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
    out.append(b"Content-Length: %d\r\n" % len(answer.body))
    if not keep_alive:
        out.append(b"Connection: close\r\n")
    out.append(b"\r\n")
    out.append(answer.body)
    return b"".join(out)


class _Head:
    """A request head as the front reads it: enough to route, never a full HTTP parser."""

    __slots__ = ("method", "target", "version", "headers", "length", "plain", "close")

    def __init__(self, raw: bytes) -> None:
        lines = raw.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise ValueError("request line")
        self.method, self.target, self.version = parts
        self.headers: list[tuple[str, str]] = []
        self.length: int | None = None
        self.plain = self.version == b"HTTP/1.1"  # False: the front does not serve it itself
        self.close = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise ValueError("header line")
            key = name.decode("latin-1")
            text = value.strip().decode("utf-8", "surrogateescape")  # as aiohttp does
            lower = key.lower()
            if lower == "content-length":
                if not text.isdigit() or (self.length is not None and int(text) != self.length):
                    raise ValueError("content-length")
                self.length = int(text)
            elif lower in ("transfer-encoding", "expect", "upgrade", "content-encoding"):
                if lower != "content-encoding" or text.lower() != "identity":
                    self.plain = False
            elif lower == "connection":
                self.close = "close" in text.lower()
            self.headers.append((key, text))


class _Idle(Generic[C]):
    """Kept-alive connections of one kind (to the aiohttp backend, or to Triton for streams): at most
    `BACKEND_IDLE`, none reused after `BACKEND_IDLE_S` idle."""

    def __init__(self) -> None:
        self._conns: list[C] = []

    def take(self) -> C | None:
        now = time.monotonic()
        while self._conns:
            conn = self._conns.pop()
            if not conn.closed and now - conn.idle_since < BACKEND_IDLE_S:
                return conn
            conn.close()
        return None

    def put(self, conn: C, closing: bool) -> None:
        if closing or conn.closed or len(self._conns) >= BACKEND_IDLE:
            conn.close()
        else:
            conn.idle_since = time.monotonic()
            self._conns.append(conn)

    def close_all(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns.clear()


class _Backend(asyncio.Protocol):
    """One connection to the aiohttp backend, carrying one relayed request at a time (or a tunnel)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None
        self.framing: ResponseFraming | None = None
        self.head_request = False
        self.tunnel = False
        self.closed = False
        self.finished: asyncio.Future[bool] | None = None  # True: reusable
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:  # nothing asked: not HTTP we can follow
            self.close()
            return
        client.write(data)
        if self.tunnel or self.framing is None:
            return
        try:
            self.framing.feed(data, self.head_request)
        except (ValueError, IndexError, UpstreamConnectionError):
            self._end(False)
            return
        if self.framing.done:
            self._end(not self.framing.close_after)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.client is not None and (self.tunnel or (self.framing is not None and not self.framing.done)):
            self.client.close()  # a tunnel, or a response cut short (or close-delimited): the client's ends too
        self._end(False)

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client.pause_reading()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.resume_reading()

    def _end(self, reusable: bool) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(reusable and not self.closed)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class _Upstream(asyncio.Protocol):
    """One connection to Triton for streamed responses (generate_stream), one at a time: what
    arrives goes to `sink` as it comes, so the front relays Triton's bytes without a copy."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Callable[[bytes], None] | None = None
        self.on_lost: Callable[[], None] | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(data)
        else:  # nothing was asked: the connection is out of step
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_lost is not None:
            self.on_lost()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class _Client(asyncio.Protocol):
    """One client connection: requests one at a time, each served here or relayed to the backend."""

    def __init__(self, front: HttpFront) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.tunnel: _Backend | None = None
        self.relaying: _Backend | None = None
        self.streaming: _Upstream | None = None
        self.closed = False
        self._paused = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self._to_tunnel(data)
            return
        self.buffer += data
        if self.task is None:
            self._next()

    def eof_received(self) -> bool | None:
        if self.tunnel is not None and self.tunnel.transport is not None and not self.tunnel.closed:
            with contextlib.suppress(Exception):
                self.tunnel.transport.write_eof()
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.clients.discard(self)
        if self.task is not None:
            self.task.cancel()
        for backend in (self.tunnel, self.relaying):
            if backend is not None:
                backend.client = None
                backend.close()
        if self.streaming is not None:
            self.streaming.close()

    def pause_writing(self) -> None:
        for peer in (self.tunnel, self.relaying, self.streaming):
            if peer is not None and peer.transport is not None and not peer.closed:
                peer.transport.pause_reading()

    def resume_writing(self) -> None:
        for peer in (self.tunnel, self.relaying, self.streaming):
            if peer is not None and peer.transport is not None and not peer.closed:
                peer.transport.resume_reading()

    # -- helpers for the backend ------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    # -- requests -------------------------------------------------------------------------------

    def _next(self) -> None:
        """Starts the next request in the buffer, if it is all here."""
        if self.closed or not self.buffer:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > self.front.max_head_bytes():
                self._start_tunnel()
            return
        try:
            head = _Head(bytes(self.buffer[:end]))
        except (ValueError, UnicodeDecodeError):
            self._start_tunnel()
            return
        if not head.plain or end > self.front.max_head_bytes():
            self._start_tunnel()
            return
        length = head.length or 0
        if length > self.front.max_body_bytes():
            self._start_tunnel()
            return
        if len(self.buffer) < end + 4 + length:
            return
        raw_head = bytes(self.buffer[: end + 4])
        body = bytes(self.buffer[end + 4: end + 4 + length])
        del self.buffer[: end + 4 + length]
        match = _MODEL_OP.match(head.target) if head.method == b"POST" and self.front.hot_path else None
        if match is not None:
            self.task = asyncio.get_running_loop().create_task(self._serve(head, match, body))
        else:
            self.task = asyncio.get_running_loop().create_task(self._relay(head, raw_head, body))

    def _done(self, task_close: bool) -> None:
        self.task = None
        if task_close:
            self.close()
        elif not self.closed:
            self._next()

    async def _serve(self, head: _Head, match: re.Match[bytes], body: bytes) -> None:
        model, op = unquote(match.group(1).decode("latin-1")), match.group(2).decode()
        close = head.close
        try:
            if op == "generate_stream":
                close = await self._serve_stream(head, model, body)
            else:
                answer = await self.front.proxy.unary(
                    model, op, head.target.decode("latin-1"), CIMultiDict(head.headers), body,
                )
                self.write(_answer_bytes(answer, keep_alive=not close))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must cost one request a 500, never the connection's next requests
            log.exception("the HTTP front failed a request")
            close = close or op == "generate_stream"  # part of a stream may be out already
            self.write(_answer_bytes(Answer.json(500, {"error": "the sidecar failed this request; see its log"}),
                                     keep_alive=not close))
        self._done(close)

    async def _serve_stream(self, head: _Head, model: str, body: bytes) -> bool:
        """generate_stream: prepared and admitted as the aiohttp handler does, then Triton's response
        relayed byte for byte (its own chunked framing), counting events as it passes. True when the
        client's connection must close after it."""
        proxy = self.front.proxy
        close = head.close
        prepared = proxy.prepare("generate_stream", model, CIMultiDict(head.headers), body)
        if isinstance(prepared, Answer):
            self.write(_answer_bytes(prepared, keep_alive=not close))
            return close
        try:
            async with proxy.controller.admit(model, prepared.klass, prepared.cost, prepared.tenant) as ticket:
                return await self._stream(ticket, proxy.prefix + head.target.decode("latin-1"), prepared) or close
        except Rejected as rejected:
            self.write(_answer_bytes(proxy._refused(rejected, model, prepared), keep_alive=not close))
            return close

    async def _stream(self, ticket: Ticket, target: str, prepared: _Prepared) -> bool:
        """Relays one streamed response; True when the client's connection must close after it."""
        proxy, front = self.front.proxy, self.front
        try:
            up = await front.upstream()
        except UpstreamConnectionError as err:
            ticket.completed = True  # nothing went upstream
            ticket.outcome = "upstream_failed"
            proxy.health.mark_down(f"{type(err).__name__}: {err}")
            self.write(_answer_bytes(proxy._down(), keep_alive=True))
            return False
        framing = ResponseFraming()
        ended: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        error_body = bytearray()
        written = False

        def on_data(data: bytes) -> None:
            nonlocal written
            self.write(data)
            written = True
            try:
                framing.feed(data, False)
            except (ValueError, IndexError, UpstreamConnectionError):
                up.close()  # Triton's framing is broken: the connection is useless (on_lost ends it)
                return
            if not framing.in_head:
                events = data.count(b"data:")
                if events:
                    ticket.first_token()
                    ticket.tokens += events
                if framing.status >= 400:
                    if len(error_body) < 65536:
                        error_body.extend(data)
                elif _SSE_ERROR in data:  # the engine failed the request mid-stream
                    ticket.outcome = upstream_outcome(data)
            if framing.done and not ended.done():
                ended.set_result(not framing.close_after)

        def on_lost() -> None:
            if not ended.done():
                ended.set_result(None)

        up.sink, up.on_lost = on_data, on_lost
        self.streaming = up
        assert up.transport is not None and proxy.pool is not None
        ticket.sent = True
        up.transport.write(proxy.pool.request_head("POST", target, prepared.headers.items(), prepared.body)
                           + prepared.body)
        try:
            reusable = await ended
        except asyncio.CancelledError:
            up.close()
            raise
        finally:
            up.sink = up.on_lost = None
            self.streaming = None
        ticket.completed = True
        if reusable is None:  # Triton went away before the response ended
            ticket.outcome = "upstream_failed"
            proxy.health.mark_down("Triton closed the connection mid-stream")
            if not written:
                self.write(_answer_bytes(proxy._down(), keep_alive=True))
                return False
            if framing.at_boundary:
                event = b'data: {"error": "Triton failed mid-stream: the connection closed"}\n\n'
                self.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
                return False
            return True
        if framing.status >= 400:
            ticket.outcome = ticket.outcome or upstream_outcome(bytes(error_body))
        if reusable:
            front.give_back_upstream(up)
            return False
        up.close()
        return True  # Triton's own head said `Connection: close`, and the client got it verbatim

    async def _relay(self, head: _Head, raw_head: bytes, body: bytes) -> None:
        backend = await self.front.backend()
        if backend is None:
            self.write(_answer_bytes(Answer.json(503, {"error": "the sidecar is stopping"}), keep_alive=False))
            self._done(True)
            return
        self.relaying = backend
        backend.client = self
        backend.framing = ResponseFraming()
        backend.head_request = head.method == b"HEAD"
        finished = backend.finished = asyncio.get_running_loop().create_future()
        assert backend.transport is not None
        backend.transport.write(raw_head + body if body else raw_head)
        try:
            reusable = await finished
        finally:
            backend.client = None
            backend.framing = None
            self.relaying = None
        if reusable and not head.close:
            self.front.give_back(backend)
        else:
            backend.close()
        # not reusable: the response said `Connection: close`, ran to the backend's close, or was cut
        self._done(head.close or not reusable)

    def _start_tunnel(self) -> None:
        """Hands this connection to the backend for the rest of its life (see the module docstring)."""
        pending = bytes(self.buffer)
        self.buffer.clear()
        self.task = asyncio.get_running_loop().create_task(self._open_tunnel(pending))

    async def _open_tunnel(self, pending: bytes) -> None:
        backend = await self.front.backend(fresh=True)
        if backend is None:
            self.close()
            return
        backend.tunnel = True
        backend.client = self
        self.tunnel = backend
        self.task = None
        if self.closed:
            backend.close()
            return
        self._to_tunnel(pending + bytes(self.buffer))
        self.buffer.clear()

    def _to_tunnel(self, data: bytes) -> None:
        backend = self.tunnel
        if backend is None or backend.closed or backend.transport is None:
            self.close()
            return
        if data:
            backend.transport.write(data)


class HttpFront:
    """The public listener (see the module docstring). `start` binds host:port and returns the port."""

    def __init__(self, proxy: HttpProxy, backend_path: str, limits: Callable[[], Any]) -> None:
        self.proxy = proxy
        self.backend_path = backend_path
        self.limits = limits
        self.hot_path = proxy.pool is not None
        self.clients: set[_Client] = set()
        self._idle: _Idle[_Backend] = _Idle()
        self._streams: _Idle[_Upstream] = _Idle()
        self._server: asyncio.base_events.Server | None = None
        self._closing = False

    def max_head_bytes(self) -> int:
        return int(self.limits().max_header_bytes) + HEAD_SLACK

    def max_body_bytes(self) -> int:
        return int(self.limits().max_body_bytes)

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def backend(self, fresh: bool = False) -> _Backend | None:
        if self._closing:
            return None
        backend = None if fresh else self._idle.take()
        if backend is not None:
            return backend
        loop = asyncio.get_running_loop()
        try:
            _, backend = await loop.create_unix_connection(_Backend, self.backend_path)
        except OSError as err:
            log.error("the HTTP front cannot reach its backend at %s: %s", self.backend_path, err)
            return None
        return backend

    async def upstream(self) -> _Upstream:
        """A connection to Triton for a stream: an idle one, or a new one (UpstreamConnectionError)."""
        assert self.proxy.pool is not None
        return self._streams.take() or await self.proxy.pool.connect(_Upstream)

    def give_back_upstream(self, up: _Upstream) -> None:
        self._streams.put(up, self._closing)

    def give_back(self, backend: _Backend) -> None:
        self._idle.put(backend, self._closing)

    async def close(self) -> None:
        """Stops listening; idle connections close at once, requests in flight get `STOP_GRACE_S` to
        finish (then they are cancelled), and every connection closes."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            if client.task is None and client.tunnel is None:
                client.close()
        busy = [c.task for c in self.clients if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=STOP_GRACE_S)
        for client in list(self.clients):
            client.close()
        self._idle.close_all()
        self._streams.close_all()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
