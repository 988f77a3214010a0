"""The admission state's parts, set up from a policy (again on a reload), and everything it answers
without changing anything: the policy by name, the rooms a request faces and whether it fits, the
measurements the wait estimate reads, the counts and the status document. `AdmissionState`
(sidecar/admission.py) is this view plus the operations that change it: what a metric or the status
reads is defined apart from how a decision changes the books.

The parts, each in its own module: admission_index (the policy by name), admission_ledger (the
books), admission_queue (the wait queue), admission_capacity (what each memory scope can hold),
admission_estimates (measurements and the wait estimate), admission_limits (the limits that move),
admission_prompts (prompt counting); the rooms and the rule that checks them: admission_types.
"""

from __future__ import annotations

import math

from sidecar.admission_capacity import Capacity
from sidecar.admission_estimates import Estimates, WaitTerms, wait_from
from sidecar.admission_index import PolicyIndex
from sidecar.admission_ledger import Ledger
from sidecar.admission_limits import AdaptiveLimit, LowerShare, engine_queues, pool_blocks
from sidecar.admission_prompts import PromptCounting
from sidecar.admission_queue import Group, Waiting, WaitQueue
from sidecar.admission_types import Clock, Reading, Request, Room, Verdict, decide
from sidecar.engine_concurrency import EngineConcurrency
from tritongen.core.sidecar_policy.base import DEFAULT_TENANT, OTHER_TENANTS
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.core.sidecar_policy.sections import ClassPolicy, ModelPolicy, TenantQuota

LIMIT_GROUP: Group = ("limit", "llm")  # the queue group the adaptive concurrency limit holds


