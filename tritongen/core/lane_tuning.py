"""The constants of the sidecar's native lane (sidecar/lane.py, sidecar/lane_control.py), each with
where its value comes from. All of them are policy fields (`lane` in the policy,
`tritongen.core.sidecar_policy.tuning.LanePolicy`) with these defaults: they trade the control
plane's CPU against requests overflowing into the Python path, and both depend on the host.

Provenance words as in `tritongen.core.admission_tuning`.
"""

from __future__ import annotations

SPARE_MIN = 4
"""Lane slots kept beyond what the lane was asked for while nothing waits in the Python queue for
the model, at least. Policy field `lane.spare_min`. Value: a judgement (commit b548e12), enough
that a closed loop ramping up rarely overflows to Python; no sweep was run. Higher: fewer
overflows, more of the model's room held idle by the lane."""

SPARE_FRACTION = 0.5
"""...and at least this fraction of what the lane was asked for. Policy field
`lane.spare_fraction`. Value: a judgement (commit b548e12): about one sync period's growth of a
ramp."""

HOLD_S = 2.0
"""The lane's demand is the most it was asked for over this long, not its last reading: what nginx
has read and not finished swings with its reads (a busy worker reads clients in batches), and slots
that followed each reading sent every upward swing into the Python path. Policy field
`lane.hold_s`. Value: a judgement (2026-12-07), measured once: 64 perf_analyzer clients of a model
that does nothing (bench_sidecar's identity) read 4 to 64 in flight from one 20 ms sync to the next,
so a window of many syncs; two seconds return idle slots soon after a load falls. Longer: fewer
overflows into Python, slots held idle longer (a Python-path request that finds no room takes them
back at once: lane_control.LaneControl.reclaim)."""

IDLE_AFTER_S = 10.0
"""A (model, class) pair with no lane demand for this long keeps no spare slots, so an idle class
does not hold its model's room. Policy field `lane.idle_after_s`. Value: a judgement (commit
484e19c)."""

SYNC_BUSY_MS = 20.0
"""The lane's control plane syncs with nginx this often while its slots move (caps pushed, requests
overflowing, requests waiting in Python), and at most this often on requests overflowing into
Python. Policy field `lane.sync_busy_ms`. Value: checked on one run, on one host: commit 0463fa9
synced this often only while slots moved (CPU per request at c=1 fell from about 24 to 11-17 us);
commit 6a76d92 went back to this cadence while the lane carries requests, after one demo run saw 74
tinyllm refusals from bursts overflowing into the Python path, whose overflow was then seen only at
the next idle sync; since 2026-12-07 an overflow wakes the sync at once, and a steady lane syncs at
SYNC_IDLE_MS (a sync per busy period cost 3-5% of a core under a steady closed loop). Lower: bursts
find their slots sooner, at more CPU for nginx and the sidecar."""

SYNC_IDLE_MS = 100.0
"""The sync cadence otherwise (an idle pair's first requests overflow to Python until a sync grows
its slots). Policy field `lane.sync_idle_ms`. Value: a judgement (commit b548e12), checked on one
run on one host with SYNC_BUSY_MS (commits 0463fa9 and 6a76d92). Higher: less CPU while idle, and
an idle pair's first burst overflows to Python for longer."""
