"""The native front's fast lane: which models it carries, its slots as reservations in the admission
state, and the control plane's sync against a fake nginx (its counts are what the test says)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import Action, Cost, Request
from sidecar.lane import LaneCounts, caps_body, demand, lane_keys, parse_counts, spare_slots, target_slots
from sidecar.accounting import Accounting
from sidecar.lane_control import LaneControl
from sidecar.metrics import LATENCY_BUCKETS, SidecarMetrics, add_observations
from sidecar.nginx_front import FrontAddresses, NginxInstall, render_config
from tests.sidecar_rigs import FakeClock, policy_doc
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.core.sidecar_policy.tuning import LanePolicy


def state_of(**over: Any) -> tuple[AdmissionState, FakeClock]:
    clock = FakeClock()
    return AdmissionState(parse_policy(policy_doc(**over)), clock), clock


def classic(name: str, **over: Any) -> dict[str, Any]:
    return {"name": name, "kind": "classic", "devices": ["gpu0"], "request_bytes": 100, **over}


# -- which models ----------------------------------------------------------------------------------

def test_lane_carries_classic_models_in_the_classes_that_need_no_priority_written() -> None:
    doc = policy_doc()
    doc["models"] += [
        classic("only_batch", classes=["batch"]),
        classic("levels", priority_levels=3, default_priority=2),  # only "normal" is at level 2
    ]
    keys = lane_keys(parse_policy(doc))
    assert sorted(keys) == [("cls", "batch"), ("cls", "interactive"), ("cls", "normal"), ("levels", "normal"),
                            ("only_batch", "batch")]  # never the LLM


# -- the arithmetic --------------------------------------------------------------------------------

def test_targets_grow_with_demand_shrink_to_in_flight_when_something_waits_and_close_when_down() -> None:
    lane = LanePolicy()  # the defaults: at least 4 spare, or half the demand
    assert spare_slots(0, lane) == 4 and spare_slots(40, lane) == 20
    assert target_slots(inflight=3, wanted=10, may_grow=True, upstream_up=True, cfg=lane) == 15
    assert target_slots(inflight=3, wanted=10, may_grow=False, upstream_up=True, cfg=lane) == 3
    assert target_slots(inflight=3, wanted=10, may_grow=True, upstream_up=False, cfg=lane) == 0
    wider = LanePolicy(spare_min=1, spare_fraction=1.0)  # the policy's `lane` moves them
    assert spare_slots(0, wider) == 1 and spare_slots(40, wider) == 40
    # a closed loop read between a completion and its next send reads low; its peak and overflow do not
    assert demand(LaneCounts(inflight=10, peak=16), overflow_since=0) == 16
    assert demand(LaneCounts(inflight=10, peak=12), overflow_since=5) == 17


def test_control_text_round_trips_and_ignores_what_it_cannot_read() -> None:
    assert caps_body({("b", "normal"): 2, ("a", "batch"): 7}) == "a\tbatch\t7\nb\tnormal\t2\n"
    counts = parse_counts("a\tnormal\t3\t100\t0.5\t2\t9\t90,10,0\t500=4,down=1,499=2\nbroken line\n"
                          "b\tnormal\tx\t1\t1\t1\t1\t1\t\nc\tnormal\t1\t1\t1\t1\t1\t1\n"
                          "d\tnormal\t1\t1\t1\t1\t1\t1\tgone=1\ne\tnormal\t0\t1\t0.1\t0\t0\t\t\n\n")
    assert counts == {("a", "normal"): LaneCounts(inflight=3, done=100, seconds=0.5, overflow=2, peak=9,
                                                  buckets=(90, 10, 0), ends=(("499", 2), ("500", 4), ("down", 1))),
                      ("e", "normal"): LaneCounts(done=1, seconds=0.1)}


def test_lane_requests_reach_every_counter_the_python_path_fills() -> None:
    """One accounting (sidecar/accounting.py): sidecar_requests_finished_total by the outcome its one
    classification names from the statuses nginx tallied apart, sidecar_requests_admitted_total,
    and (issue 45: the lane skipped them) the tenant's admissions and the queue wait, since the
    previous reading."""
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(done=5, seconds=0.04, ends=(("500", 1),))}
    sync(lane, clock)
    front.counts = {N: LaneCounts(done=9, seconds=0.1, ends=(("404", 1), ("499", 1), ("500", 1), ("down", 2)))}
    sync(lane, clock)
    text = lane.metrics.exposition().decode()

    def sample(series: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " "))

    finished = 'sidecar_requests_finished_total{class="normal",model="cls",outcome="%s"}'
    assert sample(finished % "ok") == 4
    assert sample(finished % "upstream_error") == 2  # the 500 of the first reading, the 404 of the second
    assert sample(finished % "upstream_failed") == 2
    assert sample(finished % "client_disconnect") == 1
    assert sample('sidecar_requests_admitted_total{class="normal",model="cls"}') == 9
    assert sample('sidecar_tenant_requests_admitted_total{tenant="default"}') == 9
    assert sample('sidecar_queue_wait_seconds_count{class="normal"}') == 9
    assert sample('sidecar_queue_wait_seconds_bucket{class="normal",le="0.0005"}') == 9  # a free slot waits nothing
    assert sample('sidecar_lane_requests_total{class="normal",model="cls"}') == 9


def test_lane_requests_reach_the_latency_histogram_the_python_path_fills() -> None:
    """The P99 panel reads sidecar_request_duration_seconds: nginx's per-bucket counts land there,
    added since the previous reading, next to what the Python path observed."""
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    lane, front, _ = control(state, clock, [True])
    empty = (0,) * (len(LATENCY_BUCKETS) + 1)
    first = (0, 0, 0, 5) + empty[4:]  # 5 requests in the 4th bucket (5-10 ms)
    front.counts = {N: LaneCounts(done=5, seconds=0.04, buckets=first)}
    sync(lane, clock)
    front.counts = {N: LaneCounts(done=7, seconds=0.1, buckets=(0, 0, 0, 5, 0, 0, 2) + empty[7:])}
    sync(lane, clock)
    lane.metrics.latency.labels("normal", "cls").observe(0.3)  # one the Python path carried
    text = lane.metrics.exposition().decode()

    def sample(series: str) -> float:
        return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith(f"sidecar_request_duration_seconds{series} "))

    assert sample('_count{class="normal",model="cls"}') == 8
    assert sample('_bucket{class="normal",le="0.01",model="cls"}') == 5  # cumulative: the first five
    assert sample('_bucket{class="normal",le="0.25",model="cls"}') == 7
    assert abs(sample('_sum{class="normal",model="cls"}') - 0.4) < 1e-9


def test_observations_added_to_a_histogram_match_its_buckets() -> None:
    metrics = SidecarMetrics()
    child = metrics.latency.labels("normal", "m")
    with pytest.raises(ValueError, match="bucket counts"):
        add_observations(child, [1, 2], 0.1)


# -- slots are reservations ------------------------------------------------------------------------

def test_slots_fill_the_models_quota_at_the_default_classes_share_and_count_nothing_as_served() -> None:
    state, _ = state_of()  # cls: max_inflight 5; the default class "normal" may fill 0.9 of it: 4
    taken = [slot for slot in range(10) if state.take_lane_slot(("lane", slot), "cls", "normal")]
    assert len(taken) == 4
    assert state.inflight_of("cls") == 4 and state.reserved_scope("gpu0") == 400
    assert not state.take_lane_slot(("lane", 99), "llm", "normal")  # never an LLM
    for slot in taken:
        assert state.return_lane_slot(("lane", slot))
    assert state.inflight_of("cls") == 0 and state.reserved_scope("gpu0") == 0
    assert state.drain_rate("cls") is None  # a returned slot is not a finished request
    assert not state.return_lane_slot(("lane", 0))


def test_a_request_waiting_in_python_stops_the_lane_and_gets_the_first_returned_slot() -> None:
    state, clock = state_of()
    for slot in range(4):
        assert state.take_lane_slot(("lane", slot), "cls", "normal")
    decision = state.submit(Request("python-1", "cls", "normal", Cost(request_bytes=100)))
    assert decision.action is Action.QUEUE
    assert not state.lane_may_grow("cls")
    assert not state.take_lane_slot(("lane", 9), "cls", "normal")
    clock.advance(0.01)
    state.return_lane_slot(("lane", 0))
    granted = state.take_events().granted
    assert [g.request_id for g in granted] == ["python-1"]
    assert state.lane_may_grow("cls")


def test_finished_lane_requests_feed_the_drain_rate_and_service_time() -> None:
    state, clock = state_of()
    for _ in range(40):  # 400 a second, reported every 50 ms as the sync does
        clock.advance(0.05)
        state.lane_finished("cls", 20, 20 * 0.004)
    rate = state.drain_rate("cls")
    assert rate is not None and 380 <= rate <= 420
    assert state.upstream_latency_s("cls") is None or abs(state.upstream_latency_s("cls") - 0.004) < 1e-9


# -- the control plane against a fake nginx --------------------------------------------------------

class FakeFront:
    """nginx's control socket as the test sets it: `counts` is what nginx says; pushed caps are kept."""

    def __init__(self) -> None:
        self.counts: dict[str, LaneCounts] = {}
        self.caps: dict[str, int] = {}
        self.pushes = 0

    async def exchange(self, caps: dict[str, int] | None) -> dict[str, LaneCounts]:
        if caps is not None:
            self.caps = dict(caps)
            self.pushes += 1
        return dict(self.counts)


