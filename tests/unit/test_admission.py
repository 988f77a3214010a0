"""The sidecar's pure admission state (sidecar/admission.py), with a fake clock: decide(), what a
grant reserves and a release frees, the limits that queue or refuse a request, and what a policy
does not name.

The rest of admission has files of its own: queue order and waits (test_admission_queue.py),
headroom and the adaptive limit (test_admission_headroom.py), tenants (test_admission_tenants.py),
the asyncio owner (test_admission_controller.py), and what a request costs (test_request_cost.py).
"""

from __future__ import annotations

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import CLASS_NOT_SERVED, EXCEEDS_BUDGET, Action, Cost, Request, Room, decide
from sidecar.cost import cost_for
from tests.sidecar_rigs import FakeClock, admission_request, admission_state, granted_ids, policy_doc
from tritongen.core.sidecar_policy.schema import parse_policy


# ------------------------------------------------------------------------------------------------
# decide()


def room(name: str, used: float, cap: float, need: float, shared: bool = True, unit: str = "bytes") -> Room:
    return Room(name, unit, used, cap, need, shared=shared, static=False)


def test_decide_admits_when_every_room_fits() -> None:
    verdict = decide(Cost(kv_bytes=10), [room("a", 0, 100, 10), room("b", 50, 100, 10)], [room("c", 1, 2, 1, unit="requests")])
    assert verdict.ok and verdict.blocked is None
    assert verdict.headroom_bytes == 50  # the smallest free memory


def test_decide_names_the_first_full_room_concurrency_first() -> None:
    verdict = decide(Cost(kv_bytes=10), [room("mem", 95, 100, 10)], [room("slots", 2, 2, 1, unit="requests")])
    assert not verdict.ok and verdict.blocked is not None and verdict.blocked.name == "slots"
    verdict = decide(Cost(kv_bytes=10), [room("mem", 95, 100, 10)], [room("slots", 1, 2, 1, unit="requests")])
    assert verdict.blocked is not None and verdict.blocked.name == "mem"


def test_decide_exact_fit_is_admitted() -> None:
    assert decide(Cost(kv_bytes=10), [room("m", 90, 100, 10)], []).ok


# ------------------------------------------------------------------------------------------------
# admit, reserve, release


def test_admit_reserves_and_release_frees() -> None:
    state, _ = admission_state()
    r = admission_request(kv=300, prefill=50)
    decision = state.submit(r)
    assert decision.action is Action.ADMIT and decision.admitted
    assert state.inflight == 1 and state.inflight_of("llm") == 1
    assert state.reserved_bytes == 350
    assert state.reserved_scope("pool:llm") == 300
    assert state.reserved_scope("gpu0") == 50  # the KV pool is pre-allocated: only prefill is device memory
    assert state.release(r.id) is True
    assert state.release(r.id) is False  # idempotent
    assert (state.inflight, state.reserved_bytes, state.reserved_scope("gpu0"), state.reserved_scope("pool:llm")) == (0, 0, 0, 0)


def test_end_prefill_drops_the_prefill_peak_only() -> None:
    state, _ = admission_state()
    r = admission_request(kv=300, prefill=50)
    state.submit(r)
    state.end_prefill(r.id)
    assert state.reserved_bytes == 300 and state.reserved_scope("gpu0") == 0
    state.end_prefill(r.id)  # twice is harmless
    state.release(r.id)
    assert state.reserved_bytes == 0 and state.reserved_scope("gpu0") == 0


def test_kv_not_preallocated_counts_on_the_device() -> None:
    doc = policy_doc()
    doc["models"][0]["kv"]["preallocated"] = False
    state = AdmissionState(parse_policy(doc), FakeClock())
    r = admission_request(kv=300, prefill=50)
    state.submit(r)
    assert state.reserved_scope("gpu0") == 350 and state.reserved_bytes == 350
    state.end_prefill(r.id)
    assert state.reserved_scope("gpu0") == 300
    state.release(r.id)
    assert state.reserved_scope("gpu0") == 0 and state.reserved_bytes == 0


def test_classic_request_bytes_are_device_memory() -> None:
    state, _ = admission_state()
    r = admission_request(model="cls", request=100)
    assert state.submit(r).admitted
    assert state.reserved_scope("gpu0") == 100 and state.reserved_of("cls") == 100
    state.release(r.id)
    assert state.reserved_of("cls") == 0


def test_duplicate_request_id_is_a_bug() -> None:
    state, _ = admission_state()
    state.submit(admission_request(rid="same", kv=1))
    with pytest.raises(ValueError, match="already known"):
        state.submit(admission_request(rid="same", kv=1))


def test_release_with_linger_keeps_bytes_until_the_grace_passes() -> None:
    state, clock = admission_state()
    r = admission_request(kv=400)
    state.submit(r)
    assert state.release(r.id, linger_s=0.3) is True
    assert state.inflight == 0 and state.reserved_bytes == 400 and state.lingering == 1
    assert state.release(r.id) is False  # already released; the linger stands
    clock.advance(0.29)
    state.tick()
    assert state.reserved_bytes == 400
    clock.advance(0.02)
    state.tick()
    assert state.reserved_bytes == 0 and state.lingering == 0


