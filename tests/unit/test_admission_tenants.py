"""Tenant quotas in admission: per-tenant concurrency and memory, the classes a tenant may send, the
default quota for unlisted tenants, and counts that survive a reload and return to zero.
"""

from __future__ import annotations

from typing import Any

from sidecar.admission import AdmissionState
from sidecar.admission_types import EXCEEDS_BUDGET, QUEUE_FULL, QUEUE_TIMEOUT, TENANT_CLASS_NOT_ALLOWED, Action
from tests.sidecar_rigs import FakeClock, admission_request, admission_state, granted_ids, policy_doc, tenant_usage
from tritongen.core.sidecar_policy.schema import parse_policy


# ------------------------------------------------------------------------------------------------
# tenant quotas


def tenants(*entries: dict[str, Any], default: dict[str, Any] | None = None) -> tuple[AdmissionState, FakeClock]:
    return admission_state(tenants=list(entries), default_tenant=default)



def test_tenant_concurrency_quota_queues_and_holds_only_its_tenant() -> None:
    state, _ = tenants({"name": "acme", "max_inflight": 2})
    held = [admission_request(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(2)]
    for r in held:
        assert state.submit(r).admitted
    third = admission_request(model="cls", klass="interactive", request=100, tenant="acme")
    decision = state.submit(third)
    assert decision.action is Action.QUEUE and decision.limit == "tenant_concurrency_quota:acme"
    assert (decision.limit_capacity, decision.limit_used) == (2, 2)
    # the same model for another tenant is not held behind acme's queued request
    assert state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="beta")).admitted
    # acme's requests to other models wait in order behind it
    behind = admission_request(model="llm", klass="interactive", kv=10, tenant="acme")
    assert state.submit(behind).action is Action.QUEUE
    state.release(held[0].id)
    assert granted_ids(state) == [third.id]
    state.release(held[1].id)
    assert granted_ids(state) == [behind.id]
    assert tenant_usage(state, "acme") == (2, 110)


def test_tenant_memory_quota_counts_every_held_byte() -> None:
    state, _ = tenants({"name": "acme", "max_reserved_bytes": 500})
    first = admission_request(kv=300, prefill=100, klass="interactive", tenant="acme")
    assert state.submit(first).admitted and tenant_usage(state, "acme") == (1, 400)
    second = admission_request(kv=150, klass="interactive", tenant="acme")
    decision = state.submit(second)
    assert decision.action is Action.QUEUE and decision.limit == "tenant_memory_quota:acme"
    assert (decision.limit_capacity, decision.limit_used) == (500, 400)
    state.end_prefill(first.id)  # the prefill peak is given back: 300 + 150 fits in 500
    assert granted_ids(state) == [second.id] and tenant_usage(state, "acme") == (2, 450)
    state.release(first.id, linger_s=0.3)  # lingering bytes still count against the tenant
    assert tenant_usage(state, "acme") == (1, 450)


def test_tenant_request_that_can_never_fit_is_refused_at_once() -> None:
    state, _ = tenants({"name": "acme", "max_reserved_bytes": 500})
    decision = state.submit(admission_request(kv=401, klass="batch", tenant="acme"))  # batch may fill 80 %: 400
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_BUDGET
    assert decision.limit == "tenant_memory_quota:acme" and decision.limit_capacity == 400
    assert state.submit(admission_request(kv=401, klass="interactive", tenant="acme")).admitted


def test_budget_fraction_applies_to_tenant_quotas() -> None:
    state, _ = tenants({"name": "acme", "max_inflight": 5})
    for _ in range(4):  # floor(5 x 0.8)
        assert state.submit(admission_request(model="llm", klass="batch", kv=1, tenant="acme")).admitted
    assert state.submit(admission_request(model="llm", klass="batch", kv=1, tenant="acme")).action is Action.QUEUE
    assert state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="acme")).admitted


