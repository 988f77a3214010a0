"""Keep-alive HTTP/1.1 connections to Triton for unary requests: the sidecar's hot path.

Why not aiohttp's client, which the sidecar uses for streams and pass-through: per request it
builds request and response objects, a URL, cookie and trace hooks and timers, which cost about as
much CPU as everything else the sidecar does (profiled: ~40% of the sidecar's time per unary
infer). A unary infer needs far less: write the request bytes on an idle connection, read the
status line and headers, then exactly `Content-Length` body bytes (or the chunks of a chunked
body, or up to the close when the server sends neither). Bodies are bytes in, bytes out:
tensors, binary tensor data and compressed bodies pass through untouched.

Connections are reused only after a complete response on a connection the server keeps open. A
request that is cancelled (client gone) or fails mid-way closes its connection, so a late answer
can never be read as the next request's. Failures raise `UpstreamConnectionError`, which the proxy
treats as "Triton is down" (503 and the health probe), as it does aiohttp's connection errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

P = TypeVar("P", bound=asyncio.Protocol)

MAX_HEAD_BYTES = 64 * 1024  # status line + headers of one response; Triton sends a few hundred bytes


class UpstreamConnectionError(ConnectionError):
    """The upstream connection failed, closed early, or answered something that is not HTTP/1.x."""


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.closed = False
        self.reusable = False
        self._head: tuple[int, list[tuple[str, str]], int | None, bool, bool] | None = None
        self._body_from = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is not None and not self.waiter.done():
            try:
                self._advance(eof=False)
            except UpstreamConnectionError as err:
                self._fail(err)

    def eof_received(self) -> bool | None:
        self._finish_at_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish_at_eof(exc)

    # -- one exchange -------------------------------------------------------------------------

    def send(self, data: Iterable[bytes]) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        self.buffer.clear()
        self._head = None
        self.reusable = False
        self.waiter = self.loop.create_future()
        # One write, one segment for a small request: Triton reads the head and the body together
        # instead of waking twice (the copy costs microseconds even for large tensors).
        self.transport.write(b"".join(data))
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _finish_at_eof(self, exc: Exception | None = None) -> None:
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        try:
            if self._head is not None and self._head[2] is None and not self._head[3]:
                self._complete(len(self.buffer))  # no length, not chunked: the body ends at the close
                return
            self._advance(eof=True)
        except UpstreamConnectionError as err:
            self._fail(err)
            return
        if not self.waiter.done():
            reason = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
            self._fail(UpstreamConnectionError(f"upstream closed mid-response ({reason})"))

    def _fail(self, err: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
        self.close()

    def _advance(self, eof: bool) -> None:
        if self._head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise UpstreamConnectionError("upstream response headers exceed 64 KiB")
                return
            self._head = _parse_head(bytes(self.buffer[:end]))
            self._body_from = end + 4
        status, _, length, chunked, _ = self._head
        if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue, 103): the real one follows
            del self.buffer[: self._body_from]
            self._head, self._body_from = None, 0
            self._advance(eof)
            return
        if status in (204, 304) or status == 101:
            self._complete(self._body_from, body=b"")
        elif length is not None:
            if len(self.buffer) - self._body_from >= length:
                self._complete(self._body_from + length)
        elif chunked:
            body = _dechunk(self.buffer, self._body_from)
            if body is not None:
                self._complete(len(self.buffer), body=body)

    def _complete(self, end: int, body: bytes | None = None) -> None:
        assert self._head is not None and self.waiter is not None
        status, headers, length, chunked, keep_alive = self._head
        if body is None:
            body = bytes(self.buffer[self._body_from:end])
        # Reusable only when the response was framed (length or chunks) and nothing trails it.
        self.reusable = keep_alive and (length is not None or chunked or status in (204, 304)) and \
            end == len(self.buffer) and not self.closed
        self.waiter.set_result(UpstreamResponse(status, headers, body))


def _parse_head(head: bytes) -> tuple[int, list[tuple[str, str]], int | None, bool, bool]:
    """(status, headers, content length or None, chunked?, keep-alive?) of a response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamConnectionError(f"upstream answered something that is not HTTP/1.x: {lines[0][:80]!r}")
    status = int(parts[1])
    keep_alive = parts[0] != b"HTTP/1.0"
    headers: list[tuple[str, str]] = []
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UpstreamConnectionError(f"malformed upstream header line: {line[:80]!r}")
        key = name.strip().decode("latin-1")
        text = value.strip().decode("utf-8", "replace")
        lower = key.lower()
        if lower == "content-length":
            if not text.isdigit():
                raise UpstreamConnectionError(f"malformed upstream Content-Length: {text[:40]!r}")
            length = int(text)
        elif lower == "transfer-encoding":
            chunked = "chunked" in text.lower()
        elif lower == "connection":
            keep_alive = "close" not in text.lower() and (keep_alive or "keep-alive" in text.lower())
        headers.append((key, text))
    if chunked:
        length = None  # RFC 9112: Transfer-Encoding overrides Content-Length
    return status, headers, length, chunked, keep_alive


