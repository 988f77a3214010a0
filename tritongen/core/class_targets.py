"""A simulated result read against the spec's traffic-class targets.

The spec's `TrafficClass.p99_ms` is an end-to-end P99 for a classic model and a time-to-first-token
P99 for a streaming LLM (the wait before text appears, which is what a user of a stream feels).
Which figure a target holds is stated here once, so that a command reporting against the spec's
targets reads a result the way the spec's field is documented.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, Field

from tritongen.core.simulator import ClassStats, SimResult
from tritongen.core.spec import TrafficClass


class TargetCheck(BaseModel):
    """One class's P99 against the spec's target for it."""

    target_ms: float = Field(description="The spec's p99_ms for the class.")
    p99_ms: float | None = Field(description="The P99 held to it (TTFT for a streaming LLM); None: nothing completed.")
    met: bool


class ClassLatencies(Protocol):
    """A class's P99s as a simulated or a live run gives them (ClassStats)."""

    @property
    def p99_ms(self) -> float | None: ...
    @property
    def ttft_p99_ms(self) -> float | None: ...


def held_to_target(stats: ClassLatencies, streaming: bool) -> float | None:
    """The P99 a class's `p99_ms` target is about: time to first token for a streaming LLM."""
    return stats.ttft_p99_ms if streaming else stats.p99_ms


def check_targets(result: SimResult, classes: Sequence[TrafficClass], streaming: bool) -> dict[str, TargetCheck]:
    """Each class of `result` that `classes` give a target and that sent requests (a class that
    sent none has no P99 to judge), by name. A class none of whose requests completed misses."""
    targets = {c.name: c.p99_ms for c in classes}
    checks: dict[str, TargetCheck] = {}
    for stats in result.classes:
        if stats.name not in targets or stats.sent == 0:
            continue
        value = held_to_target(stats, streaming)
        target = targets[stats.name]
        checks[stats.name] = TargetCheck(target_ms=target, p99_ms=value, met=value is not None and value <= target)
    return checks
