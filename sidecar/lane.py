"""The native fast lane: which requests nginx may send straight to Triton, and how many at once.

Pure arithmetic, no I/O. With `--front native` the sidecar puts nginx in front (sidecar/nginx_front.py)
and keeps the admission state in Python. A request nginx can judge without parsing it, a classic
model's unary infer of the default class and tenant, goes to Triton directly while the model holds
a free *lane slot*; every other request, and every one over the slots, goes through the Python path
as before (which queues, refuses with 429, or admits).

Why slots and not a copy of the admission rules in Lua: a slot is a real reservation in the
`AdmissionState` (the model's quota, the tenant's, device headroom, the class's budget share), taken
and given back by the Python control plane between requests, so the Python path sees the lane's
requests as in flight, and every rule stays in one place. nginx only counts its own requests
against the number of slots it was granted.

The control plane grows the slots ahead of the lane's demand (`spare`) while nothing waits in the
Python queue for the model, and shrinks them to what the lane has in flight as soon as something
does: then new lane requests overflow to the Python queue and take their turn in priority order,
and the lane's slots go back to the state as its requests finish. A request that waits in Python
never waits behind lane requests that arrived after it for longer than one sync.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.policy import ModelPolicy, SidecarPolicy

# Slots kept beyond the lane's in-flight requests while nothing waits: enough that a closed loop
# ramping up overflows to Python rarely, and at most one sync period's growth.
SPARE_MIN = 4
SPARE_FRACTION = 0.5


@dataclass(frozen=True)
class LaneCounts:
    """What nginx counted for one model since it started (cumulative, except `inflight`)."""

    inflight: int = 0  # lane requests now at Triton
    done: int = 0  # lane requests finished (any status)
    seconds: float = 0.0  # their summed request time
    overflow: int = 0  # requests that found no free slot and went to the Python path
    peak: int = 0  # the most lane requests in flight at once since the previous reading


def lane_models(policy: SidecarPolicy) -> dict[str, ModelPolicy]:
    """Models whose plain requests the lane may carry: classic (no KV cost to read from the body),
    serving the default class, and needing no priority written into the request for it (Triton's
    default level is the default class's). Everything about an LLM request depends on its body."""
    default = policy.class_named(policy.default_class)
    out: dict[str, ModelPolicy] = {}
    for model in policy.models:
        if model.kind != "classic" or model.kv is not None:
            continue
        if model.classes is not None and default.name not in model.classes:
            continue
        if model.priority_levels and default.priority != model.default_priority:
            continue
        out[model.name] = model
    return out


def spare_slots(inflight: int) -> int:
    return max(SPARE_MIN, math.ceil(inflight * SPARE_FRACTION))


def demand(counts: LaneCounts, overflow_since: int) -> int:
    """What the lane was asked to carry at once since the last reading: its peak in flight, or more
    when requests overflowed for want of a slot (they would have been in flight too). A sample of
    the in-flight count alone reads low between a closed loop's completions and its next sends."""
    return max(counts.inflight, counts.peak) + max(0, overflow_since)


def target_slots(inflight: int, wanted: int, may_grow: bool, upstream_up: bool) -> int:
    """Slots the lane should hold: what it was asked for plus spare, or only its in-flight
    requests when something waits for the model in Python (no spare: new ones queue in order), or
    none while Triton is down (the Python path answers 503 at once)."""
    if not upstream_up:
        return 0
    return max(inflight, wanted) + spare_slots(wanted) if may_grow else inflight


def parse_counts(text: str) -> dict[str, LaneCounts]:
    """nginx's control answer: one line per model, `model inflight done seconds overflow peak`,
    tab-separated (sidecar/tritongen_lane.lua writes it)."""
    out: dict[str, LaneCounts] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 6 or not parts[0]:
            continue
        try:
            out[parts[0]] = LaneCounts(max(0, int(float(parts[1]))), int(float(parts[2])), float(parts[3]),
                                       int(float(parts[4])), max(0, int(float(parts[5]))))
        except ValueError:
            continue
    return out


def caps_body(caps: Mapping[str, int]) -> str:
    """The control request's body: `model cap` per line, tab-separated; a model not listed has no
    lane (nginx sends its requests to the Python path)."""
    return "".join(f"{name}\t{int(cap)}\n" for name, cap in sorted(caps.items()))
