"""The sidecar's pure admission state, with a fake clock; and what a request costs (cost model and
request parsing), since those numbers are what admission decides by."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest

from sidecar import protocol
from sidecar.admission import AdmissionState
from sidecar.admission_limits import AdaptiveLimit
from sidecar.admission_types import (
    CLASS_NOT_SERVED,
    EXCEEDS_BUDGET,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    QUEUE_WAIT,
    TENANT_CLASS_NOT_ALLOWED,
    Action,
    Cost,
    HeadroomSnapshot,
    Reading,
    Request,
    Room,
    decide,
)
from sidecar.cost import (
    LLMFacts,
    cost_for,
    kv_bytes_for,
    llm_cost,
    prefill_peak_bytes,
    sequence_tokens,
)
from tests.helpers import FakeClock, policy_doc
from tritongen.core.sidecar_policy.kv_cost import CappedKV, KVCost, PrefillPoint
from tritongen.core.sidecar_policy.schema import SidecarPolicy, parse_policy
from tritongen.core.sidecar_policy.sections import ConcurrencyPolicy


def make(**over: Any) -> tuple[AdmissionState, FakeClock]:
    clock = FakeClock()
    return AdmissionState(parse_policy(policy_doc(**over)), clock), clock


_ids = iter(range(1, 10**9))


def req(model: str = "llm", klass: str = "normal", kv: int = 0, prefill: int = 0, request: int = 0,
        tokens: int = 0, rid: Any = None, tenant: str = "default") -> Request:
    return Request(rid if rid is not None else next(_ids), model, klass,
                   Cost(kv_bytes=kv, prefill_bytes=prefill, request_bytes=request, tokens=tokens), tenant)


def granted_ids(state: AdmissionState) -> list[Any]:
    return [d.request_id for d in state.take_events().granted]


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
    state, _ = make()
    r = req(kv=300, prefill=50)
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
    state, _ = make()
    r = req(kv=300, prefill=50)
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
    r = req(kv=300, prefill=50)
    state.submit(r)
    assert state.reserved_scope("gpu0") == 350 and state.reserved_bytes == 350
    state.end_prefill(r.id)
    assert state.reserved_scope("gpu0") == 300
    state.release(r.id)
    assert state.reserved_scope("gpu0") == 0 and state.reserved_bytes == 0


def test_classic_request_bytes_are_device_memory() -> None:
    state, _ = make()
    r = req(model="cls", request=100)
    assert state.submit(r).admitted
    assert state.reserved_scope("gpu0") == 100 and state.reserved_of("cls") == 100
    state.release(r.id)
    assert state.reserved_of("cls") == 0


def test_duplicate_request_id_is_a_bug() -> None:
    state, _ = make()
    state.submit(req(rid="same", kv=1))
    with pytest.raises(ValueError, match="already known"):
        state.submit(req(rid="same", kv=1))


def test_release_with_linger_keeps_bytes_until_the_grace_passes() -> None:
    state, clock = make()
    r = req(kv=400)
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
    state, clock = make()
    r = req(kv=900, klass="interactive")
    state.submit(r)
    state.release(r.id, linger_s=0.1)
    second = req(kv=900, klass="interactive")
    assert state.submit(second).action is Action.QUEUE
    clock.advance(0.1)
    state.tick()
    assert granted_ids(state) == [second.id]


# ------------------------------------------------------------------------------------------------
# limits and queueing


def test_memory_quota_queues_then_grants_on_release() -> None:
    state, _ = make()
    first = req(kv=800, klass="interactive")
    assert state.submit(first).admitted
    second = req(kv=300, klass="interactive")
    decision = state.submit(second)
    assert decision.action is Action.QUEUE and decision.limit == "model_memory_quota:llm"
    assert decision.limit_capacity == 1000 and decision.limit_used == 800
    assert state.waiting == 1 and granted_ids(state) == []
    state.release(first.id)
    assert granted_ids(state) == [second.id]
    assert state.waiting == 0 and state.reserved_bytes == 300


def test_class_budget_fraction_keeps_room_for_the_top_class() -> None:
    state, _ = make()
    assert state.submit(req(kv=700, klass="batch")).admitted
    # batch may fill 80 % of the 1000-byte quota: 100 more would make 800, allowed; 101 is not
    assert state.submit(req(kv=100, klass="batch")).admitted
    assert state.submit(req(kv=1, klass="batch")).action is Action.QUEUE
    assert state.submit(req(kv=100, klass="normal")).admitted  # normal: up to 900
    assert state.submit(req(kv=100, klass="interactive")).admitted  # interactive: all 1000


def test_request_that_can_never_fit_is_refused_at_once() -> None:
    state, _ = make()
    decision = state.submit(req(kv=1001, klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_BUDGET
    assert decision.limit == "model_memory_quota:llm" and "can never be admitted" in decision.detail
    decision = state.submit(req(kv=801, klass="batch"))  # 80 % of the quota
    assert decision.reason == EXCEEDS_BUDGET
    assert state.waiting == 0 and state.inflight == 0


def test_class_a_model_does_not_serve_is_refused() -> None:
    doc = policy_doc()
    doc["models"][1]["classes"] = ["interactive"]
    state = AdmissionState(parse_policy(doc), FakeClock())
    decision = state.submit(req(model="cls", klass="batch", request=1))
    assert decision.action is Action.REJECT and decision.reason == CLASS_NOT_SERVED
    assert state.submit(req(model="cls", klass="interactive", request=1)).admitted


def test_model_concurrency_quota() -> None:
    state, _ = make()
    held = [req(model="cls", klass="interactive") for _ in range(5)]
    for r in held:
        assert state.submit(r).admitted
    extra = req(model="cls", klass="interactive")
    decision = state.submit(extra)
    assert decision.action is Action.QUEUE and decision.limit == "model_concurrency_quota:cls"
    state.release(held[0].id)
    assert granted_ids(state) == [extra.id]


def test_concurrency_quota_scales_with_class_fraction() -> None:
    state, _ = make()
    # normal may use floor(5 x 0.9) = 4 of cls's 5 slots
    for _ in range(4):
        assert state.submit(req(model="cls", klass="normal")).admitted
    assert state.submit(req(model="cls", klass="normal")).action is Action.QUEUE
    assert state.submit(req(model="cls", klass="interactive")).admitted


def test_global_concurrency_limit_counts_llm_requests_only() -> None:
    """The adaptive limit guards LLM memory; classic requests, bounded by what Triton accepts, neither
    count against it nor wait for it."""
    doc = policy_doc()
    doc["models"][0]["max_inflight"] = 100
    doc["models"][1]["max_inflight"] = None
    state = AdmissionState(parse_policy(doc), FakeClock())
    for _ in range(20):
        assert state.submit(req(model="cls", klass="interactive")).admitted
    for _ in range(8):
        assert state.submit(req(model="llm", klass="interactive", kv=1)).admitted
    decision = state.submit(req(model="llm", klass="interactive", kv=1))
    assert decision.action is Action.QUEUE and decision.limit == "concurrency_limit"
    assert state.submit(req(model="cls", klass="interactive")).admitted


def test_strict_priority_order() -> None:
    state, clock = make()
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = req(kv=100, klass="batch")
    normal = req(kv=100, klass="normal")
    clock.advance(0.01)
    inter = req(kv=100, klass="interactive")
    for r in (batch, normal, inter):
        assert state.submit(r).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [inter.id, normal.id, batch.id]


def test_equal_priority_is_fifo() -> None:
    state, clock = make()
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    order = []
    for _ in range(3):
        r = req(kv=100, klass="normal")
        state.submit(r)
        order.append(r.id)
        clock.advance(0.001)
    state.release(blocker.id)
    assert granted_ids(state) == order


def test_starvation_guard_promotes_one_level_per_guard_up_to_below_the_top() -> None:
    state, clock = make()
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = req(kv=600, klass="batch")
    state.submit(batch)
    normal = req(kv=600, klass="normal")
    clock.advance(0.2)
    state.submit(normal)
    waiting = state._waiting[batch.id]
    assert state.effective_level(waiting, clock()) == 2  # one guard period: level with normal
    clock.advance(0.2)
    assert state.effective_level(waiting, clock()) == 2  # never level with the top class
    assert state.effective_level(waiting, clock() + 10) == 2
    # level with normal, it waited longer: it goes before the normal request; a fresh interactive
    # request goes before both (the top class is never queued behind a promoted backlog)
    fresh = req(kv=600, klass="interactive")
    assert state.submit(fresh).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [fresh.id]
    state.release(fresh.id)
    assert granted_ids(state) == [batch.id]


def test_without_promotion_interactive_goes_first() -> None:
    state, clock = make()
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = req(kv=600, klass="batch")
    state.submit(batch)
    clock.advance(0.199)  # just under the guard
    fresh = req(kv=600, klass="interactive")
    state.submit(fresh)
    state.release(blocker.id)
    assert granted_ids(state) == [fresh.id]


def test_new_request_does_not_overtake_a_queued_one_of_the_same_model() -> None:
    state, _ = make()
    blocker = req(kv=900, klass="interactive")
    state.submit(blocker)
    big = req(kv=500, klass="interactive")
    assert state.submit(big).action is Action.QUEUE
    small = req(kv=50, klass="interactive")  # would fit, but the model's queue is ahead of it
    # The big one is held by the model's own quota (not shared): other models still pass, this one waits.
    assert state.submit(small).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [big.id, small.id]


def test_a_model_at_its_own_quota_does_not_hold_other_models() -> None:
    state, _ = make()
    state.submit(req(kv=1000, klass="interactive"))
    assert state.submit(req(kv=10, klass="interactive")).action is Action.QUEUE
    assert state.submit(req(model="cls", klass="batch", request=100)).admitted


def test_a_shared_limit_holds_the_whole_queue() -> None:
    doc = policy_doc(devices=[{"id": "gpu0", "memory_bytes": 1000, "utilization_cap": 1.0, "static_used_bytes": 0}])
    state = AdmissionState(parse_policy(doc), FakeClock())
    holder = req(model="cls", klass="interactive", request=900)
    state.submit(holder)
    big = req(model="llm", klass="interactive", kv=10, prefill=500)  # its prefill needs device room
    assert state.submit(big).action is Action.QUEUE
    small = req(model="cls", klass="interactive", request=50)  # fits, but the head is held by a shared limit
    decision = state.submit(small)
    assert decision.action is Action.QUEUE and decision.limit == "headroom:gpu0"
    state.release(holder.id)
    assert granted_ids(state) == [big.id, small.id]


def test_queue_cap_refuses_with_retry_after() -> None:
    state, _ = make()
    state.submit(req(kv=1000, klass="interactive"))
    for _ in range(4):
        assert state.submit(req(kv=10, klass="batch")).action is Action.QUEUE
    decision = state.submit(req(kv=10, klass="batch"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_FULL
    assert decision.retry_after_s == 1.0  # no drain measured yet: the floor
    assert decision.limit == "model_memory_quota:llm" and decision.queue_position == 5
    # other classes have their own caps
    assert state.submit(req(kv=10, klass="normal")).action is Action.QUEUE


def test_queue_timeout_expires_waiting_requests() -> None:
    state, clock = make()
    state.submit(req(kv=1000, klass="interactive"))
    inter = req(kv=10, klass="interactive")
    normal = req(kv=10, klass="normal")
    state.submit(inter)
    state.submit(normal)
    clock.advance(0.124)
    state.tick()
    assert state.take_events().expired == []
    clock.advance(0.002)
    state.tick()
    expired = state.take_events().expired
    assert [d.request_id for d in expired] == [inter.id]
    assert expired[0].reason == QUEUE_TIMEOUT and expired[0].action is Action.REJECT
    assert expired[0].waited_s == pytest.approx(0.126)
    assert expired[0].limit == "model_memory_quota:llm"
    assert state.waiting == 1
    clock.advance(0.4)
    state.tick()
    assert [d.request_id for d in state.take_events().expired] == [normal.id]


def test_drain_rate_and_retry_after() -> None:
    state, clock = make()
    assert state.drain_rate("llm") is None
    for _ in range(4):
        r = req(kv=10)
        state.submit(r)
        clock.advance(0.5)
        state.release(r.id)
    # four completions over 1.5 s since the first
    assert state.drain_rate("llm") == pytest.approx(4 / 1.5)
    assert state.expected_wait_s("llm", 8, clock()) == pytest.approx(3.0)
    assert state.retry_after_s(2.2) == 3.0
    assert state.retry_after_s(0.1) == 1.0
    assert state.retry_after_s(1e6) == 30.0  # limits.max_retry_after_s
    clock.advance(20)  # the window forgets
    assert state.drain_rate("llm") is None
    # while requests are in flight: in flight / mean service time (0.5 s here)
    busy = [req(kv=10) for _ in range(2)]
    for r in busy:
        state.submit(r)
    assert state.drain_rate("llm") == pytest.approx(2 / 0.5)
    assert state.retry_after_s(state.expected_wait_s("llm", 6, clock())) == 2.0


def test_estimated_wait_beyond_the_class_limit_is_refused_early() -> None:
    state, clock = make()
    for _ in range(3):  # slow drain: each request takes 1 s
        r = req(kv=10)
        state.submit(r)
        clock.advance(1.0)
        state.release(r.id)
    state.submit(req(kv=1000, klass="interactive"))
    # interactive may wait 125 ms; one request in flight for ~1 s: the wait for position 1 is ~1 s
    decision = state.submit(req(kv=10, klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert decision.retry_after_s == 1.0 and "exceeds the 125 ms class 'interactive' may wait" in decision.detail
    # batch may wait 2.5 s, and the mean wait fits, but one departure at this drain takes longer
    # one time in four: below the top class a request waits only on a sure wait (WAIT_Z)
    batch = state.submit(req(kv=10, klass="batch"))
    assert batch.action is Action.REJECT and batch.reason == QUEUE_WAIT
    assert "th percentile" in batch.detail and "exceeds the 2500 ms class 'batch' may wait" in batch.detail


def test_below_the_top_class_a_request_waits_only_if_it_surely_leaves_in_time() -> None:
    """A lower class queued on the mean wait waits its whole budget about half the time it is near
    the limit and is then refused late; queued on the wait's 98th percentile it is told at once."""
    state, clock = make(classes=[dict(c, queue_cap=None) for c in policy_doc()["classes"]])
    for _ in range(40):  # each request takes 0.1 s
        rs = [req(kv=10) for _ in range(4)]
        for r in rs:
            assert state.submit(r).admitted
        clock.advance(0.1)
        for r in rs:
            state.release(r.id)
    while True:  # fill the engine's limits: from here on a request waits
        r = req(kv=10)
        if not state.submit(r).admitted:
            state.cancel(r.id)
            break
    rate = state.drain_rate("llm")
    allowed = state.allowed_wait_s("llm", state.class_policy("normal"))
    assert rate and rate * allowed > 20  # room for a queue of tens on the mean
    queued = 0
    while (decision := state.submit(req(kv=10))).action is Action.QUEUE:
        queued += 1
    assert decision.reason == QUEUE_WAIT and "th percentile" in decision.detail
    n = queued + 1
    assert (queued + 2 * queued ** 0.5) / rate <= allowed < (n + 2 * n ** 0.5) / rate
    assert n / rate < allowed  # on the mean alone it would have waited