def test_class_a_tenant_may_not_send_is_refused() -> None:
    state, _ = tenants({"name": "acme", "classes": ["batch"]})
    decision = state.submit(admission_request(klass="interactive", kv=1, tenant="acme"))
    assert decision.action is Action.REJECT and decision.reason == TENANT_CLASS_NOT_ALLOWED
    assert decision.limit == "tenant_classes:acme" and "may send classes ['batch']" in decision.detail
    assert state.submit(admission_request(klass="batch", kv=1, tenant="acme")).admitted
    assert state.submit(admission_request(klass="interactive", kv=1, tenant="beta")).admitted  # not listed, no default quota


def test_default_tenant_quota_applies_to_each_unlisted_tenant() -> None:
    state, _ = tenants({"name": "internal"}, default={"max_inflight": 1})
    for tenant in ("x", "y", "default"):
        assert state.submit(admission_request(model="cls", klass="interactive", request=100, tenant=tenant)).admitted
    decision = state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="x"))
    assert decision.action is Action.QUEUE and decision.limit == "tenant_concurrency_quota:x"
    for _ in range(2):  # a listed tenant without limits is not held to the default quota
        assert state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="internal")).admitted
    assert state.tenant_label("x") == "other" and state.tenant_label("internal") == "internal"
    assert state.tenant_label("default") == "default"
    assert state.tenant_usage() == {"internal": (2, 200), "default": (1, 100), "other": (2, 200)}


def test_tenant_counts_return_to_zero_and_unlisted_names_are_forgotten() -> None:
    state, clock = tenants(default={"max_inflight": 100})
    rids = [admission_request(kv=10, prefill=5, klass="interactive", tenant=f"t{i}") for i in range(8)]
    for r in rids:
        assert state.submit(r).admitted
    for r in rids[:4]:
        state.end_prefill(r.id)
        state.release(r.id)
    for r in rids[4:]:
        state.release(r.id, linger_s=0.2)
    assert sum(state.inflight_of_tenant(f"t{i}") for i in range(8)) == 0
    assert state.tenant_usage()["other"] == (0, 4 * 15)  # lingering: still reserved
    clock.advance(0.2)
    state.tick()
    assert state.tenant_usage()["other"] == (0, 0)
    assert state.ledger.inflight_by_tenant == {} and state.ledger.reserved_by_tenant == {}  # no entry per name sent


def test_tenant_queue_refusals_name_the_tenant_limit() -> None:
    state, clock = tenants({"name": "acme", "max_inflight": 1})
    assert state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="acme")).admitted
    queued = [admission_request(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(4)]
    for r in queued:
        assert state.submit(r).action is Action.QUEUE
    full = state.submit(admission_request(model="cls", klass="interactive", request=100, tenant="acme"))
    assert full.reason == QUEUE_FULL and full.limit == "tenant_concurrency_quota:acme"
    clock.advance(0.126)  # past interactive's 125 ms queue wait
    state.tick()
    expired = state.take_events().expired
    assert [d.request_id for d in expired] == [r.id for r in queued]
    assert {d.reason for d in expired} == {QUEUE_TIMEOUT}
    assert {d.limit for d in expired} == {"tenant_concurrency_quota:acme"}


def test_reload_applies_new_tenant_quotas_and_keeps_counts() -> None:
    state, _ = admission_state()
    held = [admission_request(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(3)]
    for r in held:
        assert state.submit(r).admitted
    state.apply_policy(parse_policy(policy_doc(tenants=[{"name": "acme", "max_inflight": 2}])))
    assert tenant_usage(state, "acme") == (3, 300)  # in-flight accounting survives the reload
    late = admission_request(model="cls", klass="interactive", request=100, tenant="acme")
    assert state.submit(late).action is Action.QUEUE  # 3 in flight against the new quota of 2
    state.release(held[0].id)
    assert granted_ids(state) == []  # 2 in flight: still at the quota
    state.release(held[1].id)
    assert granted_ids(state) == [late.id] and tenant_usage(state, "acme") == (2, 200)
    state.apply_policy(parse_policy(policy_doc()))  # acme no longer listed: counted as "other"
    assert state.tenant_usage()["other"] == (2, 200)
    state.release(held[2].id)
    state.release(late.id)
    assert tenant_usage(state, "acme") == (0, 0) and state.tenant_usage()["other"] == (0, 0)
