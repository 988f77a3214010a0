"""What admission reads besides its own books: headroom (static capacity, live readings, foreign
memory, stale readings, the watermark) and the adaptive concurrency limit that follows it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_limits import AdaptiveLimit
from sidecar.admission_types import Action, HeadroomSnapshot, Reading
from tests.sidecar_rigs import FakeClock, admission_request, admission_state, policy_doc
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.core.sidecar_policy.sections import ConcurrencyPolicy


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
    r = admission_request(kv=300, klass="interactive")
    state.submit(r)
    # pool: 1000 total; the engine shows 200 used while the sidecar holds 300 -> nothing foreign
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 200, "triton_metrics")))
    assert state.capacity("pool:llm") == 1000  # no pad on a KV pool
    # 500 used while the sidecar held 300 at the sample: 200 bytes belong to someone else
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 500, "triton_metrics")))
    assert state.capacity("pool:llm") == 800
    decision = state.submit(admission_request(kv=600, klass="interactive"))
    assert decision.action is Action.QUEUE and decision.limit == "headroom:pool:llm"
    # device: the pad applies
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 40_000, "nvml")))
    assert state.capacity("gpu0") == 100_000 - 100 - 40_000


def test_foreign_memory_on_the_device_blocks_prefill() -> None:
    state, clock = admission_state()
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 99_950, "nvml")))
    decision = state.submit(admission_request(kv=10, prefill=100, klass="interactive"))
    assert decision.action is Action.QUEUE and decision.limit == "headroom:gpu0"
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 50_000, "nvml")))
    assert len(state.take_events().granted) == 1


def test_stale_reading_falls_back_to_static() -> None:
    state, clock = admission_state()
    state.observe_headroom(snapshot(clock(), Reading("gpu0", 100_000, 99_000, "nvml")))
    assert state.reading("gpu0").source == "nvml"  # type: ignore[union-attr]
    clock.advance(5.001)  # headroom.stale_after_ms default 5000
    assert state.reading("gpu0").source == "static"  # type: ignore[union-attr]
    assert state.capacity("gpu0") == 100_000


def test_status_reports_sources_and_failures() -> None:
    state, clock = admission_state()
    state.observe_headroom(snapshot(clock(), Reading("pool:llm", 1000, 0, "triton_metrics"),
                                    failures={"nvml": "NVML unavailable"}))
    status = state.status()
    assert status["headroom_failures"] == {"nvml": "NVML unavailable"}
    assert status["scopes"]["pool:llm"]["source"] == "triton_metrics"  # type: ignore[index]
    assert status["scopes"]["gpu0"]["source"] == "static"  # type: ignore[index]
    json.dumps(status)  # served as JSON


def test_watermark_and_oom_risk() -> None:
    state, _ = admission_state()
    assert state.watermark() == 0
    r = admission_request(kv=500, tokens=50, klass="interactive")
    state.submit(r)
    assert state.watermark() == 0  # a pre-allocated pool's KV is checked exactly, not watermarked
    busy = admission_request(model="cls", request=50_000, klass="interactive")
    state.submit(busy)
    assert state.watermark() == pytest.approx(0.5)  # device bytes: half of gpu0
    state.release(busy.id)
    # one sequence x 50 tokens (requested, nothing finished yet) x 10 B / 1000 B
    assert state.oom_risk("llm") == pytest.approx(0.5)
    state.release(r.id, tokens=80)
    r2 = admission_request(kv=500, tokens=50, klass="interactive")
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
    state.submit(admission_request(prefill=95_000, klass="interactive"))  # 95 % of gpu0's memory
    clock.advance(1.0)
    state.tick()
    assert state.limit.value == 7 and state.last_limit_move == "down"


def test_reconfigure_clamps_the_limit() -> None:
    limit = AdaptiveLimit(concurrency(), now=0)
    limit.reconfigure(concurrency(min=1, max=5))
    assert limit.value == 5


def test_apply_policy_keeps_reservations() -> None:
    state, _ = admission_state()
    r = admission_request(kv=600, klass="interactive")
    state.submit(r)
    doc = policy_doc()
    doc["models"][0]["memory_quota_bytes"] = 700
    state.apply_policy(parse_policy(doc))
    assert state.reserved_bytes == 600
    assert state.submit(admission_request(kv=200, klass="interactive")).action is Action.QUEUE  # the new quota applies
    state.release(r.id)
    assert state.reserved_bytes == 200