class AdmissionView:
    def __init__(self, policy: SidecarPolicy, clock: Clock) -> None:
        self._clock = clock
        self.ledger = Ledger()
        self.estimates = Estimates()
        self._waiting = WaitQueue()
        self._capacity = Capacity(policy)
        self.prompts = PromptCounting({})
        self._lower_share: dict[str, LowerShare] = {}
        self._engine_limits: dict[str, EngineConcurrency] = {}  # models whose engine queues (_follow_engines)
        self._set_policy(policy)
        self.limit = AdaptiveLimit(policy.concurrency, clock())

    # -- the policy and the prompts --------------------------------------------------------------------

    def _set_policy(self, policy: SidecarPolicy) -> None:
        self.policy = policy
        self._index = PolicyIndex(policy)
        self._waiting.configure(self._index.top_level, policy.starvation_guard_ms)
        self._capacity.configure(policy)
        self.prompts.models = self._index.models
        for share in self._lower_share.values():
            share.cfg = policy.admission.lower_share
        self._follow_engines()

    # -- lookups ----------------------------------------------------------------------------------

    def _follow_engines(self) -> None:
        """One EngineConcurrency per model whose engine queues, started at its max_inflight; a
        reloaded policy keeps a law whose starting figure it did not change, and what it learnt."""
        kept = self._engine_limits
        self._engine_limits = {}
        for model in self.policy.models:
            if not engine_queues(model):
                continue
            assert model.max_inflight is not None
            ceiling = pool_blocks(model)
            law = kept.get(model.name)
            if law is None or law.start != model.max_inflight or law.ceiling != ceiling:
                law = EngineConcurrency(self.policy.queueing_engines, model.max_inflight, ceiling=ceiling)
            law.cfg = self.policy.queueing_engines
            self._engine_limits[model.name] = law

    def model_policy(self, name: str) -> ModelPolicy:
        return self._index.model_policy(name)

    def known_model(self, name: str) -> bool:
        return name in self._index.models

    def class_policy(self, name: str | None) -> ClassPolicy:
        return self._index.class_policy(name)

    def tenant_quota(self, tenant: str) -> TenantQuota | None:
        return self._index.tenant_quota(tenant)

    def tenant_label(self, tenant: str) -> str:
        return self._index.tenant_label(tenant)

    def lower_share(self, model: str) -> float:
        """The share of the model's rooms its lower classes may fill now (LowerShare); 1.0 unless the
        top class's first tokens are coming late."""
        found = self._lower_share.get(model)
        return found.value if found is not None else 1.0

    def _counts_for_limit(self, name: str) -> bool:
        """LLMs whose memory the adaptive limit guards; a queueing engine's LLM has its own limit."""
        found = self._index.models.get(name)
        return found is not None and found.kv is not None and name not in self._engine_limits

    def engine_limit(self, name: str) -> EngineConcurrency | None:
        """The law that holds the in-flight limit of a model whose engine queues (None: not one)."""
        return self._engine_limits.get(name)

    def _now(self) -> float:
        return self._clock()

    def reading(self, scope: str, now: float | None = None) -> Reading | None:
        """The reading in force for a scope: a fresh live one, else the static fallback (devices)."""
        return self._capacity.reading(scope, self._now() if now is None else now)

    def capacity(self, scope: str, now: float | None = None) -> float | None:
        """Bytes the sidecar may hold on a scope in all (reservations included); None: unconstrained."""
        return self._capacity.capacity(scope, self._now() if now is None else now)

    # -- rooms ------------------------------------------------------------------------------------

    def rooms(self, request: Request, now: float) -> tuple[list[Room], list[Room]]:
        """(memory rooms, concurrency rooms) for a request, scaled by its class's budget share."""
        model = self.model_policy(request.model)
        klass = self.class_policy(request.klass)
        frac = klass.budget_fraction
        cost = request.cost
        books = self.ledger
        # The tenant's rooms come first in each list: a request over its tenant's quota is named as
        # waiting for its tenant, and so holds only its tenant's requests, not its model's.
        slots, memory = self._tenant_rooms(request, frac)
        if self._counts_for_limit(model.name):
            # The adaptive limit guards LLM memory; a classic model is bounded by what Triton accepts.
            slots.append(Room("concurrency_limit", "requests", books.inflight_llm,
                              max(1, math.floor(self.limit.value * frac)), 1, shared=False, static=False,
                              holds="limit"))
        law = self._engine_limits.get(model.name)
        if law is not None:
            # An engine that queues has no room to keep for the top class: a slot frees within one
            # sequence's run and the queue's order gives it to the most urgent; LowerShare (below)
            # holds the lower classes back when the top class's first tokens come late.
            slots.append(Room(f"model_concurrency_quota:{model.name}", "requests",
                              books.inflight_by_model[model.name], law.limit, 1, shared=False, static=False))
        elif model.max_inflight is not None:
            slots.append(Room(f"model_concurrency_quota:{model.name}", "requests",
                              books.inflight_by_model[model.name], max(1, math.floor(model.max_inflight * frac)),
                              1, shared=False, static=True))
        reserves = model.kv is None or model.kv.reserves
        # its own KV, and the shared prompt blocks no request in flight holds yet (held ones are reserved)
        kv_need = cost.kv_bytes + books.new_shared_bytes(model.name, cost)
        if model.memory_quota_bytes is not None and reserves:
            memory.append(Room(f"model_memory_quota:{model.name}", "bytes", books.kv_by_model[model.name],
                               math.floor(model.memory_quota_bytes * frac), kv_need, shared=False, static=True))
        share = self.lower_share(model.name)
        if share < 1.0 and model.kv is not None and klass.priority != self._index.top_priority(model):
            # The top class's first tokens are late: lower classes fill less (LowerShare), of the
            # pool where the engine reserves, else of its sequences.
            if model.memory_quota_bytes is not None and reserves:
                memory.append(Room(f"lower_class_share:{model.name}", "bytes", books.kv_by_model[model.name],
                                   math.floor(model.memory_quota_bytes * frac * share), kv_need, shared=False,
                                   static=False))
            elif model.max_inflight is not None:
                seqs = law.limit if law is not None else model.max_inflight * frac
                slots.append(Room(f"lower_class_share:{model.name}", "requests", books.inflight_by_model[model.name],
                                  max(1, math.floor(seqs * share)), 1, shared=False, static=False))
        if model.kv is not None and reserves:
            pool = f"pool:{model.name}"
            cap = self.capacity(pool, now)
            if cap is not None:
                memory.append(Room(f"headroom:{pool}", "bytes", books.by_scope[pool],
                                   cap * frac, kv_need, shared=False, static=False))
        device_need = cost.prefill_bytes + cost.request_bytes
        if model.kv is not None and not model.kv.preallocated:
            device_need += kv_need
        for device in model.devices:
            cap = self.capacity(device, now)
            if cap is None:
                continue
            memory.append(Room(f"headroom:{device}", "bytes", books.by_scope[device],
                               cap * frac, device_need, shared=True, static=False))
        return memory, slots

    def _tenant_rooms(self, request: Request, frac: float) -> tuple[list[Room], list[Room]]:
        """(concurrency rooms, memory rooms) of the request's tenant quota; none when unlimited."""
        quota = self.tenant_quota(request.tenant)
        slots: list[Room] = []
        memory: list[Room] = []
        if quota is None:
            return slots, memory
        tenant = request.tenant
        if quota.max_inflight is not None:
            slots.append(Room(f"tenant_concurrency_quota:{tenant}", "requests", self.inflight_of_tenant(tenant),
                              max(1, math.floor(quota.max_inflight * frac)), 1, shared=False, static=True,
                              holds="tenant"))
        if quota.max_reserved_bytes is not None:
            memory.append(Room(f"tenant_memory_quota:{tenant}", "bytes", self.reserved_of_tenant(tenant),
                               math.floor(quota.max_reserved_bytes * frac), request.cost.total_bytes, shared=False,
                               static=True, holds="tenant"))
        return slots, memory

    def verdict(self, request: Request, now: float | None = None) -> Verdict:
        now = self._now() if now is None else now
        memory, slots = self.rooms(request, now)
        return decide(request.cost, memory, slots)

    # -- queue order ------------------------------------------------------------------------------

    def effective_level(self, waiting: Waiting, now: float) -> int:
        """The level a waiting request leaves at (WaitQueue.level_of says how it is promoted)."""
        return self._waiting.level_of(now)(waiting)

    @staticmethod
    def _hold_key(request: Request, room: Room) -> Group:
        """The group a request blocked by a non-shared room holds in the queue: its model's requests
        (a model quota or pool), its tenant's (a tenant quota) or every LLM request (the adaptive
        concurrency limit, which only LLM requests count against)."""
        if room.holds == "limit":
            return LIMIT_GROUP
        return ("tenant", request.tenant) if room.holds == "tenant" else ("model", request.model)

    def _groups(self, request: Request) -> tuple[Group, ...]:
        groups = (("model", request.model), ("tenant", request.tenant))
        return (*groups, LIMIT_GROUP) if self._counts_for_limit(request.model) else groups

    def _head_blocker(self, now: float, request: Request | None = None) -> Room | None:
        """The limit that holds the queue for a request that would fit itself: a shared one, or one
        that holds its model or its tenant (the requests of its group ahead of it wait for it)."""
        groups = self._groups(request) if request is not None else ()
        for waiting in self._waiting.order(now):
            blocked = self.verdict(waiting.request, now).blocked
            if blocked is not None and (blocked.shared or self._hold_key(waiting.request, blocked) in groups):
                return blocked
        return None

    # -- measurements -----------------------------------------------------------------------------

    def drain_rate(self, model: str, now: float | None = None) -> float | None:
        """Requests of `model` that finish per second (Estimates.drain_rate says how)."""
        now = self._now() if now is None else now
        return self.estimates.drain_rate(model, now, self.inflight_of(model))

    def upstream_latency_s(self, model: str) -> float | None:
        """Estimates.upstream_latency_s at the policy's `admission.latency_quantile`."""
        return self.estimates.upstream_latency_s(model, self.policy.admission.latency_quantile)

    def allowed_wait_s(self, model: str, klass: ClassPolicy) -> float:
        """How long a request may wait in the queue: the class's longest wait, and no longer than its
        latency target minus what the upstream part usually takes, so the ones served meet the target."""
        allowed = klass.max_queue_wait_ms / 1000
        upstream = self.upstream_latency_s(model)
        if upstream is not None:
            allowed = min(allowed, klass.p99_ms / 1000 - upstream)
        return max(0.0, allowed)

    def expected_wait_s(self, model: str, position: int, now: float, priority: int | None = None) -> float | None:
        """Seconds until a request at `position` in its model's queue leaves it (sidecar/admission_estimates.py
        says how); None: no drain measured."""
        terms = self._wait_terms(model, now, priority)
        return None if terms is None else wait_from(terms, position)

    def _wait_terms(self, model: str, now: float, priority: int | None) -> WaitTerms | None:
        return self.estimates.wait_terms(model, now, priority, self.inflight_of(model), self._index.top_level,
                                         self.policy.starvation_guard_ms)

    def retry_after_s(self, wait_s: float | None) -> float:
        """Seconds before a retry can expect room: the drain-rate estimate, at least 1, capped."""
        cap = self.policy.limits.max_retry_after_s
        if wait_s is None:
            return 1.0
        if not math.isfinite(wait_s):
            return float(cap)
        return float(min(cap, max(1, math.ceil(wait_s))))

    def queue_delay_s(self, now: float) -> float | None:
        return self._capacity.queue_delay_s(now)

    def watermark(self, now: float | None = None) -> float:
        """The fullest device (Capacity.watermark): what the adaptive limit steps down for."""
        return self._capacity.watermark(self._now() if now is None else now, self.ledger.by_scope)

    def oom_risk(self, model: str) -> float | None:
        """The leading out-of-memory indicator: in-flight sequences x the KV bytes a sequence of the
        mean length holds (KVCost.bytes_at: bytes per token x length for a classic model), over the
        model's KV budget. Above 1 an engine that allocates as it goes runs out."""
        policy = self.policy.model_named(model)
        if policy is None or policy.kv is None or not policy.memory_quota_bytes:
            return None
        seqs = self.ledger.sequences_by_model.get(model, 0)
        mean = self.estimates.seq_len.get(model)
        if mean is None:
            mean = self.ledger.mean_live_tokens(model)
        return seqs * policy.kv.bytes_at(mean) / policy.memory_quota_bytes

    # -- read-only views --------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self.ledger.inflight

    def inflight_of(self, model: str) -> int:
        return self.ledger.inflight_by_model.get(model, 0)

    @property
    def reserved_bytes(self) -> int:
        """Every byte still reserved (lingering reservations included)."""
        return self.ledger.reserved_bytes

    def reserved_of(self, model: str) -> int:
        return self.ledger.reserved_of(model)

    def reserved_scope(self, scope: str) -> int:
        return self.ledger.by_scope.get(scope, 0)

    def inflight_of_tenant(self, tenant: str) -> int:
        return self.ledger.inflight_by_tenant.get(tenant, 0)

    def reserved_of_tenant(self, tenant: str) -> int:
        """Bytes the tenant's requests hold (lingering reservations included)."""
        return self.ledger.reserved_by_tenant.get(tenant, 0)

    def tenant_usage(self) -> dict[str, tuple[int, int]]:
        """(in flight, reserved bytes) per tenant metrics label: every listed tenant, `default` and
        `other` (all tenants the policy does not list, together), zeros included."""
        out = {label: (0, 0) for label in (*self._index.tenants, DEFAULT_TENANT, OTHER_TENANTS)}
        for tenant in self.ledger.inflight_by_tenant.keys() | self.ledger.reserved_by_tenant.keys():
            label = self.tenant_label(tenant)
            inflight, reserved = out[label]
            out[label] = (inflight + self.inflight_of_tenant(tenant), reserved + self.reserved_of_tenant(tenant))
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def waiting_by_class(self) -> dict[str, int]:
        out = {c.name: 0 for c in self.policy.classes}
        for w in self._waiting.values():
            out[w.request.klass] = out.get(w.request.klass, 0) + 1
        return out

    @property
    def lingering(self) -> int:
        return self.ledger.lingering

    def _tenant_status(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for label, (inflight, reserved) in self.tenant_usage().items():
            quota = self.tenant_quota(label) if label != OTHER_TENANTS else self.policy.default_tenant
            out[label] = {
                "inflight": inflight,
                "reserved_bytes": reserved,
                "max_inflight": quota.max_inflight if quota else None,
                "max_reserved_bytes": quota.max_reserved_bytes if quota else None,
            }
        return out

    def scopes(self) -> list[str]:
        """The memory scopes the policy names: its devices and its LLMs' KV pools."""
        return sorted({d.id for d in self.policy.devices} | {f"pool:{m.name}" for m in self.policy.models if m.kv})

    def status(self) -> dict[str, object]:
        now = self._now()
        models: dict[str, dict[str, object]] = {}
        names = {m.name for m in self.policy.models} | {r.request.model for r in self.ledger.reservations.values()}
        for name in sorted(names):
            models[name] = {
                "inflight": self.inflight_of(name),
                "reserved_bytes": self.reserved_of(name),
                "oom_risk": self.oom_risk(name),
                "drain_rate_per_s": self.drain_rate(name, now),
                "lower_class_share": self.lower_share(name),  # LowerShare: 1.0 unless the top class is late
            }
            law = self._engine_limits.get(name)
            if law is not None:
                models[name]["engine_limit"] = law.status()
            known = self._index.models.get(name)
            if known is not None and known.kv is not None:
                models[name]["prompt_tokens_counted_by"] = self.prompts.describe(name)
        scopes = {}
        for scope in self.scopes():
            reading = self.reading(scope, now)
            scopes[scope] = {
                "source": reading.source if reading else None,
                "total_bytes": reading.total_bytes if reading else None,
                "used_bytes": reading.used_bytes if reading else None,
                "capacity_bytes": self.capacity(scope, now),
                "reserved_bytes": self.reserved_scope(scope),
            }
        snap = self._capacity.snapshot
        return {
            "inflight": self.inflight,
            "reserved_bytes": self.reserved_bytes,
            "lingering": self.lingering,
            "waiting": self.waiting_by_class(),
            "concurrency_limit": self.limit.value,
            "watermark": round(self.watermark(now), 4),
            "queue_delay_s": self.queue_delay_s(now),
            "models": models,
            "tenants": self._tenant_status(),
            "scopes": scopes,
            "headroom_failures": dict(snap.failures) if snap else {},
            "headroom_age_s": None if snap is None else round(now - snap.taken_at, 3),
        }
