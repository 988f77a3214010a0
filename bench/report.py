"""Every benchmark's figures land in a file as well as on the terminal.

`with saved_report("sim_fidelity"):` tees what the benchmark prints into
`bench/results/sim_fidelity.md`, under a header with the date, the machine and the commit, so the
README can quote the latest table with where and when it was taken. The file is written beside and
renamed at the end: an interrupted run leaves the previous report whole.
"""

from __future__ import annotations

import io
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.rig import ROOT

RESULTS = Path(__file__).resolve().parent / "results"


def shown(path: Path, base: Path = ROOT) -> str:
    """A path as a report prints it: relative to `base` (the checkout) where it lies under it."""
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)


class _Tee(io.TextIOBase):
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()

    def isatty(self) -> bool:
        return False


def machine() -> str:
    """One line: CPUs, memory, Python, and the commit the figures belong to."""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    return (f"{os.cpu_count()} CPUs, {mem_gib:.0f} GiB, {platform.machine()}, Python {platform.python_version()}, "
            f"commit {commit}{' (uncommitted changes)' if dirty else ''}")


def _stop_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the bench's `with` blocks then stop what they started. Python's default
    for SIGTERM exits at once, and a killed bench left its tritonserver's backend stub and a vLLM
    engine running for an hour (2026-12-07)."""
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def saved_report(name: str, results: Path = RESULTS) -> Iterator[Path]:
    """Tee stdout into `results/<name>.md` for the duration of the block."""
    results.mkdir(parents=True, exist_ok=True)
    target = results / f"{name}.md"
    buffer = io.StringIO()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    real = sys.stdout
    sys.stdout = _Tee(real, buffer)
    before = signal.signal(signal.SIGTERM, _stop_as_interrupt)
    try:
        yield target
    finally:
        sys.stdout = real
        signal.signal(signal.SIGTERM, before)
    header = f"# {name}\n\n`{command}`, {started}; {machine()}\n\n```\n"
    partial = target.with_suffix(".md.partial")
    partial.write_text(header + buffer.getvalue().rstrip() + "\n```\n")
    partial.replace(target)
    print(f"(figures written to {shown(target, Path.cwd())})")


def rel(reference: float | None, value: float | None) -> str:
    """`value`'s error against `reference`, as the fidelity tables print it."""
    if reference is None or value is None:
        return "-"
    if reference == 0 and value == 0:
        return "both 0"
    return f"{(value - reference) / reference:+.0%}" if reference else "inf"


def ms(v: float | None) -> str:
    """A latency in a table cell: whole milliseconds from 100 up, one decimal below."""
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


# A fidelity bench's live capacity: what the engine completes when offered this many times what the
# simulation says it can (far past its knee, and not so far that the run is all queue).
FLOOD_FACTOR = 2.0


def flooded_capacity(sim_capacity: float, flood: Callable[[float], Any]) -> tuple[float, Any]:
    """(completed/s of the one class, the run) when `flood(rate)` offers FLOOD_FACTOR x
    `sim_capacity`: the capacity whose fractions the fidelity benches load the engine at."""
    result = flood(FLOOD_FACTOR * sim_capacity)
    return result.summary()[0][0].throughput_per_s, result


def live_vs_sim(live, sim) -> str:
    """The fidelity tables' three cells of one live run against the simulation: completed/s, TTFT P50
    and TTFT P99, each 'live / sim (error)'. `live` and `sim` carry throughput_per_s, ttft_p50_ms and
    ttft_p99_ms (ClassStats)."""
    return (f"{live.throughput_per_s:.1f} / {sim.throughput_per_s:.1f} ({rel(live.throughput_per_s, sim.throughput_per_s)}) "
            f"| {ms(live.ttft_p50_ms)} / {ms(sim.ttft_p50_ms)} ({rel(live.ttft_p50_ms, sim.ttft_p50_ms)}) "
            f"| {ms(live.ttft_p99_ms)} / {ms(sim.ttft_p99_ms)} ({rel(live.ttft_p99_ms, sim.ttft_p99_ms)})")