def test_wait_is_bounded_by_the_target_minus_upstream_latency() -> None:
    state, clock = make()
    inter = state.class_policy("interactive")
    assert state.allowed_wait_s("llm", inter) == 0.125  # no samples yet: the class's longest wait
    for _ in range(5):  # first responses come 200 ms after admission
        r = req(kv=10, klass="interactive")
        state.submit(r)
        clock.advance(0.2)
        state.end_prefill(r.id)
        state.release(r.id)
    assert state.upstream_latency_s("llm") == pytest.approx(0.2)
    assert state.allowed_wait_s("llm", inter) == pytest.approx(0.05)  # 250 ms target - 200 ms upstream
    assert state.allowed_wait_s("llm", state.class_policy("normal")) == 0.5  # 1000 - 200 > 500
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    decision = state.submit(req(kv=10, klass="interactive"))  # ~200 ms until the blocker ends
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert "exceeds the 50 ms class 'interactive' may wait" in decision.detail
    for _ in range(5):  # the upstream got slower than the whole target
        r = req(model="cls", klass="interactive")
        state.submit(r)
        clock.advance(0.3)
        state.release(r.id)  # unary: admission -> end
    assert state.upstream_latency_s("cls") == pytest.approx(0.3)
    assert state.allowed_wait_s("cls", inter) == 0.0
    held = [req(model="cls", klass="interactive") for _ in range(5)]
    for r in held:
        state.submit(r)
    decision = state.submit(req(model="cls", klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert "leaves no time to wait: upstream alone takes 300 ms" in decision.detail


def test_cancel_waiting_and_after_grant() -> None:
    state, _ = make()
    blocker = req(kv=1000, klass="interactive")
    state.submit(blocker)
    waiting = req(kv=10, klass="interactive")
    state.submit(waiting)
    assert state.cancel(waiting.id) is True and state.waiting == 0
    assert state.cancel(waiting.id) is False
    other = req(kv=10, klass="interactive")
    state.submit(other)
    state.release(blocker.id)  # grants `other`
    assert state.cancel(other.id) is False  # it holds a reservation now: the owner must release it
    assert state.release(other.id) is True and state.reserved_bytes == 0


def test_unknown_model_passes_unlimited_at_no_cost() -> None:
    state, _ = make()
    model = state.model_policy("not-in-policy")
    cost = cost_for(model, None)
    assert cost == Cost() and model.max_inflight is None and model.devices == ["gpu0"]
    r = Request("u1", "not-in-policy", "batch", cost)
    assert state.submit(r).admitted
    assert state.inflight == 1 and state.reserved_scope("gpu0") == 0 and not state.known_model("not-in-policy")
    state.release(r.id)
    assert state.inflight == 0


def test_unknown_class_falls_back_to_the_default() -> None:
    state, _ = make()
    assert state.class_policy("nope").name == "normal"
    assert state.class_policy(None).name == "normal"


# ------------------------------------------------------------------------------------------------
# headroom


def snapshot(at: float, *readings: Reading, failures: dict[str, str] | None = None) -> HeadroomSnapshot:
    return HeadroomSnapshot(at, {r.scope: r for r in readings}, failures or {})


def test_static_capacity_is_total_minus_pad_and_static_use() -> None:
    doc = policy_doc(devices=[{"id": "gpu0", "memory_bytes": 10_000, "utilization_cap": 0.5, "static_used_bytes": 1000}])
    doc["headroom"]["safety_pad_bytes"] = 500
    state = AdmissionState(parse_policy(doc), FakeClock())
    assert state.capacity("gpu0") == 10_000 * 0.5 - 500 - 1000
    assert state.reading("gpu0").source == "static"  # type: ignore[union-attr]
    assert state.capacity("pool:llm") is None  # no live pool reading: only the static quota applies


def test_live_reading_counts_reservations_once() -> None:
    doc = policy_doc()
    doc["headroom"]["safety_pad_bytes"] = 100
    state = AdmissionState(parse_policy(doc), clock := FakeClock())
    r = req(kv=300, klass="interactive")
    state.submit(r)
    # pool: 1000 total; the engine shows 200 used while the sidecar holds 300 -> nothing foreign
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 200, "triton_metrics")))
    assert state.capacity("pool:llm") == 1000  # no pad on a KV pool
    # 500 used while the sidecar held 300 at the sample: 200 bytes belong to someone else
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 500, "triton_metrics")))
    assert state.capacity("pool:llm") == 800
    decision = state.submit(req(kv=600, klass="interactive"))
    assert decision.action is Action.QUEUE and decision.limit == "headroom:pool:llm"
    # device: the pad applies
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 40_000, "nvml")))
    assert state.capacity("gpu0") == 100_000 - 100 - 40_000


