"""The asyncio owner of the admission state: capacity as a context manager.

    async with controller.admit(model, klass, cost, tenant) as ticket:
        ticket.started(); ...forward upstream; ticket.first_token(); ticket.finished()...

Whatever happens inside the block (completion, an error, cancellation, the client going away,
the upstream failing), leaving it releases the reservation exactly once. A request that is still
waiting when its task is cancelled leaves the queue; one that was granted in the instant it was
cancelled is released. `Rejected` carries the decision for the 429/413/403/400 answer.

The tenant's in-flight count and reserved bytes are part of the same reservation, so they are
released with it, exactly once, on every way out of the block (see sidecar/admission.py for how a
tenant over its quota waits or is refused).

A request that was sent upstream and did not see its end (cancelled, client gone) keeps its bytes
reserved for the model's `release_grace_ms`, because the engine may hold its KV blocks until it
notices the cancellation; the in-flight count drops at once.
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
from tritongen.core.engine_metrics import is_out_of_memory
from tritongen.core.engine_window import SIDECAR_OOM_OUTCOME
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


def upstream_outcome(error: bytes | str) -> str:
    """How an admitted request that Triton answered with an error ended: "oom" when its engine
    killed it for want of KV memory (doctor's DR112 counts these), else "upstream_error"."""
    text = error.decode("utf-8", errors="replace") if isinstance(error, bytes) else error
    return SIDECAR_OOM_OUTCOME if is_out_of_memory(text) else "upstream_error"


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
    # block turns what was learnt into the release and the metrics (`_Admission.__aexit__`).

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

    def finished(self, error: bytes | str | None = None) -> None:
        """Triton said it is over; `error` (its text, maybe empty) when it ended the request failed."""
        self.completed = True
        if error is not None:
            self.errored(error)

    def upstream_lost(self) -> None:
        """The connection to Triton broke: the request is over there too."""
        self.completed = True
        self.outcome = "upstream_failed"

    def client_left(self) -> None:
        """Not completed: the engine may still hold the request until it notices."""
        if self.outcome is None:
            self.outcome = "client_disconnect"

    def unsent(self) -> None:
        """Granted, but the client left before it went upstream: nothing to linger for."""
        self.sent = False
        self.outcome = "client_disconnect"

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
        self._children: dict[tuple[str, ...], object] = {}
        self._hot: dict[tuple[str, str], _Series] = {}  # (class, model label) -> its per-request series
        # Called when a request starts waiting (the native lane stops growing at once: lane_control).
        self.on_queued: Callable[[], None] | None = None
        # Called with a model when its request found no room: True if the native lane gave idle slots
        # of it back (lane_control.LaneControl.reclaim), so the request is judged again.
        self.reclaim: Callable[[str], bool] | None = None

    def _child(self, metric: object, *labels: str) -> object:
        """prometheus_client's labels() lookup is not free; keep the children per label set."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)  # type: ignore[attr-defined]
        return child

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

    def label(self, model: str) -> str:
        return model if self.state.known_model(model) else "other"

    def admit(self, model: str, klass: str, cost: Cost, tenant: str = DEFAULT_TENANT,
              before_s: float = 0.0) -> _Admission:
        """The reservation of one request, as an async context manager yielding its `Ticket`.
        `before_s`: how long the request had already waited in front of the sidecar (nginx tells
        it): its time to first token counts from its real arrival, and its class's wait is shorter."""
        return _Admission(self, model, klass, cost, tenant, before_s)

    def _series(self, klass: str, mlabel: str) -> _Series:
        series = self._hot.get((klass, mlabel))
        if series is None:
            m = self.metrics
            series = self._hot[(klass, mlabel)] = _Series(
                m.admitted.labels(klass, mlabel), m.queue_wait.labels(klass), m.latency.labels(klass, mlabel), {}
            )
        return series

    def _finished(self, series: _Series, klass: str, mlabel: str, outcome: str) -> None:
        child = series.outcomes.get(outcome)
        if child is None:
            child = series.outcomes[outcome] = self.metrics.outcomes.labels(klass, mlabel, outcome)
        child.inc()

    def first_token(self, ticket: Ticket) -> None:
        self.state.end_prefill(ticket.id)
        self.dispatch()
        assert ticket.first_token_at is not None
        self.metrics.ttft.labels(ticket.klass, self.label(ticket.model)).observe(ticket.first_token_at - ticket.arrived)

    def _admitted(self, series: _Series, cost: Cost, mlabel: str, tlabel: str, waited_s: float) -> None:
        """Count an admission. Prompt lengths are observed here, not on arrival: the histogram
        describes what reached Triton's queue (DR103 judges that queue), and a refused request
        that is retried would otherwise be counted once per try."""
        m = self.metrics
        series.admitted.inc()
        self._child(m.tenant_admitted, tlabel).inc()  # type: ignore[attr-defined]
        series.queue_wait.observe(waited_s)
        if cost.prompt_lengths:
            histogram = self._child(m.prompt_tokens, mlabel)
            for length in cost.prompt_lengths:
                histogram.observe(length)  # type: ignore[attr-defined]

    def _rejected(self, decision: Decision, klass: str, mlabel: str, tlabel: str) -> None:
        self._child(self.metrics.rejected, klass, mlabel, decision.reason).inc()  # type: ignore[attr-defined]
        self._child(self.metrics.tenant_rejected, tlabel, decision.reason).inc()  # type: ignore[attr-defined]

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
            ratio = state.prompt_ratio(name)
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


@dataclass(frozen=True)
class _Series:
    """The metric children every admitted request of one (class, model label) touches."""

    admitted: Any
    queue_wait: Any
    latency: Any
    outcomes: dict[str, Any]


class _Admission:
    """`AdmissionController.admit(...)`: enter waits for (or is refused) the reservation, exit
    releases it, exactly once, whatever ended the block.

    A class rather than a `contextlib.asynccontextmanager` generator: every request of the
    pass-through enters one, and the generator machinery (a generator, `asend`/`athrow` and
    contextlib's wrapper per request) cost several microseconds more than these two methods.
    """

    __slots__ = ("_ctl", "_model", "_klass", "_cost", "_tenant", "_before_s", "_ticket", "_mlabel", "_series",
                 "_waited_s")

    def __init__(self, ctl: AdmissionController, model: str, klass: str, cost: Cost, tenant: str,
                 before_s: float = 0.0) -> None:
        self._ctl = ctl
        self._model = model
        self._klass = klass
        self._cost = cost
        self._tenant = tenant
        self._before_s = before_s
        self._ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        ctl, model, klass, cost, tenant = self._ctl, self._model, self._klass, self._cost, self._tenant
        state = ctl.state
        rid = next(ctl._ids)
        arrived = ctl.clock() - self._before_s
        mlabel = model if state.known_model(model) else "other"
        tlabel = state.tenant_label(tenant)
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
            ctl._rejected(decision, klass, mlabel, tlabel)
            raise Rejected(decision, model, klass, tenant)
        if future is not None:
            held_by = (decision.limit or "queue_order").split(":", 1)[0]  # the kind, not the model or scope named after it
            ctl._child(ctl.metrics.queued, klass, mlabel, held_by).inc()  # type: ignore[attr-defined]
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
                ctl._rejected(decision, klass, mlabel, tlabel)
                raise Rejected(decision, model, klass, tenant)
        series = ctl._series(klass, mlabel)
        ctl._admitted(series, cost, mlabel, tlabel, decision.waited_s)
        self._mlabel, self._series, self._waited_s = mlabel, series, decision.waited_s
        self._ticket = Ticket(rid, model, klass, cost, arrived, ctl.clock(), decision.waited_s, ctl, tenant=tenant)
        return self._ticket

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        ticket = self._ticket
        assert ticket is not None
        self._ticket = None
        ctl, state = self._ctl, self._ctl.state
        if exc_type is None:
            outcome = "ok"
        elif issubclass(exc_type, (asyncio.CancelledError, GeneratorExit)):
            outcome = "cancelled"
        else:
            outcome = "error"
        outcome = ticket.outcome or outcome
        grace = 0.0
        if ticket.sent and not ticket.completed:
            grace = state.model_policy(ticket.model).release_grace_ms / 1000
        tokens = ticket.cost.prompt_tokens + ticket.tokens if ticket.tokens else None
        state.release(ticket.id, tokens=tokens, linger_s=grace, responses=ticket.tokens)
        if state.has_events:
            ctl.dispatch()
        ctl._finished(self._series, ticket.klass, self._mlabel, outcome)
        end = ctl.clock()
        # Every admitted request's end-to-end time, whatever its outcome: nginx's lane counts its
        # requests so (its log phase sees every end), and one panel must read both paths alike.
        self._series.latency.observe(end - ticket.arrived)
        if log.isEnabledFor(logging.DEBUG):
            ttft = "-" if ticket.first_token_at is None else f"{1000 * (ticket.first_token_at - ticket.arrived):.1f}"
            log.debug("%s %s %s (tenant %s): waited %.1f ms, first response %s ms, total %.1f ms, %d responses",
                      ticket.model, ticket.klass, outcome, ticket.tenant, 1000 * self._waited_s, ttft,
                      1000 * (end - ticket.arrived), ticket.tokens)
        if grace:
            ctl._wake.set()  # the ticker ends lingering reservations
