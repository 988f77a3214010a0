"""The proxies in front of a fake Triton (in-process gRPC and HTTP servers that record what they
receive and answer with metadata of their own): gRPC metadata goes both ways untouched, request ids
come back, and the tenant header reaches admission on both protocols, with refusals naming the
tenant limit and nothing left reserved afterwards; a stream's requests end when Triton ends them,
whatever the client reads, and are answered UNAVAILABLE one by one when Triton is gone. In-process servers on loopback ports, so here
rather than in tests/unit (issue 33)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2 as pb

from sidecar.admission import AdmissionState
from sidecar.grpc_proxy import MODEL_INFER, MODEL_STREAM_INFER, SERVICE, GrpcProxy
from sidecar.metrics import SidecarMetrics
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy
from tests.sidecar_rigs import admission_parts, policy_doc, started_grpc_server, started_http_proxy

pytestmark = pytest.mark.integration

SERVER_METADATA = SERVICE + "ServerMetadata"
BIG_REPLIES, BIG_REPLY = 16, 256 << 10  # 4 MiB: more than a client that does not read takes in (about 3.75)
TENANTS = {"tenants": [{"name": "acme", "max_inflight": 1, "classes": ["interactive", "normal"]}]}


def tenant_policy() -> SidecarPolicy:
    doc = policy_doc(**TENANTS)
    for klass in doc["classes"]:
        klass["queue_cap"] = 0  # a request that cannot go at once is refused at once: no timing in these tests
    return parse_policy(doc)


# ------------------------------------------------------------------------------------------------
# a fake Triton on gRPC


@dataclass
class FakeTriton:
    """Answers with initial and trailing metadata of its own; records the metadata it was sent.
    A request whose id starts with "hold" waits for `release`."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    streamed: int = 0  # requests that reached it on streams
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def _record(self, context: grpc.aio.ServicerContext) -> None:
        self.seen.append(dict(context.invocation_metadata() or ()))

    async def infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._record(context)
        request = pb.ModelInferRequest.FromString(raw)
        if request.model_name == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "model 'missing' is not found",
                                trailing_metadata=(("x-upstream-error", "not-found"),))
        if request.id.startswith("hold"):
            self.started.set()
            await self.release.wait()
        await context.send_initial_metadata((("x-upstream-initial", f"i-{request.id}"),))
        context.set_trailing_metadata((("x-upstream-trailing", f"t-{request.id}"), ("x-trace-bin", b"\x00\x01")))
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        response.outputs.add(name="OUT", datatype="FP32", shape=[1])
        response.raw_output_contents.append(b"\x00\x00\x80\x3f")
        return response.SerializeToString()

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        self._record(context)
        first = True
        async for raw in requests:
            request = pb.ModelInferRequest.FromString(raw)
            self.streamed += 1
            if first:  # like a server that sends its headers with its first response
                await context.send_initial_metadata((("x-stream-initial", "hello"),))
                first = False
            # A request with the parameter "big" (a count) gets that many replies of BIG_REPLY bytes
            # before its final one.
            parts = request.parameters["big"].int64_param if "big" in request.parameters else 0
            for part in range(parts + 1):
                out = pb.ModelStreamInferResponse()
                out.infer_response.id = request.id
                out.infer_response.model_name = request.model_name
                out.infer_response.outputs.add(name="OUT", datatype="BYTES", shape=[1])
                body = b"x" * (BIG_REPLY if part < parts else 1)
                out.infer_response.raw_output_contents.append(len(body).to_bytes(4, "little") + body)
                out.infer_response.parameters["triton_final_response"].bool_param = part == parts
                await context.write(out.SerializeToString())
        context.set_trailing_metadata((("x-stream-trailing", "bye"),))

    async def server_metadata(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._record(context)
        await context.send_initial_metadata((("x-upstream-initial", "meta"),))
        context.set_trailing_metadata((("x-upstream-trailing", "meta"),))
        return pb.ServerMetadataResponse(name="fake-triton", version="0").SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        fake = self

        class _Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                if details.method == MODEL_INFER:
                    return grpc.unary_unary_rpc_method_handler(fake.infer)
                if details.method == MODEL_STREAM_INFER:
                    return grpc.stream_stream_rpc_method_handler(fake.stream)
                if details.method == SERVER_METADATA:
                    return grpc.unary_unary_rpc_method_handler(fake.server_metadata)
                return None

        return _Handler()



@dataclass
class GrpcRig:
    fake: FakeTriton
    state: AdmissionState
    metrics: SidecarMetrics
    channel: grpc.aio.Channel
    proxy: GrpcProxy
    upstream: grpc.aio.Server

    async def infer(self, rid: str, metadata: tuple[tuple[str, Any], ...] = (), model: str = "cls") -> Any:
        call = self.channel.unary_unary(MODEL_INFER)(
            pb.ModelInferRequest(model_name=model, id=rid).SerializeToString(), metadata=metadata, timeout=10
        )
        return call, pb.ModelInferResponse.FromString(await call)


@asynccontextmanager
async def grpc_rig(policy: SidecarPolicy) -> AsyncIterator[GrpcRig]:
    fake = FakeTriton()
    upstream, upstream_port = await started_grpc_server(fake.handler())
    state, metrics, controller, health = await admission_parts(policy)
    controller.start()
    proxy = GrpcProxy(f"127.0.0.1:{upstream_port}", controller, health, metrics, lambda: policy)
    await proxy.start()
    server, port = await started_grpc_server(proxy.handler())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield GrpcRig(fake, state, metrics, channel, proxy, upstream)
    finally:
        await channel.close()
        await server.stop(grace=None)
        await proxy.close()
        await controller.stop()
        await upstream.stop(grace=None)


async def settled(condition: Callable[[], Any], seconds: float = 5.0) -> None:
    """Until `condition()` holds or `seconds` pass; the caller asserts what it needs afterwards."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)


def big_request(rid: str, replies: int) -> bytes:
    """A stream request the fake Triton answers with `replies` replies of BIG_REPLY bytes, then its final one."""
    request = pb.ModelInferRequest(model_name="cls", id=rid)
    request.parameters["big"].int64_param = replies
    return request.SerializeToString()


def idle(state: AdmissionState) -> tuple[int, int, int, int, int]:
    return (state.inflight, state.reserved_bytes, state.waiting, state.inflight_of_tenant("acme"),
            state.reserved_of_tenant("acme"))


def test_grpc_unary_metadata_goes_both_ways_untouched() -> None:
    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            sent = (("x-request-id", "abc-123"), ("x-tenant", "acme"), ("x-custom-bin", b"\x01\x02"))
            call, response = await rig.infer("req-1", sent)
            assert response.id == "req-1" and response.model_name == "cls"
            # the client's metadata reached Triton as sent
            assert {k: rig.fake.seen[-1][k] for k, _ in sent} == dict(sent)
            # Triton's initial and trailing metadata reached the client as Triton sent them
            assert tuple(await call.initial_metadata()) == (("x-upstream-initial", "i-req-1"),)
            assert tuple(await call.trailing_metadata()) == (("x-upstream-trailing", "t-req-1"),
                                                              ("x-trace-bin", b"\x00\x01"))
            assert idle(rig.state) == (0, 0, 0, 0, 0)

    asyncio.run(main())


def test_grpc_upstream_error_keeps_code_details_and_trailers() -> None:
    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rig.infer("e-1", model="missing")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert err.value.details() == "model 'missing' is not found"
            assert tuple(err.value.trailing_metadata()) == (("x-upstream-error", "not-found"),)
            assert idle(rig.state) == (0, 0, 0, 0, 0)

    asyncio.run(main())


def test_grpc_passthrough_method_relays_metadata() -> None:
    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            call = rig.channel.unary_unary(SERVER_METADATA)(
                pb.ServerMetadataRequest().SerializeToString(), metadata=(("x-request-id", "m-1"),), timeout=10
            )
            assert pb.ServerMetadataResponse.FromString(await call).name == "fake-triton"
            assert rig.fake.seen[-1]["x-request-id"] == "m-1"
            assert tuple(await call.initial_metadata()) == (("x-upstream-initial", "meta"),)
            assert tuple(await call.trailing_metadata()) == (("x-upstream-trailing", "meta"),)

    asyncio.run(main())


def test_grpc_stream_keeps_ids_and_relays_metadata() -> None:
    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            call = rig.channel.stream_stream(MODEL_STREAM_INFER)(metadata=(("x-request-id", "s-1"),), timeout=10)
            for rid in ("c-0", "c-1", "c-2"):
                await call.write(pb.ModelInferRequest(model_name="cls", id=rid).SerializeToString())
            ids = []
            for _ in range(3):
                ids.append(pb.ModelStreamInferResponse.FromString(await call.read()).infer_response.id)
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert sorted(ids) == ["c-0", "c-1", "c-2"]  # the sidecar's internal ids are mapped back
            assert rig.fake.seen[-1]["x-request-id"] == "s-1"
            assert tuple(await call.initial_metadata()) == (("x-stream-initial", "hello"),)
            assert tuple(await call.trailing_metadata()) == (("x-stream-trailing", "bye"),)
            assert await call.code() == grpc.StatusCode.OK
            assert idle(rig.state) == (0, 0, 0, 0, 0)

    asyncio.run(main())


def test_grpc_stream_request_ends_when_triton_ends_it_not_when_the_client_reads() -> None:
    """A client that reads its stream slowly does not hold the reservation of a request Triton has
    finished: the sidecar reads Triton's side as it comes (admission sees what the engine runs and
    when its room frees) and keeps the replies, in order, for the client."""

    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            call = rig.channel.stream_stream(MODEL_STREAM_INFER)(timeout=20)
            await call.write(big_request("big-1", BIG_REPLIES))
            # the client reads nothing meanwhile
            await settled(lambda: rig.state.inflight == 0 and rig.metrics.exposition().count(b'outcome="ok"'))
            assert idle(rig.state) == (0, 0, 0, 0, 0)
            sizes = []
            for _ in range(BIG_REPLIES + 1):
                reply = pb.ModelStreamInferResponse.FromString(await call.read())
                assert reply.infer_response.id == "big-1" and not reply.error_message
                sizes.append(len(reply.infer_response.raw_output_contents[0]) - 4)
            assert sizes == [BIG_REPLY] * BIG_REPLIES + [1]
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF and await call.code() == grpc.StatusCode.OK

    asyncio.run(main())


def test_grpc_stream_client_that_does_not_read_gets_nothing_more_admitted() -> None:
    """What waits for a client is bounded: past `stream_buffer_bytes` of replies its next request is
    neither admitted nor sent to Triton until it takes them; then it is served as usual."""

    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            rig.proxy.stream_buffer_bytes = 1 << 20
            call = rig.channel.stream_stream(MODEL_STREAM_INFER)(timeout=20)
            await call.write(big_request("big-1", 4 * BIG_REPLIES))  # 16 MiB: most of it waits in the sidecar
            # Triton has answered big-1 in full; the client reads nothing meanwhile
            await settled(lambda: rig.fake.streamed == 1 and rig.state.inflight == 0)
            await call.write(pb.ModelInferRequest(model_name="cls", id="next").SerializeToString())
            await asyncio.sleep(0.5)
            assert rig.fake.streamed == 1 and idle(rig.state) == (0, 0, 0, 0, 0)
            ids = [pb.ModelStreamInferResponse.FromString(await call.read()).infer_response.id
                   for _ in range(4 * BIG_REPLIES + 2)]
            assert ids == ["big-1"] * (4 * BIG_REPLIES + 1) + ["next"] and rig.fake.streamed == 2
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF and await call.code() == grpc.StatusCode.OK

    asyncio.run(main())


def test_grpc_stream_with_triton_gone_answers_each_request_unavailable() -> None:
    """Triton does not answer: each request of the stream gets UNAVAILABLE with its own id, as Triton
    reports per-request errors on a stream, and nothing stays reserved."""

    async def main() -> None:
        async with grpc_rig(parse_policy(policy_doc())) as rig:
            await rig.upstream.stop(grace=None)
            rig.proxy.connect_timeout_s = 0.2
            call = rig.channel.stream_stream(MODEL_STREAM_INFER)(timeout=10)
            for rid in ("gone-1", "gone-2"):
                await call.write(pb.ModelInferRequest(model_name="cls", id=rid).SerializeToString())
                reply = pb.ModelStreamInferResponse.FromString(await call.read())
                assert reply.infer_response.id == rid and reply.error_message.startswith("UNAVAILABLE: "), reply
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert idle(rig.state) == (0, 0, 0, 0, 0)

    asyncio.run(main())


def test_grpc_stream_refusal_before_triton_speaks_then_service() -> None:
    """The sidecar answers first (a class the tenant may not send): the refusal goes out with the
    sidecar's own (empty) initial metadata, the next request is served, Triton's trailers still come."""

    async def main() -> None:
        async with grpc_rig(tenant_policy()) as rig:
            call = rig.channel.stream_stream(MODEL_STREAM_INFER)(metadata=(("x-tenant", "acme"),), timeout=10)
            refused = pb.ModelInferRequest(model_name="cls", id="no")
            refused.parameters["traffic_class"].string_param = "batch"
            await call.write(refused.SerializeToString())
            first = pb.ModelStreamInferResponse.FromString(await call.read())
            assert first.infer_response.id == "no" and first.error_message.startswith("PERMISSION_DENIED: ")
            assert '"tenant": "acme"' in first.error_message
            await call.write(pb.ModelInferRequest(model_name="cls", id="yes").SerializeToString())
            second = pb.ModelStreamInferResponse.FromString(await call.read())
            assert second.infer_response.id == "yes" and not second.error_message
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert tuple(await call.initial_metadata()) == ()
            assert tuple(await call.trailing_metadata()) == (("x-stream-trailing", "bye"),)
            assert idle(rig.state) == (0, 0, 0, 0, 0)

    asyncio.run(main())


def test_grpc_tenant_over_quota_is_refused_naming_the_limit_and_releases_exactly() -> None:
    async def main() -> None:
        async with grpc_rig(tenant_policy()) as rig:
            acme = (("x-tenant", "acme"),)
            holder = asyncio.ensure_future(rig.infer("hold-1", acme))
            await rig.fake.started.wait()
            assert (rig.state.inflight_of_tenant("acme"), rig.state.reserved_of_tenant("acme")) == (1, 100)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rig.infer("r-2", acme)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            body = json.loads(err.value.details())
            assert body["limit"] == "tenant_concurrency_quota:acme" and body["reason"] == "queue_full"
            assert body["tenant"] == "acme" and int(dict(err.value.trailing_metadata())["retry-after"]) >= 1
            # another tenant of the same model is not held behind acme
            _, other = await rig.infer("r-3", (("x-tenant", "beta"),))
            assert other.id == "r-3"
            # a class acme may not send: PERMISSION_DENIED at once
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rig.infer("r-4", (*acme, ("x-traffic-class", "batch")))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert json.loads(err.value.details())["reason"] == "tenant_class_not_allowed"
            # a tenant value that could not be a name: INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rig.infer("r-5", (("x-tenant", "no spaces please"),))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tenant" in err.value.details()
            rig.fake.release.set()
            await holder
            assert idle(rig.state) == (0, 0, 0, 0, 0)
            text = rig.metrics.exposition().decode()
            assert 'sidecar_tenant_requests_rejected_total{reason="queue_full",tenant="acme"} 1.0' in text
            assert 'sidecar_tenant_requests_admitted_total{tenant="other"} 1.0' in text  # beta is not listed

    asyncio.run(main())


def test_grpc_client_gone_mid_request_releases_the_tenant() -> None:
    async def main() -> None:
        async with grpc_rig(tenant_policy()) as rig:
            call = rig.channel.unary_unary(MODEL_INFER)(
                pb.ModelInferRequest(model_name="cls", id="hold-9").SerializeToString(),
                metadata=(("x-tenant", "acme"),), timeout=10,
            )
            await rig.fake.started.wait()
            assert rig.state.inflight_of_tenant("acme") == 1
            call.cancel()
            await settled(lambda: idle(rig.state) == (0, 0, 0, 0, 0), seconds=2.0)
            assert idle(rig.state) == (0, 0, 0, 0, 0)
            rig.fake.release.set()

    asyncio.run(main())


# ------------------------------------------------------------------------------------------------
# the tenant header on HTTP


@asynccontextmanager
async def http_rig(policy: SidecarPolicy) -> AsyncIterator[tuple[str, AdmissionState, asyncio.Event]]:
    release = asyncio.Event()

    async def upstream_infer(request: web.Request) -> web.Response:
        if request.headers.get("x-hold"):
            await release.wait()
        return web.json_response({"model_name": request.match_info["model"], "id": "x", "outputs": []})

    upstream_app = web.Application()
    upstream_app.router.add_post("/v2/models/{model}/infer", upstream_infer)
    runners = [web.AppRunner(upstream_app)]
    await runners[0].setup()
    up_site = web.TCPSite(runners[0], "127.0.0.1", 0)
    await up_site.start()
    upstream_port = runners[0].addresses[0][1]

    proxy, state, metrics = await started_http_proxy(upstream_port, policy, token=None)
    runners.append(web.AppRunner(proxy.application(), handler_cancellation=True))
    await runners[1].setup()
    await web.TCPSite(runners[1], "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runners[1].addresses[0][1]}"
    try:
        yield base, state, release
    finally:
        release.set()
        await proxy.close()
        for runner in reversed(runners):
            await runner.cleanup()


def test_http_tenant_header_reaches_admission() -> None:
    async def main() -> None:
        async with http_rig(tenant_policy()) as (base, state, release), aiohttp.ClientSession() as session:
            url = f"{base}/v2/models/cls/infer"
            doc = {"inputs": []}
            holder = asyncio.ensure_future(session.post(url, json=doc, headers={"x-tenant": "acme", "x-hold": "1"}))
            await settled(lambda: state.inflight_of_tenant("acme"), seconds=2.0)
            assert state.inflight_of_tenant("acme") == 1
            async with session.post(url, json=doc, headers={"x-tenant": "acme"}) as resp:
                body = await resp.json()
                assert resp.status == 429 and resp.headers["Retry-After"] == "1"
                assert body["limit"] == "tenant_concurrency_quota:acme" and body["tenant"] == "acme"
            async with session.post(url, json=doc) as resp:  # no header: tenant "default", unlimited here
                assert resp.status == 200
            async with session.post(url, json=doc, headers={"x-tenant": "acme", "x-traffic-class": "batch"}) as resp:
                assert resp.status == 403 and (await resp.json())["reason"] == "tenant_class_not_allowed"
            async with session.post(url, json=doc, headers={"x-tenant": "a/b"}) as resp:
                assert resp.status == 400 and "is not a tenant name" in (await resp.json())["error"]
            release.set()
            async with await holder as resp:
                assert resp.status == 200
            assert idle(state) == (0, 0, 0, 0, 0)

    asyncio.run(main())