def test_foreign_memory_on_the_device_blocks_prefill() -> None:
    state, clock = make()
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 99_950, "nvml")))
    decision = state.submit(req(kv=10, prefill=100, klass="interactive"))
    assert decision.action is Action.QUEUE and decision.limit == "headroom:gpu0"
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 50_000, "nvml")))
    assert len(state.take_events().granted) == 1


def test_stale_reading_falls_back_to_static() -> None:
    state, clock = make()
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 99_000, "nvml")))
    assert state.reading("gpu0").source == "nvml"  # type: ignore[union-attr]
    clock.advance(5.001)  # headroom.stale_after_ms default 5000
    assert state.reading("gpu0").source == "static"  # type: ignore[union-attr]
    assert state.capacity("gpu0") == 100_000


def test_status_reports_sources_and_failures() -> None:
    state, clock = make()
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 0, "triton_metrics"),
                                    failures={"nvml": "NVML unavailable"}))
    status = state.status()
    assert status["headroom_failures"] == {"nvml": "NVML unavailable"}
    assert status["scopes"]["pool:llm"]["source"] == "triton_metrics"  # type: ignore[index]
    assert status["scopes"]["gpu0"]["source"] == "static"  # type: ignore[index]
    json.dumps(status)  # served as JSON


def test_watermark_and_oom_risk() -> None:
    state, _ = make()
    assert state.watermark() == 0
    r = req(kv=500, tokens=50, klass="interactive")
    state.submit(r)
    assert state.watermark() == 0  # a pre-allocated pool's KV is checked exactly, not watermarked
    busy = req(model="cls", request=50_000, klass="interactive")
    state.submit(busy)
    assert state.watermark() == pytest.approx(0.5)  # device bytes: half of gpu0
    state.release(busy.id)
    # one sequence x 50 tokens (requested, nothing finished yet) x 10 B / 1000 B
    assert state.oom_risk("llm") == pytest.approx(0.5)
    state.release(r.id, tokens=80)
    r2 = req(kv=500, tokens=50, klass="interactive")
    state.submit(r2)
    assert state.oom_risk("llm") == pytest.approx(80 * 10 / 1000)  # observed mean length now
    assert state.oom_risk("cls") is None