def control(state: AdmissionState, clock: FakeClock, up: list[bool]) -> tuple[LaneControl, FakeFront, list[int]]:
    front = FakeFront()
    dispatched: list[int] = []
    lane = LaneControl(front, state, Accounting(state, SidecarMetrics()), lambda: up[0], lambda: dispatched.append(1),
                       clock=clock)
    return lane, front, dispatched


N = ("cls", "normal")
B = ("cls", "batch")
I = ("cls", "interactive")


def sync(lane: LaneControl, clock: FakeClock) -> dict[tuple[str, str], int]:
    clock.advance(0.02)
    return asyncio.run(lane.sync())


def test_an_idle_pair_holds_no_slot_and_grows_from_its_overflow() -> None:
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    lane, front, _ = control(state, clock, [True])
    assert sync(lane, clock) == {N: 0, B: 0, I: 0}  # every pair has a cap: nginx counts its overflow
    assert state.inflight_of("cls") == 0
    front.counts = {N: LaneCounts(overflow=3)}  # three plain requests went to Python for want of a slot
    assert sync(lane, clock) == {N: 7, B: 0, I: 0}  # their demand plus spare
    front.counts = {N: LaneCounts(inflight=7, done=50, seconds=0.2, overflow=3, peak=7)}
    assert sync(lane, clock)[N] == 11
    assert state.inflight_of("cls") == 11
    decision = state.submit(Request("py", "cls", "interactive", Cost(request_bytes=100)))
    assert decision.action is Action.ADMIT  # room under the quota: the Python path is not starved
    front.counts = {N: LaneCounts(inflight=0, done=57, seconds=0.23, overflow=3, peak=0)}
    clock.advance(10.0)
    assert sync(lane, clock)[N] == 0  # unused for the idle period: its spare goes back
    assert front.pushes == 4


