"""The native fast lane: which requests nginx may send straight to Triton, and how many at once. Pure.

A request nginx can judge without parsing it (a classic model's unary infer naming no tenant and no
priority, whose class needs no priority written in) goes to Triton directly while its (model, class)
pair holds a free *lane slot*; every other request, and every one over the slots, takes the Python
path. Why slots and not the admission rules again in Lua: a slot is a real reservation in the
`AdmissionState`, taken and given back by the control plane between requests (sidecar/lane_control.py),
so every rule stays in one place and the Python path sees the lane's requests in flight; nginx
only counts its requests against the slots it was granted. docs/sidecar.md says how the slots move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.accounting import DOWN, ENDED
from sidecar.reading import priority_to_write
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.core.sidecar_policy.tuning import LanePolicy


@dataclass(frozen=True)
class LaneCounts:
    """What nginx counted for one model since it started (cumulative, except `inflight`)."""

    inflight: int = 0  # lane requests now at Triton
    done: int = 0  # lane requests finished (any status)
    seconds: float = 0.0  # their summed request time
    overflow: int = 0  # requests that found no free slot and went to the Python path
    peak: int = 0  # the most lane requests in flight at once since the previous reading
    buckets: tuple[int, ...] = ()  # finished requests per latency bucket (sidecar/metrics.py's bounds, then +Inf)
    ends: tuple[tuple[str, int], ...] = ()  # finished requests nginx tallied apart: (the end, count), sorted

    def ends_since(self, before: LaneCounts) -> dict[tuple[str, int], int]:
        """Lane requests tallied apart since `before`, by (how, status) as `accounting.outcome` reads
        them: nginx's "down" (Triton unreachable), or the status the client got (400 and up)."""
        old = dict(before.ends)
        out = {}
        for tally, n in self.ends:
            if n > old.get(tally, 0):
                out[(DOWN, 0) if tally == DOWN else (ENDED, int(tally))] = n - old.get(tally, 0)
        return out


def since(now: tuple[int, ...], before: tuple[int, ...]) -> list[int]:
    """Per-position growth of nginx's cumulative counts since an earlier reading; a reading of
    another length (a new policy's bucket bounds, a restarted nginx) counts from zero."""
    old = before if len(before) == len(now) else (0,) * len(now)
    return [n - o for n, o in zip(now, old)]


LaneKey = tuple[str, str]  # (model, class)


def lane_keys(policy: SidecarPolicy) -> set[LaneKey]:
    """The (model, class) pairs the lane may carry: classic models (an LLM's cost is in its body),
    each class the model serves for which a request naming no priority needs none written
    (`reading.priority_to_write`, the one rule: only the Python path writes one in)."""
    out: set[LaneKey] = set()
    for model in policy.models:
        if model.kind != "classic" or model.kv is not None:
            continue
        for klass in policy.classes:
            if model.classes is not None and klass.name not in model.classes:
                continue
            if priority_to_write(model, klass, names_priority=False) is None:
                out.add((model.name, klass.name))
    return out


def spare_slots(wanted: int, cfg: LanePolicy) -> int:
    """Slots kept beyond what the lane was asked for while nothing waits in the Python queue: a
    ramp finds them at once instead of overflowing until the next sync (the policy's `lane`;
    tritongen/core/lane_tuning.py says where the defaults come from)."""
    return max(cfg.spare_min, math.ceil(wanted * cfg.spare_fraction))


def demand(counts: LaneCounts, overflow_since: int, overflow_inflight: int = 0) -> int:
    """What the lane was asked to carry at once since the last reading: its peak in flight, or more
    when requests overflowed for want of a slot (they would have been in flight too): those that
    overflowed since, or those of its kind the Python path still has in flight, whichever is more. A
    sample of the in-flight count alone reads low between a closed loop's completions and its next
    sends."""
    return max(counts.inflight, counts.peak) + max(0, overflow_since, overflow_inflight)


def target_slots(inflight: int, wanted: int, may_grow: bool, upstream_up: bool, cfg: LanePolicy) -> int:
    """Slots the lane should hold: what it was asked for plus spare, or only its in-flight
    requests when something waits for the model in Python (no spare: new ones queue in order), or
    none while Triton is down (the Python path answers 503 at once)."""
    if not upstream_up:
        return 0
    return max(inflight, wanted) + spare_slots(wanted, cfg) if may_grow else inflight


def parse_counts(text: str) -> dict[LaneKey, LaneCounts]:
    """nginx's control answer: one line per model and class, `model class inflight done seconds
    overflow peak buckets ends`, tab-separated, the buckets comma-separated, the ends `end=count`
    comma-separated (sidecar/tritongen_lane.lua writes it)."""
    out: dict[LaneKey, LaneCounts] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 9 or not parts[0] or not parts[1]:
            continue
        try:
            buckets = tuple(int(float(n)) for n in parts[7].split(",")) if parts[7] else ()
            ends = tuple(sorted(_end(e) for e in parts[8].split(",") if e))
            out[(parts[0], parts[1])] = LaneCounts(max(0, int(float(parts[2]))), int(float(parts[3])),
                                                   float(parts[4]), int(float(parts[5])), max(0, int(float(parts[6]))),
                                                   buckets, ends)
        except ValueError:
            continue
    return out


def _end(text: str) -> tuple[str, int]:
    """One `end=count` of nginx's counts: the end is "down" or a status."""
    tally, _, n = text.partition("=")
    if tally != DOWN and not tally.isdigit():
        raise ValueError(f"an end nginx does not tally: {tally!r}")
    return tally, int(float(n))


def caps_body(caps: Mapping[LaneKey, int]) -> str:
    """The control request's body: `model class slots` per line, tab-separated; a pair not listed
    has no lane (nginx sends its requests to the Python path)."""
    return "".join(f"{model}\t{klass}\t{int(cap)}\n" for (model, klass), cap in sorted(caps.items()))