# ------------------------------------------------------------------------------------------------
# the adaptive limit


def concurrency(**over: Any) -> ConcurrencyPolicy:
    base = {"min": 4, "max": 10, "queue_delay_high_ms": 50, "queue_delay_low_ms": 20,
            "adjust_interval_ms": 1000, "increase_hold_ms": 3000, "high_watermark": 0.9, "low_watermark": 0.7}
    base.update(over)
    return ConcurrencyPolicy(**base)


def test_limit_steps_down_on_high_watermark_and_delay() -> None:
    limit = AdaptiveLimit(concurrency(), now=0)
    assert limit.value == 10
    assert limit.update(0.5, 0.95, None, True) == "hold"  # within the interval
    assert limit.update(1.0, 0.95, None, True) == "down" and limit.value == 9
    assert limit.update(2.0, 0.1, 0.05, True) == "down" and limit.value == 8  # 50 ms queue delay
    for t in range(3, 20):
        limit.update(float(t), 1.0, None, True)
    assert limit.value == 4  # never below min


def test_limit_holds_in_the_band_and_steps_up_only_with_demand() -> None:
    limit = AdaptiveLimit(concurrency(initial=6), now=0)
    assert limit.update(1.0, 0.8, 0.03, True) == "hold"  # between the watermarks: hysteresis band
    assert limit.update(2.0, 0.5, 0.03, True) == "hold"  # delay between low and high
    assert limit.update(3.0, 0.5, 0.01, False) == "hold"  # nobody is waiting for more
    assert limit.update(4.0, 0.5, None, True) == "up" and limit.value == 7
    assert limit.update(4.5, 0.5, None, True) == "hold"  # one change per interval
    for t in range(5, 20):
        limit.update(float(t), 0.0, 0.0, True)
    assert limit.value == 10  # never above max


def test_limit_does_not_step_up_right_after_stepping_down() -> None:
    limit = AdaptiveLimit(concurrency(), now=0)
    limit.update(1.0, 0.95, None, True)
    assert limit.value == 9
    assert limit.update(2.0, 0.1, None, True) == "hold"
    assert limit.update(3.9, 0.1, None, True) == "hold"
    assert limit.update(4.0, 0.1, None, True) == "up" and limit.value == 10


def test_limit_does_not_oscillate_under_a_steady_mid_band_load() -> None:
    limit = AdaptiveLimit(concurrency(), now=0)
    moves = [limit.update(float(t), 0.8, 0.035, True) for t in range(1, 30)]
    assert set(moves) == {"hold"}


def test_state_tick_moves_the_limit_from_the_watermark() -> None:
    doc = policy_doc(concurrency={"min": 2, "max": 8, "queue_delay_high_ms": 50, "queue_delay_low_ms": 20})
    state = AdmissionState(parse_policy(doc), clock := FakeClock())
    state.submit(req(prefill=95_000, klass="interactive"))  # 95 % of gpu0's memory
    clock.advance(1.0)
    state.tick()
    assert state.limit.value == 7 and state.last_limit_move == "down"


