"""The asyncio owner of the admission state: capacity as a context manager.

    async with controller.admit(model, klass, cost, tenant) as ticket:
        ticket.started(); ...forward upstream; ticket.first_token(); ticket.finished()...

Whatever ends the block (completion, an error, cancellation, the client going away, the upstream
failing), leaving it releases the reservation, the tenant's counts with it, exactly once. A request
still waiting when its task is cancelled leaves the queue; one granted in the instant it was
cancelled is released. `Rejected` carries the decision for the 429/413/403/400 answer. A request
that went upstream and did not see its end keeps its bytes reserved for the model's
`release_grace_ms` (the engine may hold its KV blocks until it notices); its in-flight count drops
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.accounting import (
    CANCELLED, CLIENT_CLOSED, DOWN, ENDED, ERROR, OK, UNSENT, Accounting, outcome, upstream_outcome,
)
from sidecar.admission import AdmissionState
from sidecar.admission_types import (
    CLASS_NOT_SERVED,
    EXCEEDS_BUDGET,
    EXCEEDS_CONTEXT,
    QUEUE_FULL,
    QUEUE_WAIT,
    TENANT_CLASS_NOT_ALLOWED,
    Action,
    Cost,
    Decision,
    Request,
)
from sidecar.metrics import SidecarMetrics
from sidecar.tasks import BackgroundTask
from tritongen.core.sidecar_policy.base import DEFAULT_TENANT

log = logging.getLogger("tritongen.sidecar")


UPSTREAM_UNAVAILABLE = "upstream_unavailable"


# Refusals for want of room (not a request that can never run or is not served here).
_ROOM_REASONS = frozenset({QUEUE_FULL, QUEUE_WAIT})
_STATUS = {EXCEEDS_BUDGET: 413, EXCEEDS_CONTEXT: 400, CLASS_NOT_SERVED: 400, TENANT_CLASS_NOT_ALLOWED: 403}


def refusal(
    decision: Decision, model: str, klass: str, tenant: str = DEFAULT_TENANT
) -> tuple[int, dict[str, object]]:
    """(HTTP status, JSON body) for a refused request; gRPC maps the status (see grpc_proxy)."""
    status = _STATUS.get(decision.reason, 429)
    body: dict[str, object] = {
        "error": f"sidecar refused the request ({decision.reason}): {decision.detail}",
        "reason": decision.reason,
        "limit": decision.limit,
        "limit_capacity": decision.limit_capacity,
        "limit_used": decision.limit_used,
        "headroom_bytes": None if decision.headroom_bytes is None else int(decision.headroom_bytes),
        "retry_after_s": decision.retry_after_s,
        "model": model,
        "class": klass,
        "tenant": tenant,
    }
    if decision.queue_position is not None:
        body["queue_position"] = decision.queue_position
    if decision.waited_s:
        body["waited_ms"] = round(decision.waited_s * 1000, 1)
    return status, body


def unavailable(reason: str | None, retry_after_s: int = 1) -> dict[str, object]:
    return {
        "error": f"Triton is unavailable: {reason or 'not ready'}; the sidecar answers at once until it is back",
        "reason": UPSTREAM_UNAVAILABLE,
        "retry_after_s": retry_after_s,
    }


class Rejected(Exception):
    def __init__(self, decision: Decision, model: str, klass: str, tenant: str = DEFAULT_TENANT) -> None:
        super().__init__(decision.detail or decision.reason)
        self.decision = decision
        self.model = model
        self.klass = klass
        self.tenant = tenant


@dataclass
class Ticket:
    id: int
    model: str
    klass: str
    cost: Cost
    arrived: float
    admitted: float
    waited_s: float
    _controller: AdmissionController = field(repr=False)
    sent: bool = False  # the request went upstream
    completed: bool = False  # the upstream said the request is over (final response, error, body end)
    outcome: str | None = None  # set by the proxy where it knows better ("client_disconnect", ...)
    tokens: int = 0  # responses streamed (≈ generated tokens)
    first_token_at: float | None = None
    tenant: str = DEFAULT_TENANT

    # The request's life after admission, whoever carries it (the HTTP and gRPC relays, nginx through
    # the decision socket): each thing a carrier can learn is one call, and leaving the admission
    # block turns what was learnt into the release and the metrics (`_Admission.__aexit__`). How it
    # ended is named by the one classification, `accounting.outcome`, whichever carrier saw it.

    def started(self) -> None:
        """It went upstream: an end the sidecar does not see now lingers for release_grace_ms."""
        self.sent = True

    def first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = self._controller.clock()
            self._controller.first_token(self)

    def streamed(self, responses: int) -> None:
        self.tokens += responses

    def errored(self, error: bytes | str) -> None:
        """Triton answered with an error (mid-stream, or as its answer); the first one names the outcome."""
        if self.outcome is None:
            self.outcome = upstream_outcome(error)

    def ended(self, how: str, status: int, error: bytes | str | None = None) -> None:
        """What its carrier saw at the end (`accounting.outcome`'s words: nginx reports them so). A
        client gone (499) is not an end at the engine, which may hold the request until it notices;
        a request never sent holds nothing there."""
        if how == UNSENT:
            self.sent = False
        elif how == DOWN or status != CLIENT_CLOSED:
            self.completed = True
        found = outcome(how, status, error)
        if how in (UNSENT, DOWN) or (self.outcome is None and found != OK):
            self.outcome = found

    def finished(self, error: bytes | str | None = None) -> None:
        """Triton said it is over; `error` (its text, maybe empty) when it ended the request failed."""
        self.ended(ENDED, 200 if error is None else 500, error)

    def upstream_lost(self) -> None:
        """The connection to Triton broke: the request is over there too."""
        self.ended(DOWN, 502)

    def client_left(self) -> None:
        self.ended(ENDED, CLIENT_CLOSED)

    def unsent(self) -> None:
        """Granted, but the client left before it went upstream: nothing to linger for."""
        self.ended(UNSENT, CLIENT_CLOSED)

    def abandoned(self, why: str) -> None:
        """Its carrier went away before reporting the end (nginx restarted, the sidecar stopping)."""
        self.outcome = why


class AdmissionController:
    def __init__(
        self,
        state: AdmissionState,
        metrics: SidecarMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Decision]] = {}
        self._background = BackgroundTask(self._ticker, "sidecar-admission-ticker")
        self._wake = asyncio.Event()
        self._known_models: set[str] = set()
        self._tenant_labels: set[str] = set()
        self.accounting = Accounting(state, metrics)  # every admitted request's counters, the lane's too
        # Called when a request starts waiting (the native lane stops growing at once: lane_control).
        self.on_queued: Callable[[], None] | None = None
        # Called with a model when its request found no room: True if the native lane gave idle slots
        # of it back (lane_control.LaneControl.reclaim), so the request is judged again.
        self.reclaim: Callable[[str], bool] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()

    async def _ticker(self) -> None:
        while True:
            busy = self.state.waiting or self.state.lingering
            try:
                await asyncio.wait_for(self._wake.wait(), 0.02 if busy else 0.1)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            # No publish() here: the gauges are read only when scraped, and the metrics endpoint
            # publishes before it answers; at 50 ticks a second it cost more than the requests.
            try:
                self.state.tick()
                self.dispatch()
            except Exception:  # never let the ticker die: admission would stall
                log.exception("admission ticker failed")

    # -- the context manager ----------------------------------------------------------------------

    def admit(self, model: str, klass: str, cost: Cost, tenant: str = DEFAULT_TENANT,
              before_s: float = 0.0) -> _Admission:
        """The reservation of one request, as an async context manager yielding its `Ticket`.
        `before_s`: how long the request had already waited in front of the sidecar (nginx tells
        it): its time to first token counts from its real arrival, and its class's wait is shorter."""
        return _Admission(self, model, klass, cost, tenant, before_s)

    def first_token(self, ticket: Ticket) -> None:
        self.state.end_prefill(ticket.id)
        self.dispatch()
        assert ticket.first_token_at is not None
        self.accounting.child(self.metrics.ttft, ticket.klass, self.accounting.label(ticket.model)).observe(
            ticket.first_token_at - ticket.arrived)

    def dispatch(self) -> None:
        """Hand grants and queue timeouts to the requests waiting for them."""
        while self.state.has_events:
            events = self.state.take_events()
            if not events.granted and not events.expired:
                return
            for decision in (*events.granted, *events.expired):
                future = self._waiters.pop(decision.request_id, None)
                if future is not None and not future.done():
                    future.set_result(decision)
                elif decision.action is Action.ADMIT:
                    self.state.release(decision.request_id)  # its waiter is gone: give the room back

    def wake(self) -> None:
        self._wake.set()

    # -- metrics ----------------------------------------------------------------------------------

    def publish(self) -> None:
        state, m = self.state, self.metrics
        m.inflight_total.set(state.inflight)
        m.reserved_total.set(state.reserved_bytes)
        m.limit.set(state.limit.value)
        now = self.clock()
        m.watermark.set(state.watermark(now))
        delay = state.queue_delay_s(now)
        m.triton_queue_delay.set(delay or 0.0)
        for name, count in state.waiting_by_class().items():
            m.waiting.labels(name).set(count)
        models = {mp.name for mp in state.policy.models} | self._known_models
        self._known_models = {mp.name for mp in state.policy.models}
        for name in models:
            m.inflight.labels(name).set(state.inflight_of(name))
            m.reserved.labels(name).set(state.reserved_of(name))
            risk = state.oom_risk(name)
            if risk is not None:
                m.oom_risk.labels(name).set(risk)
            law = state.engine_limit(name)
            if law is not None:
                m.engine_limit.labels(name).set(law.limit)
            ratio = state.prompts.ratio(name)
            if ratio is not None:
                m.prompt_ratio.labels(name, ratio[1]).set(ratio[0])
        m.inflight.labels("other").set(
            state.inflight - sum(state.inflight_of(n) for n in {mp.name for mp in state.policy.models})
        )
        self._publish_tenants()

    def _publish_tenants(self) -> None:
        """Per-tenant gauges; a tenant a reloaded policy no longer lists loses its series (its
        requests still in flight are counted under `other` from then on)."""
        m = self.metrics
        usage = self.state.tenant_usage()
        for gone in self._tenant_labels - usage.keys():
            for gauge in (m.tenant_inflight, m.tenant_reserved):
                with contextlib.suppress(KeyError):
                    gauge.remove(gone)
        for label, (inflight, reserved) in usage.items():
            m.tenant_inflight.labels(label).set(inflight)
            m.tenant_reserved.labels(label).set(reserved)
        self._tenant_labels = set(usage)


class _Admission:
    """`AdmissionController.admit(...)`: enter waits for (or is refused) the reservation, exit
    releases it, exactly once, whatever ended the block.

    A class rather than a `contextlib.asynccontextmanager` generator: every request of the
    pass-through enters one, and the generator machinery (a generator, `asend`/`athrow` and
    contextlib's wrapper per request) cost several microseconds more than these two methods.
    """

    __slots__ = ("_ctl", "_model", "_klass", "_cost", "_tenant", "_before_s", "_ticket", "_series", "_waited_s",
                 "_inner_ended", "_inner_seen", "_inner_last")

    def __init__(self, ctl: AdmissionController, model: str, klass: str, cost: Cost, tenant: str,
                 before_s: float = 0.0) -> None:
        self._ctl = ctl
        self._model = model
        self._klass = klass
        self._cost = cost
        self._tenant = tenant
        self._before_s = before_s
        self._ticket: Ticket | None = None
        self._inner_ended = self._inner_seen = 0  # requests inside a carried gRPC stream (inner_request_ended)
        self._inner_last = 0.0

    async def __aenter__(self) -> Ticket:
        ctl, model, klass, cost, tenant = self._ctl, self._model, self._klass, self._cost, self._tenant
        state, accounting = ctl.state, ctl.accounting
        rid = next(ctl._ids)
        arrived = ctl.clock() - self._before_s
        mlabel = accounting.label(model)
        request = Request(rid, model, klass, cost, tenant, self._before_s)
        decision = state.submit(request)
        if decision.action is Action.REJECT and decision.reason in _ROOM_REASONS and ctl.reclaim is not None \
                and ctl.reclaim(model):
            decision = state.submit(request)  # the native lane gave idle slots of the model back: judged again
        elif decision.action is Action.QUEUE and ctl.reclaim is not None:
            ctl.reclaim(model)  # idle lane slots back: the return's pump may grant it (its event, below)
        future: asyncio.Future[Decision] | None = None
        if decision.action is Action.QUEUE:
            # Registered before anything else runs: handing out other grants below may grant this one.
            future = asyncio.get_running_loop().create_future()
            ctl._waiters[rid] = future
        if state.has_events:
            ctl.dispatch()
        if decision.action is Action.REJECT:
            accounting.rejected(decision, klass, mlabel, tenant)
            raise Rejected(decision, model, klass, tenant)
        if future is not None:
            held_by = (decision.limit or "queue_order").split(":", 1)[0]  # the kind, not the model or scope named after it
            accounting.child(ctl.metrics.queued, klass, mlabel, held_by).inc()
            ctl._wake.set()
            if ctl.on_queued is not None:
                ctl.on_queued()
            try:
                decision = await future
            except asyncio.CancelledError:
                ctl._waiters.pop(rid, None)
                if not state.cancel(rid):
                    state.release(rid)  # granted in the same instant; nothing went upstream
                    ctl.dispatch()
                raise
            if decision.action is Action.REJECT:
                accounting.rejected(decision, klass, mlabel, tenant)
                raise Rejected(decision, model, klass, tenant)
        series = accounting.series(klass, mlabel)
        accounting.admitted(series, tenant, decision.waited_s, cost)
        self._series, self._waited_s = series, decision.waited_s
        self._ticket = Ticket(rid, model, klass, cost, arrived, ctl.clock(), decision.waited_s, ctl, tenant=tenant)
        return self._ticket

    def inner_request_ended(self, seconds: float, first_s: float, error: bytes | None) -> None:
        """One request inside a gRPC stream nginx carries ended (`seconds`, `first_s`: its span and time to
        first response as nginx could time them). The stream holds one reservation, but each of its
        requests is one on the dashboard: admitted (the stream's admission counted the first), ended
        with its own outcome and duration, and after the first its time to first token. The stream's
        end then counts only the requests it cut short, not itself."""
        if self._inner_ended and not error:
            ctl = self._ctl
            ctl.accounting.child(ctl.metrics.ttft, self._klass, self._series.mlabel).observe(first_s)
        self._count_inner(upstream_outcome(error) if error else OK, seconds)
        self._inner_last = self._ctl.clock()

    def inner_requests_seen(self, requests: int) -> None:
        """How many requests the stream's response frames named (nginx says so before its end)."""
        self._inner_seen = max(self._inner_seen, requests)

    def _count_inner(self, how: str, seconds: float) -> None:
        accounting = self._ctl.accounting
        if self._inner_ended:
            accounting.admitted(self._series, self._tenant, 0.0)
        self._inner_ended += 1
        accounting.ended(self._series, how, seconds)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        ticket = self._ticket
        assert ticket is not None
        self._ticket = None
        ctl, state = self._ctl, self._ctl.state
        if ticket.outcome is not None:
            how = ticket.outcome
        elif exc_type is None:
            how = OK
        else:
            how = CANCELLED if issubclass(exc_type, (asyncio.CancelledError, GeneratorExit)) else ERROR
        grace = 0.0
        if ticket.sent and not ticket.completed:
            grace = state.model_policy(ticket.model).release_grace_ms / 1000
        tokens = ticket.cost.prompt_tokens + ticket.tokens if ticket.tokens else None
        state.release(ticket.id, tokens=tokens, linger_s=grace, responses=ticket.tokens)
        if state.has_events:
            ctl.dispatch()
        end = ctl.clock()
        if self._inner_ended:  # a stream whose requests were counted each: the ones it cut short
            for _ in range(self._inner_seen - self._inner_ended):
                self._count_inner(how, end - self._inner_last)
        else:
            ctl.accounting.ended(self._series, how, end - ticket.arrived)
        if log.isEnabledFor(logging.DEBUG):
            ttft = "-" if ticket.first_token_at is None else f"{1000 * (ticket.first_token_at - ticket.arrived):.1f}"
            log.debug("%s %s %s (tenant %s): waited %.1f ms, first response %s ms, total %.1f ms, %d responses",
                      ticket.model, ticket.klass, how, ticket.tenant, 1000 * self._waited_s, ttft,
                      1000 * (end - ticket.arrived), ticket.tokens)
        if grace:
            ctl._wake.set()  # the ticker ends lingering reservations
