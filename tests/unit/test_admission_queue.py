"""The admission queue, on the pure state with a fake clock: the order requests leave it in
(priority, FIFO, the starvation guard, one model's queue never overtaken), its caps and timeouts,
the drain rate behind Retry-After, and the waits a class is allowed before it is refused.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import QUEUE_FULL, QUEUE_TIMEOUT, QUEUE_WAIT, Action
from tests.sidecar_rigs import FakeClock, admission_request, admission_state, granted_ids, policy_doc
from tritongen.core.sidecar_policy.schema import parse_policy


def test_strict_priority_order() -> None:
    state, clock = admission_state()
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = admission_request(kv=100, klass="batch")
    normal = admission_request(kv=100, klass="normal")
    clock.advance(0.01)
    inter = admission_request(kv=100, klass="interactive")
    for r in (batch, normal, inter):
        assert state.submit(r).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [inter.id, normal.id, batch.id]


def test_equal_priority_is_fifo() -> None:
    state, clock = admission_state()
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    order = []
    for _ in range(3):
        r = admission_request(kv=100, klass="normal")
        state.submit(r)
        order.append(r.id)
        clock.advance(0.001)
    state.release(blocker.id)
    assert granted_ids(state) == order


def test_starvation_guard_promotes_one_level_per_guard_up_to_below_the_top() -> None:
    state, clock = admission_state()
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = admission_request(kv=600, klass="batch")
    state.submit(batch)
    normal = admission_request(kv=600, klass="normal")
    clock.advance(0.2)
    state.submit(normal)
    waiting = state._waiting[batch.id]
    assert state.effective_level(waiting, clock()) == 2  # one guard period: level with normal
    clock.advance(0.2)
    assert state.effective_level(waiting, clock()) == 2  # never level with the top class
    assert state.effective_level(waiting, clock() + 10) == 2
    # level with normal, it waited longer: it goes before the normal request; a fresh interactive
    # request goes before both (the top class is never queued behind a promoted backlog)
    fresh = admission_request(kv=600, klass="interactive")
    assert state.submit(fresh).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [fresh.id]
    state.release(fresh.id)
    assert granted_ids(state) == [batch.id]


def test_without_promotion_interactive_goes_first() -> None:
    state, clock = admission_state()
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    batch = admission_request(kv=600, klass="batch")
    state.submit(batch)
    clock.advance(0.199)  # just under the guard
    fresh = admission_request(kv=600, klass="interactive")
    state.submit(fresh)
    state.release(blocker.id)
    assert granted_ids(state) == [fresh.id]


def test_new_request_does_not_overtake_a_queued_one_of_the_same_model() -> None:
    state, _ = admission_state()
    blocker = admission_request(kv=900, klass="interactive")
    state.submit(blocker)
    big = admission_request(kv=500, klass="interactive")
    assert state.submit(big).action is Action.QUEUE
    small = admission_request(kv=50, klass="interactive")  # would fit, but the model's queue is ahead of it
    # The big one is held by the model's own quota (not shared): other models still pass, this one waits.
    assert state.submit(small).action is Action.QUEUE
    state.release(blocker.id)
    assert granted_ids(state) == [big.id, small.id]


def test_a_model_at_its_own_quota_does_not_hold_other_models() -> None:
    state, _ = admission_state()
    state.submit(admission_request(kv=1000, klass="interactive"))
    assert state.submit(admission_request(kv=10, klass="interactive")).action is Action.QUEUE
    assert state.submit(admission_request(model="cls", klass="batch", request=100)).admitted


def test_a_shared_limit_holds_the_whole_queue() -> None:
    doc = policy_doc(devices=[{"id": "gpu0", "memory_bytes": 1000, "utilization_cap": 1.0, "static_used_bytes": 0}])
    state = AdmissionState(parse_policy(doc), FakeClock())
    holder = admission_request(model="cls", klass="interactive", request=900)
    state.submit(holder)
    big = admission_request(model="llm", klass="interactive", kv=10, prefill=500)  # its prefill needs device room
    assert state.submit(big).action is Action.QUEUE
    small = admission_request(model="cls", klass="interactive", request=50)  # fits, but the head is held by a shared limit
    decision = state.submit(small)
    assert decision.action is Action.QUEUE and decision.limit == "headroom:gpu0"
    state.release(holder.id)
    assert granted_ids(state) == [big.id, small.id]


def test_queue_cap_refuses_with_retry_after() -> None:
    state, _ = admission_state()
    state.submit(admission_request(kv=1000, klass="interactive"))
    for _ in range(4):
        assert state.submit(admission_request(kv=10, klass="batch")).action is Action.QUEUE
    decision = state.submit(admission_request(kv=10, klass="batch"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_FULL
    assert decision.retry_after_s == 1.0  # no drain measured yet: the floor
    assert decision.limit == "model_memory_quota:llm" and decision.queue_position == 5
    # other classes have their own caps
    assert state.submit(admission_request(kv=10, klass="normal")).action is Action.QUEUE


def test_queue_timeout_expires_waiting_requests() -> None:
    state, clock = admission_state()
    state.submit(admission_request(kv=1000, klass="interactive"))
    inter = admission_request(kv=10, klass="interactive")
    normal = admission_request(kv=10, klass="normal")
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


def test_time_spent_before_the_sidecar_counts_against_the_class_wait() -> None:
    """nginx tells how long a request waited before the sidecar could judge it (a burst of
    connections queues in front of it): its deadline is that much sooner, and a request that has
    already spent its class's wait is refused at once instead of queued to miss its target."""
    state, clock = admission_state()
    state.submit(admission_request(kv=1000, klass="interactive"))
    late = replace(admission_request(kv=10, klass="interactive"), before_s=0.1)
    spent = replace(admission_request(kv=10, klass="interactive"), before_s=0.125)
    assert state.submit(late).action is Action.QUEUE
    refused = state.submit(spent)
    assert refused.action is Action.REJECT and refused.reason == QUEUE_WAIT
    assert "spent 125 ms reaching the sidecar" in refused.detail
    clock.advance(0.026)  # 0.1 s before + 0.026 s here: past interactive's 125 ms
    state.tick()
    assert [d.request_id for d in state.take_events().expired] == [late.id]