def test_reconfigure_clamps_the_limit() -> None:
    limit = AdaptiveLimit(concurrency(), now=0)
    limit.reconfigure(concurrency(min=1, max=5))
    assert limit.value == 5


def test_apply_policy_keeps_reservations() -> None:
    state, _ = make()
    r = req(kv=600, klass="interactive")
    state.submit(r)
    doc = policy_doc()
    doc["models"][0]["memory_quota_bytes"] = 700
    state.apply_policy(parse_policy(doc))
    assert state.reserved_bytes == 600
    assert state.submit(req(kv=200, klass="interactive")).action is Action.QUEUE  # the new quota applies
    state.release(r.id)
    assert state.reserved_bytes == 200


# ------------------------------------------------------------------------------------------------
# tenant quotas


def tenants(*entries: dict[str, Any], default: dict[str, Any] | None = None) -> tuple[AdmissionState, FakeClock]:
    return make(tenants=list(entries), default_tenant=default)


def usage(state: AdmissionState, tenant: str) -> tuple[int, int]:
    return state.inflight_of_tenant(tenant), state.reserved_of_tenant(tenant)


def test_tenant_concurrency_quota_queues_and_holds_only_its_tenant() -> None:
    state, _ = tenants({"name": "acme", "max_inflight": 2})
    held = [req(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(2)]
    for r in held:
        assert state.submit(r).admitted
    third = req(model="cls", klass="interactive", request=100, tenant="acme")
    decision = state.submit(third)
    assert decision.action is Action.QUEUE and decision.limit == "tenant_concurrency_quota:acme"
    assert (decision.limit_capacity, decision.limit_used) == (2, 2)
    # the same model for another tenant is not held behind acme's queued request
    assert state.submit(req(model="cls", klass="interactive", request=100, tenant="beta")).admitted
    # acme's requests to other models wait in order behind it
    behind = req(model="llm", klass="interactive", kv=10, tenant="acme")
    assert state.submit(behind).action is Action.QUEUE
    state.release(held[0].id)
    assert granted_ids(state) == [third.id]
    state.release(held[1].id)
    assert granted_ids(state) == [behind.id]
    assert usage(state, "acme") == (2, 110)


def test_tenant_memory_quota_counts_every_held_byte() -> None:
    state, _ = tenants({"name": "acme", "max_reserved_bytes": 500})
    first = req(kv=300, prefill=100, klass="interactive", tenant="acme")
    assert state.submit(first).admitted and usage(state, "acme") == (1, 400)
    second = req(kv=150, klass="interactive", tenant="acme")
    decision = state.submit(second)
    assert decision.action is Action.QUEUE and decision.limit == "tenant_memory_quota:acme"
    assert (decision.limit_capacity, decision.limit_used) == (500, 400)
    state.end_prefill(first.id)  # the prefill peak is given back: 300 + 150 fits in 500
    assert granted_ids(state) == [second.id] and usage(state, "acme") == (2, 450)
    state.release(first.id, linger_s=0.3)  # lingering bytes still count against the tenant
    assert usage(state, "acme") == (1, 450)


def test_tenant_request_that_can_never_fit_is_refused_at_once() -> None:
    state, _ = tenants({"name": "acme", "max_reserved_bytes": 500})
    decision = state.submit(req(kv=401, klass="batch", tenant="acme"))  # batch may fill 80 %: 400
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_BUDGET
    assert decision.limit == "tenant_memory_quota:acme" and decision.limit_capacity == 400
    assert state.submit(req(kv=401, klass="interactive", tenant="acme")).admitted


def test_budget_fraction_applies_to_tenant_quotas() -> None:
    state, _ = tenants({"name": "acme", "max_inflight": 5})
    for _ in range(4):  # floor(5 x 0.8)
        assert state.submit(req(model="llm", klass="batch", kv=1, tenant="acme")).admitted
    assert state.submit(req(model="llm", klass="batch", kv=1, tenant="acme")).action is Action.QUEUE
    assert state.submit(req(model="cls", klass="interactive", request=100, tenant="acme")).admitted


def test_class_a_tenant_may_not_send_is_refused() -> None:
    state, _ = tenants({"name": "acme", "classes": ["batch"]})
    decision = state.submit(req(klass="interactive", kv=1, tenant="acme"))
    assert decision.action is Action.REJECT and decision.reason == TENANT_CLASS_NOT_ALLOWED
    assert decision.limit == "tenant_classes:acme" and "may send classes ['batch']" in decision.detail
    assert state.submit(req(klass="batch", kv=1, tenant="acme")).admitted
    assert state.submit(req(klass="interactive", kv=1, tenant="beta")).admitted  # not listed, no default quota


def test_default_tenant_quota_applies_to_each_unlisted_tenant() -> None:
    state, _ = tenants({"name": "internal"}, default={"max_inflight": 1})
    for tenant in ("x", "y", "default"):
        assert state.submit(req(model="cls", klass="interactive", request=100, tenant=tenant)).admitted
    decision = state.submit(req(model="cls", klass="interactive", request=100, tenant="x"))
    assert decision.action is Action.QUEUE and decision.limit == "tenant_concurrency_quota:x"
    for _ in range(2):  # a listed tenant without limits is not held to the default quota
        assert state.submit(req(model="cls", klass="interactive", request=100, tenant="internal")).admitted
    assert state.tenant_label("x") == "other" and state.tenant_label("internal") == "internal"
    assert state.tenant_label("default") == "default"
    assert state.tenant_usage() == {"internal": (2, 200), "default": (1, 100), "other": (2, 200)}


def test_tenant_counts_return_to_zero_and_unlisted_names_are_forgotten() -> None:
    state, clock = tenants(default={"max_inflight": 100})
    rids = [req(kv=10, prefill=5, klass="interactive", tenant=f"t{i}") for i in range(8)]
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
    assert state.submit(req(model="cls", klass="interactive", request=100, tenant="acme")).admitted
    queued = [req(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(4)]
    for r in queued:
        assert state.submit(r).action is Action.QUEUE
    full = state.submit(req(model="cls", klass="interactive", request=100, tenant="acme"))
    assert full.reason == QUEUE_FULL and full.limit == "tenant_concurrency_quota:acme"
    clock.advance(0.126)  # past interactive's 125 ms queue wait
    state.tick()
    expired = state.take_events().expired
    assert [d.request_id for d in expired] == [r.id for r in queued]
    assert {d.reason for d in expired} == {QUEUE_TIMEOUT}
    assert {d.limit for d in expired} == {"tenant_concurrency_quota:acme"}


def test_reload_applies_new_tenant_quotas_and_keeps_counts() -> None:
    state, _ = make()
    held = [req(model="cls", klass="interactive", request=100, tenant="acme") for _ in range(3)]
    for r in held:
        assert state.submit(r).admitted
    state.apply_policy(parse_policy(policy_doc(tenants=[{"name": "acme", "max_inflight": 2}])))
    assert usage(state, "acme") == (3, 300)  # in-flight accounting survives the reload
    late = req(model="cls", klass="interactive", request=100, tenant="acme")
    assert state.submit(late).action is Action.QUEUE  # 3 in flight against the new quota of 2
    state.release(held[0].id)
    assert granted_ids(state) == []  # 2 in flight: still at the quota
    state.release(held[1].id)
    assert granted_ids(state) == [late.id] and usage(state, "acme") == (2, 200)
    state.apply_policy(parse_policy(policy_doc()))  # acme no longer listed: counted as "other"
    assert state.tenant_usage()["other"] == (2, 200)
    state.release(held[2].id)
    state.release(late.id)
    assert usage(state, "acme") == (0, 0) and state.tenant_usage()["other"] == (0, 0)


# ------------------------------------------------------------------------------------------------
# the cost model


KV = KVCost(bytes_per_token=512, bytes_per_token_source="analytic", block_tokens=16, max_context=256,
            default_max_tokens=16)


def test_llm_cost_rounds_to_blocks() -> None:
    cost = llm_cost(KV, LLMFacts(prompt_bytes=[20], max_tokens=[40]))
    assert cost.tokens == 60 and cost.prompt_tokens == 20
    assert cost.kv_bytes == 4 * 16 * 512  # ceil(60 / 16) = 4 blocks
    assert cost.prefill_bytes == 0 and cost.sequences == 1
    assert kv_bytes_for(KV, 64) == 4 * 16 * 512 and kv_bytes_for(KV, 65) == 5 * 16 * 512


def test_llm_cost_of_a_hybrid_is_its_footprint_at_its_own_length() -> None:
    # 10 B/token on the growing layers, 5 B/token on layers capped at 32 tokens, 1000 B of state.
    hybrid = KV.model_copy(update={"bytes_per_token": 10.0, "state_bytes": 1000,
                                   "capped": [CappedKV(cap_tokens=32, bytes_per_token=5.0)]})
    # 20 + 40 = 60 tokens -> 4 blocks of 16 = 64: 10 x 64 + 5 x min(64, 32) + 1000 = 1800
    assert llm_cost(hybrid, LLMFacts(prompt_bytes=[20], max_tokens=[40])).kv_bytes == 640 + 160 + 1000 == 1800
    # 1 token still holds one block and the whole state: 10 x 16 + 5 x 16 + 1000
    assert kv_bytes_for(hybrid, 1) == 1240 and kv_bytes_for(hybrid, 0) == 0
    # A policy written before hybrids (no capped, no state) charges bytes per token x length as before.
    assert KV.capped == [] and KV.state_bytes == 0 and kv_bytes_for(KV, 64) == 64 * 512
    with pytest.raises(ValueError, match="a sequence would cost nothing"):
        KVCost(bytes_per_token=0, bytes_per_token_source="analytic", max_context=16)


def test_llm_cost_defaults_and_clamps() -> None:
    assert sequence_tokens(KV, 10, None) == (10, 26)  # default_max_tokens 16
    assert sequence_tokens(KV, 250, 100) == (250, 256)  # clamped to max_context
    assert sequence_tokens(KV, None, 5) == (256, 256)  # unknown prompt: the worst case
    no_default = KV.model_copy(update={"default_max_tokens": None})
    assert sequence_tokens(no_default, 56, None) == (56, 256)
    bpe = KV.model_copy(update={"prompt_bytes_per_token": 4.0})
    assert sequence_tokens(bpe, 40, 0) == (10, 10)


def test_llm_cost_of_a_batch_adds_sequences() -> None:
    cost = llm_cost(KV, LLMFacts(prompt_bytes=[16, 32], max_tokens=[16]))
    assert cost.sequences == 2 and cost.tokens == 32 + 48
    assert cost.prompt_lengths == (16, 32)
    assert cost.kv_bytes == (2 + 3) * 16 * 512
    with pytest.raises(ValueError, match="2 prompts but 3 max_tokens"):
        LLMFacts(prompt_bytes=[1, 2], max_tokens=[1, 2, 3])


def test_prompt_lengths_are_the_stated_prompts_in_tokens() -> None:
    bpe = KV.model_copy(update={"prompt_bytes_per_token": 4.0})
    assert llm_cost(bpe, LLMFacts(prompt_bytes=[40, 1], max_tokens=[0])).prompt_lengths == (10, 1)
    assert llm_cost(KV, LLMFacts(prompt_bytes=[9999], max_tokens=[])).prompt_lengths == (256,)  # clamped
    unknown = llm_cost(KV, LLMFacts(prompt_bytes=[None, 8], max_tokens=[]))
    assert unknown.prompt_lengths == (8,) and unknown.prompt_tokens == 256 + 8  # charged, not measured


def test_prefill_peak_interpolation() -> None:
    points = [PrefillPoint(prompt_tokens=16, peak_bytes=1000), PrefillPoint(prompt_tokens=64, peak_bytes=5000)]
    assert prefill_peak_bytes(points, 0) == 0
    assert prefill_peak_bytes(points, 8) == 1000  # below the first point: its peak
    assert prefill_peak_bytes(points, 40) == 3000  # linear in between
    assert prefill_peak_bytes(points, 128) == 20000  # above: grows with the square
    assert prefill_peak_bytes([], 100) == 0
    kv = KV.model_copy(update={"prefill_peak": points})
    assert llm_cost(kv, LLMFacts([64], [1])).prefill_bytes == 5000


def test_cost_for_classic_and_llm_without_facts() -> None:
    policy = parse_policy(policy_doc())
    assert cost_for(policy.model_named("cls"), None) == Cost(request_bytes=100)  # type: ignore[arg-type]
    llm = cost_for(policy.model_named("llm"), None)  # type: ignore[arg-type]
    assert llm.kv_bytes == 100 * 10 and llm.tokens == 100  # a full context


# ------------------------------------------------------------------------------------------------
# reading requests


def bytes_tensor(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def test_http_infer_json_facts_and_priority_rewrite() -> None:
    doc = {"id": "r1", "inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [["héllo"]]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [[7]]},
    ], "parameters": {"traffic_class": "batch"}}
    body = protocol.parse_infer(json.dumps(doc).encode(), None)
    facts = protocol.infer_llm_facts(body, KV)
    assert list(facts.prompt_bytes) == [6] and list(facts.max_tokens) == [7]
    assert protocol.infer_class(body, "traffic_class") == "batch"
    out, length = protocol.infer_with_priority(body, 3)
    assert length is None
    rewritten = json.loads(out)
    assert rewritten["parameters"] == {"traffic_class": "batch", "priority": 3}
    assert rewritten["id"] == "r1" and rewritten["inputs"] == doc["inputs"]


def test_http_infer_binary_facts_and_rewrite_keep_tensor_bytes() -> None:
    text = bytes_tensor(b"abc", b"defgh")
    mt = struct.pack("<2i", 5, 9)
    header = json.dumps({"inputs": [
        {"name": "text_input", "shape": [2, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(text)}},
        {"name": "max_tokens", "shape": [2, 1], "datatype": "INT32", "parameters": {"binary_data_size": len(mt)}},
    ]}).encode()
    body = protocol.parse_infer(header + text + mt, str(len(header)))
    facts = protocol.infer_llm_facts(body, KV)
    assert list(facts.prompt_bytes) == [3, 5] and list(facts.max_tokens) == [5, 9]
    out, length = protocol.infer_with_priority(body, 1)
    assert length is not None and out[int(length):] == text + mt  # tensor bytes untouched
    assert json.loads(out[: int(length)])["parameters"]["priority"] == 1


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"{not json", None, "not valid"),
        (b"[1, 2]", None, "must be an object"),
        (b'{"inputs": 3}', None, "needs `inputs`"),
        (b'{"inputs": []}', "x", "is not a number"),
        (b'{"inputs": []}', "999", "outside the body"),
        (b'{"inputs": [{"name": "a", "parameters": {"binary_data_size": 10}}]}', None, "binary data"),
        (b'{"inputs": [], "parameters": 5}', None, "must be a JSON object"),
    ],
)
def test_http_infer_malformed(body: bytes, length: str | None, message: str) -> None:
    with pytest.raises(protocol.BadRequest, match=message):
        protocol.parse_infer(body, length)


