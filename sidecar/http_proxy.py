"""The HTTP/REST side: Triton's v2 API through admission (aiohttp server and client).

Admission applies to `POST /v2/models/<m>[/versions/<v>]/{infer,generate,generate_stream}`; the rest
passes through, but for Triton's admin APIs, shut behind the admin token (sidecar/admin_apis.py),
and the sidecar's own `GET /sidecar/status` and `POST /sidecar/reload`, behind the same token.
Bodies and headers go as they came (binary tensor data included) but for the `priority` parameter
the request's class sets, written into the JSON part, and the sidecar's token header. Request
bodies sent gzip- or deflate-compressed go upstream decompressed (aiohttp decodes them, and the size
limit applies after decoding); responses pass through as Triton compressed them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from sidecar import admin_apis, protocol
from sidecar.admission_types import Cost
from sidecar.controller import (
    AdmissionController,
    Rejected,
    Ticket,
    refusal,
    unavailable,
)
from sidecar.cost import cost_for
from sidecar.metrics import SidecarMetrics
from sidecar.reading import NOTHING, PRIORITY, Reading, read
from sidecar.upstream import Reconnecting, UpstreamHealth
from tritongen.core.sidecar_policy.schema import SidecarPolicy

log = logging.getLogger("tritongen.sidecar.http")

_SSE_ERROR = b'{"error"'  # Triton's generate_stream error event; a model's own text would be JSON-escaped
_HOP = frozenset(
    h.lower()
    for h in (
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "trailers", "transfer-encoding", "upgrade", "content-length", "host",
        # the sidecar has read the whole body: Triton must not be asked to say 100 Continue for it
        "expect",
    )
)
# aiohttp's server decodes gzip/deflate request bodies (and counts the size limit after decoding):
# bodies go upstream decoded, so their Content-Encoding does not.
_REQUEST_DROP = _HOP | {"content-encoding"}
_MODEL_OPS = ("infer", "generate", "generate_stream")
_PRIORITY_JSON = f'"{PRIORITY}"'.encode()  # the priority parameter's key, as a JSON part names it
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _forward_headers(headers: Any, drop: frozenset[str] = _HOP, **override: str | None) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in drop])
    for key, value in override.items():
        name = key.replace("_", "-")
        out.popall(name, None)
        if value is not None:
            out[name] = value
    return out


@dataclass(frozen=True)
class Answer:
    """A whole response, before anyone writes it: the aiohttp handlers turn it into a
    `web.Response` (`web`), the decision socket into a refusal nginx writes (sidecar/decisions.py)."""

    status: int
    body: bytes
    headers: list[tuple[str, str]]  # without Content-Length (whoever writes it sets it)

    @classmethod
    def json(cls, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
        return cls(status, json.dumps(payload).encode(), [("Content-Type", "application/json"), *(headers or {}).items()])

    def web(self) -> web.Response:
        return web.Response(status=self.status, body=self.body, headers=CIMultiDict(self.headers))


@dataclass(frozen=True)
class Prepared:
    """A model request ready for admission (`HttpProxy.prepare`, `GrpcProxy.prepare_carried`)."""

    reading: Reading
    cost: Cost
    body: bytes
    headers: CIMultiDict[str]


def _json_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return Answer.json(status, body, headers).web()


@dataclass
class Admin:
    """What the token-protected endpoints call."""

    token: str | None
    status: Callable[[], dict[str, Any]]
    reload: Callable[[str], Awaitable[tuple[bool, str]]]


class HttpProxy:
    def __init__(
        self,
        upstream: str,
        controller: AdmissionController,
        health: UpstreamHealth,
        metrics: SidecarMetrics,
        policy: Callable[[], SidecarPolicy],
        admin: Admin,
    ) -> None:
        self.base = upstream if "://" in upstream else f"http://{upstream}"
        self.base = self.base.rstrip("/")
        self.prefix = urlsplit(self.base).path  # an upstream mounted under a path
        self.controller = controller
        self.health = health
        self.metrics = metrics
        self.policy = policy
        self.admin = admin
        self.sessions: Reconnecting[aiohttp.ClientSession] = Reconnecting(self._new_session, _close_session, health)

    # -- upstream session -------------------------------------------------------------------------

    def _new_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=3.0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    @property
    def session(self) -> aiohttp.ClientSession | None:
        return self.sessions.current

    async def start(self) -> None:
        self.sessions.open()

    async def close(self) -> None:
        await self.sessions.close()

    # -- the application --------------------------------------------------------------------------

    def application(self) -> web.Application:
        limits = self.policy().limits
        app = web.Application(client_max_size=limits.max_body_bytes)
        app.router.add_get("/sidecar/status", self.status)
        app.router.add_post("/sidecar/reload", self.reload)
        app.router.add_post("/v2/models/{model}/versions/{version}/{op}", self.model_op)
        app.router.add_post("/v2/models/{model}/{op}", self.model_op)
        app.router.add_route("*", "/{tail:.*}", self.passthrough)
        return app

    # -- admin ------------------------------------------------------------------------------------

    def _authorised(self, request: web.Request) -> web.Response | None:
        """None when the request carries the admin token (admin_apis.authorised, the one check),
        else the refusal of the sidecar's own endpoints."""
        headers = request.headers
        if admin_apis.authorised(headers.get("Authorization"), headers.get(admin_apis.TOKEN_HEADER), self.admin.token):
            return None
        return self._token_refusal(admin_apis.SIDECAR)

    def _token_refusal(self, category: str) -> web.Response:
        status, body = admin_apis.refusal(category, "http", token_configured=bool(self.admin.token))
        return _json_response(status, body, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)

    async def status(self, request: web.Request) -> web.Response:
        denied = self._authorised(request)
        if denied is not None:
            return denied
        return _json_response(200, self.admin.status())

    async def reload(self, request: web.Request) -> web.Response:
        denied = self._authorised(request)
        if denied is not None:
            return denied
        ok, message = await self.admin.reload("reload endpoint")
        return _json_response(200 if ok else 422, {"reloaded": ok, "message": message})

    # -- admission --------------------------------------------------------------------------------

    def _bad(self, reason: str) -> Answer:
        self.metrics.malformed.labels("http").inc()
        return Answer.json(400, {"error": f"malformed request: {reason}", "reason": "malformed_request"})

    def _down(self) -> Answer:
        self.metrics.unavailable.labels("http").inc()
        return Answer.json(503, unavailable(self.health.reason), {"Retry-After": "1"})

    def prepare(self, op: str, model_name: str, headers: Any, body: bytes) -> Prepared | Answer:
        """What admission needs of one model request (its reading and price, and the body as it goes
        upstream), or the answer when it cannot go further (malformed, Triton down). Shared by the
        aiohttp handler and the decision socket (sidecar/decisions.py), so both decide alike."""
        if not self.health.up:
            return self._down()
        policy = self.policy()
        state = self.controller.state
        model = state.model_policy(model_name)
        override: dict[str, str | None] = {}
        try:
            if op == "infer":
                header_length = headers.get(protocol.HEADER_LENGTH)
                parsed = _parsed_infer(body, header_length, model.kv is not None, policy.class_parameter)
                stated = protocol.infer_stated(parsed, model.kv, policy.class_parameter) if parsed else NOTHING
            else:
                doc = protocol.parse_generate(body)
                stated = protocol.generate_stated(doc, model.kv, policy.class_parameter)
            reading = read(policy, model, model_name, stated, headers.get(policy.class_header),
                           headers.get(policy.tenant_header), state.prompts.counter(model_name))
            if reading.priority is not None:
                if op != "infer":
                    body = protocol.with_priority(doc, reading.priority)
                else:
                    body, new_length = protocol.infer_with_priority(parsed or protocol.parse_infer(body, header_length),
                                                                    reading.priority)
                    if new_length is not None:
                        override[protocol.HEADER_LENGTH] = new_length
            cost = cost_for(model, reading.llm)
        except (protocol.BadRequest, ValueError) as err:
            return self._bad(str(err))
        return Prepared(reading, cost, body, _forward_headers(headers, _REQUEST_DROP, **override))

    @staticmethod
    def refused(rejected: Rejected) -> Answer:
        """A refusal as HTTP answers it: its status, the JSON body, Retry-After on a 429."""
        status, payload = refusal(rejected.decision, rejected.model, rejected.klass, rejected.tenant)
        retry = rejected.decision.retry_after_s
        return Answer.json(status, payload, {"Retry-After": str(int(retry))} if retry is not None and status == 429
                           else None)

    async def model_op(self, request: web.Request) -> web.StreamResponse:
        op = request.match_info["op"]
        if op not in _MODEL_OPS:
            return await self.passthrough(request)
        model_name = request.match_info["model"]
        body = await request.read()
        prepared = self.prepare(op, model_name, request.headers, body)
        if isinstance(prepared, Answer):
            return prepared.web()
        url = f"{self.base}{request.path_qs}"
        try:
            reading = prepared.reading
            async with self.controller.admit(model_name, reading.klass, prepared.cost, reading.tenant) as ticket:
                if op == "generate_stream":
                    return await self._stream(request, ticket, url, prepared.body, prepared.headers)
                return await self._unary(ticket, url, prepared.body, prepared.headers)
        except Rejected as rejected:
            return self.refused(rejected).web()

    async def _unary(self, ticket: Ticket, url: str, body: bytes, headers: CIMultiDict[str]) -> web.Response:
        assert self.session is not None
        try:
            ticket.started()
            async with self.session.post(url, data=body, headers=headers) as up:
                data = await up.read()
                ticket.finished(data if up.status >= 400 else None)
                return web.Response(status=up.status, body=data, headers=_forward_headers(up.headers))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as err:
            ticket.upstream_lost()
            self.health.mark_down(f"{type(err).__name__}: {err}")
            return self._down().web()

    async def _stream(
        self, request: web.Request, ticket: Ticket, url: str, body: bytes, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        assert self.session is not None
        response: web.StreamResponse | None = None
        try:
            ticket.started()
            async with self.session.post(url, data=body, headers=headers) as up:
                response = web.StreamResponse(status=up.status, headers=_forward_headers(up.headers))
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    ticket.first_token()
                    ticket.streamed(chunk.count(b"data:"))
                    if _SSE_ERROR in chunk:  # the engine failed the request mid-stream
                        ticket.errored(chunk)
                    await response.write(chunk)
                ticket.finished(b"" if up.status >= 400 else None)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as err:
            if isinstance(err, aiohttp.ClientConnectionResetError) or _client_gone(request):
                ticket.client_left()
                return response or web.Response(status=499)
            ticket.upstream_lost()
            self.health.mark_down(f"{type(err).__name__}: {err}")
            if response is None:
                return self._down().web()
            event = json.dumps({"error": f"Triton failed mid-stream: {type(err).__name__}: {err}"})
            try:
                await response.write(f"data: {event}\n\n".encode())
            except (ConnectionError, aiohttp.ClientConnectionError):
                pass
        except ConnectionError:
            ticket.client_left()
            return response or web.Response(status=499)
        assert response is not None
        try:
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionError):
            ticket.client_left()
        return response

    # -- everything else --------------------------------------------------------------------------

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/sidecar/"):
            return _json_response(404, {"error": f"no sidecar endpoint {request.path}"})
        # classified as Triton will see it: the path the client session sends (dot segments resolved)
        url = URL(f"{self.base}{request.path_qs}")
        path = url.raw_path
        if self.prefix and path.startswith(self.prefix):
            path = path[len(self.prefix):]
        drop = _REQUEST_DROP
        category = admin_apis.http_admin_category(path)
        if category is not None:
            headers = request.headers
            kept_out = admin_apis.kept_out(category, headers.get("Authorization"), headers.get(admin_apis.TOKEN_HEADER),
                                           self.admin.token, self.policy().admin_apis.open)
            if kept_out is None:
                self.metrics.admin_refused.labels(category, "http").inc()
                log.debug("refused %s %s: Triton's %s API is shut", request.method, request.path, category)
                return self._token_refusal(category)
            drop = drop | frozenset(kept_out)
        if not self.health.up:
            return self._down().web()
        assert self.session is not None
        body = await request.read() if request.body_exists else None
        try:
            async with self.session.request(
                request.method, url, data=body, headers=_forward_headers(request.headers, drop)
            ) as up:
                data = await up.read()
                return web.Response(status=up.status, body=data, headers=_forward_headers(up.headers))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as err:
            self.health.mark_down(f"{type(err).__name__}: {err}")
            return self._down().web()


def _parsed_infer(body: bytes, header_length: str | None, llm: bool, class_key: str) -> protocol.InferBody | None:
    """An infer body parsed when its reading needs it: an LLM's (its prompt and budget), or one whose
    JSON part may name a class or a priority, or whose length header is not plainly valid (the
    parser says why); a plain classic request goes as it came, unparsed."""
    valid_length = header_length is None or (header_length.isdigit() and int(header_length) <= len(body))
    head = body[: int(header_length)] if header_length and valid_length else body
    if llm or not valid_length or _PRIORITY_JSON in head or f'"{class_key}"'.encode() in head:
        return protocol.parse_infer(body, header_length)
    return None


async def _close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
