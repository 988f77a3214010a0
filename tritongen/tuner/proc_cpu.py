"""CPU time from Linux /proc: a process tree's, the whole host's, a model's Python-backend stubs',
and how much other processes used while a measurement ran (`ForeignLoad`)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path


def proc_tree(root: int) -> list[int]:
    """`root` and every process whose parent chain leads to it (the server and its stubs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    out = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in out and pid not in out:
                out.add(pid)
                changed = True
    return sorted(out)


def host_busy_seconds() -> float:
    """CPU time the whole host has been busy (all cores), from /proc/stat."""
    try:
        parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in parts[:8]]
    except (OSError, ValueError, IndexError):
        return 0.0
    idle = values[3] + values[4]
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(values) - idle) / tick


class ForeignLoad:
    """How much CPU *other* processes used while a measurement ran, in cores.

    On a shared host another job's burst shows up as tail latency that no model of the server can
    predict; callers use this to discard and repeat such runs. Own = this process + the server's
    process tree (Triton and its Python stubs).
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def _own(self) -> float:
        pids = [os.getpid()] + (proc_tree(self.server_pid) if self.server_pid else [])
        return cpu_seconds(pids)

    def __enter__(self) -> "ForeignLoad":
        self.t0 = time.perf_counter()
        self.host0 = host_busy_seconds()
        self.own0 = self._own()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(1e-9, time.perf_counter() - self.t0)
        host = host_busy_seconds() - self.host0
        own = self._own() - self.own0
        self.cores = max(0.0, (host - own) / wall)


def stub_pids(model: str) -> list[int]:
    """PIDs of the Python-backend stub processes serving `model` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and any(
            arg.decode(errors="replace").startswith(f"{model}_") for arg in cmd
        ):
            out.append(int(entry.name))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return total / tick