def test_bytes_tensor_truncated_is_malformed() -> None:
    with pytest.raises(protocol.BadRequest, match="length prefix"):
        protocol.decode_bytes_tensor(b"\x01\x00")
    with pytest.raises(protocol.BadRequest, match="runs past"):
        protocol.decode_bytes_tensor(struct.pack("<I", 10) + b"abc")


def test_generate_facts_class_and_priority() -> None:
    doc = protocol.parse_generate(b'{"text_input": "hello", "max_tokens": 4, "parameters": {"traffic_class": "interactive"}}')
    facts = protocol.generate_llm_facts(doc, KV)
    assert list(facts.prompt_bytes) == [5] and list(facts.max_tokens) == [4]
    assert protocol.generate_class(doc, "traffic_class") == "interactive"
    assert json.loads(protocol.generate_with_priority(doc, 1))["parameters"]["priority"] == 1
    doc2 = protocol.parse_generate(b'{"text_input": "hi", "parameters": {"max_tokens": 9}}')
    assert list(protocol.generate_llm_facts(doc2, KV).max_tokens) == [9]
    doc3 = protocol.parse_generate(b'{"text_input": "hi", "sampling_parameters": "{\\"max_tokens\\": 11}"}')
    assert list(protocol.generate_llm_facts(doc3, KV).max_tokens) == [11]
    with pytest.raises(protocol.BadRequest, match="must hold integers"):
        protocol.generate_llm_facts(protocol.parse_generate(b'{"text_input": "x", "max_tokens": "many"}'), KV)
    with pytest.raises(protocol.BadRequest, match="must be a string"):
        protocol.generate_class(protocol.parse_generate(b'{"parameters": {"traffic_class": 3}}'), "traffic_class")


