"""The admission and lane knobs (issue 33): their defaults are the constants they replaced, a policy
that names none of them behaves as before, each one moves what it says, and a bad value is refused
naming its field. Also tune's live-verification thresholds, now in the core."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from sidecar.accounting import Accounting
from sidecar.admission import AdmissionState
from sidecar.admission_limits import LowerShare
from sidecar.admission_types import QUEUE_WAIT, Action, Cost, Request
from sidecar.lane import LaneCounts
from sidecar.lane_control import LaneControl
from sidecar.metrics import SidecarMetrics
from tests.sidecar_rigs import FakeClock, policy_doc
from tritongen.core import admission_tuning, lane_tuning
from tritongen.core.live_verdict import capacity_rank, keeps_up, live_verdict, throughput_rank
from tritongen.core.sidecar_policy.schema import PolicyError, parse_policy
from tritongen.core.sidecar_policy.tuning import AdmissionPolicy, LanePolicy, LowerSharePolicy


def refused(doc: dict[str, Any]) -> str:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc, "p.json")
    return str(err.value)


# -- defaults -----------------------------------------------------------------------------------------

def test_the_defaults_are_the_constants_they_replaced() -> None:
    policy = parse_policy(policy_doc())  # names neither section
    assert policy.admission == AdmissionPolicy() and policy.lane == LanePolicy()
    admission, share, lane = policy.admission, policy.admission.lower_share, policy.lane
    # the literals that were in sidecar/admission.py, sidecar/lane.py and sidecar/lane_control.py
    assert (admission.wait_z, admission.latency_quantile) == (2.0, 0.9)
    assert (share.min, share.high, share.low) == (0.5, 0.8, 0.5)
    assert (lane.spare_min, lane.spare_fraction, lane.idle_after_s) == (4, 0.5, 10.0)
    assert (lane.sync_busy_ms, lane.sync_idle_ms) == (20.0, 100.0)
    assert admission.wait_z == admission_tuning.WAIT_Z and share.min == admission_tuning.SHARE_MIN
    assert lane.spare_min == lane_tuning.SPARE_MIN and lane.sync_busy_ms == lane_tuning.SYNC_BUSY_MS


def test_every_constant_says_where_its_value_comes_from() -> None:
    """Each constant of the tuning modules has a docstring (ast: the string after the assignment)."""
    import ast
    import inspect

    for module in (admission_tuning, lane_tuning):
        body = ast.parse(inspect.getsource(module)).body
        for node, after in zip(body, [*body[1:], None]):
            if not isinstance(node, ast.Assign):
                continue
            name = ast.unparse(node.targets[0])
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            assert isinstance(doc, str) and len(doc) > 40, f"{module.__name__}.{name} has no docstring"
            assert any(word in doc for word in ("standard", "definition", "judgement", "measured", "one run", "memory bound")), name


# -- refused, naming the field ---------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "value", "message"), [
    ("admission", {"wait_z": -1}, "admission.wait_z: Input should be greater than or equal to 0"),
    ("admission", {"wait_z": "high"}, "admission.wait_z: Input should be a valid number"),
    ("admission", {"latency_quantile": 1.0}, "admission.latency_quantile: Input should be less than 1"),
    ("admission", {"latency_quantile": 0.2},
     "admission.latency_quantile: Input should be greater than or equal to 0.5"),
    ("admission", {"lower_share": {"min": 0}}, "admission.lower_share.min: Input should be greater than 0"),
    ("admission", {"lower_share": {"min": 1.5}}, "admission.lower_share.min: Input should be less than or equal to 1"),
    ("admission", {"lower_share": {"low": 0.9}},
     "admission.lower_share: admission.lower_share.low 0.9 must be below admission.lower_share.high 0.8"),
    ("admission", {"wait": 2}, "admission.wait: unknown key"),
    ("lane", {"spare_min": -1}, "lane.spare_min: Input should be greater than or equal to 0"),
    ("lane", {"spare_min": 2.5}, "lane.spare_min: Input should be a valid integer"),
    ("lane", {"idle_after_s": 0}, "lane.idle_after_s: Input should be greater than 0"),
    ("lane", {"sync_busy_ms": 200}, "lane: lane.sync_busy_ms 200 is above lane.sync_idle_ms 100"),
])
def test_bad_values_are_refused_naming_the_field(section: str, value: dict[str, Any], message: str) -> None:
    assert message in refused(policy_doc(**{section: value}))


# -- each knob moves what it says ------------------------------------------------------------------------

def _one_slot_llm(**over: Any) -> tuple[AdmissionState, FakeClock]:
    """The LLM takes one request at a time, and one finished after 1 s: it drains one a second."""
    doc = policy_doc(**over)
    doc["models"][0]["max_inflight"] = 1
    clock = FakeClock()
    state = AdmissionState(parse_policy(doc), clock)
    first = Request("first", "llm", "batch", Cost(kv_bytes=10))
    assert state.submit(first).admitted
    clock.advance(1.0)
    state.release(first.id)
    assert state.submit(Request("running", "llm", "batch", Cost(kv_bytes=10))).admitted
    return state, clock


def test_wait_z_is_how_sure_a_lower_class_wait_must_be() -> None:
    """First in line behind one running request: 1 s on the mean, 1 + 2 sqrt(1) = 3 s at z = 2,
    against the 2.5 s a batch request may wait."""
    state, _ = _one_slot_llm()
    decision = state.submit(Request("next", "llm", "batch", Cost(kv_bytes=10)))
    assert decision.action is Action.REJECT and decision.reason == QUEUE_WAIT
    assert "at its 98th percentile" in decision.detail
    on_the_mean, _ = _one_slot_llm(admission={"wait_z": 0})
    assert on_the_mean.submit(Request("next", "llm", "batch", Cost(kv_bytes=10))).action is Action.QUEUE


def test_latency_quantile_is_the_upstream_time_taken_off_the_target() -> None:
    def allowed(**over: Any) -> float:
        state = AdmissionState(parse_policy(policy_doc(**over)), FakeClock())
        for ms in range(100, 1100, 100):  # ten first tokens, 0.1 s to 1.0 s
            state.estimates.observe_upstream("llm", ms / 1000)
        return state.allowed_wait_s("llm", state.class_policy("normal"))  # target 1 s, may wait 0.5 s

    assert allowed() == pytest.approx(0.0)  # P90: 1.0 s of the 1 s target is upstream
    assert allowed(admission={"latency_quantile": 0.5}) == pytest.approx(0.4)  # P50: 0.6 s


def test_the_lower_classes_floor_is_the_policys() -> None:
    def floor(**over: Any) -> float:
        clock = FakeClock()
        state = AdmissionState(parse_policy(policy_doc(**over)), clock)
        ids = iter(range(10**6))
        for _ in range(8):  # the top class's first tokens come at 220 ms of its 250 ms target
            batch = [Request(next(ids), "llm", "interactive", Cost(kv_bytes=10)) for _ in range(3)]
            assert all(state.submit(r).admitted for r in batch)
            clock.advance(0.22)
            for r in batch:
                state.end_prefill(r.id)
                state.release(r.id)
            clock.advance(0.3)
            state.tick()
        return state.lower_share("llm")

    assert floor() == admission_tuning.SHARE_MIN == 0.5
    assert floor(admission={"lower_share": {"min": 0.8}}) == 0.8


def test_a_reload_hands_the_new_share_settings_to_the_models_already_judged() -> None:
    share = LowerShare(LowerSharePolicy(min=0.9))
    for t in range(5):
        share.observe(t * 0.1, 0.22)
    assert share.update(1.0, 0.25) == "down" and share.value == 0.9
    share.cfg = LowerSharePolicy(min=0.5)
    share.observe(1.4, 0.22)
    assert share.update(1.6, 0.25) == "down" and share.value == pytest.approx(0.63)


@dataclass
class _Front:
    counts: dict[tuple[str, str], LaneCounts]

    async def exchange(self, caps: Any) -> dict[tuple[str, str], LaneCounts]:
        return dict(self.counts)


def test_the_lanes_spare_slots_are_the_policys() -> None:
    def slots(**over: Any) -> int:
        doc = policy_doc(**over)
        doc["models"][1]["max_inflight"] = 100
        clock = FakeClock()
        state = AdmissionState(parse_policy(doc), clock)
        front = _Front({("cls", "normal"): LaneCounts(inflight=10, peak=10)})
        lane = LaneControl(front, state, Accounting(state, SidecarMetrics()), lambda: True, lambda: None, clock=clock)
        clock.advance(0.02)
        return asyncio.run(lane.sync())[("cls", "normal")]

    assert slots() == 10 + 5  # half the demand (more than 4)
    assert slots(lane={"spare_min": 2, "spare_fraction": 0.0}) == 10 + 2


# -- tune --verify's thresholds ---------------------------------------------------------------------------

@dataclass
class _Measured:
    name: str
    sent: int
    completed: int
    p99_ms: float | None
    ttft_p99_ms: float | None = None


@dataclass
class _Target:
    name: str
    p99_ms: float


def test_the_live_verdict_and_its_thresholds() -> None:
    targets = [_Target("interactive", 100.0), _Target("batch", 1000.0)]
    ok, worst, lost = live_verdict([_Measured("interactive", 100, 100, 80.0), _Measured("batch", 50, 50, 1200.0)],
                                   targets, 0.01, streaming=False)
    assert (ok, worst, lost) == (False, 1.2, 0.0)
    ok, worst, lost = live_verdict([_Measured("interactive", 100, 98, 300.0, ttft_p99_ms=90.0)], targets, 0.01,
                                   streaming=True)
    assert (ok, worst, lost) == (False, 0.9, 0.02)  # in time, but 2 % lost
    assert keeps_up(95.0, 100.0) and not keeps_up(94.9, 100.0)  # 95 % of the offered rate
    assert capacity_rank(1.50) == capacity_rank(1.52) < capacity_rank(1.45)  # within 3 %: equal
    assert throughput_rank(101.0, 100.0) == throughput_rank(100.5, 100.0) < throughput_rank(99.0, 100.0)  # 2 % steps