def test_sync_shrinks_to_what_is_in_flight_while_a_request_waits() -> None:
    state, clock = state_of()  # cls quota 5: 4 for the default class
    lane, front, dispatched = control(state, clock, [True])
    front.counts = {N: LaneCounts(inflight=2, peak=2)}
    assert sync(lane, clock)[N] == 4
    assert state.submit(Request("py", "cls", "normal", Cost(request_bytes=100))).action is Action.QUEUE
    assert sync(lane, clock)[N] == 2  # new lane requests overflow and queue behind it
    assert dispatched  # the returned slots went to the waiting request
    assert [g.request_id for g in state.take_events().granted] == ["py"]


def test_a_python_request_with_no_room_takes_the_lanes_idle_slots_back() -> None:
    state, clock = state_of()
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(inflight=1, peak=1)}
    assert sync(lane, clock)[N] == 4  # the whole of normal's share of the quota of 5
    assert state.submit(Request("py", "cls", "normal", Cost(request_bytes=100))).action is Action.QUEUE
    assert lane.reclaim("cls")
    assert len(lane.slots[N]) == 1  # the one nginx had in flight stays
    assert [g.request_id for g in state.take_events().granted] == ["py"]
    assert lane.pushed is None  # the lower cap goes to nginx at the next sync, which is woken
    assert not lane.reclaim("cls")


