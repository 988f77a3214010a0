"""Admission that never costs goodput (issue 15): each request's own footprint against the engine's
pool, refusals only for what can never run or would wait past its class's budget, classic models
bounded by what Triton itself accepts, the lower classes' share that keeps the top class's first
tokens in time, and policies under which nothing could ever be admitted refused up front."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_limits import LowerShare
from sidecar.admission_types import EXCEEDS_BUDGET, EXCEEDS_CONTEXT, QUEUE_TIMEOUT, QUEUE_WAIT, Action, Request
from sidecar.cost import LLMFacts, cost_for
from tests.sidecar_rigs import FakeClock, policy_doc
from tritongen.core.admission_tuning import SHARE_MIN
from tritongen.core.sidecar_policy.schema import PolicyError, parse_policy
from tritongen.core.sidecar_policy.tuning import LowerSharePolicy

_ids = iter(range(1, 10**9))


def engine_doc(kv_policy: str | None = "reserve_kill", pool_tokens: int = 100, **over: Any) -> dict[str, Any]:
    """One LLM with a pool of `pool_tokens` tokens (10 bytes each, blocks of 1) and 48 sequences."""
    doc = policy_doc(**over)
    doc["concurrency"].update(min=16, max=48)
    llm = doc["models"][0]
    llm["kv"].update(kv_policy=kv_policy, engine_pool_bytes=pool_tokens * 10)
    llm["memory_quota_bytes"] = pool_tokens * 10 if kv_policy != "grow_preempt" else None
    llm["max_inflight"] = 48
    for klass in doc["classes"]:
        klass["queue_cap"] = None
    return doc


def llm_request(state: AdmissionState, prompt_bytes: int, max_tokens: int | None, klass: str = "interactive") -> Request:
    model = state.model_policy("llm")
    cost = cost_for(model, LLMFacts(prompt_bytes=[prompt_bytes], max_tokens=[max_tokens]))
    return Request(next(_ids), "llm", klass, cost)


# -- each request's own footprint ------------------------------------------------------------------


def test_requests_are_charged_their_own_length_not_max_context() -> None:
    # pool 100 tokens, max_context 100: 5 requests of 10 + 10 tokens fit where max_context sizing fits 1
    state = AdmissionState(parse_policy(engine_doc()), FakeClock())
    decisions = [state.submit(llm_request(state, 10, 10)) for _ in range(5)]
    assert all(d.admitted for d in decisions)
    assert state.reserved_of("llm") == 5 * 20 * 10
    sixth = state.submit(llm_request(state, 10, 10))
    assert sixth.action is Action.QUEUE and sixth.limit == "model_memory_quota:llm"


def test_more_output_than_the_context_holds_is_refused_at_once_never_queued() -> None:
    state = AdmissionState(parse_policy(engine_doc()), FakeClock())
    decision = state.submit(llm_request(state, 10, 100_000))
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_CONTEXT
    assert "max_tokens 100000" in decision.detail and state.waiting == 0 and state.inflight == 0


def test_a_footprint_beyond_one_engines_pool_is_refused_at_once() -> None:
    doc = engine_doc(pool_tokens=50)
    doc["models"][0]["engines"] = 2
    doc["models"][0]["memory_quota_bytes"] = 2 * 50 * 10  # two engines' pools; one sequence still needs one
    state = AdmissionState(parse_policy(doc), FakeClock())
    decision = state.submit(llm_request(state, 30, 40))  # 70 tokens > 50 per engine
    assert decision.action is Action.REJECT and decision.reason == EXCEEDS_BUDGET
    assert decision.limit == "engine_pool:llm"


def test_grow_and_preempt_engines_get_no_reservation() -> None:
    """vLLM never kills: the sidecar reserves nothing and admits by its sequence limit alone."""
    state = AdmissionState(parse_policy(engine_doc("grow_preempt", pool_tokens=100)), FakeClock())
    decisions = [state.submit(llm_request(state, 40, 40)) for _ in range(10)]  # 10 x 80 tokens > the pool
    assert all(d.admitted for d in decisions)
    assert state.reserved_of("llm") == 0


def test_no_count_cap_a_class_waits_until_its_predicted_wait_is_too_long() -> None:
    clock = FakeClock()
    state = AdmissionState(parse_policy(engine_doc(pool_tokens=30)), clock)  # one of 20 tokens fits
    first = llm_request(state, 10, 10, "batch")
    assert state.submit(first).admitted
    queued = [state.submit(llm_request(state, 10, 10, "batch")) for _ in range(30)]
    assert all(d.action is Action.QUEUE for d in queued), "no drain measured yet: nothing to refuse on"
    clock.advance(0.5)
    state.release(first.id)  # one finished after 0.5 s: a drain rate of about 2 per second
    state.take_events()
    late = state.submit(llm_request(state, 10, 10, "batch"))
    assert late.action is Action.REJECT and late.reason == QUEUE_WAIT  # ~30 ahead at 2/s > 2.5 s budget
    assert late.retry_after_s is not None and late.retry_after_s >= 10


# -- classic models ----------------------------------------------------------------------------------


def test_classic_models_without_a_bound_never_wait_in_the_sidecar() -> None:
    doc = policy_doc()
    doc["models"][1]["max_inflight"] = None
    state = AdmissionState(parse_policy(doc), FakeClock())
    decisions = [state.submit(Request(next(_ids), "cls", "batch", cost_for(state.model_policy("cls"), None)))
                 for _ in range(500)]
    assert all(d.admitted for d in decisions) and state.inflight == 500


# -- the lower classes' share --------------------------------------------------------------------------


def test_lower_share_shrinks_while_the_top_class_is_late_and_grows_back() -> None:
    share = LowerShare(LowerSharePolicy())
    for t in range(5):
        share.observe(t * 0.1, 0.22)  # 220 ms first tokens against a 250 ms target: over 80 %
    assert share.update(1.0, 0.25) == "down" and share.value == pytest.approx(0.7)
    assert share.update(1.2, 0.25) == "hold"  # one move per step
    for step in range(2, 12):
        share.observe(step * 0.5 + 0.4, 0.22)  # still late
        share.update(step * 0.5 + 0.5, 0.25)
    assert share.value == SHARE_MIN == 0.5  # never below the floor
    for t in range(60):
        share.update(10 + t * 0.5, 0.25)  # the samples age out: a quiet top class
    assert share.value == 1.0


def test_lower_classes_fill_less_of_the_pool_while_the_top_class_is_late() -> None:
    clock = FakeClock()
    state = AdmissionState(parse_policy(engine_doc(pool_tokens=100)), clock)
    for _ in range(5):  # interactive first tokens 220 ms after arrival: late against 250 ms
        r = llm_request(state, 5, 5)
        state.submit(r)
        clock.advance(0.22)
        state.end_prefill(r.id)
        state.release(r.id)
    clock.advance(0.6)
    state.tick()
    assert state.lower_share("llm") == pytest.approx(0.7)
    assert state.status()["models"]["llm"]["lower_class_share"] == pytest.approx(0.7)  # type: ignore[index]
    # batch may now fill 0.8 x 0.7 = 56 % of the pool: two of 25 tokens, not three
    admitted = [state.submit(llm_request(state, 15, 10, "batch")).action for _ in range(3)]
    assert admitted[:2] == [Action.ADMIT, Action.ADMIT] and admitted[2] is Action.QUEUE
    assert state.submit(llm_request(state, 15, 10, "interactive")).admitted  # the top class keeps its room


def test_a_top_class_refused_for_room_counts_as_late_for_the_share() -> None:
    """Lower classes holding the whole pool leave the top class no first token to be late with: it is
    refused at arrival. Those refusals must move the share, or it never steps down."""
    clock = FakeClock()
    # a pool of 50 tokens, of which the batch class may fill 80 %: two batch requests of 20, and the
    # 10 left cannot hold an interactive one
    state = AdmissionState(parse_policy(engine_doc(pool_tokens=50)), clock)
    held = [llm_request(state, 10, 10, "batch") for _ in range(2)]
    assert all(state.submit(r).admitted for r in held)
    clock.advance(0.5)
    state.release(held[0].id)  # a drain of about 2 per second
    state.take_events()
    assert state.submit(llm_request(state, 10, 10, "batch")).admitted  # the batch class takes the room again
    refusals = []
    for _ in range(10):  # interactive arrivals, each at least half a second from room, past its budget
        decision = state.submit(llm_request(state, 10, 10, "interactive"))
        refusals.append(decision.action is Action.REJECT and decision.reason == QUEUE_WAIT)
        clock.advance(0.01)
    assert all(refusals), "the rig must refuse the top class for room"
    clock.advance(0.6)
    state.tick()
    assert state.lower_share("llm") < 1.0


# -- policies nothing could pass -----------------------------------------------------------------------


def test_a_safety_pad_larger_than_the_device_is_refused() -> None:
    doc = policy_doc()
    doc["headroom"]["safety_pad_bytes"] = 200_000
    with pytest.raises(PolicyError, match=r"headroom.safety_pad_bytes 200000 .* no request could ever be admitted"):
        parse_policy(doc)


def test_a_negative_static_headroom_is_refused_naming_the_fields() -> None:
    doc = policy_doc()
    doc["devices"][0]["static_used_bytes"] = 95_000
    doc["headroom"]["safety_pad_bytes"] = 10_000
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    message = str(err.value)
    assert "devices[0] ('gpu0')" in message and "static_used_bytes" in message and "kv_safety_pad_mb" in message


def test_a_kv_quota_below_one_block_is_refused() -> None:
    doc = copy.deepcopy(engine_doc())
    doc["models"][0]["memory_quota_bytes"] = 5  # one token costs 10 bytes
    with pytest.raises(PolicyError, match="below one KV block"):
        parse_policy(doc)


def test_a_waiting_request_is_refused_only_at_its_deadline_however_bad_its_prediction() -> None:
    """Issue 31: a refusal comes at arrival, or late only at the class's deadline. A request the
    estimate says cannot make it keeps its place: the estimate can be wrong, and room that comes
    before the deadline serves it."""
    clock = FakeClock()
    doc = engine_doc(pool_tokens=30)  # one of 20 tokens at a time
    for klass in doc["classes"]:
        if klass["name"] == "batch":  # batch may wait 10 s: places 1 and 2 are 1 s and 2 s on the mean, sure
            klass.update(max_queue_wait_ms=10_000, p99_ms=20_000)  # (WAIT_Z) within 3 s and 4.8 s
    state = AdmissionState(parse_policy(doc), clock)
    first = llm_request(state, 10, 10, "batch")
    assert state.submit(first).admitted
    clock.advance(1.0)
    state.release(first.id)  # a service time of 1 s: one request a second drains
    state.take_events()
    running = llm_request(state, 10, 10, "batch")
    assert state.submit(running).admitted
    queued = [llm_request(state, 10, 10, "batch") for _ in range(2)]
    assert all(state.submit(r).action is Action.QUEUE for r in queued)
    clock.advance(9.1)  # nothing finished; 0.9 s left, and the second in line is predicted at 2 s
    state.tick()
    assert state.take_events().expired == [] and state.waiting == 2
    state.release(running.id)  # room came sooner than predicted: the first in line is served
    assert [d.request_id for d in state.take_events().granted] == [queued[0].id]
    clock.advance(0.95)  # past the deadline: now, and only now, the other is refused
    state.tick()
    expired = state.take_events().expired
    assert [d.request_id for d in expired] == [queued[1].id] and expired[0].reason == QUEUE_TIMEOUT
    assert state.waiting == 0


def test_the_wait_a_lower_class_is_told_counts_the_urgent_requests_that_will_pass_it() -> None:
    """At 10 completions a second with 8 interactive arrivals a second, a batch request 5th in line
    leaves after 5 / (10 - 8) = 2.5 s: interactive requests always pass it. With 10 interactive a
    second nothing is left for it: it would wait for ever."""
    clock = FakeClock()
    state = AdmissionState(parse_policy(engine_doc(pool_tokens=1000)), clock)
    state.estimates.service_s["llm"] = 1.0  # a measured service time of 1 s ...
    state.ledger.inflight_by_model["llm"] = 10  # ... with 10 in flight: 10 drain a second
    for i in range(40):  # 8 interactive a second over 5 s
        state.estimates.note_arrival("llm", 1, i * 0.125)
    clock.t = 5.0
    assert state.expected_wait_s("llm", 5, 5.0) == pytest.approx(0.5)  # no class: position / drain
    assert state.expected_wait_s("llm", 5, 5.0, priority=1) == pytest.approx(0.5)  # nobody passes the top
    assert state.expected_wait_s("llm", 5, 5.0, priority=3) == pytest.approx(5 / (10 - 8), rel=0.05)
    for i in range(10):
        state.estimates.note_arrival("llm", 1, 4.0 + i * 0.1)  # now 10 a second
    assert state.expected_wait_s("llm", 5, 5.0, priority=3) == math.inf


# -- the in-flight limit of an engine that queues (sidecar/engine_concurrency.py) ----------------------


def test_a_queueing_engine_takes_its_whole_limit_in_every_class_and_reserving_engines_have_no_law() -> None:
    # An engine that queues has no room to keep for the top class: batch requests fill all 48 slots and
    # one more, to take the next free slot at once (the class's budget fraction is for rooms the
    # engine cannot give back, its pool).
    state = AdmissionState(parse_policy(engine_doc("grow_preempt", pool_tokens=10_000)), FakeClock())
    assert state.engine_limit("llm") is not None and state.engine_limit("llm").limit == 49
    admitted = [state.submit(llm_request(state, 10, 10, "batch")).admitted for _ in range(50)]
    assert admitted.count(True) == 49
    kill = AdmissionState(parse_policy(engine_doc("reserve_kill", pool_tokens=10_000)), FakeClock())
    assert kill.engine_limit("llm") is None


def test_the_queueing_engines_limit_grows_while_requests_wait_and_the_engine_starts_them_at_once() -> None:
    clock = FakeClock()
    doc = engine_doc("grow_preempt", pool_tokens=10_000)
    doc["models"][0]["max_inflight"] = 4  # a policy that says far less than the engine runs
    state = AdmissionState(parse_policy(doc), clock)
    waiting: dict[object, Request] = {}
    for _ in range(12):  # one second each: what runs finishes, first token 10 ms after admission, 10 ms gaps
        for _ in range(state.engine_limit("llm").limit + 2 - len(waiting)):
            request = llm_request(state, 10, 10)
            if state.submit(request).action is Action.QUEUE:
                waiting[request.id] = request
        started = list(state.ledger.reservations.values())
        clock.advance(0.01)
        for r in started:
            state.end_prefill(r.request.id)
        clock.advance(0.09)
        for r in started:
            state.release(r.request.id, tokens=20, responses=10)
        for granted in state.take_events().granted:
            waiting.pop(granted.request_id, None)
        state.tick()
        clock.advance(0.91)  # a tick a little over the law's interval apart
    law = state.engine_limit("llm")
    assert law.limit > 8, law.last
    assert state.status()["models"]["llm"]["engine_limit"]["limit"] == law.limit
