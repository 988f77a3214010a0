"""Hand-offs read from request timestamps (tritongen.core.handoff) and Triton's trace file format."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritongen.core.handoff import LATE_S, handoff_stats
from tritongen.errors import BadInput
from tritongen.triton_trace import read_trace, trace_flags

MS = 1e-3


def times(*requests):
    """(queue, start, end) arrays from (queued ms, started ms, ended ms) per request."""
    arr = np.asarray(requests, dtype=float) * MS
    return arr[:, 0], arr[:, 1], arr[:, 2]


def test_a_prompt_hand_off_a_lost_one_and_an_idle_start_are_told_apart() -> None:
    q, s, e = times(
        (0.0, 0.0, 10.0),  # first execution
        (5.0, 10.3, 20.0),  # queued during it, started 0.3 ms after its end: prompt
        (12.0, 10.3, 20.0),  # (same batch)
        (15.0, 28.0, 38.0),  # queued during the second, started 8 ms after its end: lost
        (50.0, 50.2, 60.0),  # nothing was waiting at 38 ms: not a hand-off
    )
    st = handoff_stats(q, s, e, window_s=0.0)
    assert (st.handoffs, st.lost) == (2, 1)
    assert st.lost_share == 0.5
    assert st.gap_mean_ms == pytest.approx(0.3)


def test_a_start_held_by_the_batching_window_is_not_a_lost_wake() -> None:
    # queued 1 ms before the end with a 4 ms window: due at 13 ms, started at 13.2
    q, s, e = times((0.0, 0.0, 10.0), (9.0, 13.2, 20.0))
    st = handoff_stats(q, s, e, window_s=0.004)
    assert (st.handoffs, st.lost) == (1, 0)
    assert st.gap_mean_ms == 0.0  # not due at the end, so its delay says nothing of the hand-off
    late = handoff_stats(*times((0.0, 0.0, 10.0), (9.0, 13.0 + LATE_S / MS + 0.5, 20.0)), window_s=0.004)
    assert late.lost == 1


def test_the_trace_reader_keeps_one_models_finished_requests(tmp_path) -> None:
    def rec(i, model, **ns):
        return [{"id": i, "model_name": model, "model_version": 1},
                {"id": i, "timestamps": [{"name": k, "ns": v} for k, v in ns.items()]}]

    records = (
        rec(1, "m", QUEUE_START=1_000_000, COMPUTE_START=2_000_000, COMPUTE_END=12_000_000)
        + rec(2, "other", QUEUE_START=1_000_000, COMPUTE_START=2_000_000, COMPUTE_END=12_000_000)
        + rec(3, "m", QUEUE_START=3_000_000)  # never executed (rejected)
        + [{"id": 4, "timestamps": [{"name": "HTTP_RECV_START", "ns": 5}]}]
    )
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(records))
    got = read_trace(path, "m")
    assert got.queue_s.tolist() == [0.001] and got.start_s.tolist() == [0.002] and got.end_s.tolist() == [0.012]
    assert len(read_trace(path, "absent").queue_s) == 0
    assert any("log-frequency=0" in f for f in trace_flags(path))
    # flushed from a running server: the array is closed only at shutdown
    path.write_text(json.dumps(records)[:-1])
    assert read_trace(path, "m").queue_s.tolist() == [0.001]
    path.write_text("[{")
    with pytest.raises(BadInput, match="not a Triton trace file"):
        read_trace(path, "m")


def test_with_two_instances_only_an_end_that_frees_the_last_slot_is_a_hand_off() -> None:
    q, s, e = times(
        (0.0, 0.0, 10.0),  # instance 1
        (1.0, 2.0, 12.0),  # instance 2
        (5.0, 10.2, 20.0),  # waiting at 10 ms while instance 2 was busy: prompt hand-off
        (11.0, 20.5, 30.0),  # waiting at 12 ms while instance 1 was busy again: lost (8.5 ms late)
        (40.0, 40.1, 45.0),  # nothing waiting at 20 or 30 ms
        (41.0, 41.1, 46.0),  # queued at 41 while instance 1 was free: no hand-off at 45
    )
    st = handoff_stats(q, s, e, window_s=0.0, instances=2)
    assert (st.handoffs, st.lost) == (2, 1)
    assert st.gap_mean_ms == pytest.approx(0.2)