def test_drain_rate_and_retry_after() -> None:
    state, clock = admission_state()
    assert state.drain_rate("llm") is None
    for _ in range(4):
        r = admission_request(kv=10)
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
    busy = [admission_request(kv=10) for _ in range(2)]
    for r in busy:
        state.submit(r)
    assert state.drain_rate("llm") == pytest.approx(2 / 0.5)
    assert state.retry_after_s(state.expected_wait_s("llm", 6, clock())) == 2.0


def test_estimated_wait_beyond_the_class_limit_is_refused_early() -> None:
    state, clock = admission_state()
    for _ in range(3):  # slow drain: each request takes 1 s
        r = admission_request(kv=10)
        state.submit(r)
        clock.advance(1.0)
        state.release(r.id)
    state.submit(admission_request(kv=1000, klass="interactive"))
    # interactive may wait 125 ms; one request in flight for ~1 s: the wait for position 1 is ~1 s
    decision = state.submit(admission_request(kv=10, klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert decision.retry_after_s == 1.0 and "exceeds the 125 ms class 'interactive' may wait" in decision.detail
    # batch may wait 2.5 s, and the mean wait fits, but one departure at this drain takes longer
    # one time in four: below the top class a request waits only on a sure wait (WAIT_Z)
    batch = state.submit(admission_request(kv=10, klass="batch"))
    assert batch.action is Action.REJECT and batch.reason == QUEUE_WAIT
    assert "th percentile" in batch.detail and "exceeds the 2500 ms class 'batch' may wait" in batch.detail


def test_below_the_top_class_a_request_waits_only_if_it_surely_leaves_in_time() -> None:
    """A lower class queued on the mean wait waits its whole budget about half the time it is near
    the limit and is then refused late; queued on the wait's 98th percentile it is told at once."""
    state, clock = admission_state(classes=[dict(c, queue_cap=None) for c in policy_doc()["classes"]])
    for _ in range(40):  # each request takes 0.1 s
        rs = [admission_request(kv=10) for _ in range(4)]
        for r in rs:
            assert state.submit(r).admitted
        clock.advance(0.1)
        for r in rs:
            state.release(r.id)
    while True:  # fill the engine's limits: from here on a request waits
        r = admission_request(kv=10)
        if not state.submit(r).admitted:
            state.cancel(r.id)
            break
    rate = state.drain_rate("llm")
    allowed = state.allowed_wait_s("llm", state.class_policy("normal"))
    assert rate and rate * allowed > 20  # room for a queue of tens on the mean
    queued = 0
    while (decision := state.submit(admission_request(kv=10))).action is Action.QUEUE:
        queued += 1
    assert decision.reason == QUEUE_WAIT and "th percentile" in decision.detail
    n = queued + 1
    assert (queued + 2 * queued ** 0.5) / rate <= allowed < (n + 2 * n ** 0.5) / rate
    assert n / rate < allowed  # on the mean alone it would have waited

def test_wait_is_bounded_by_the_target_minus_upstream_latency() -> None:
    state, clock = admission_state()
    inter = state.class_policy("interactive")
    assert state.allowed_wait_s("llm", inter) == 0.125  # no samples yet: the class's longest wait
    for _ in range(5):  # first responses come 200 ms after admission
        r = admission_request(kv=10, klass="interactive")
        state.submit(r)
        clock.advance(0.2)
        state.end_prefill(r.id)
        state.release(r.id)
    assert state.upstream_latency_s("llm") == pytest.approx(0.2)
    assert state.allowed_wait_s("llm", inter) == pytest.approx(0.05)  # 250 ms target - 200 ms upstream
    assert state.allowed_wait_s("llm", state.class_policy("normal")) == 0.5  # 1000 - 200 > 500
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    decision = state.submit(admission_request(kv=10, klass="interactive"))  # ~200 ms until the blocker ends
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert "exceeds the 50 ms class 'interactive' may wait" in decision.detail
    for _ in range(5):  # the upstream got slower than the whole target
        r = admission_request(model="cls", klass="interactive")
        state.submit(r)
        clock.advance(0.3)
        state.release(r.id)  # unary: admission -> end
    assert state.upstream_latency_s("cls") == pytest.approx(0.3)
    assert state.allowed_wait_s("cls", inter) == 0.0
    held = [admission_request(model="cls", klass="interactive") for _ in range(5)]
    for r in held:
        state.submit(r)
    decision = state.submit(admission_request(model="cls", klass="interactive"))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert "leaves no time to wait: upstream alone takes 300 ms" in decision.detail


def test_cancel_waiting_and_after_grant() -> None:
    state, _ = admission_state()
    blocker = admission_request(kv=1000, klass="interactive")
    state.submit(blocker)
    waiting = admission_request(kv=10, klass="interactive")
    state.submit(waiting)
    assert state.cancel(waiting.id) is True and state.waiting == 0
    assert state.cancel(waiting.id) is False
    other = admission_request(kv=10, klass="interactive")
    state.submit(other)
    state.release(blocker.id)  # grants `other`
    assert state.cancel(other.id) is False  # it holds a reservation now: the owner must release it
    assert state.release(other.id) is True and state.reserved_bytes == 0