def _dechunk(buffer: bytearray, start: int) -> bytes | None:
    """The body of a complete chunked message starting at `start`, or None while it is incomplete."""
    out = bytearray()
    pos = start
    while True:
        eol = buffer.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buffer[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise UpstreamConnectionError(f"malformed chunk size from upstream: {size_text[:20]!r}") from None
        pos = eol + 2
        if size == 0:  # then optional trailer lines and an empty line
            if len(buffer) < pos + 2:
                return None
            if buffer[pos:pos + 2] == b"\r\n" or buffer.find(b"\r\n\r\n", pos) >= 0:
                return bytes(out)
            return None
        if len(buffer) < pos + size + 2:
            return None
        out += buffer[pos:pos + size]
        pos += size + 2


class ResponseFraming:
    """Finds the end of a response relayed byte for byte (the sidecar's HTTP front): Content-Length,
    chunked, or the close. Fed the response's bytes as they come; never copies the body."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.in_head = True
        self.status = 0
        self.remaining: int | None = None  # body bytes left (Content-Length)
        self.chunked = False
        self.until_close = False
        self.close_after = False
        self._chunk_left = 0
        self._line = bytearray()
        self._state = "size"  # size / data / crlf / trailer
        self.done = False

    def feed(self, data: bytes, head_request: bool) -> None:
        """Advances over `data` (all of it belongs to this response: the backend answers one request
        at a time and sends nothing after it)."""
        view = memoryview(data)
        if self.in_head:
            self.head += view
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.in_head = False
            rest = bytes(self.head[end + 4:])
            self._read_head(bytes(self.head[:end]), head_request)
            view = memoryview(rest)
        if self.done or self.until_close:
            return
        if self.remaining is not None:
            self.remaining -= len(view)
            self.done = self.remaining <= 0
            return
        self._chunks(view)

    def _read_head(self, head: bytes, head_request: bool) -> None:
        status, _, length, self.chunked, keep_alive = _parse_head(head)
        self.status = status
        self.close_after = not keep_alive
        if head_request or status in (204, 304) or 100 <= status < 200:
            self.done = True
        elif self.chunked:
            pass
        elif length is not None:
            self.remaining = length
            self.done = length == 0
        else:
            self.until_close = True
            self.close_after = True

    def _chunks(self, view: memoryview) -> None:
        i, n = 0, len(view)
        while i < n and not self.done:
            if self._state == "data":
                take = min(self._chunk_left, n - i)
                self._chunk_left -= take
                i += take
                if self._chunk_left == 0:
                    self._state = "crlf"
                    self._line.clear()
                continue
            byte = view[i]
            i += 1
            self._line.append(byte)
            if not self._line.endswith(b"\r\n"):
                continue
            line = bytes(self._line[:-2])
            self._line.clear()
            if self._state == "size":
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self._state = "trailer"
                else:
                    self._chunk_left, self._state = size, "data"
            elif self._state == "crlf":
                self._state = "size"
            elif not line:  # trailer: the empty line ends the response
                self.done = True


    @property
    def at_boundary(self) -> bool:
        """Between two chunks of a chunked body: an extra chunk written now is well framed."""
        return self.chunked and not self.in_head and not self.done and self._state == "size" and not self._line


class UpstreamPool:
    """Idle keep-alive connections to one upstream, opened on demand, unbounded like the proxy's
    aiohttp connector (admission, not the pool, bounds what is in flight)."""

    def __init__(self, host: str, port: int, max_idle: int = 256) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._host_header = f"Host: {host}:{port}\r\n".encode("latin-1")

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        return await self.connect(lambda: _Connection(loop))

    async def connect(self, factory: Callable[[], P]) -> P:
        """A new connection to the upstream speaking `factory`'s protocol (the pool's own, or the
        HTTP front's stream connections); UpstreamConnectionError when it cannot be opened in 3 s."""
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(loop.create_connection(factory, self.host, self.port), timeout=3.0)
        except (OSError, asyncio.TimeoutError) as err:
            raise UpstreamConnectionError(f"cannot connect to {self.host}:{self.port}: {err or type(err).__name__}") \
                from None
        return protocol

    def request_head(self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
        """The request line and headers `request` sends (Host and Content-Length added)."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        # aiohttp's server decoded the client's header bytes as UTF-8 with surrogateescape (the HTTP
        # front does the same): this writes back the very bytes the client sent.
        head.extend(f"{k}: {v}\r\n".encode("utf-8", "surrogateescape") for k, v in headers)
        head.append(f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1"))
        return b"".join(head)

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> UpstreamResponse:
        """Send one request and return the whole response. `headers` must not hold Host,
        Content-Length or hop-by-hop headers (the caller filters them)."""
        # An idle connection without a coroutine of its own: the common case, on every request.
        conn = self._idle_connection() or await self._connect()
        done = False
        try:
            response = await conn.send((self.request_head(method, target, headers, body), body))
            done = True
        finally:
            if not done or not conn.reusable or len(self._idle) >= self.max_idle:
                conn.close()
            else:
                self._idle.append(conn)
        return response

    def reset(self) -> None:
        """Close every idle connection (Triton restarted: they lead to a dead process)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
