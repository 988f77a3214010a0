"""The sidecar's lean keep-alive client (sidecar/upstream_pool.py) against raw TCP servers that
answer exactly the bytes each case needs: framing, reuse, fragmentation, failures, cancellation.
In-process servers on loopback ports, so here rather than in tests/unit (issue 33); the head parser
and the dechunker are tested there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sidecar.upstream_pool import UpstreamConnectionError, UpstreamPool

pytestmark = pytest.mark.integration

Step = bytes | Callable[[], Awaitable[None]]  # a chunk to write, or something to await between chunks


class RawServer:
    """Reads one request head + Content-Length body per turn and writes the scripted chunks; a
    script may put an awaitable step between chunks (to hold the answer until the test says)."""

    def __init__(self, script: Callable[[int, bytes], list[Step] | None]) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                chunks = self.script(len(self.requests), head + body)
                if chunks is None:  # hang up without answering
                    writer.close()
                    return
                for chunk in chunks:
                    if not isinstance(chunk, bytes):
                        await chunk()
                        continue
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(0.005)  # the client sees the answer in fragments
                if any(isinstance(c, bytes) and b"Connection: close" in c for c in chunks):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def ok(body: bytes, extra: bytes = b"") -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body)
    return [head[:10], head[10:], body[:3], body[3:]]


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_content_length_responses_reuse_one_connection_and_keep_headers_and_bytes() -> None:
    payload = bytes(range(256)) * 4  # binary data passes untouched

    async def main() -> None:
        async with RawServer(lambda n, req: ok(payload, b"X-Id: r%d\r\n" % n)) as srv:
            pool = UpstreamPool("127.0.0.1", srv.port)
            for n in (1, 2, 3):
                resp = await pool.request("POST", "/v2/models/m/infer?x=1", [("Content-Type", "application/json"),
                                                                               ("X-Trace", "é")], b"\x00\x01body")
                assert resp.status == 200 and resp.body == payload
                assert ("X-Id", f"r{n}") in resp.headers
            assert srv.connections == 1
            first = srv.requests[0]
            assert first.startswith(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"Content-Length: 6\r\n\r\n\x00\x01body" in first
            assert "X-Trace: é".encode() in first
            pool.reset()

    run(main())


def test_an_interim_100_continue_is_skipped_for_the_answer_after_it() -> None:
    """A server that says 100 Continue (or 103 Early Hints) before its answer: the answer is what
    comes back, and the connection stays in step for the next request."""

    async def main() -> None:
        script = lambda n, req: [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                                 *ok(b"answer %d" % n)]
        async with RawServer(script) as srv:
            pool = UpstreamPool("127.0.0.1", srv.port)
            for n in (1, 2):
                resp = await pool.request("POST", "/a", [], b"x")
                assert (resp.status, resp.body) == (200, b"answer %d" % n)
            assert srv.connections == 1
            pool.reset()

    run(main())


def test_chunked_and_close_delimited_bodies() -> None:
    chunked = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\r\nhello\r\n", b"6;ext=1\r\n world\r\n",
               b"0\r\nX-Trailer: t\r\n\r\n"]
    close_delimited = [b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n", b"no length"]

    async def main() -> None:
        async with RawServer(lambda n, req: chunked if n == 1 else close_delimited) as srv:
            pool = UpstreamPool("127.0.0.1", srv.port)
            first = await pool.request("POST", "/a", [], b"")
            assert (first.status, first.body) == (200, b"hello world")
            second = await pool.request("POST", "/b", [], b"")  # the chunked answer left the connection reusable
            assert (second.status, second.body) == (500, b"no length")
            assert srv.connections == 1
            third = await pool.request("POST", "/c", [], b"")  # Connection: close was honoured: a new one
            assert third.status == 500 and srv.connections == 2

    run(main())


def test_a_hang_up_or_garbage_is_a_connection_error_and_the_connection_is_not_reused() -> None:
    def script(n: int, req: bytes) -> list[bytes] | None:
        if n == 1:
            return None
        if n == 2:
            return [b"SSH-2.0-OpenSSH\r\n\r\n"]
        if n == 3:
            return [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort"]
        return ok(b"{}")

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool("127.0.0.1", srv.port)
            for _ in range(3):
                with pytest.raises(UpstreamConnectionError):
                    await pool.request("POST", "/x", [], b"")
            resp = await pool.request("POST", "/x", [], b"")
            assert resp.status == 200 and srv.connections == 4

    run(main())


def test_nothing_listening_is_a_connection_error() -> None:
    async def main() -> None:
        async with RawServer(lambda n, r: ok(b"")) as srv:
            port = srv.port
        with pytest.raises(UpstreamConnectionError, match="cannot connect"):
            await UpstreamPool("127.0.0.1", port).request("POST", "/x", [], b"")

    run(main())


def test_a_cancelled_request_closes_its_connection_so_a_late_answer_is_never_read() -> None:
    """Event-driven: the first answer stops after its first fragment until the request has been
    cancelled, so the cancel lands mid-answer on every run, however slow the host."""

    async def main() -> None:
        half_sent, cancelled = asyncio.Event(), asyncio.Event()

        async def mark_half_sent() -> None:
            half_sent.set()

        def script(n: int, req: bytes) -> list[Step]:
            chunks: list[Step] = list(ok(b'{"n": %d}' % n))
            if n == 1:  # hold the rest of the first answer until the client has given up on it
                chunks[1:1] = [mark_half_sent, cancelled.wait]
            return chunks

        async with RawServer(script) as srv:
            pool = UpstreamPool("127.0.0.1", srv.port)
            task = asyncio.create_task(pool.request("POST", "/x", [], b""))
            await asyncio.wait_for(half_sent.wait(), 10)  # sent, and its answer begun
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            cancelled.set()  # the late rest of the first answer goes out now, to nobody
            resp = await pool.request("POST", "/x", [], b"")
            assert resp.body == b'{"n": 2}' and srv.connections == 2

    run(main())