def test_lingering_bytes_still_block_admission() -> None:
    state, clock = admission_state()
    r = admission_request(kv=900, klass="interactive")
    state.submit(r)
    state.release(r.id, linger_s=0.1)
    second = admission_request(kv=900, klass="interactive")
    assert state.submit(second).action is Action.QUEUE
    clock.advance(0.1)
    state.tick()
    assert granted_ids(state) == [second.id]


# ------------------------------------------------------------------------------------------------
# limits


def test_memory_quota_queues_then_grants_on_release() -> None:
    state, _ = admission_state()
    first = admission_request(kv=800, klass="interactive")
    assert state.submit(first).admitted
    second = admission_request(kv=300, klass="interactive")
    decision = state.submit(second)
    assert decision.action is Action.QUEUE and decision.limit == "model_memory_quota:llm"
    assert decision.limit_capacity == 1000 and decision.limit_used == 800
    assert state.waiting == 1 and granted_ids(state) == []
    state.release(first.id)
    assert granted_ids(state) == [second.id]
    assert state.waiting == 0 and state.reserved_bytes == 300


def test_class_budget_fraction_keeps_room_for_the_top_class() -> None:
    state, _ = admission_state()
    assert state.submit(admission_request(kv=700, klass="batch")).admitted
    # batch may fill 80 % of the 1000-byte quota: 100 more would make 800, allowed; 101 is not
    assert state.submit(admission_request(kv=100, klass="batch")).admitted
    assert state.submit(admission_request(kv=1, klass="batch")).action is Action.QUEUE
    assert state.submit(admission_request(kv=100, klass="normal")).admitted  # normal: up to 900
    assert state.submit(admission_request(kv=100, klass="interactive")).admitted  # interactive: all 1000


def test_request_that_can_never_fit_is_refused_at_once() -> None:
    state, _ = admission_state()
    decision = state.submit(admission_request(kv=1001, klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_BUDGET
    assert decision.limit == "model_memory_quota:llm" and "can never be admitted" in decision.detail
    decision = state.submit(admission_request(kv=801, klass="batch"))  # 80 % of the quota
    assert decision.reason == EXCEEDS_BUDGET
    assert state.waiting == 0 and state.inflight == 0


def test_class_a_model_does_not_serve_is_refused() -> None:
    doc = policy_doc()
    doc["models"][1]["classes"] = ["interactive"]
    state = AdmissionState(parse_policy(doc), FakeClock())
    decision = state.submit(admission_request(model="cls", klass="batch", request=1))
    assert decision.action is Action.REJECT and decision.reason == CLASS_NOT_SERVED
    assert state.submit(admission_request(model="cls", klass="interactive", request=1)).admitted


def test_model_concurrency_quota() -> None:
    state, _ = admission_state()
    held = [admission_request(model="cls", klass="interactive") for _ in range(5)]
    for r in held:
        assert state.submit(r).admitted
    extra = admission_request(model="cls", klass="interactive")
    decision = state.submit(extra)
    assert decision.action is Action.QUEUE and decision.limit == "model_concurrency_quota:cls"
    state.release(held[0].id)
    assert granted_ids(state) == [extra.id]


def test_concurrency_quota_scales_with_class_fraction() -> None:
    state, _ = admission_state()
    # normal may use floor(5 x 0.9) = 4 of cls's 5 slots
    for _ in range(4):
        assert state.submit(admission_request(model="cls", klass="normal")).admitted
    assert state.submit(admission_request(model="cls", klass="normal")).action is Action.QUEUE
    assert state.submit(admission_request(model="cls", klass="interactive")).admitted


def test_global_concurrency_limit_counts_llm_requests_only() -> None:
    """The adaptive limit guards LLM memory; classic requests, bounded by what Triton accepts, neither
    count against it nor wait for it."""
    doc = policy_doc()
    doc["models"][0]["max_inflight"] = 100
    doc["models"][1]["max_inflight"] = None
    state = AdmissionState(parse_policy(doc), FakeClock())
    for _ in range(20):
        assert state.submit(admission_request(model="cls", klass="interactive")).admitted
    for _ in range(8):
        assert state.submit(admission_request(model="llm", klass="interactive", kv=1)).admitted
    decision = state.submit(admission_request(model="llm", klass="interactive", kv=1))
    assert decision.action is Action.QUEUE and decision.limit == "concurrency_limit"
    assert state.submit(admission_request(model="cls", klass="interactive")).admitted


# ------------------------------------------------------------------------------------------------
# what the policy does not name


def test_unknown_model_passes_unlimited_at_no_cost() -> None:
    state, _ = admission_state()
    model = state.model_policy("not-in-policy")
    cost = cost_for(model, None)
    assert cost == Cost() and model.max_inflight is None and model.devices == ["gpu0"]
    r = Request("u1", "not-in-policy", "batch", cost)
    assert state.submit(r).admitted
    assert state.inflight == 1 and state.reserved_scope("gpu0") == 0 and not state.known_model("not-in-policy")
    state.release(r.id)
    assert state.inflight == 0


def test_unknown_class_falls_back_to_the_default() -> None:
    state, _ = admission_state()
    assert state.class_policy("nope").name == "normal"
    assert state.class_policy(None).name == "normal"
