"""The gRPC side: Triton's `inference.GRPCInferenceService` through admission (grpc.aio). With the
native front, nginx hands it what it does not carry itself (sidecar/nginx_front.py says which).

`ModelInfer` and `ModelStreamInfer` go through admission; every other method passes as raw bytes.
Client metadata is forwarded (the tenant is the policy's `tenant_header` key); the only change to a
request is its `priority` parameter and, on streams, what sidecar/grpc_stream.py says. Triton's
reply metadata comes back as Triton sent it (sidecar/grpc_metadata.py), with one limit on streams:
initial metadata goes out once, so if the sidecar answers first (a refusal before Triton has said
anything) Triton's, arriving later, is dropped. Refusals: the HTTP side's status mapped to a gRPC
code (`grpc_code`), the JSON body as details and `retry-after` in the trailing metadata (unary), or
a stream response whose `error_message` carries the same JSON (streams). Triton's admin methods
are shut behind the admin token as the HTTP ones (sidecar/admin_apis.py); the token's key is not
forwarded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from multidict import CIMultiDict
from tritonclient.grpc import service_pb2 as pb

from sidecar import admin_apis, protocol
from sidecar.controller import (
    AdmissionController,
    Rejected,
    refusal,
    unavailable,
)
from sidecar.admission_types import Cost
from sidecar.cost import carried_stream_cost, cost_for
from sidecar.grpc_metadata import (
    Metadata, abort_like, call_metadata, grpc_code, header_value, relay_reply_metadata,
)
from sidecar.grpc_stream import STREAM_BUFFER_BYTES, StreamRelay, error_reply
from sidecar.http_proxy import Answer, Prepared
from sidecar.metrics import SidecarMetrics
from sidecar.reading import Reading, read, resolve_class, resolve_tenant
from sidecar.stream_path import RELAY
from sidecar.upstream import Reconnecting, UpstreamHealth
from tritongen.core.sidecar_policy.schema import SidecarPolicy

log = logging.getLogger("tritongen.sidecar.grpc")

SERVICE = "/inference.GRPCInferenceService/"
MODEL_INFER = SERVICE + "ModelInfer"
MODEL_STREAM_INFER = SERVICE + "ModelStreamInfer"


class GrpcProxy:
    def __init__(
        self,
        upstream: str,
        controller: AdmissionController,
        health: UpstreamHealth,
        metrics: SidecarMetrics,
        policy: Callable[[], SidecarPolicy],
        token: str | None = None,
    ) -> None:
        self.upstream = upstream.split("://", 1)[-1]
        self.token = token  # the admin token (None: admin methods only as the policy opens them)
        self.controller = controller
        self.health = health
        self.metrics = metrics
        self.policy = policy
        self._ids = itertools.count(1)
        self._unary_calls: dict[str, Any] = {}
        self.channels: Reconnecting[grpc.aio.Channel] = Reconnecting(self._new_channel, _close_channel, health)
        self.connect_timeout_s = 3.0
        self.stream_buffer_bytes = STREAM_BUFFER_BYTES

    # -- upstream channel -------------------------------------------------------------------------

    def _new_channel(self) -> grpc.aio.Channel:
        self._unary_calls = {}
        return grpc.aio.insecure_channel(
            self.upstream,
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
                ("grpc.use_local_subchannel_pool", 1),  # a new channel must not inherit a dead one's backoff
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )

    @property
    def channel(self) -> grpc.aio.Channel | None:
        return self.channels.current

    async def start(self) -> None:
        self.channels.open()

    async def close(self) -> None:
        await self.channels.close()

    async def _ready(self, context: grpc.aio.ServicerContext) -> None:
        """Answer UNAVAILABLE unless Triton is up and the channel connected (Triton may just have come
        back); a connected channel costs one state check."""
        if not self.health.up or not await self._connected():
            await _abort_with(context, self._down())

    def _still_connected(self) -> bool:
        channel = self.channel
        return channel is not None and channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY

    def _unary(self, method: str) -> Any:
        call = self._unary_calls.get(method)
        if call is None:
            assert self.channel is not None
            call = self._unary_calls[method] = self.channel.unary_unary(method)
        return call

    # -- the server side --------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        proxy = self

        class _Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                method = details.method
                if method == MODEL_INFER:
                    return grpc.unary_unary_rpc_method_handler(proxy.model_infer)
                if method == MODEL_STREAM_INFER:
                    return grpc.stream_stream_rpc_method_handler(proxy.model_stream_infer)
                if method.startswith(SERVICE):
                    if admin_apis.grpc_admin_category(method) is not None:

                        async def admin(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                            return await proxy.admin_passthrough(method, request, context)

                        return grpc.unary_unary_rpc_method_handler(admin)

                    async def passthrough(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                        return await proxy.passthrough(method, request, context)

                    return grpc.unary_unary_rpc_method_handler(passthrough)
                return None

        return _Handler()

    def _down(self) -> Answer:
        self.metrics.unavailable.labels("grpc").inc()
        return _grpc_answer(grpc.StatusCode.UNAVAILABLE, json.dumps(unavailable(self.health.reason)), "1")

    async def admin_passthrough(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """A shut admin method: passed through with the admin token (its key removed) or when the
        policy opens the category; refused otherwise."""
        category = admin_apis.grpc_admin_category(method)
        assert category is not None
        metadata = call_metadata(context)
        drop = admin_apis.kept_out(category, header_value(metadata, admin_apis.AUTHORIZATION),
                                   header_value(metadata, admin_apis.TOKEN_HEADER), self.token,
                                   self.policy().admin_apis.open)
        if drop is None:
            status, body = admin_apis.refusal(category, "grpc", token_configured=bool(self.token))
            self.metrics.admin_refused.labels(category, "grpc").inc()
            log.debug("refused %s: Triton's %s API is shut (%d)", method, category, status)
            await context.abort(grpc_code(status), json.dumps(body))
        return await self.passthrough(method, request, context, tuple((k, v) for k, v in metadata if k not in drop))

    async def passthrough(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext, metadata: Metadata | None = None
    ) -> bytes:
        await self._ready(context)
        if metadata is None:
            metadata = call_metadata(context)
        call = self._unary(method)(request, metadata=metadata, timeout=context.time_remaining())
        try:
            response: bytes = await call
        except grpc.aio.AioRpcError as err:
            # Triton itself answers some calls UNAVAILABLE (RepositoryModelLoad/Unload when model
            # control is not explicit): over a connection still READY that is its answer, not an outage.
            if err.code() == grpc.StatusCode.UNAVAILABLE and not self._still_connected():
                self.health.mark_down(f"gRPC UNAVAILABLE: {err.details()}")
            await abort_like(context, err)
            raise AssertionError("unreachable") from None  # pragma: no cover
        await relay_reply_metadata(call, context)
        return response

    def prepare(self, request: Any, metadata: Metadata) -> tuple[Reading, Cost]:
        """The reading and price of one ModelInferRequest (unary, a stream's, or one nginx carries);
        writes its priority in when the reading says so."""
        policy = self.policy()
        state = self.controller.state
        model = state.model_policy(request.model_name)
        stated = protocol.grpc_stated(request, model.kv, policy.class_parameter)
        reading = read(policy, model, request.model_name, stated, header_value(metadata, policy.class_header),
                       header_value(metadata, policy.tenant_header), state.prompts.counter(request.model_name))
        if reading.priority is not None:
            protocol.grpc_set_priority(request, reading.priority)
        return reading, cost_for(model, reading.llm)

    def prepare_carried(self, raw: bytes, metadata: Metadata) -> Prepared | Answer:
        """A ModelInfer nginx carries (sidecar/decisions.py): what admission needs and the request as it
        goes upstream (its priority written in), or the refusal, as `model_infer` would answer it.
        A refusal's status is the gRPC code's number, its body the status message."""
        if not self.health.up:
            return self._down()
        parsed = self._parsed(raw, metadata)
        if isinstance(parsed, Answer):
            return parsed
        request, reading, cost = parsed
        data = request.SerializeToString() if reading.priority is not None else raw
        return Prepared(reading, cost, data, CIMultiDict())

    def prepare_stream(self, model_name: str, metadata: Metadata) -> Prepared | Answer:
        """A ModelStreamInfer nginx carries (sidecar/stream_path.py), as it opens: its class and tenant
        from the metadata, a slot of `model_name` priced by `carried_stream_cost`, or the refusal
        (INVALID_ARGUMENT for an unknown class or a malformed tenant, UNAVAILABLE while Triton is down)."""
        if not self.health.up:
            return self._down()
        policy = self.policy()
        model = self.controller.state.model_policy(model_name)
        try:
            klass = resolve_class(policy, header_value(metadata, policy.class_header), None)
            tenant = resolve_tenant(header_value(metadata, policy.tenant_header))
        except protocol.BadRequest as err:
            self.metrics.malformed.labels("grpc").inc()
            return _grpc_answer(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {err}")
        return Prepared(Reading(model_name, klass.name, tenant, None, None), carried_stream_cost(model), b"",
                        CIMultiDict())

    def _parsed(self, raw: bytes, metadata: Metadata) -> tuple[Any, Reading, Cost] | Answer:
        """(the request with its priority set, its reading, its price), or the malformed answer."""
        try:
            request = pb.ModelInferRequest.FromString(raw)
            reading, cost = self.prepare(request, metadata)
        except Exception as err:  # the reader's BadRequest or ValueError, or protobuf's DecodeError
            self.metrics.malformed.labels("grpc").inc()
            why = err if isinstance(err, (protocol.BadRequest, ValueError)) else f"{type(err).__name__}: {err}"
            return _grpc_answer(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {why}")
        return request, reading, cost

    @staticmethod
    def refused_carried(rejected: Rejected) -> Answer:
        """A refusal as gRPC answers it: code, the JSON body as its message, Retry-After on a 429."""
        status, body = refusal(rejected.decision, rejected.model, rejected.klass, rejected.tenant)
        retry = rejected.decision.retry_after_s
        return _grpc_answer(grpc_code(status), json.dumps(body), str(int(retry)) if retry is not None and status == 429
                            else None)

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._ready(context)
        metadata = call_metadata(context)
        parsed = self._parsed(raw, metadata)
        if isinstance(parsed, Answer):
            await _abort_with(context, parsed)
        request, reading, cost = parsed  # type: ignore[misc]
        payload = request.SerializeToString() if reading.priority is not None else raw
        try:
            async with self.controller.admit(request.model_name, reading.klass, cost, reading.tenant) as ticket:
                ticket.started()
                call = self._unary(MODEL_INFER)(payload, metadata=metadata, timeout=context.time_remaining())
                try:
                    response = await call
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.UNAVAILABLE:
                        ticket.upstream_lost()
                        self.health.mark_down(f"gRPC UNAVAILABLE: {err.details()}")
                    else:
                        ticket.finished(err.details() or "")
                    error = err
                else:
                    ticket.finished()
                    await relay_reply_metadata(call, context)
                    return response
        except Rejected as rejected:
            await _abort_with(context, self.refused_carried(rejected))
        await abort_like(context, error)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- streams ----------------------------------------------------------------------------------

    async def _connected(self) -> bool:
        channel = self.channel
        assert channel is not None
        if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return True
        try:
            await asyncio.wait_for(channel.channel_ready(), self.connect_timeout_s)
            return True
        except asyncio.TimeoutError:
            self.health.mark_down(f"Triton's gRPC endpoint at {self.upstream} (--grpc-url) did not connect within "
                                  f"{self.connect_timeout_s:g} s")
            return False

    async def _stream_unavailable(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """Triton is down: answer every request of the stream with UNAVAILABLE, the way Triton itself
        reports per-request errors on a stream (aborting a stream the client is still writing to can
        reach the client as INTERNAL instead)."""
        body = json.dumps(unavailable(self.health.reason))
        async for raw in requests:
            self.metrics.unavailable.labels("grpc").inc()
            try:
                request = pb.ModelInferRequest.FromString(raw)
            except Exception:
                request = pb.ModelInferRequest()
            await context.write(error_reply(request.id, request.model_name, f"UNAVAILABLE: {body}").SerializeToString())

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        if not self.health.up or not await self._connected():
            await self._stream_unavailable(requests, context)
            return
        assert self.channel is not None
        self.metrics.grpc_streams.labels(RELAY).inc()
        metadata = call_metadata(context)
        upstream = self.channel.stream_stream(MODEL_STREAM_INFER)(metadata=metadata, timeout=context.time_remaining())
        await StreamRelay(self, upstream, metadata, context).run(requests)

    def next_id(self) -> str:
        """An id for a request on Triton's side of a stream, unique across the sidecar's streams."""
        return f"sidecar-{next(self._ids)}"


def _grpc_answer(code: grpc.StatusCode, message: str, retry_after: str | None = None) -> Answer:
    """A gRPC refusal as an `Answer`: the status is the code's number, the body its message."""
    return Answer(code.value[0], message.encode(), [("Retry-After", retry_after)] if retry_after else [])


async def _abort_with(context: grpc.aio.ServicerContext, answer: Answer) -> None:
    """End the client's call with a `_grpc_answer`: its code, message and Retry-After as trailing metadata."""
    retry = [("retry-after", v) for k, v in answer.headers if k.lower() == "retry-after"]
    if retry:
        context.set_trailing_metadata(tuple(retry))
    code = next(c for c in grpc.StatusCode if c.value[0] == answer.status)
    await context.abort(code, answer.body.decode())


async def _close_channel(channel: grpc.aio.Channel) -> None:
    await channel.close(grace=None)