def test_sync_closes_the_lane_while_triton_is_down_and_for_a_model_the_policy_drops() -> None:
    state, clock = state_of()
    up = [True]
    lane, front, _ = control(state, clock, up)
    front.counts = {N: LaneCounts(inflight=1, peak=1)}
    assert sync(lane, clock)[N] == 4
    up[0] = False
    assert sync(lane, clock) == {}
    assert front.caps == {} and state.inflight_of("cls") == 1  # the one in flight keeps its slot
    front.counts = {N: LaneCounts(inflight=0, done=1, seconds=0.01, peak=0)}
    sync(lane, clock)
    assert state.inflight_of("cls") == 0
    up[0] = True
    front.counts = {N: LaneCounts(inflight=1, done=1, seconds=0.01, peak=1)}
    assert sync(lane, clock)[N] == 4
    doc = policy_doc()
    doc["models"] = [m for m in doc["models"] if m["name"] != "cls"]
    state.apply_policy(parse_policy(doc))
    lane.policy_changed()
    assert sync(lane, clock) == {}
    assert state.inflight_of("cls") == 1  # nginx's one in flight; it goes back when it ends
    front.counts = {N: LaneCounts(inflight=0, done=2, seconds=0.02, peak=0)}
    sync(lane, clock)
    assert state.inflight_of("cls") == 0 and lane.status() == {}


def test_a_reloaded_policy_that_lowers_the_quota_takes_idle_slots_back() -> None:
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(inflight=2, peak=10)}
    assert sync(lane, clock)[N] == 15
    state.apply_policy(parse_policy(policy_doc(models=[classic("cls", max_inflight=3)])))
    assert sync(lane, clock)[N] == 2  # over the new quota: back to what nginx has in flight


def test_finished_lane_requests_are_counted_once_and_an_nginx_restart_starts_over() -> None:
    state, clock = state_of()
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(done=10, seconds=0.1)}
    sync(lane, clock)
    sync(lane, clock)
    front.counts = {N: LaneCounts(done=3, seconds=0.03)}  # nginx started again
    sync(lane, clock)
    text = lane.metrics.exposition().decode()
    assert 'sidecar_lane_requests_total{class="normal",model="cls"} 13.0' in text


# -- nginx's configuration -------------------------------------------------------------------------

def test_config_names_the_policys_headers_and_limits_and_keeps_the_private_ports_private(tmp_path: Path) -> None:
    doc = policy_doc(class_header="x-my-class", tenant_header="x-org", class_parameter="lane_class",
                     limits={"max_body_bytes": 2_000_000, "max_header_bytes": 8192})
    install = NginxInstall(Path("/usr/sbin/nginx"), (Path("/m/ndk.so"), Path("/m/lua.so")))
    at = FrontAddresses("127.0.0.1:9000", "127.0.0.1:8000", "127.0.0.1:40000", "127.0.0.1:9001", "127.0.0.1:8001",
                        "127.0.0.1:40001")
    text = render_config(install, tmp_path, at, parse_policy(doc))
    assert text == render_config(install, tmp_path, at, parse_policy(doc))  # pure: a reload compares it
    assert 'class_var = "http_x_my_class"' in text and 'tenant_var = "http_x_org"' in text
    assert 'class_parameter = "lane_class"' in text
    assert "client_max_body_size 2000000;" in text and "large_client_header_buffers 8 8192;" in text
    assert "listen 127.0.0.1:9000;" in text and "listen 127.0.0.1:9001 http2;" in text
    assert "load_module /m/lua.so;" in text and f"listen unix:{tmp_path}/control.sock;" in text
    no_grpc = render_config(install, tmp_path, FrontAddresses("127.0.0.1:9000", "127.0.0.1:8000", "127.0.0.1:1"),
                            parse_policy(doc))
    assert "grpc_pass" not in no_grpc


def test_a_queued_request_wakes_the_sync_only_while_the_lane_holds_slots() -> None:
    """An LLM's requests queue one by one under overload; a lane with no slot has nothing to give
    back or stop growing, so they neither wake the sync nor keep it at the busy cadence."""
    state, clock = state_of()
    lane, front, _ = control(state, clock, [True])
    assert sync(lane, clock)[N] == 0  # idle: no slots
    actions = [state.submit(Request(f"py{i}", "cls", "normal", Cost(request_bytes=100))).action for i in range(6)]
    assert actions[-1] is Action.QUEUE and state.waiting > 0  # the Python path filled the quota itself
    lane.queued()
    assert not lane._wake.is_set()
    sync(lane, clock)
    assert not lane.hot
    for i in range(6):  # the quota comes free and the lane carries requests again
        state.release(f"py{i}")
    state.take_events()
    front.counts = {N: LaneCounts(inflight=1, peak=1)}
    sync(lane, clock)
    assert lane.holds_slots()
    lane.queued()
    assert lane._wake.is_set()


