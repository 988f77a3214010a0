"""The lean HTTP front (sidecar/http_front.py) before the real HttpProxy and a fake Triton: the hot
path answers as the aiohttp handler does, keep-alive and pipelining hold, everything else reaches
aiohttp byte for byte (relayed, or tunnelled when the front does not parse it), and a client that
goes away releases its reservation. In-process servers on a loopback port, so here rather than in
tests/unit (issue 33); the head parser and the response framing are tested there."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web

from sidecar.admission import AdmissionState
from sidecar.http_front import HttpFront
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy
from tests.sidecar_rigs import policy_doc, started_http_proxy

pytestmark = pytest.mark.integration

INFER = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1.0]}]}'


@dataclass
class Rig:
    host: str
    port: int
    state: AdmissionState
    release: asyncio.Event
    seen: list[bytes]

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)


def _policy() -> SidecarPolicy:
    return parse_policy(policy_doc())


@asynccontextmanager
async def rig(policy: SidecarPolicy | None = None) -> AsyncIterator[Rig]:
    policy = policy or _policy()
    release = asyncio.Event()
    seen: list[bytes] = []

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(body)
        if request.headers.get("x-hold"):
            await release.wait()
        return web.json_response({"model_name": request.match_info["model"], "echo": len(body)},
                                 headers={"x-upstream": "yes"})

    async def stream(request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        if model == "bad":
            return web.json_response({"error": "unexpected input"}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f'data: {{"text_output": "t{i}"}}\n\n'.encode())
            if model == "cut":  # Triton dies between two events
                assert request.transport is not None
                request.transport.abort()
                return response
            if request.headers.get("x-hold"):
                await release.wait()
        await response.write_eof()
        return response

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="")

    upstream = web.Application()
    upstream.router.add_post("/v2/models/{model}/infer", infer)
    upstream.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    upstream.router.add_post("/v2/models/{model}/generate_stream", stream)
    upstream.router.add_get("/v2/health/ready", ready)
    up_runner = web.AppRunner(upstream)
    await up_runner.setup()
    await web.TCPSite(up_runner, "127.0.0.1", 0).start()
    upstream_port = up_runner.addresses[0][1]

    proxy, state, metrics = await started_http_proxy(upstream_port, policy, token=None)
    limits = policy.limits
    runner = web.AppRunner(proxy.application(), handler_cancellation=True, max_line_size=limits.max_header_bytes,
                           max_field_size=limits.max_header_bytes)
    await runner.setup()
    folder = tempfile.mkdtemp(prefix="front-test-")
    path = os.path.join(folder, "http.sock")
    await web.UnixSite(runner, path).start()
    front = HttpFront(proxy, path, lambda: policy.limits)
    port = await front.start("127.0.0.1", 0)
    try:
        yield Rig("127.0.0.1", port, state, release, seen)
    finally:
        release.set()
        await front.close()
        await proxy.close()
        await runner.cleanup()
        await up_runner.cleanup()
        os.unlink(path) if os.path.exists(path) else None
        os.rmdir(folder)


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers (lower-case names), body (Content-Length or chunked)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, headers, body
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return status, headers, await reader.read()


def _idle(state: AdmissionState) -> tuple[int, int, int]:
    return state.inflight, state.reserved_bytes, state.waiting


async def _until_idle(state: AdmissionState) -> None:
    """Until nothing is in flight, reserved or waiting (a cancelled request is released a moment later)."""
    for _ in range(200):
        if _idle(state) == (0, 0, 0):
            return
        await asyncio.sleep(0.01)
    assert _idle(state) == (0, 0, 0)


def test_the_hot_path_answers_with_the_upstream_headers_and_keeps_the_connection() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            for _ in range(3):
                writer.write(_post("/v2/models/cls/infer", INFER))
                status, headers, body = await _response(reader)
                assert status == 200 and headers["x-upstream"] == "yes"
                assert json.loads(body) == {"model_name": "cls", "echo": len(INFER)}
                assert "connection" not in headers
            writer.close()
            assert r.seen == [INFER] * 3
            assert _idle(r.state) == (0, 0, 0)

    asyncio.run(main())


def test_pipelined_requests_are_answered_in_order() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", INFER) + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                         + _post("/v2/models/other/versions/1/infer", INFER))
            first, second, third = [await _response(reader) for _ in range(3)]
            assert first[0] == 200 and json.loads(first[2])["model_name"] == "cls"
            assert second[0] == 200 and second[2] == b""
            assert third[0] == 200 and json.loads(third[2])["model_name"] == "other"
            writer.close()

    asyncio.run(main())


def test_a_stream_is_relayed_and_the_connection_serves_the_next_request() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/generate_stream", b'{"text_input": "hi"}'))
            status, headers, body = await _response(reader)
            assert status == 200 and headers["content-type"].startswith("text/event-stream")
            assert body.count(b"data:") == 3
            writer.write(_post("/v2/models/cls/infer", INFER))
            status, _, body = await _response(reader)
            assert status == 200 and json.loads(body)["echo"] == len(INFER)
            writer.close()
            assert _idle(r.state) == (0, 0, 0)

    asyncio.run(main())


def test_a_stream_cut_by_triton_ends_with_an_error_event_and_errors_come_back_whole() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/bad/generate_stream", b'{"text_input": "hi"}'))
            status, _, body = await _response(reader)
            assert status == 400 and json.loads(body) == {"error": "unexpected input"}
            writer.write(_post("/v2/models/cut/generate_stream", b'{"text_input": "hi"}'))
            status, _, body = await _response(reader)  # the same connection still serves
            assert status == 200 and body.count(b"data:") == 2 and b"Triton failed mid-stream" in body
            writer.write(_post("/v2/models/cls/infer", INFER))  # and after: Triton is marked down until probed
            assert (await _response(reader))[0] == 503
            writer.close()
            assert _idle(r.state) == (0, 0, 0)

    asyncio.run(main())


def test_a_client_gone_mid_stream_releases_its_reservation() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/generate_stream", b'{"text_input": "hi"}', "x-hold: 1"))
            await reader.readuntil(b"data:")
            assert r.state.inflight == 1
            writer.close()
            await _until_idle(r.state)

    asyncio.run(main())


def test_what_the_front_does_not_parse_reaches_aiohttp_through_a_tunnel() -> None:
    async def main() -> None:
        async with rig() as r:
            # a chunked request body
            reader, writer = await r.connect()
            half = len(INFER) // 2
            writer.write(b"POST /v2/models/cls/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, INFER[:half], len(INFER) - half, INFER[half:]))
            status, _, body = await _response(reader)
            assert status == 200 and json.loads(body)["echo"] == len(INFER)
            writer.write(_post("/v2/models/cls/infer", INFER))  # the tunnel carries the next one too
            assert (await _response(reader))[0] == 200
            writer.close()
            # Expect: 100-continue
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", b"", "Expect: 100-continue").replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(INFER)))
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            writer.write(INFER)
            assert (await _response(reader))[0] == 200
            writer.close()
            # a malformed head: aiohttp's 400
            reader, writer = await r.connect()
            writer.write(b"POST /v2/models/cls/infer HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
            assert (await _response(reader))[0] == 400
            writer.close()
            # HTTP/1.0
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", INFER).replace(b"HTTP/1.1", b"HTTP/1.0"))
            assert (await reader.read()).startswith(b"HTTP/1.0 200")
            writer.close()
            assert _idle(r.state) == (0, 0, 0)

    asyncio.run(main())


def test_connection_close_and_oversized_bodies() -> None:
    async def main() -> None:
        policy = parse_policy(policy_doc(limits={"max_body_bytes": 1024, "max_header_bytes": 8192}))
        async with rig(policy) as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", INFER, "Connection: close"))
            status, headers, _ = await _response(reader)
            assert status == 200 and headers["connection"] == "close"
            assert await reader.read() == b""  # and the front closed it
            writer.close()
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", b"x" * 2000))
            assert (await _response(reader))[0] == 413
            writer.close()
            assert r.seen == [INFER]

    asyncio.run(main())


def test_a_client_gone_mid_request_releases_its_reservation() -> None:
    async def main() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            writer.write(_post("/v2/models/cls/infer", INFER, "x-hold: 1"))
            for _ in range(200):
                if r.state.inflight:
                    break
                await asyncio.sleep(0.01)
            assert r.state.inflight == 1
            writer.close()
            await _until_idle(r.state)

    asyncio.run(main())
