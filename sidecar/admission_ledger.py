"""The admission state's books: every reservation the sidecar holds, and the running counts the
rooms read (bytes per scope, in flight per model and tenant). Pure; the state decides, the ledger
only adds and subtracts, so each count moves in exactly one place.

Per-tenant counts are keyed by the name the request carries and dropped when they reach zero, so
tenants the policy does not list cost nothing once their requests are gone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from sidecar.admission_types import Cost, Request
from tritongen.core.sidecar_policy.sections import ModelPolicy


@dataclass
class Reservation:
    request: Request
    admitted_at: float
    kv_scopes: tuple[str, ...]
    device_scopes: tuple[str, ...]
    kv_bytes: int
    extra_bytes: int  # prefill + request bytes: device memory outside the KV pool
    prefill_bytes: int
    kv_on_device: bool  # the engine does not pre-allocate its pool: KV bytes are device bytes too
    lingering_until: float | None = None
    first_response_at: float | None = None
    arrived_at: float = 0.0  # when the sidecar first saw it (admitted_at unless it queued)

    @property
    def device_bytes(self) -> int:
        return self.extra_bytes + (self.kv_bytes if self.kv_on_device else 0)

    @property
    def held_bytes(self) -> int:
        return self.kv_bytes + self.extra_bytes


class Ledger:
    """Reservations by request id, and the counts derived from them."""

    def __init__(self) -> None:
        self.reservations: dict[Hashable, Reservation] = {}
        self.by_scope: dict[str, int] = defaultdict(int)  # bytes reserved per device or pool scope
        self.kv_by_model: dict[str, int] = defaultdict(int)
        self.inflight_by_model: dict[str, int] = defaultdict(int)
        self.started_by_model: dict[str, int] = defaultdict(int)  # of those, past their first response
        self.sequences_by_model: dict[str, int] = defaultdict(int)
        self.inflight_by_tenant: dict[str, int] = {}  # no zero entries (see count_tenant)
        self.reserved_by_tenant: dict[str, int] = {}
        self.inflight = 0
        self.inflight_llm = 0  # what the adaptive concurrency limit counts
        self.lingering = 0
        # model -> prompt block -> reservations holding it (Cost.shared_keys): a block several hold
        # is reserved once, in the model's pool, while any of them holds it
        self.shared_refs: dict[str, dict[bytes, int]] = defaultdict(dict)

    def new_shared_bytes(self, model: str, cost: Cost) -> int:
        """The bytes of the request's shared prompt blocks that nothing in flight holds yet: what
        admitting it adds to the pool beyond its own part (cost.kv_bytes)."""
        if not cost.shared_keys:
            return 0
        held = self.shared_refs.get(model, {})
        return sum(1 for k in cost.shared_keys if k not in held) * cost.shared_block_bytes

    def _share(self, res: Reservation, step: int) -> None:
        """Take (+1) or give back (-1) the request's shared blocks: a block's bytes enter the pool
        with its first holder and leave with its last."""
        cost, model = res.request.cost, res.request.model
        refs = self.shared_refs[model]
        changed = 0
        for key in cost.shared_keys:
            count = refs.get(key, 0) + step
            if count > 0:
                refs[key] = count
            else:
                refs.pop(key, None)
            if (step > 0 and count == 1) or (step < 0 and count == 0):
                changed += step
        delta = changed * cost.shared_block_bytes
        for scope in (*res.kv_scopes, *(res.device_scopes if res.kv_on_device else ())):
            self.by_scope[scope] += delta
        self.kv_by_model[model] += delta

    def reserve(self, request: Request, model: ModelPolicy, now: float, arrived_at: float | None,
                counts_for_limit: bool) -> Reservation:
        cost = request.cost
        kv_scopes = (f"pool:{model.name}",) if model.kv is not None else ()
        res = Reservation(
            request, now, kv_scopes, tuple(model.devices), kv_bytes=cost.kv_bytes,
            extra_bytes=cost.prefill_bytes + cost.request_bytes, prefill_bytes=cost.prefill_bytes,
            kv_on_device=model.kv is not None and not model.kv.preallocated,
            arrived_at=now if arrived_at is None else arrived_at,
        )
        self.reservations[request.id] = res
        for scope in kv_scopes:
            self.by_scope[scope] += res.kv_bytes
        for scope in res.device_scopes:
            self.by_scope[scope] += res.device_bytes
        self.kv_by_model[request.model] += cost.kv_bytes
        if cost.shared_keys:
            self._share(res, +1)
        self.inflight += 1
        if counts_for_limit:
            self.inflight_llm += 1
        self.inflight_by_model[request.model] += 1
        self.sequences_by_model[request.model] += cost.sequences
        self.count_tenant(request.tenant, inflight=1, reserved=res.held_bytes)
        return res

    def started(self, res: Reservation, at: float) -> None:
        """The request's first response came back."""
        res.first_response_at = at
        self.started_by_model[res.request.model] += 1

    def end_prefill(self, res: Reservation) -> None:
        """The prefill peak is no longer held on the devices."""
        for scope in res.device_scopes:
            self.by_scope[scope] -= res.prefill_bytes
        self.count_tenant(res.request.tenant, reserved=-res.prefill_bytes)
        res.extra_bytes -= res.prefill_bytes
        res.prefill_bytes = 0

    def uncount(self, res: Reservation, counts_for_limit: bool) -> None:
        """Drop a reservation's in-flight counts (its bytes go with `free`)."""
        model = res.request.model
        self.inflight -= 1
        if counts_for_limit:
            self.inflight_llm -= 1
        self.inflight_by_model[model] -= 1
        if res.first_response_at is not None:
            self.started_by_model[model] -= 1
        self.sequences_by_model[model] -= res.request.cost.sequences
        self.count_tenant(res.request.tenant, inflight=-1)

    def linger(self, res: Reservation, until: float) -> None:
        """Keep the bytes reserved until `until` (the in-flight counts went with `uncount`)."""
        res.lingering_until = until
        self.lingering += 1

    def free(self, request_id: Hashable) -> None:
        res = self.reservations.pop(request_id)
        for scope in res.kv_scopes:
            self.by_scope[scope] -= res.kv_bytes
        for scope in res.device_scopes:
            self.by_scope[scope] -= res.device_bytes
        self.kv_by_model[res.request.model] -= res.kv_bytes
        if res.request.cost.shared_keys:
            self._share(res, -1)
        self.count_tenant(res.request.tenant, reserved=-res.held_bytes)
        if res.lingering_until is not None:
            self.lingering -= 1

    def expire_lingering(self, now: float) -> None:
        if self.lingering:
            for rid in [r for r, res in self.reservations.items()
                        if res.lingering_until is not None and res.lingering_until <= now]:
                self.free(rid)

    def count_tenant(self, tenant: str, inflight: int = 0, reserved: int = 0) -> None:
        """Move a tenant's in-flight count and reserved bytes. Entries that reach zero are removed:
        the tenant names clients send are unbounded, the requests holding something are not."""
        for counts, delta in ((self.inflight_by_tenant, inflight), (self.reserved_by_tenant, reserved)):
            if delta:
                value = counts.get(tenant, 0) + delta
                if value:
                    counts[tenant] = value
                else:
                    del counts[tenant]

    # -- views ----------------------------------------------------------------------------------------

    @property
    def reserved_bytes(self) -> int:
        """Every byte still reserved (lingering reservations included)."""
        return sum(res.held_bytes for res in self.reservations.values())

    def reserved_of(self, model: str) -> int:
        return sum(r.held_bytes for r in self.reservations.values() if r.request.model == model)

    def mean_live_tokens(self, model: str) -> float:
        """The mean sequence length of the model's requests in flight (0 with none)."""
        live = [r.request.cost.tokens / max(1, r.request.cost.sequences)
                for r in self.reservations.values() if r.request.model == model and r.lingering_until is None]
        return sum(live) / len(live) if live else 0.0

    def pending_first_tokens(self, now: float) -> dict[str, list[float]]:
        """Per model, how long each request at the engine without a first token yet has been there."""
        pending: dict[str, list[float]] = defaultdict(list)
        for res in self.reservations.values():
            if res.first_response_at is None and res.lingering_until is None:
                pending[res.request.model].append(now - res.admitted_at)
        return pending