def test_a_policy_with_nothing_for_the_lane_tells_nginx_once_and_then_leaves_it_alone() -> None:
    """LLMs only: the first sync pushes the empty caps, later ones ask nginx nothing (an exchange
    per period was the sidecar's largest idle cost); a policy that brings a classic model back
    syncs again."""
    state, clock = state_of(models=[m for m in policy_doc()["models"] if m["kind"] == "llm"])
    lane, front, _ = control(state, clock, [True])
    assert not lane.keys
    calls = []
    exchange = front.exchange

    async def counted(caps: dict[str, int] | None) -> dict[str, LaneCounts]:
        calls.append(caps)
        return await exchange(caps)

    front.exchange = counted  # type: ignore[method-assign]
    assert sync(lane, clock) == {} and front.pushes == 1
    for _ in range(3):
        assert sync(lane, clock) == {}
    assert len(calls) == 2 and not lane.hot  # the read and the push of the first sync, nothing since
    state.apply_policy(parse_policy(policy_doc(models=[classic("cls", max_inflight=40)])))
    lane.policy_changed()
    assert sync(lane, clock) == {N: 0, B: 0, I: 0}


def test_the_lanes_demand_is_its_peak_over_the_hold_and_its_overflow_still_in_python() -> None:
    """What nginx has read and not finished swings with its reads; slots that followed each reading
    sent every upward swing into the Python path. Overflowed requests still in flight through the
    Python path are demand too."""
    state, clock = state_of(models=[classic("cls", max_inflight=400)])
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(inflight=50, peak=60)}
    assert sync(lane, clock)[N] == 90  # 60 and half again
    pushes = front.pushes
    for inflight in (5, 30, 12):  # the swing: no slot goes back, no cap is pushed
        front.counts = {N: LaneCounts(inflight=inflight, peak=inflight)}
        assert sync(lane, clock)[N] == 90
    assert front.pushes == pushes and not lane.hot
    clock.advance(lane.state.policy.lane.hold_s)
    assert sync(lane, clock)[N] == 18  # the peak left the window: 12 and half again
    for i in range(20):  # overflowed earlier, admitted by the Python path, still in flight
        assert state.submit(Request(f"py{i}", "cls", "normal", Cost(request_bytes=100))).action is Action.ADMIT
    assert state.submit(Request("tenant", "cls", "normal", Cost(request_bytes=100), "acme")).action is Action.ADMIT
    front.counts = {N: LaneCounts(inflight=2, peak=2)}
    assert sync(lane, clock)[N] == 2 + 20 + 11  # a tenant's request never rides the lane: not its demand


def test_an_overflow_wakes_the_sync_at_most_once_a_busy_period() -> None:
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    lane, front, _ = control(state, clock, [True])
    front.counts = {N: LaneCounts(inflight=4, peak=4)}
    sync(lane, clock)
    sync(lane, clock)
    assert not lane.hot and not lane._wake.is_set()  # steady: the idle cadence
    lane.overflowed(("llm", "normal"))  # not a lane pair
    assert not lane._wake.is_set()
    clock.advance(state.policy.lane.sync_busy_ms / 1000 * 1.01)
    lane.overflowed(N)
    assert lane._wake.is_set() and lane.hot
    lane._wake.clear()
    front.counts = {N: LaneCounts(inflight=4, peak=4, overflow=1)}
    asyncio.run(lane.sync())
    front.counts = {N: LaneCounts(inflight=4, peak=4, overflow=1)}
    asyncio.run(lane.sync())
    assert not lane.hot
    lane.overflowed(N)  # within a busy period of the last sync: no wake
    assert not lane._wake.is_set()
    clock.advance(state.policy.lane.sync_busy_ms / 1000 * 1.01)
    lane.overflowed(N)
    assert lane._wake.is_set()
