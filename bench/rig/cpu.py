"""Per-core CPU use over a bench run, from /proc/stat: on these 2-core hosts the engine has a core of
its own and everything else shares the other, so a table that says how busy each core was tells a
slow engine from a starved front."""

from __future__ import annotations

from pathlib import Path


def cpu_times() -> dict[str, tuple[int, int]]:
    """(busy, total) jiffies per CPU from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            values = [int(v) for v in fields]
            idle = values[3] + values[4]
            out[name] = (sum(values) - idle, sum(values))
    return out


def busy(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    """'cpu0 37%, cpu1 99%': each core's busy share between two readings."""
    parts = []
    for name in sorted(after):
        b = after[name][0] - before[name][0]
        t = after[name][1] - before[name][1]
        parts.append(f"{name} {b / t:.0%}" if t else f"{name} -")
    return ", ".join(parts)


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) one process has used, from /proc/PID/stat; None once it is gone."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
