"""How `tune --verify` judges a candidate measured on the embedded server, and how it ranks the ones
it measured: the thresholds and the rules in one place, each value with where it comes from (they
were literals in the CLI). Pure: the CLI runs the load and passes what it measured.

Provenance words as in `tritongen.core.admission_tuning`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from tritongen.core.class_targets import ClassLatencies, held_to_target

OFFERED_FRACTION = 0.95
"""A live capacity probe passes only if the server served at least this fraction of the rate it
was offered (besides meeting every class's target). Value: a judgement (commit d812484), leaving
room for the open-loop generator's own shortfall at the end of a run. Higher: a probe fails sooner
for want of throughput; lower: an overloaded server can pass."""

CAPACITY_BAND = 0.03
"""Measured capacities (multiples of the traffic's rate) within the same band of this width count as
equal, and the simulator's order decides between them. Value: a judgement (commit a628532),
described as the noise of open-loop runs; no repeat-run measurement of that noise is recorded.
Wider: the simulator's order decides more often."""

THROUGHPUT_STEP = 0.02
"""Among candidates that meet (or all miss) their targets live, throughputs are compared in steps of
this fraction of the offered rate, and the simulator's order decides within a step. Value: a
judgement (commit 7bdbfcb): smaller differences are noise under open-loop load."""


class MeasuredClass(ClassLatencies, Protocol):
    """One traffic class as a live run measured it (core.simulator's ClassStats)."""

    @property
    def name(self) -> str: ...
    @property
    def sent(self) -> int: ...
    @property
    def completed(self) -> int: ...


class Target(Protocol):
    """A class's latency target (core.spec's TrafficClass)."""

    @property
    def name(self) -> str: ...
    @property
    def p99_ms(self) -> float: ...


def live_verdict(measured: Sequence[MeasuredClass], targets: Sequence[Target], max_error_fraction: float,
                 streaming: bool) -> tuple[bool, float, float]:
    """(meets every target, worst P99 / target, largest share of a class lost) of a live run; a
    streaming model is judged on its time to first token."""
    worst = 0.0
    lost = 0.0
    for c in measured:
        target_ms = next((k.p99_ms for k in targets if k.name == c.name), None)
        if target_ms is None or not c.sent:
            continue
        value = held_to_target(c, streaming)
        worst = max(worst, (value or float("inf")) / target_ms)
        lost = max(lost, (c.sent - c.completed) / c.sent)
    return worst <= 1.0 and lost <= max_error_fraction, worst, lost


def keeps_up(throughput_per_s: float, offered_per_s: float) -> bool:
    """Whether a capacity probe served enough of what it was offered (OFFERED_FRACTION)."""
    return throughput_per_s >= OFFERED_FRACTION * offered_per_s


def capacity_rank(factor: float | None) -> float:
    """Sort key of a measured capacity (lower first): higher capacity first, equal within CAPACITY_BAND."""
    return -(factor or 0.0) // CAPACITY_BAND


def throughput_rank(throughput_per_s: float, offered_per_s: float) -> int:
    """Sort key of a measured throughput (lower first): higher first, equal within THROUGHPUT_STEP of
    the offered rate."""
    step = max(1e-9, THROUGHPUT_STEP * offered_per_s)
    return -math.floor(throughput_per_s / step)