def test_grpc_facts_from_contents_and_raw() -> None:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="tinyllm")
    t = request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(b"hello!")
    m = request.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1])
    m.contents.int_contents.append(12)
    facts = protocol.grpc_llm_facts(request, KV)
    assert list(facts.prompt_bytes) == [6] and list(facts.max_tokens) == [12]

    raw = pb.ModelInferRequest(model_name="tinyllm")
    raw.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    raw.inputs.add(name="max_tokens", datatype="INT64", shape=[1, 1])
    raw.raw_input_contents.append(bytes_tensor(b"abcd"))
    raw.raw_input_contents.append(struct.pack("<q", 33))
    raw.parameters["traffic_class"].string_param = "batch"
    facts = protocol.grpc_llm_facts(raw, KV)
    assert list(facts.prompt_bytes) == [4] and list(facts.max_tokens) == [33]
    assert protocol.grpc_class(raw, "traffic_class") == "batch"
    protocol.grpc_set_priority(raw, 3)
    assert raw.parameters["priority"].uint64_param == 3
    raw.parameters["traffic_class"].int64_param = 1
    with pytest.raises(protocol.BadRequest, match="must be a string"):
        protocol.grpc_class(raw, "traffic_class")


def test_resolve_class() -> None:
    policy: SidecarPolicy = parse_policy(policy_doc())
    assert protocol.resolve_class(policy, None, None).name == "normal"
    assert protocol.resolve_class(policy, "batch", "interactive").name == "batch"  # the header wins
    assert protocol.resolve_class(policy, None, "interactive").name == "interactive"
    with pytest.raises(protocol.BadRequest, match="unknown traffic class 'vip'; known classes: interactive, normal, batch"):
        protocol.resolve_class(policy, "vip", None)


def test_resolve_tenant() -> None:
    assert protocol.resolve_tenant(None) == "default"
    assert protocol.resolve_tenant("  ") == "default"
    assert protocol.resolve_tenant(" acme-eu.1 ") == "acme-eu.1"
    for bad in ("a b", "-x", "x" * 129, "ten\u00e4nt", "a/b"):
        with pytest.raises(protocol.BadRequest, match="is not a tenant name"):
            protocol.resolve_tenant(bad)


