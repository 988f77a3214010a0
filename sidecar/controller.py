"""The asyncio owner of the admission state: capacity as a context manager.

    async with controller.admit(model, klass, cost, tenant) as ticket:
        ...forward upstream; ticket.first_token(); ticket.completed = True...

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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sidecar.admission import (
    CLASS_NOT_SERVED,
    EXCEEDS_BUDGET,
    TENANT_CLASS_NOT_ALLOWED,
    Action,
    AdmissionState,
    Cost,
    Decision,
    Request,
)
from sidecar.metrics import SidecarMetrics
from sidecar.policy import DEFAULT_TENANT
from sidecar.tasks import BackgroundTask

log = logging.getLogger("tritongen.sidecar")


UPSTREAM_UNAVAILABLE = "upstream_unavailable"


_STATUS = {EXCEEDS_BUDGET: 413, CLASS_NOT_SERVED: 400, TENANT_CLASS_NOT_ALLOWED: 403}


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

    def first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = self._controller.clock()
            self._controller.first_token(self)


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
            try:
                self.state.tick()
                self.dispatch()
                self.publish()
            except Exception:  # never let the ticker die: admission would stall
                log.exception("admission ticker failed")

    # -- the context manager ----------------------------------------------------------------------

    def label(self, model: str) -> str:
        return model if self.state.known_model(model) else "other"

    @contextlib.asynccontextmanager
    async def admit(
        self, model: str, klass: str, cost: Cost, tenant: str = DEFAULT_TENANT
    ) -> AsyncIterator[Ticket]:
        rid = next(self._ids)
        arrived = self.clock()
        mlabel = self.label(model)
        tlabel = self.state.tenant_label(tenant)
        decision = self.state.submit(Request(rid, model, klass, cost, tenant))
        future: asyncio.Future[Decision] | None = None
        if decision.action is Action.QUEUE:
            # Registered before anything else runs: handing out other grants below may grant this one.
            future = asyncio.get_running_loop().create_future()
            self._waiters[rid] = future
        self.dispatch()
        if decision.action is Action.REJECT:
            self._rejected(decision, klass, mlabel, tlabel)
            raise Rejected(decision, model, klass, tenant)
        if future is not None:
            self._child(self.metrics.queued, klass, mlabel).inc()  # type: ignore[attr-defined]
            self._wake.set()
            try:
                decision = await future
            except asyncio.CancelledError:
                self._waiters.pop(rid, None)
                if not self.state.cancel(rid):
                    self.state.release(rid)  # granted in the same instant; nothing went upstream
                    self.dispatch()
                raise
            if decision.action is Action.REJECT:
                self._rejected(decision, klass, mlabel, tlabel)
                raise Rejected(decision, model, klass, tenant)
        admitted = self.clock()
        self._admitted(cost, klass, mlabel, tlabel, decision.waited_s)
        ticket = Ticket(rid, model, klass, cost, arrived, admitted, decision.waited_s, self, tenant=tenant)
        outcome = "ok"
        try:
            yield ticket
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except GeneratorExit:
            outcome = "cancelled"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            outcome = ticket.outcome or outcome
            grace = 0.0
            if ticket.sent and not ticket.completed:
                grace = self.state.model_policy(model).release_grace_ms / 1000
            tokens = cost.prompt_tokens + ticket.tokens if ticket.tokens else None
            self.state.release(rid, tokens=tokens, linger_s=grace)
            self.dispatch()
            self._child(self.metrics.outcomes, klass, mlabel, outcome).inc()  # type: ignore[attr-defined]
            end = self.clock()
            if outcome == "ok":
                self._child(self.metrics.latency, klass, mlabel).observe(end - arrived)  # type: ignore[attr-defined]
            if log.isEnabledFor(logging.DEBUG):
                ttft = "-" if ticket.first_token_at is None else f"{1000 * (ticket.first_token_at - arrived):.1f}"
                log.debug("%s %s %s (tenant %s): waited %.1f ms, first response %s ms, total %.1f ms, %d responses",
                          model, klass, outcome, tenant, 1000 * decision.waited_s, ttft, 1000 * (end - arrived),
                          ticket.tokens)
            if grace:
                self._wake.set()  # the ticker ends lingering reservations

    def first_token(self, ticket: Ticket) -> None:
        self.state.end_prefill(ticket.id)
        self.dispatch()
        assert ticket.first_token_at is not None
        self.metrics.ttft.labels(ticket.klass, self.label(ticket.model)).observe(ticket.first_token_at - ticket.arrived)

    def _admitted(self, cost: Cost, klass: str, mlabel: str, tlabel: str, waited_s: float) -> None:
        """Count an admission. Prompt lengths are observed here, not on arrival: the histogram
        describes what reached Triton's queue (DR103 judges that queue), and a refused request
        that is retried would otherwise be counted once per try."""
        m = self.metrics
        self._child(m.admitted, klass, mlabel).inc()  # type: ignore[attr-defined]
        self._child(m.tenant_admitted, tlabel).inc()  # type: ignore[attr-defined]
        self._child(m.queue_wait, klass).observe(waited_s)  # type: ignore[attr-defined]
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
