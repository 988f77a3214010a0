"""Triton's admin APIs behind both proxies (sidecar/admin_apis.py, http_proxy.py, grpc_proxy.py),
in front of a fake Triton in this process that records what reaches it (the token header must
not): refusals, the token, the policy's allow-list. In-process servers on loopback ports, so here
rather than in tests/unit (issue 33); the classifier and the policy are tested there."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from sidecar import admin_apis
from sidecar.grpc_proxy import GrpcProxy
from sidecar.metrics import SidecarMetrics
from tests.sidecar_rigs import (ADMIN_TOKEN, TRITON_GRPC_METHODS, TRITON_GRPC_SERVICE, TRITON_HTTP_PATHS, admission_parts,
                                policy_doc, started_grpc_server, started_http_proxy)
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy

pytestmark = pytest.mark.integration


@dataclass
class Seen:
    """What reached the fake Triton: (method or path, headers or metadata) per request."""

    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@asynccontextmanager
async def http_rig(policy: SidecarPolicy, token: str | None) -> AsyncIterator[tuple[str, Seen, SidecarMetrics]]:
    seen = Seen()

    async def upstream(request: web.Request) -> web.Response:
        seen.requests.append((request.raw_path, {k.lower(): v for k, v in request.headers.items()}))
        return web.json_response({"from": "triton", "path": request.raw_path})

    up_app = web.Application()
    up_app.router.add_route("*", "/{tail:.*}", upstream)
    runners = [web.AppRunner(up_app)]
    await runners[0].setup()
    await web.TCPSite(runners[0], "127.0.0.1", 0).start()
    upstream_port = runners[0].addresses[0][1]
    proxy, state, metrics = await started_http_proxy(upstream_port, policy, token=token)
    runners.append(web.AppRunner(proxy.application()))
    await runners[1].setup()
    await web.TCPSite(runners[1], "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runners[1].addresses[0][1]}", seen, metrics
    finally:
        await proxy.close()
        for runner in reversed(runners):
            await runner.cleanup()


def refused_count(metrics: SidecarMetrics, category: str, protocol: str) -> float:
    value = metrics.registry.get_sample_value("sidecar_admin_refused_total",
                                              {"category": category, "protocol": protocol})
    return value or 0.0


async def _get(session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.get(url, headers=headers or {}) as resp:
        return resp.status, await resp.json()


def test_http_without_a_configured_token_refuses_with_403() -> None:
    async def main() -> None:
        async with http_rig(parse_policy(policy_doc()), None) as (base, seen, metrics), \
                aiohttp.ClientSession() as session:
            for path, category in TRITON_HTTP_PATHS:
                if category not in admin_apis.SHUT:
                    continue
                status, body = await _get(session, base + path, {"Authorization": "Bearer anything"})
                assert status == 403, path
                assert body == admin_apis.refusal(category, "http", token_configured=False)[1]
            assert seen.requests == []  # none reached Triton
            assert refused_count(metrics, "shared-memory", "http") == 12
            assert refused_count(metrics, "model-repository", "http") == 5
            status, body = await _get(session, base + "/v2/models/ranker/config")  # not an admin API: passes
            assert status == 200 and body["from"] == "triton"

    asyncio.run(main())


def test_http_token_opens_and_is_not_forwarded() -> None:
    async def main() -> None:
        async with http_rig(parse_policy(policy_doc()), ADMIN_TOKEN) as (base, seen, metrics), \
                aiohttp.ClientSession() as session:
            url = base + "/v2/logging"
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Sidecar-Token": "wrong"}):
                async with session.get(url, headers=headers) as resp:
                    assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
                    body = await resp.json()
                assert body["reason"] == "admin_api_restricted" and body["category"] == "logging"
            assert seen.requests == [] and refused_count(metrics, "logging", "http") == 3
            sent = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Request-Id": "r-1"}
            assert await _get(session, url, sent) == (200, {"from": "triton", "path": "/v2/logging"})
            path, headers = seen.requests[-1]
            assert "authorization" not in headers and headers["x-request-id"] == "r-1"
            sent = {"X-Sidecar-Token": ADMIN_TOKEN, "Authorization": "Basic for-triton"}
            assert (await _get(session, base + "/v2/repository/index", sent))[0] == 200
            path, headers = seen.requests[-1]
            assert path == "/v2/repository/index"
            assert "x-sidecar-token" not in headers and headers["authorization"] == "Basic for-triton"
            assert refused_count(metrics, "logging", "http") == 3

    asyncio.run(main())


def test_http_dot_segments_do_not_slip_past() -> None:
    """`/v2/models/x/../../logging` would reach Triton as `/v2/logging` (the client session resolves
    dot segments): it is refused as logging."""

    async def main() -> None:
        async with http_rig(parse_policy(policy_doc()), ADMIN_TOKEN) as (base, seen, _):
            host, port = base.removeprefix("http://").split(":")
            for raw in ("/v2/models/x/../../logging", "/v2/models/x/%2e%2e/%2e%2e/repository/index",
                        "/v2/models/m/../trace/setting"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(f"GET {raw} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                await writer.drain()
                reply = await reader.read()
                writer.close()
                assert reply.startswith(b"HTTP/1.1 401"), (raw, reply)
                assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["reason"] == "admin_api_restricted"
            assert seen.requests == []

    asyncio.run(main())


def test_http_policy_opens_a_category_for_everyone() -> None:
    async def main() -> None:
        policy = parse_policy(policy_doc(admin_apis={"open": ["trace"]}))
        async with http_rig(policy, ADMIN_TOKEN) as (base, seen, metrics), aiohttp.ClientSession() as session:
            assert (await _get(session, base + "/v2/trace/setting"))[0] == 200
            assert (await _get(session, base + "/v2/models/ranker/trace/setting"))[0] == 200
            status, body = await _get(session, base + "/v2/logging")
            assert status == 401 and body["category"] == "logging"
            assert [p for p, _ in seen.requests] == ["/v2/trace/setting", "/v2/models/ranker/trace/setting"]
            assert refused_count(metrics, "trace", "http") == 0

    asyncio.run(main())


@asynccontextmanager
async def grpc_rig(
    policy: SidecarPolicy, token: str | None
) -> AsyncIterator[tuple[grpc.aio.Channel, Seen, SidecarMetrics]]:
    seen = Seen()

    class _Upstream(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            method = details.method

            async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                metadata = dict(context.invocation_metadata() or ())
                seen.requests.append((method, metadata))
                if "x-answer-unavailable" in metadata:  # as Triton answers a load with polling on
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "explicit model load / unload is not allowed")
                return b""  # an empty message of any response type

            return grpc.unary_unary_rpc_method_handler(answer)

    upstream, upstream_port = await started_grpc_server(_Upstream())
    _, metrics, controller, health = await admission_parts(policy)
    proxy = GrpcProxy(f"127.0.0.1:{upstream_port}", controller, health, metrics, lambda: policy, token=token)
    await proxy.start()
    server, port = await started_grpc_server(proxy.handler())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, seen, metrics
    finally:
        await channel.close()
        await server.stop(grace=None)
        await proxy.close()
        await upstream.stop(grace=None)


async def _call(channel: grpc.aio.Channel, name: str, metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
    return await channel.unary_unary(TRITON_GRPC_SERVICE + name)(b"", metadata=metadata, timeout=10)


def test_grpc_admin_methods_are_refused_then_served_with_the_token() -> None:
    admin_methods = [m for m, c in TRITON_GRPC_METHODS.items() if c in admin_apis.SHUT]
    assert len(admin_methods) == 11

    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc()), ADMIN_TOKEN) as (channel, seen, metrics):
            for name in admin_methods:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _call(channel, name, (("authorization", "Bearer wrong"),))
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
                body = json.loads(err.value.details() or "")
                assert body == admin_apis.refusal(TRITON_GRPC_METHODS[name], "grpc", token_configured=True)[1]
            assert seen.requests == []
            assert refused_count(metrics, "shared-memory", "grpc") == 6
            for name in admin_methods:
                await _call(channel, name, (("authorization", f"Bearer {ADMIN_TOKEN}"), ("x-request-id", name)))
                method, metadata = seen.requests[-1]
                assert method == TRITON_GRPC_SERVICE + name and metadata["x-request-id"] == name
                assert "authorization" not in metadata
            await _call(channel, "LogSettings",
                        (("x-sidecar-token", ADMIN_TOKEN), ("authorization", "Basic for-triton")))
            _, metadata = seen.requests[-1]
            assert "x-sidecar-token" not in metadata and metadata["authorization"] == "Basic for-triton"
            await _call(channel, "ServerMetadata")  # not an admin method: passes without a token
            assert seen.requests[-1][0] == TRITON_GRPC_SERVICE + "ServerMetadata"

    asyncio.run(main())


def test_grpc_without_a_configured_token_and_with_the_allow_list() -> None:
    async def main() -> None:
        policy = parse_policy(policy_doc(admin_apis={"open": ["model-repository"]}))
        async with grpc_rig(policy, None) as (channel, seen, metrics):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(channel, "TraceSetting", (("authorization", "Bearer anything"),))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert json.loads(err.value.details() or "")["category"] == "trace"
            assert "--token-file" in json.loads(err.value.details() or "")["error"]
            await _call(channel, "RepositoryIndex")
            await _call(channel, "RepositoryModelLoad")
            assert [m for m, _ in seen.requests] == [TRITON_GRPC_SERVICE + m for m in
                                                     ("RepositoryIndex", "RepositoryModelLoad")]
            assert refused_count(metrics, "trace", "grpc") == 1
            assert refused_count(metrics, "model-repository", "grpc") == 0

    asyncio.run(main())


def test_grpc_unavailable_answered_by_triton_is_not_an_outage() -> None:
    """Triton answers RepositoryModelLoad UNAVAILABLE when model control is not explicit: the client
    gets that answer, and the sidecar does not take Triton for down (the connection is fine)."""

    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc()), ADMIN_TOKEN) as (channel, seen, metrics):
            auth = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(channel, "RepositoryModelLoad", (*auth, ("x-answer-unavailable", "1")))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "explicit model load / unload is not allowed"
            await _call(channel, "RepositoryIndex", auth)  # still served: reaches Triton
            await _call(channel, "ServerMetadata")
            assert [m for m, _ in seen.requests] == [TRITON_GRPC_SERVICE + m for m in
                                                     ("RepositoryModelLoad", "RepositoryIndex", "ServerMetadata")]
            assert metrics.registry.get_sample_value("sidecar_requests_upstream_unavailable_total",
                                                     {"protocol": "grpc"}) in (None, 0.0)

    asyncio.run(main())