# ------------------------------------------------------------------------------------------------
# the asyncio owner: capacity as a context manager never leaks


def controller(**over: Any) -> tuple[Any, AdmissionState, FakeClock]:
    from sidecar.controller import AdmissionController
    from sidecar.metrics import SidecarMetrics

    state, clock = make(**over)
    return AdmissionController(state, SidecarMetrics(), clock), state, clock


def test_context_manager_releases_on_success_error_and_cancel() -> None:
    from sidecar.controller import Rejected, refusal

    async def main() -> None:
        ctl, state, _ = controller()
        async with ctl.admit("llm", "normal", Cost(kv_bytes=300)) as ticket:
            assert state.reserved_bytes == 300 and ticket.waited_s == 0
        assert state.reserved_bytes == 0 and state.inflight == 0

        with pytest.raises(RuntimeError):
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300)):
                raise RuntimeError("upstream exploded")
        assert state.reserved_bytes == 0

        # cancelled after it was sent upstream: the bytes linger for the model's grace, the slot frees
        async def in_flight() -> None:
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300)) as ticket:
                ticket.sent = True
                await asyncio.sleep(10)

        task = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert state.inflight == 0 and state.reserved_bytes == 300 and state.lingering == 1

        with pytest.raises(Rejected) as err:
            async with ctl.admit("llm", "interactive", Cost(kv_bytes=5000)):
                pass
        status, body = refusal(err.value.decision, "llm", "interactive")
        assert status == 413 and body["reason"] == EXCEEDS_BUDGET and body["limit"] == "model_memory_quota:llm"

    asyncio.run(main())


def test_queued_request_is_granted_or_leaves_cleanly() -> None:
    async def main() -> None:
        ctl, state, clock = controller()
        order: list[str] = []

        async def user(name: str, klass: str, kv: int, hold: float) -> None:
            async with ctl.admit("llm", klass, Cost(kv_bytes=kv)):
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.ensure_future(user("first", "interactive", 1000, 0.05))
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(user("queued", "normal", 100, 0))
        gave_up = asyncio.ensure_future(user("gave-up", "batch", 100, 0))
        await asyncio.sleep(0)
        assert state.waiting == 2
        gave_up.cancel()  # the client went away while waiting
        await asyncio.gather(first, queued)
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        assert order == ["first", "queued"]
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

        # granted in the same instant the waiter is cancelled: the grant is given back
        holder = asyncio.ensure_future(user("holder", "interactive", 1000, 10))
        await asyncio.sleep(0)
        racer = asyncio.ensure_future(user("racer", "interactive", 100, 0))
        await asyncio.sleep(0)
        holder.cancel()
        racer.cancel()
        await asyncio.gather(holder, racer, return_exceptions=True)
        clock.advance(1)
        state.tick()
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

    asyncio.run(main())


def test_queue_timeout_becomes_a_rejection() -> None:
    from sidecar.controller import Rejected

    async def main() -> None:
        ctl, state, clock = controller()
        held = state.submit(req(kv=1000, klass="interactive"))

        async def waiter() -> None:
            async with ctl.admit("llm", "interactive", Cost(kv_bytes=10)):
                pass

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        clock.advance(0.2)
        state.tick()
        ctl.dispatch()
        with pytest.raises(Rejected) as err:
            await task
        assert err.value.decision.reason == QUEUE_TIMEOUT and err.value.decision.retry_after_s == 1.0
        state.release(held.request_id)
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

    asyncio.run(main())


def test_tenant_accounting_is_released_on_every_way_out() -> None:
    from sidecar.controller import Rejected, refusal

    async def main() -> None:
        ctl, state, clock = controller(tenants=[{"name": "acme", "max_inflight": 1, "classes": ["interactive", "normal"]}])
        async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme") as ticket:
            assert ticket.tenant == "acme" and usage(state, "acme") == (1, 300)
        assert usage(state, "acme") == (0, 0)

        with pytest.raises(RuntimeError):
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme"):
                raise RuntimeError("upstream exploded")
        assert usage(state, "acme") == (0, 0)

        async def in_flight() -> None:  # sent upstream, then cancelled: the bytes linger, the slot frees
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme") as ticket:
                ticket.sent = True
                await asyncio.sleep(10)

        task = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        assert usage(state, "acme") == (1, 300)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert usage(state, "acme") == (0, 300)
        clock.advance(0.3)  # llm's release grace
        state.tick()
        assert usage(state, "acme") == (0, 0)

        # waiting for acme's quota and cancelled while waiting: leaves the queue, holds nothing
        holder = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        assert state.waiting == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert state.waiting == 0 and usage(state, "acme") == (1, 300)
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        clock.advance(0.3)
        state.tick()
        assert usage(state, "acme") == (0, 0)

        with pytest.raises(Rejected) as err:
            async with ctl.admit("llm", "batch", Cost(kv_bytes=1), "acme"):
                pass
        status, body = refusal(err.value.decision, "llm", "batch", err.value.tenant)
        assert status == 403 and body["reason"] == TENANT_CLASS_NOT_ALLOWED and body["tenant"] == "acme"

        async with ctl.admit("llm", "normal", Cost(kv_bytes=1), "someone-else"):
            ctl.publish()
            text = ctl.metrics.exposition().decode()
            assert 'sidecar_tenant_inflight_requests{tenant="other"} 1.0' in text
            assert 'sidecar_tenant_inflight_requests{tenant="acme"} 0.0' in text
        text = ctl.metrics.exposition().decode()
        assert 'sidecar_tenant_requests_admitted_total{tenant="acme"} 4.0' in text
        assert 'sidecar_tenant_requests_admitted_total{tenant="other"} 1.0' in text
        assert 'sidecar_tenant_requests_rejected_total{reason="tenant_class_not_allowed",tenant="acme"} 1.0' in text
        assert "someone-else" not in text  # label cardinality stays bounded

        ctl.state.apply_policy(parse_policy(policy_doc()))  # acme removed: its series go
        ctl.publish()
        text = ctl.metrics.exposition().decode()
        assert 'sidecar_tenant_inflight_requests{tenant="acme"}' not in text
        assert (state.inflight, state.reserved_bytes, state.waiting) == (0, 0, 0)

    asyncio.run(main())
