"""Decisions for requests nginx carries: the Python end of sidecar/tritongen_decide.lua.

Why: relaying a stream through Python costs CPU per token (an event loop reads, parses and writes
every chunk), and on a host where the engine shares the cores that CPU is the sidecar's cost to the
user: first tokens later, refusals slower, fewer completions (bench_llm_guard). With the native
front, nginx carries a model request's bytes both ways and asks here once, before it goes upstream:
admit (the body to send, when the class's priority had to be written into it), or refuse (status,
Retry-After, the JSON body). A queued request waits in nginx on its connection; a client that goes
away closes it and the request leaves the queue. nginx then reports the stream's first token and
its end (status, events, the engine's error), and the reservation goes back through the same
admission context (`AdmissionController.admit`) and the same metrics as the Python path's.

The wire, on a Unix socket only nginx and this process know (`\t`-separated lines, each body
length-prefixed so no JSON parser is needed in Lua):
  nginx -> here  `admit\tMODEL\tOP\tCLASS\tTENANT\tN\n` + N body bytes
  here -> nginx  `admit\tID\t\tN\n` + N bytes of rewritten body (N = 0: unchanged)
                 `refuse\tSTATUS\tRETRY_AFTER\tN\n` + N bytes of JSON
  nginx -> here  `ok\tID\n` on the same connection once it read a grant (a connection that closes
                 before it: the client left, the grant goes back),
                 `first\tID\n`, `end\tID\tSTATUS\tEVENTS\tHOW\tN\n` + N bytes of the engine's error
                 (HOW: "ok", or "down" when nginx could not reach Triton); no answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from sidecar.controller import AdmissionController, Rejected, Ticket, upstream_outcome
from sidecar.http_proxy import Answer, HttpProxy
from sidecar.upstream import UpstreamHealth

log = logging.getLogger("tritongen.sidecar")

DECIDED_OPS = ("generate", "generate_stream")  # the model operations nginx carries after a decision
CLIENT_CLOSED = 499  # nginx's status for a client that went away


class DecisionServer:
    """The decision socket. `held` maps the id of each admitted request nginx carries to its open
    admission context, until nginx reports its end."""

    def __init__(self, path: Path, proxy: HttpProxy, controller: AdmissionController, health: UpstreamHealth) -> None:
        self.path = path
        self.proxy = proxy
        self.controller = controller
        self.health = health
        self.held: dict[int, tuple[Any, Ticket]] = {}
        self.carried = 0  # admitted and reported ended by nginx
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        await self.release_all("cancelled")

    async def release_all(self, outcome: str) -> None:
        """nginx went away (a crash, a restart, the sidecar's stop): its requests' ends will never
        be reported, so every reservation it held goes back now, lingering as a cut request's does."""
        held, self.held = self.held, {}
        for admission, ticket in held.values():
            ticket.outcome = outcome
            await admission.__aexit__(None, None, None)
        if held:
            log.warning("the native front's %d request(s) in flight were released (%s)", len(held), outcome)

    def status(self) -> dict[str, int]:
        return {"in_flight": len(self.held), "carried": self.carried}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        unconfirmed: int | None = None  # a grant written here that nginx has not said it read
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                fields = line.rstrip(b"\n").decode("utf-8", errors="replace").split("\t")
                kind = fields[0]
                if kind == "admit":
                    granted = await self._admit(fields, reader, writer)
                    if granted is False:
                        return
                    unconfirmed = granted
                elif kind == "ok":
                    unconfirmed = None
                elif kind == "first":
                    held = self.held.get(int(fields[1]))
                    if held is not None:
                        held[1].first_token()
                elif kind == "end":
                    error = await reader.readexactly(int(fields[5])) if int(fields[5]) else b""
                    await self._end(int(fields[1]), int(fields[2]), int(fields[3]), fields[4], error)
                else:
                    log.error("the native front sent an unknown message %r; closing its connection", line[:80])
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as err:
            log.debug("decision connection closed: %s", err)
        finally:
            writer.close()
            if unconfirmed is not None:  # the client left as it was granted: nothing went upstream
                await self._end(unconfirmed, CLIENT_CLOSED, 0, "unsent", b"")

    async def _admit(self, fields: list[str], reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> int | bool | None:
        """One decision: the id granted, None when refused, False when nginx closed the connection
        (the client left while queued)."""
        _, model, op, klass, tenant, size = fields
        body = await reader.readexactly(int(size))
        policy = self.proxy.policy()
        headers = {}
        if klass:
            headers[policy.class_header] = klass
        if tenant:
            headers[policy.tenant_header] = tenant
        prepared = self.proxy.prepare(op, model, headers, body)
        if isinstance(prepared, Answer):
            _refuse(writer, prepared)
            return None
        admission = self.controller.admit(model, prepared.klass, prepared.cost, prepared.tenant)
        entering = asyncio.ensure_future(admission.__aenter__())
        await asyncio.sleep(0)  # admitted or refused at once in the common case: no watch needed
        if not entering.done():
            gone = asyncio.ensure_future(reader.read(1))  # nginx sends nothing until answered: EOF = the client left
            await asyncio.wait((entering, gone), return_when=asyncio.FIRST_COMPLETED)
            if not entering.done():
                entering.cancel()
                with contextlib.suppress(asyncio.CancelledError, Rejected):
                    await entering
                return False
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone  # the stream reader takes one waiter: this one must be gone before the next read
        try:
            ticket = entering.result()
        except Rejected as rejected:
            _refuse(writer, HttpProxy._refused(rejected, model, prepared))
            return None
        ticket.sent = True
        self.held[ticket.id] = (admission, ticket)
        rewritten = prepared.body if prepared.body is not body else b""
        writer.write(f"admit\t{ticket.id}\t\t{len(rewritten)}\n".encode() + rewritten)
        return ticket.id

    async def _end(self, rid: int, status: int, events: int, how: str, error: bytes) -> None:
        held = self.held.pop(rid, None)
        if held is None:
            return
        admission, ticket = held
        ticket.tokens = events
        if how == "unsent":
            ticket.sent = False  # granted, never sent: nothing to linger for
            ticket.outcome = "client_disconnect"
        elif how == "down":
            ticket.completed = True
            ticket.outcome = "upstream_failed"
            self.health.mark_down("the native front could not reach Triton")
        elif status == CLIENT_CLOSED:
            ticket.outcome = "client_disconnect"  # not completed: the engine may still hold it a moment
        else:
            ticket.completed = True
            if status >= 400 or error:
                ticket.outcome = upstream_outcome(error)
        if how != "unsent":
            self.carried += 1
        await admission.__aexit__(None, None, None)


def _refuse(writer: asyncio.StreamWriter, answer: Answer) -> None:
    retry = next((v for k, v in answer.headers if k.lower() == "retry-after"), "")
    writer.write(f"refuse\t{answer.status}\t{retry}\t{len(answer.body)}\n".encode() + answer.body)
