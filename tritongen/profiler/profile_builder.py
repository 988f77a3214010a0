"""What has been measured so far of one model's profile, and the (possibly partial) `Profile` made
from it at any moment: a run that fails or is interrupted half-way still writes what it measured.

Its own module because both halves of the profiler fill it: `Profiler` (profiler/run.py) makes one
per model and the classic steps fill it, the streaming steps (profiler/streaming_steps.py) fill its
memory, streaming and engine sections; held by either, the two would import each other.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tritongen import __version__
from tritongen.core import profile_math as pm
from tritongen.core.profile_types import (EngineMeasurement, LoadLevel, MeasurementGap, MemorySection, Profile,
                                         ProfileSettings, StreamingSection, StreamLevel, UnaryLLMMeasurement)
from tritongen.profiler.classic import ClassicResult
from tritongen.profiler.load import queue_rejected
from tritongen.profiler.targets import Target


@dataclass
class ProfileBuilder:
    """What has been measured so far for one model; `build` makes a (possibly partial) Profile."""

    target: Target
    settings: ProfileSettings
    server_version: str
    server_url: str
    started: float = field(default_factory=time.monotonic)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    memory: MemorySection | None = None
    streaming: StreamingSection | None = None
    engine: EngineMeasurement | None = None
    classic: ClassicResult = field(default_factory=ClassicResult)
    llm: UnaryLLMMeasurement | None = None
    gaps: list[MeasurementGap] = field(default_factory=list)

    def build(self, complete: bool, error: str | None) -> Profile:
        c = self.classic
        knee = (
            pm.find_knee([(lv.concurrency, lv.throughput_per_s, lv.p99_ms) for lv in c.levels])
            if len(c.levels) >= 2
            else None
        )
        return Profile(
            model=self.target.name,
            kind=self.target.kind,  # type: ignore[arg-type]
            spec_model=self.target.spec_model,
            server_version=self.server_version,
            server_url=self.server_url,
            created_at=self.created_at,
            tritongen_version=__version__,
            complete=complete,
            error=error,
            duration_s=round(time.monotonic() - self.started, 3),
            max_batch_size=self.target.max_batch_size,
            settings=self.settings,
            curve=c.curve,
            fit=c.fit,
            load_levels=c.levels,
            knee=knee,
            memory=self.memory,
            streaming=self.streaming,
            engine=self.engine,
            stated_engine=self.target.stated_engine,
            overheads=c.overheads,
            scaling=c.scaling,
            variant=c.variant,
            llm=self.llm,
            gaps=self.gaps,
            served_config=self.target.config or None,
            notes=[*c.notes, *rejection_notes(c.levels, "requests"),
                   *rejection_notes(self.streaming.levels if self.streaming else [], "streams")],
        )


def rejection_notes(levels: Sequence[LoadLevel | StreamLevel], unit: str) -> list[str]:
    """One line per level whose requests the served queue policy turned away: the profile goes on
    (they never reached the model), and says that the level's latencies are of the requests served."""
    notes = []
    for level in levels:
        if level.rejected:
            rejections = [e for e in level.error_samples if queue_rejected(e)]
            notes.append(
                f"concurrency {level.concurrency}: the served config's queue policy rejected {level.rejected} of "
                f"{level.requests + level.errors + level.rejected} {unit} ({rejections[0] if rejections else 'queue rejection'}); "
                f"not the model's errors: its latencies are of the {level.requests} served, and capacity is not read from it"
            )
    return notes
