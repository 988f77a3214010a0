"""One `ModelStreamInfer` call through the sidecar: the client's requests in, each admitted on its own
and written to one upstream stream to Triton, Triton's replies routed back to their requests.

Each request gets an internal id (mapped back on every reply, so the client sees its own ids) and
`triton_enable_empty_final_response`, so the sidecar sees its end; an empty final reply the client
did not ask for is not forwarded. Triton's side is read as fast as Triton sends, and the replies go
to the client through one writer, in order: a request's first token and end reach admission when
the engine gives them, not when a slow client has taken the replies before them (a client that read
nothing held a finished request's reservation). What is buffered is bounded by intake instead: past
`STREAM_BUFFER_BYTES` of replies waiting for a client, its next request waits unadmitted (and gRPC's
flow control then holds the client). A refusal, a malformed request or a failed upstream answers
that request alone, with an `error_message`, as Triton reports per-request errors on a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from tritonclient.grpc import service_pb2 as pb

from sidecar import protocol
from sidecar.admission_types import Cost
from sidecar.controller import AdmissionController, Rejected, Ticket, refusal, unavailable
from sidecar.grpc_metadata import Metadata, StreamMetadata, grpc_code
from sidecar.metrics import SidecarMetrics
from sidecar.reading import Reading
from sidecar.upstream import UpstreamHealth

STREAM_BUFFER_BYTES = 16 << 20
"""Replies waiting for one stream's client past which its next request waits unadmitted: four of the
largest message gRPC takes by default (4 MiB), and thousands of token replies; a reply is never
dropped or held from the buffer, whatever its size."""

_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"


class StreamHost(Protocol):
    """What a stream needs of the gRPC proxy it runs in (sidecar/grpc_proxy.py's GrpcProxy)."""

    controller: AdmissionController
    health: UpstreamHealth
    metrics: SidecarMetrics
    stream_buffer_bytes: int  # STREAM_BUFFER_BYTES unless set

    def prepare(self, request: Any, metadata: Metadata) -> tuple[Reading, Cost]: ...

    def next_id(self) -> str: ...


@dataclass
class _Pending:
    ticket: Ticket
    client_id: str
    model: str
    wants_empty_final: bool
    done: asyncio.Event = field(default_factory=asyncio.Event)


def error_reply(request_id: str, model: str, message: str) -> Any:
    """A reply that fails one request of a stream, as Triton reports per-request errors on one."""
    out = pb.ModelStreamInferResponse(error_message=message)
    out.infer_response.id = request_id
    out.infer_response.model_name = model
    return out


@dataclass
class StreamRelay:
    proxy: StreamHost
    upstream: Any  # the stream_stream call to Triton
    metadata: Metadata
    context: grpc.aio.ServicerContext
    pending: dict[str, _Pending] = field(default_factory=dict)  # by internal id
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    upstream_failed: list[str] = field(default_factory=list)
    outbox: asyncio.Queue[tuple[bytes, bool] | None] = field(default_factory=asyncio.Queue)
    buffered: int = 0  # bytes in the outbox
    _drained: asyncio.Event = field(default_factory=asyncio.Event)  # set while buffered is within the bound
    _up_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.reply_metadata = StreamMetadata(self.upstream)
        self._drained.set()

    def send(self, message: Any, from_upstream: bool = False) -> None:
        data = message.SerializeToString()
        self.buffered += len(data)
        if self.buffered > self.proxy.stream_buffer_bytes:
            self._drained.clear()
        self.outbox.put_nowait((data, from_upstream))

    async def run(self, requests: AsyncIterator[bytes]) -> None:
        reader = asyncio.ensure_future(self._read_client(requests))
        pump = asyncio.ensure_future(self._read_upstream())
        writer = asyncio.ensure_future(self._write_client())
        # A reply the client can no longer take (it went away, the deadline passed) ends the call.
        writer.add_done_callback(lambda done: done.cancelled() or done.exception() is None or reader.cancel())
        try:
            # If Triton's side fails first, the requests in flight were answered with UNAVAILABLE and
            # the ones still to come are too (see _one), until the client closes its side.
            await reader
            await pump
            self.outbox.put_nowait(None)
            await writer
            with contextlib.suppress(grpc.aio.UsageError):  # the call already ended (deadline): nothing to add
                await self.reply_metadata.finish(self.context)
        finally:
            self.reply_metadata.close()
            for task in (reader, pump, writer, *self.tasks):
                task.cancel()
            self.upstream.cancel()
            await asyncio.gather(reader, pump, writer, *self.tasks, return_exceptions=True)

    async def _write_client(self) -> None:
        while (item := await self.outbox.get()) is not None:
            data, from_upstream = item
            await self.reply_metadata.before_write(self.context, from_upstream)
            await self.context.write(data)
            self.buffered -= len(data)
            if self.buffered <= self.proxy.stream_buffer_bytes:
                self._drained.set()

    async def _read_client(self, requests: AsyncIterator[bytes]) -> None:
        async for raw in requests:
            await self._drained.wait()  # a request is taken only while the client takes its replies
            self._take(raw)
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.upstream.done_writing()

    def _take(self, raw: bytes) -> None:
        """One request from the client: answered at once when malformed or Triton is down, else off to
        admission on its own task."""
        proxy = self.proxy
        try:
            request = pb.ModelInferRequest.FromString(raw)
        except Exception as err:
            proxy.metrics.malformed.labels("grpc").inc()
            self.send(error_reply("", "", f"malformed request: {type(err).__name__}: {err}"))
            return
        if not proxy.health.up or self.upstream_failed:
            body = unavailable(proxy.health.reason or (self.upstream_failed[0] if self.upstream_failed else None))
            self.send(error_reply(request.id, request.model_name, f"UNAVAILABLE: {json.dumps(body)}"))
            return
        task = asyncio.ensure_future(self._one(request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(self, request: Any) -> None:
        proxy, client_id = self.proxy, request.id
        try:
            reading, cost = proxy.prepare(request, self.metadata)
        except (protocol.BadRequest, ValueError) as err:
            proxy.metrics.malformed.labels("grpc").inc()
            self.send(error_reply(client_id, request.model_name, f"malformed request: {err}"))
            return
        uid = proxy.next_id()
        try:
            async with proxy.controller.admit(request.model_name, reading.klass, cost, reading.tenant) as ticket:
                entry = _Pending(ticket, client_id, request.model_name,
                                 _EMPTY_FINAL in request.parameters and request.parameters[_EMPTY_FINAL].bool_param)
                self.pending[uid] = entry
                try:
                    request.id = uid
                    request.parameters[_EMPTY_FINAL].bool_param = True
                    async with self._up_lock:
                        if self.upstream_failed:
                            raise ConnectionError(self.upstream_failed[0])
                        ticket.started()
                        await self.upstream.write(request.SerializeToString())
                    await entry.done.wait()
                finally:
                    self.pending.pop(uid, None)
        except Rejected as rejected:
            status, body = refusal(rejected.decision, rejected.model, rejected.klass, rejected.tenant)
            code = grpc_code(status).name
            self.send(error_reply(client_id, request.model_name, f"{code}: {json.dumps(body)}"))
        except (ConnectionError, grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            self.send(error_reply(client_id, request.model_name, f"UNAVAILABLE: Triton stream failed: {err}"))

    async def _read_upstream(self) -> None:
        try:
            async for raw in self.upstream:
                self._route(pb.ModelStreamInferResponse.FromString(raw))
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED:
                return
            reason = f"{err.code().name}: {err.details()}"
            self.upstream_failed.append(reason)
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                self.proxy.health.mark_down(f"gRPC stream: {reason}")
        finally:
            why = self.upstream_failed[0] if self.upstream_failed else "closed"
            for entry in list(self.pending.values()):
                if not entry.done.is_set():
                    entry.ticket.upstream_lost()
                    self.send(error_reply(entry.client_id, entry.model,
                                          f"UNAVAILABLE: Triton stream ended before the request did ({why})"))
                    entry.done.set()

    def _route(self, message: Any) -> None:
        response = message.infer_response
        entry = self.pending.get(response.id)
        if entry is None:
            self.send(message, True)  # not ours (should not happen): pass it on untouched
            return
        params = response.parameters
        final = bool(message.error_message) or (_FINAL in params and params[_FINAL].bool_param)
        empty = not message.error_message and not len(response.outputs)
        if not message.error_message and len(response.outputs):
            entry.ticket.first_token()
            entry.ticket.streamed(1)
        response.id = entry.client_id
        if not (final and empty and not entry.wants_empty_final):
            self.send(message, True)
        if final:
            entry.ticket.finished(message.error_message or None)
            entry.done.set()
