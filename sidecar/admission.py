"""The sidecar's admission state: pure, single-threaded, clock injected. No asyncio, no I/O.

The asyncio code in `sidecar/controller.py` owns one `AdmissionState` and calls it; everything that
decides (admit, queue or refuse; who leaves the queue next; when the concurrency limit moves; what
Retry-After says) is reached from here so it can be tested exhaustively with a fake clock. This
module holds the operations that change the state; what it is made of and what it answers without
changing anything are `AdmissionView`'s (sidecar/admission_view.py). The numbers that shape the
decisions are in tritongen/core/admission_tuning.py with their provenance; the ones a deployer may
move are the policy's `admission` section.

Waiting or refused. A request that cannot be admitted at once waits only if it is expected to
leave the queue within its class's wait (sidecar/admission_estimates.py); below the top class at
a high quantile of the wait (`admission.wait_z`), not its mean: one queued on the mean near the
limit waits its whole budget about half the time and is then refused late. Once waiting, a request
is refused only at its class's deadline: refusing mid-wait on a fresh prediction cost goodput
whenever the drain estimate dipped (a real vLLM's burst: 35 of 100 batch requests refused after
4.5 s of a 10 s wait, where the server alone served 71 within target against the sidecar's 65).

A request blocked by a shared room (device headroom) holds everything behind it, so a large
request cannot starve; one blocked by its own model's quota holds only its model, one blocked by
the adaptive limit every LLM request, one blocked by its tenant's quota only its tenant (so one
tenant at its quota cannot block the others: docs/sidecar.md, tenants). Two approximations for
tenants: the wait estimate is the model's, and a tenant's waiting requests count against its
class's queue cap like any other's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping

from sidecar.admission_estimates import wait_from
from sidecar.admission_limits import LowerShare
from sidecar.admission_queue import Group, Waiting
from sidecar.admission_types import (
    CLASS_NOT_SERVED,
    EXCEEDS_BUDGET,
    EXCEEDS_CONTEXT,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    QUEUE_WAIT,
    TENANT_CLASS_NOT_ALLOWED,
    Action,
    Clock,
    Decision,
    Events,
    HeadroomSnapshot,
    Request,
    decide,
)
from sidecar.admission_view import AdmissionView
from sidecar.cost import cost_for
from sidecar.reading import lane_reading
from tritongen.core.sidecar_policy.schema import SidecarPolicy


def _z_percentile(z: float) -> float:
    """The one-sided normal percentile of `z` standard deviations (97.7 for 2), for messages."""
    return 100 * 0.5 * (1 + math.erf(z / math.sqrt(2)))


class AdmissionState(AdmissionView):
    def __init__(self, policy: SidecarPolicy, clock: Clock) -> None:
        super().__init__(policy, clock)
        # Models whose engine queues that a request waited for since the last tick.
        self._engine_demand: set[str] = set()
        self._demand = False
        self._granted: list[Decision] = []
        self._expired: list[Decision] = []
        self.last_limit_move = "hold"

    # -- policy and observations ------------------------------------------------------------------

    def apply_policy(self, policy: SidecarPolicy) -> None:
        """A reloaded policy takes effect at once; reservations and waiting requests are kept."""
        self._set_policy(policy)
        self.limit.reconfigure(policy.concurrency)
        for waiting in self._waiting.values():
            waiting.groups = self._groups(waiting.request)
        self._pump()

    def set_token_counters(self, counters: Mapping[str, Callable[[bytes], int]]) -> None:
        """The models' tokenizers (sidecar/admission_prompts.py), loaded by the owner; the proxies count with them."""
        self.prompts.set_counters(counters)

    def observe_headroom(self, snapshot: HeadroomSnapshot) -> None:
        self.prompts.observe(snapshot.prompt_tokens_total)
        self._capacity.observe(snapshot, self.ledger.by_scope)
        self._pump()

    # -- the main entry points --------------------------------------------------------------------

    def submit(self, request: Request) -> Decision:
        """Admit now, queue, or refuse. Queued requests are granted later through `take_events()`."""
        now = self._now()
        if request.id in self._waiting or request.id in self.ledger.reservations:
            raise ValueError(f"request id {request.id!r} is already known to the admission state")
        self._expire(now)
        model = self.model_policy(request.model)
        klass = self.class_policy(request.klass)
        if model.classes is not None and klass.name not in model.classes:
            return Decision(
                Action.REJECT, request.id, CLASS_NOT_SERVED,
                detail=f"model {model.name!r} does not serve class {klass.name!r}; it serves {model.classes}",
            )
        quota = self.tenant_quota(request.tenant)
        if quota is not None and quota.classes is not None and klass.name not in quota.classes:
            return Decision(
                Action.REJECT, request.id, TENANT_CLASS_NOT_ALLOWED, limit=f"tenant_classes:{request.tenant}",
                detail=f"tenant {request.tenant!r} may send classes {quota.classes}; class {klass.name!r} is not one "
                "of them",
            )
        if request.cost.never is not None:
            reason, detail = request.cost.never
            return Decision(Action.REJECT, request.id, reason, limit=f"model_context:{model.name}"
                            if reason == EXCEEDS_CONTEXT else f"engine_pool:{model.name}", detail=detail)
        memory, slots = self.rooms(request, now)
        verdict = decide(request.cost, memory, slots)
        never = [r for r in (*memory, *slots) if r.static and r.need > r.capacity]
        if never:
            room = never[0]
            return Decision(
                Action.REJECT, request.id, EXCEEDS_BUDGET, limit=room.name, limit_capacity=room.capacity,
                limit_used=room.used, headroom_bytes=verdict.headroom_bytes,
                detail=f"the request needs {room.need:.0f} {room.unit} but {room.name} allows class "
                f"{klass.name!r} at most {room.capacity:.0f}; it can never be admitted",
            )
        if verdict.ok and not self._waiting:  # the common case: room, and nobody ahead
            self._reserve(request, now)
            self.estimates.note_arrival(request.model, klass.priority, now)
            return Decision(Action.ADMIT, request.id, "admitted", headroom_bytes=verdict.headroom_bytes)
        seq = self._waiting.next_seq()
        allowed_s = max(0.0, self.allowed_wait_s(request.model, klass) - request.before_s)
        waiting = Waiting(request, now, now + allowed_s, klass.priority, seq, self._groups(request))
        self._waiting[request.id] = waiting
        self._pump(now, expire=False)  # expired already above; the newcomer must not expire before it is judged
        granted = [g for g in self._granted if g.request_id == request.id]
        if granted:
            self._granted.remove(granted[0])
            self.estimates.note_arrival(request.model, klass.priority, now)
            return granted[0]
        # Not admitted: it waits, unless its queue is full or the wait would exceed the class's.
        del self._waiting[request.id]
        self._demand = True
        blocked = verdict.blocked or self._head_blocker(now, request)
        if blocked is not None and request.model in self._engine_limits and blocked.name in (
                f"model_concurrency_quota:{request.model}", f"lower_class_share:{request.model}"):
            self._engine_demand.add(request.model)
        if blocked is None:
            limit_name, cap, used = "queue_order", None, None
        else:
            limit_name, cap, used = blocked.name, blocked.capacity, blocked.used
        ahead = self._waiting.ahead(request.model, (klass.priority, now, seq), now)
        same_class = sum(1 for w in self._waiting.values() if w.request.klass == klass.name)
        terms = self._wait_terms(request.model, now, klass.priority)
        wait_s = None if terms is None else wait_from(terms, ahead + 1)
        # Below the top class a request waits only if it leaves in time with high confidence (the
        # policy's admission.wait_z); the top class waits on the mean: its budget is a few departures
        # long, and refusing it on a quantile would hand its share to the classes below.
        z = self.policy.admission.wait_z if klass.priority > self._index.top_level else 0.0
        sure_s = None if terms is None else wait_from(terms, ahead + 1, z)
        common = dict(limit=limit_name, limit_capacity=cap, limit_used=used, headroom_bytes=verdict.headroom_bytes)

        def refused(reason: str, detail: str) -> Decision:
            """Room did not come in time: the top class's LowerShare hears of it too."""
            self._judge_top_class(request.model, request.klass, now, math.inf)
            return Decision(Action.REJECT, request.id, reason, retry_after_s=self.retry_after_s(wait_s),
                            queue_position=ahead + 1, detail=detail, **common)

        if klass.queue_cap is not None and same_class >= klass.queue_cap:
            return refused(QUEUE_FULL, f"{limit_name} is reached and class {klass.name!r} already has {same_class} "
                           f"requests waiting (its queue cap is {klass.queue_cap})")
        if allowed_s <= 0:
            upstream_ms = (self.upstream_latency_s(request.model) or 0.0) * 1000
            quantile = self.policy.admission.latency_quantile * 100
            spent = f" and the request spent {request.before_s * 1000:.0f} ms reaching the sidecar" \
                if request.before_s > 0 else ""
            return refused(QUEUE_WAIT, f"{limit_name} is reached and class {klass.name!r}'s {klass.p99_ms:.0f} ms "
                           f"target leaves no time to wait: upstream alone takes {upstream_ms:.0f} ms "
                           f"(P{quantile:.0f}){spent}")
        if sure_s is not None and sure_s > allowed_s:
            assert wait_s is not None
            likely = f" ({sure_s * 1000:.0f} ms at its {_z_percentile(z):.0f}th percentile)" if z else ""
            return refused(QUEUE_WAIT, f"{limit_name} is reached and the estimated wait, {wait_s * 1000:.0f} ms"
                           f"{likely} for {ahead} request(s) ahead, exceeds the {allowed_s * 1000:.0f} ms class "
                           f"{klass.name!r} may wait")
        self._waiting[request.id] = waiting
        self.estimates.note_arrival(request.model, klass.priority, now)
        return Decision(Action.QUEUE, request.id, "queued", queue_position=ahead + 1, **common,
                        detail=f"waiting for {limit_name}")

    def cancel(self, request_id: Hashable) -> bool:
        """The client gave up while waiting. False if it is not waiting (already granted or gone)."""
        return self._waiting.pop(request_id, None) is not None

    def end_prefill(self, request_id: Hashable) -> None:
        """The first token came back: the prefill peak is no longer held, and the time from
        admission to this first response is a sample of the model's upstream latency."""
        res = self.ledger.reservations.get(request_id)
        if res is None:
            return
        if res.first_response_at is None:
            model_name = res.request.model
            self.ledger.started(res, self._now())
            assert res.first_response_at is not None
            self.estimates.observe_upstream(model_name, res.first_response_at - res.admitted_at)
            law = self._engine_limits.get(model_name)
            if law is not None:
                law.observe_first_token(res.first_response_at - res.admitted_at)
                law.observe_running(self.ledger.started_by_model[model_name], res.first_response_at)
            self._judge_top_class(model_name, res.request.klass, res.first_response_at,
                                  res.first_response_at - res.arrived_at)
        if res.prefill_bytes == 0:
            return
        self.ledger.end_prefill(res)
        self._pump()

    def release(self, request_id: Hashable, tokens: int | None = None, linger_s: float = 0.0,
                responses: int | None = None) -> bool:
        """The request ended (any way). Idempotent; False if it held nothing.

        `tokens`: the sequence's length (prompt + output); `responses`: the streamed responses it got
        (one a token), whose spacing is the engine's step (EngineConcurrency).

        `linger_s` > 0 keeps its bytes reserved that much longer (a cancelled request the engine may
        still hold memory for); the in-flight count drops at once either way.
        """
        res = self.ledger.reservations.get(request_id)
        if res is None or res.lingering_until is not None:
            return False
        now = self._now()
        model = res.request.model
        self.ledger.uncount(res, self._counts_for_limit(model))
        per_seq = tokens / max(1, res.request.cost.sequences) if tokens is not None and tokens > 0 else None
        self.estimates.observe_end(model, now, now - res.admitted_at,
                                   whole=res.first_response_at is None and linger_s == 0, tokens_per_sequence=per_seq)
        law = self._engine_limits.get(model)
        if law is not None:
            law.observe_running(self.ledger.started_by_model[model], now)
            if responses is not None and responses > 1 and res.first_response_at is not None and linger_s == 0:
                law.observe_gap((now - res.first_response_at) / (responses - 1))
        if linger_s > 0:
            self.ledger.linger(res, now + linger_s)
        else:
            self.ledger.free(request_id)
        self._pump(now)
        return True

    # -- the native lane (sidecar/lane.py) ---------------------------------------------------------

    def lane_may_grow(self, model: str, now: float | None = None) -> bool:
        """Whether the lane may take more slots of `model`: not while a request of the model waits
        here (new lane requests must queue behind it), nor while the queue's head waits for a
        shared room (a device's headroom), which a slot would take from it."""
        if not self._waiting:
            return True
        now = self._now() if now is None else now
        if any(w.request.model == model for w in self._waiting.values()):
            return False
        blocked = self._head_blocker(now)
        return blocked is None or not blocked.shared

    def take_lane_slot(self, slot_id: Hashable, model: str, klass: str) -> bool:
        """Reserve one lane slot of a classic model, as a request of `klass` and the default tenant
        would be reserved, if it fits now and the lane may grow. No arrival is counted: a slot is
        capacity handed to nginx, not a request."""
        now = self._now()
        request = self._lane_request(slot_id, model, klass)
        if request is None or slot_id in self.ledger.reservations or not self.lane_may_grow(model, now):
            return False
        memory, slots = self.rooms(request, now)
        if not decide(request.cost, memory, slots).ok:
            return False
        self._reserve(request, now)
        return True

    def lane_overfull(self, model: str, klass: str) -> bool:
        """Whether a room of `model`'s lane slots of `klass` holds more than it may (a reloaded policy
        lowered a quota, or live headroom fell): its idle slots go back."""
        request = self._lane_request(("lane", "probe"), model, klass)
        if request is None:
            return True
        memory, slots = self.rooms(request, self._now())
        return any(room.used > room.capacity for room in (*memory, *slots))

    def _lane_request(self, slot_id: Hashable, model: str, klass: str) -> Request | None:
        """What one lane slot of `model` and `klass` holds: a classic request of the default tenant
        (`cost.cost_for`'s classic cost); None for a model the policy does not list or an LLM."""
        mp = self._index.models.get(model)
        if mp is None or mp.kv is not None:
            return None
        reading = lane_reading(model, klass)  # what nginx's lane key says of its requests
        return Request(slot_id, model, reading.klass, cost_for(mp, reading.llm), reading.tenant)

    def lane_like_inflight(self, slots: Collection[Hashable]) -> Counter[tuple[str, str]]:
        """Per (model, class): requests of the lane's tenant that the Python path admitted and that
        have not ended (reservations other than the lane's `slots`), in one pass for every pair: the
        lane's overflow, still in flight, is demand the lane did not see. Without it a lane whose load
        had overflowed read its own few requests as its demand and shrank, so more overflowed: under 64
        clients of a model that does nothing the lane held 4-30 slots and the Python path decided most
        requests."""
        out: Counter[tuple[str, str]] = Counter()
        for rid, res in self.ledger.reservations.items():
            request = res.request
            if res.lingering_until is None and rid not in slots \
                    and request.tenant == lane_reading(request.model, request.klass).tenant:
                out[(request.model, request.klass)] += 1
        return out

    def return_lane_slot(self, slot_id: Hashable) -> bool:
        """Give a lane slot back (nginx no longer counts on it); its room goes to whoever waits.
        Unlike `release`, no completion is recorded: the lane's requests are (`lane_finished`)."""
        res = self.ledger.reservations.get(slot_id)
        if res is None:
            return False
        self.ledger.uncount(res, self._counts_for_limit(res.request.model))
        self.ledger.free(slot_id)
        self._pump()
        return True

    def lane_finished(self, model: str, count: int, seconds: float) -> None:
        """`count` lane requests of `model` ended, taking `seconds` in all: they feed the drain rate,
        the service time and the upstream latency that the Python path's wait estimates read."""
        if count <= 0 or model not in self._index.models:
            return
        now = self._now()
        self.estimates.lane_finished(model, now, count, seconds)
        self._pump(now)

    def tick(self) -> None:
        """Time passes: lingering reservations end, queue deadlines pass, the limit may move."""
        now = self._now()
        self._expire(now)
        watermark = self.watermark(now)
        delay = self.queue_delay_s(now)
        near_limit = self.ledger.inflight >= max(1, self.limit.value - 1)
        self.last_limit_move = self.limit.update(now, watermark, delay, self._demand or near_limit)
        if self.last_limit_move != "hold":
            self._demand = False
        due = [name for name, law in self._engine_limits.items() if law.due(now)]
        if due:
            waited = {w.request.model for w in self._waiting.values()}
            pending = self.ledger.pending_first_tokens(now)  # at the engine, no first token yet
            for name in due:
                self._engine_limits[name].update(now, demand=name in self._engine_demand or name in waited,
                                                 pending_ages=pending.get(name, ()),
                                                 running=self.ledger.started_by_model.get(name, 0))
                self._engine_demand.discard(name)
        for name, share in self._lower_share.items():
            top = self._index.top_class.get(name)
            if top is not None:
                share.update(now, top.p99_ms / 1000)
        self._pump(now)

    @property
    def has_events(self) -> bool:
        return bool(self._granted or self._expired)

    def take_events(self) -> Events:
        events = Events(self._granted, self._expired)
        self._granted, self._expired = [], []
        return events

    # -- internals --------------------------------------------------------------------------------

    def _judge_top_class(self, model_name: str, class_name: str, now: float, first_token_s: float) -> None:
        """A first token (or a refusal for lack of room, as an infinitely late one) of the model's
        top class, for LowerShare. A refusal must count: when lower classes hold the rooms, the top
        class is refused at arrival and never gets a late first token to show it (measured on a
        vLLM-like engine at 1.5x: 9 of 77 interactive served, the share never moved)."""
        model = self._index.models.get(model_name)
        if model is None or model.kv is None:
            return
        if self.class_policy(class_name).priority != self._index.top_priority(model):
            return
        share = self._lower_share.get(model.name)
        if share is None:
            share = self._lower_share[model.name] = LowerShare(self.policy.admission.lower_share)
        share.observe(now, first_token_s)

    def _reserve(self, request: Request, now: float, arrived_at: float | None = None) -> None:
        self.ledger.reserve(request, self.model_policy(request.model), now, arrived_at,
                            self._counts_for_limit(request.model))
        self.prompts.sent(request.model, request.cost.prompt_bytes)

    def _expire(self, now: float) -> None:
        self.ledger.expire_lingering(now)
        for rid in [r for r, w in self._waiting.items() if w.deadline <= now]:
            waiting = self._waiting.pop(rid)
            klass = self.class_policy(waiting.request.klass)
            wait_s = self.expected_wait_s(waiting.request.model, 1, now)
            verdict = self.verdict(waiting.request, now)
            blocked = verdict.blocked or self._head_blocker(now, waiting.request)
            self._judge_top_class(waiting.request.model, waiting.request.klass, now, math.inf)
            self._expired.append(Decision(
                Action.REJECT, rid, QUEUE_TIMEOUT, retry_after_s=self.retry_after_s(wait_s),
                waited_s=now - waiting.enqueued_at, headroom_bytes=verdict.headroom_bytes,
                limit=blocked.name if blocked else "queue_order",
                limit_capacity=blocked.capacity if blocked else None,
                limit_used=blocked.used if blocked else None,
                detail=f"waited {1000 * (now - waiting.enqueued_at):.0f} ms, class {klass.name!r}'s "
                f"longest queue wait, without room being made",
            ))

    def _pump(self, now: float | None = None, expire: bool = True) -> None:
        """Grant waiting requests in effective order while they fit."""
        if not self._waiting:
            return
        now = self._now() if now is None else now
        if expire:
            self._expire(now)
        held: set[Group] = set()  # groups (model or tenant) held by a request ahead of them
        for waiting in self._waiting.order(now):
            request = waiting.request
            if held and not held.isdisjoint(waiting.groups):
                continue
            memory, slots = self.rooms(request, now)
            verdict = decide(request.cost, memory, slots)
            if verdict.ok:
                del self._waiting[request.id]
                self._reserve(request, now, waiting.enqueued_at)
                self._granted.append(Decision(
                    Action.ADMIT, request.id, "admitted", headroom_bytes=verdict.headroom_bytes,
                    waited_s=now - waiting.enqueued_at,
                ))
                continue
            assert verdict.blocked is not None
            if verdict.blocked.shared:
                break
            held.add(self._hold_key(request, verdict.blocked))

