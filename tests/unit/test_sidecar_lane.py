"""The native front's fast lane: which models it carries, its slots as reservations in the admission
state, and the control plane's sync against a fake nginx (its counts are what the test says)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sidecar.admission import Action, AdmissionState, Cost, Request
from sidecar.lane import LaneCounts, caps_body, demand, lane_models, parse_counts, spare_slots, target_slots
from sidecar.lane_control import LaneControl
from sidecar.metrics import SidecarMetrics
from sidecar.nginx_front import FrontAddresses, NginxInstall, render_config
from sidecar.policy import parse_policy
from tests.helpers import FakeClock, policy_doc


def state_of(**over: Any) -> tuple[AdmissionState, FakeClock]:
    clock = FakeClock()
    return AdmissionState(parse_policy(policy_doc(**over)), clock), clock


def classic(name: str, **over: Any) -> dict[str, Any]:
    return {"name": name, "kind": "classic", "devices": ["gpu0"], "request_bytes": 100, **over}


# -- which models ----------------------------------------------------------------------------------

def test_lane_carries_classic_models_of_the_default_class_only() -> None:
    doc = policy_doc()
    doc["models"] += [
        classic("only_batch", classes=["batch"]),  # does not serve the default class
        classic("levels_other", priority_levels=3, default_priority=1),  # default class is level 2: rewrite needed
        classic("levels_same", priority_levels=3, default_priority=2),
        classic("unbounded"),
    ]
    models = lane_models(parse_policy(doc))
    assert sorted(models) == ["cls", "levels_same", "unbounded"]  # never the LLM


# -- the arithmetic --------------------------------------------------------------------------------

def test_targets_grow_with_demand_shrink_to_in_flight_when_something_waits_and_close_when_down() -> None:
    assert spare_slots(0) == 4 and spare_slots(40) == 20
    assert target_slots(inflight=3, wanted=10, may_grow=True, upstream_up=True) == 15
    assert target_slots(inflight=3, wanted=10, may_grow=False, upstream_up=True) == 3
    assert target_slots(inflight=3, wanted=10, may_grow=True, upstream_up=False) == 0
    # a closed loop read between a completion and its next send reads low; its peak and overflow do not
    assert demand(LaneCounts(inflight=10, peak=16), overflow_since=0) == 16
    assert demand(LaneCounts(inflight=10, peak=12), overflow_since=5) == 17


def test_control_text_round_trips_and_ignores_what_it_cannot_read() -> None:
    assert caps_body({"b": 2, "a": 7}) == "a\t7\nb\t2\n"
    counts = parse_counts("a\t3\t100\t0.5\t2\t9\nbroken line\nb\tx\t1\t1\t1\t1\n\n")
    assert counts == {"a": LaneCounts(inflight=3, done=100, seconds=0.5, overflow=2, peak=9)}


# -- slots are reservations ------------------------------------------------------------------------

def test_slots_fill_the_models_quota_at_the_default_classes_share_and_count_nothing_as_served() -> None:
    state, _ = state_of()  # cls: max_inflight 5; the default class "normal" may fill 0.9 of it: 4
    taken = [slot for slot in range(10) if state.take_lane_slot(("lane", slot), "cls")]
    assert len(taken) == 4
    assert state.inflight_of("cls") == 4 and state.reserved_scope("gpu0") == 400
    assert not state.take_lane_slot(("lane", 99), "llm")  # never an LLM
    for slot in taken:
        assert state.return_lane_slot(("lane", slot))
    assert state.inflight_of("cls") == 0 and state.reserved_scope("gpu0") == 0
    assert state.drain_rate("cls") is None  # a returned slot is not a finished request
    assert not state.return_lane_slot(("lane", 0))


def test_a_request_waiting_in_python_stops_the_lane_and_gets_the_first_returned_slot() -> None:
    state, clock = state_of()
    for slot in range(4):
        assert state.take_lane_slot(("lane", slot), "cls")
    decision = state.submit(Request("python-1", "cls", "normal", Cost(request_bytes=100)))
    assert decision.action is Action.QUEUE
    assert not state.lane_may_grow("cls")
    assert not state.take_lane_slot(("lane", 9), "cls")
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


def control(state: AdmissionState, up: list[bool]) -> tuple[LaneControl, FakeFront, list[int]]:
    front = FakeFront()
    dispatched: list[int] = []
    lane = LaneControl(front, state, SidecarMetrics(), lambda: up[0], lambda: dispatched.append(1))
    return lane, front, dispatched


def test_sync_grants_spare_slots_then_hands_them_to_a_waiting_request() -> None:
    state, clock = state_of(models=[classic("cls", max_inflight=40)])
    up = [True]
    lane, front, dispatched = control(state, up)
    assert asyncio.run(lane.sync()) == {"cls": 4}  # idle: the spare alone
    front.counts = {"cls": LaneCounts(inflight=4, done=50, seconds=0.2, peak=4)}
    assert asyncio.run(lane.sync()) == {"cls": 8}  # busy: what it had in flight plus spare
    assert state.inflight_of("cls") == 8
    decision = state.submit(Request("py", "cls", "interactive", Cost(request_bytes=100)))
    assert decision.action is Action.ADMIT  # room under the quota: the Python path is not starved
    front.counts = {"cls": LaneCounts(inflight=5, done=60, seconds=0.25, peak=8)}
    assert asyncio.run(lane.sync())["cls"] == 12
    assert front.pushes == 3


def test_sync_shrinks_to_what_is_in_flight_while_a_request_waits() -> None:
    state, clock = state_of()  # cls quota 5: 4 for the default class
    up = [True]
    lane, front, dispatched = control(state, up)
    front.counts = {"cls": LaneCounts(inflight=2, peak=2)}
    assert asyncio.run(lane.sync()) == {"cls": 4}
    assert state.submit(Request("py", "cls", "normal", Cost(request_bytes=100))).action is Action.QUEUE
    assert asyncio.run(lane.sync()) == {"cls": 2}  # new lane requests overflow and queue behind it
    assert dispatched  # the returned slots went to the waiting request
    assert [g.request_id for g in state.take_events().granted] == ["py"]


def test_sync_closes_the_lane_while_triton_is_down_and_for_a_model_the_policy_drops() -> None:
    state, clock = state_of()
    up = [True]
    lane, front, _ = control(state, up)
    assert asyncio.run(lane.sync()) == {"cls": 4}
    up[0] = False
    front.counts = {"cls": LaneCounts(inflight=1)}
    assert asyncio.run(lane.sync()) == {}
    assert front.caps == {} and state.inflight_of("cls") == 1  # the one in flight keeps its slot
    front.counts = {"cls": LaneCounts(inflight=0, done=1, seconds=0.01)}
    asyncio.run(lane.sync())
    assert state.inflight_of("cls") == 0
    up[0] = True
    assert asyncio.run(lane.sync()) == {"cls": 4}
    doc = policy_doc()
    doc["models"] = [m for m in doc["models"] if m["name"] != "cls"]
    state.apply_policy(parse_policy(doc))
    lane.policy_changed()
    assert asyncio.run(lane.sync()) == {}
    assert state.inflight_of("cls") == 0 and lane.status() == {}


def test_finished_lane_requests_are_counted_once_and_an_nginx_restart_starts_over() -> None:
    state, _ = state_of()
    lane, front, _ = control(state, [True])
    front.counts = {"cls": LaneCounts(done=10, seconds=0.1)}
    asyncio.run(lane.sync())
    asyncio.run(lane.sync())
    front.counts = {"cls": LaneCounts(done=3, seconds=0.03)}  # nginx started again
    asyncio.run(lane.sync())
    text = lane.metrics.exposition().decode()
    assert 'sidecar_lane_requests_total{model="cls"} 13.0' in text


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
