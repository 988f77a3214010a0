"""gRPC metadata across the sidecar's relay: what may cross a hop, and Triton's reply metadata
(initial and trailing, errors included) brought back onto the client's call as Triton sent it;
and the gRPC status a refusal the HTTP side answers with a given status goes out with."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

_DROP_METADATA = ("user-agent", "content-type", "te", "authority", "host")
_STATUS_WAIT_S = 1.0  # after Triton's last stream message, how long its status (and trailers) may take

Metadata = tuple[tuple[str, Any], ...]

_GRPC_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
                401: grpc.StatusCode.UNAUTHENTICATED, 503: grpc.StatusCode.UNAVAILABLE}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status of a refusal the HTTP side answers with `status` (sidecar/controller.py's refusal)."""
    return _GRPC_STATUS.get(status, grpc.StatusCode.RESOURCE_EXHAUSTED)


def forwardable(metadata: Any) -> Metadata:
    """Metadata as the other side should see it: without what the gRPC transport owns and sets
    itself on each hop (pseudo-headers, `grpc-*`, content-type, user-agent, ...)."""
    return tuple(
        (k, v) for k, v in (metadata or ())
        if not k.startswith(":") and not k.startswith("grpc-") and k not in _DROP_METADATA
    )


def call_metadata(context: grpc.aio.ServicerContext) -> Metadata:
    return forwardable(context.invocation_metadata())


async def relay_reply_metadata(call: Any, context: grpc.aio.ServicerContext) -> None:
    """Triton's initial and trailing metadata of a finished unary call, onto the client's call.
    Both have arrived with the response, so this waits for nothing."""
    initial = forwardable(await call.initial_metadata())
    if initial:
        await context.send_initial_metadata(initial)
    trailing = forwardable(await call.trailing_metadata())
    if trailing:
        context.set_trailing_metadata(trailing)


async def abort_like(context: grpc.aio.ServicerContext, err: grpc.aio.AioRpcError) -> None:
    """End the client's call the way Triton ended the sidecar's: code, details and metadata."""
    initial = forwardable(err.initial_metadata())
    if initial:
        await context.send_initial_metadata(initial)
    await context.abort(err.code(), err.details() or "", trailing_metadata=forwardable(err.trailing_metadata()))


async def quiet_metadata(awaitable: Any) -> Any:
    try:
        return await awaitable
    except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):  # the call failed: nothing to relay
        return ()


class StreamMetadata:
    """Triton's response metadata on one stream, relayed to the client: its initial metadata just
    before the first message the client gets, its trailing metadata when the stream ends."""

    def __init__(self, upstream: Any) -> None:
        self._upstream = upstream
        self._initial: asyncio.Future[Any] = asyncio.ensure_future(quiet_metadata(upstream.initial_metadata()))
        self.sent = False

    async def before_write(self, context: grpc.aio.ServicerContext, from_upstream: bool) -> None:
        """Called under the write lock before each message. A message from Triton means its initial
        metadata has arrived; a message of the sidecar's own (a refusal) does not wait for it."""
        if self.sent:
            return
        self.sent = True
        if from_upstream and not self._initial.done():
            await asyncio.wait((self._initial,))
        if self._initial.done() and not self._initial.cancelled() and self._initial.exception() is None:
            initial = forwardable(self._initial.result())
            if initial:
                await context.send_initial_metadata(initial)

    async def finish(self, context: grpc.aio.ServicerContext) -> None:
        """Triton's side of the stream is over: its trailing metadata for the client's status, and
        its initial metadata too if the client was sent no message at all."""
        try:
            trailing = await asyncio.wait_for(quiet_metadata(self._upstream.trailing_metadata()), _STATUS_WAIT_S)
        except asyncio.TimeoutError:
            trailing = ()
        if not self.sent and self._initial.done():
            await self.before_write(context, from_upstream=True)
        trailing = forwardable(trailing)
        if trailing:
            context.set_trailing_metadata(trailing)

    def close(self) -> None:
        self._initial.cancel()


def header_value(metadata: tuple[tuple[str, Any], ...], name: str) -> str | None:
    for key, value in metadata:
        if key == name:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None
