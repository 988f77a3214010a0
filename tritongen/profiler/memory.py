"""Memory probes behind one small interface, so the profiler runs the same on CPU and GPU hosts.

* `StubRssProbe`: the resident memory (VmRSS) of a Python-backend model's instance processes, the
  `triton_python_backend_stub` children of the server whose command line names an instance of the
  model (`<model>_<group>_<index>`). Reads `/proc` through an injectable root, so tests pass a fake
  tree. The peak of a process can be reset and read back by the kernel (`clear_refs` "5", then
  `VmHWM`) where we may write to it: a transient shorter than the sampling interval is still seen.
* `NvmlProbe`: used device memory of the model's GPUs through NVML (`pynvml`, injected: tests pass
  a fake module; a host without a GPU gets None from `NvmlProbe.open`).
* `NullProbe`: nothing to measure (a remote server, no GPU); every reading is None.

`PeakSampler` samples a probe from a thread every ~2 ms while a request runs.
The server's Prometheus text (the model's own `*_kv_*` gauges) is read by tritongen.core.prometheus.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tritongen.shared.nvml import Nvml, NvmlUnavailable

STUB_NAME = "triton_python_backend_stub"


class MemoryProbe(Protocol):
    """Memory of one model's instances, in bytes."""

    name: str  # "rss" | "nvml" | "none"

    def refresh(self, exclude: Sequence[int] = ()) -> int:
        """Find the model's instances again (after a reload); how many were found."""

    def sample(self) -> int | None:
        """Current memory, or None when there is nothing to read."""

    def reset_peak(self) -> bool:
        """Start a new peak window; False when the source keeps no peak of its own."""

    def peak(self) -> int | None:
        """Highest memory since reset_peak(), if the source tracks it."""

    @property
    def instances(self) -> list[int]: ...


# ---------------------------------------------------------------------------------------------
# /proc


@dataclass(frozen=True)
class ProcFS:
    """The bits of /proc the RSS probe reads; `root` is injectable for tests."""

    root: Path = Path("/proc")

    def pids(self) -> list[int]:
        try:
            return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())
        except OSError:
            return []

    def cmdline(self, pid: int) -> list[str]:
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except OSError:
            return []
        return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]

    def status(self, pid: int) -> dict[str, str]:
        try:
            text = (self.root / str(pid) / "status").read_text()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
        return out

    def kib_field(self, pid: int, name: str) -> int | None:
        value = self.status(pid).get(name)
        if not value:
            return None
        try:
            return int(value.split()[0]) * 1024
        except (ValueError, IndexError):
            return None

    def listening_inodes(self, port: int) -> set[str]:
        """Socket inodes listening on TCP `port` (any address), from net/tcp and net/tcp6."""
        inodes = set()
        for table in ("tcp", "tcp6"):
            try:
                lines = (self.root / "net" / table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()
                if len(cols) < 10 or cols[3] != "0A":  # 0A: LISTEN
                    continue
                if int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
        return inodes

    def listening_pid(self, port: int) -> int | None:
        """The process (of those we may inspect) that listens on `port`: which local server is it."""
        inodes = {f"socket:[{i}]" for i in self.listening_inodes(port)}
        if not inodes:
            return None
        for pid in self.pids():
            try:
                fds = list((self.root / str(pid) / "fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(fd) in inodes:
                        return pid
                except OSError:
                    continue
        return None

    def reset_hwm(self, pid: int) -> bool:
        """Reset the kernel's peak-RSS mark (VmHWM) of `pid`; False when not permitted."""
        try:
            (self.root / str(pid) / "clear_refs").write_text("5")
        except OSError:
            return False
        return True


def find_stubs(proc: ProcFS, model: str, server_pid: int | None = None) -> list[int]:
    """Instance processes of `model`: Python-backend stubs whose arguments name `<model>_<g>_<i>`,
    children of `server_pid` when it is given."""
    pattern = re.compile(rf"^{re.escape(model)}_\d+_\d+$")
    found = []
    for pid in proc.pids():
        cmd = proc.cmdline(pid)
        if not cmd or not cmd[0].endswith(STUB_NAME):
            continue
        if not any(pattern.match(arg) for arg in cmd[1:]):
            continue
        if server_pid is not None:
            ppid = proc.status(pid).get("PPid")
            if ppid != str(server_pid):
                continue
        found.append(pid)
    return found


def stub_parents(proc: ProcFS, pids: Sequence[int]) -> set[str]:
    return {proc.status(pid).get("PPid", "?") for pid in pids}


class StubRssProbe:
    """VmRSS summed over the model's stub processes."""

    name = "rss"

    def __init__(self, model: str, server_pid: int | None = None, proc: ProcFS | None = None) -> None:
        self.model = model
        self.server_pid = server_pid
        self.proc = proc or ProcFS()
        self._pids: list[int] = []
        self._retired: set[int] = set()
        self._hwm = False

    @property
    def instances(self) -> list[int]:
        return list(self._pids)

    def refresh(self, exclude: Sequence[int] = ()) -> int:
        """Excluded processes (instances a reload replaced) stay excluded: an old stub lingers for
        a while after its replacement is ready."""
        self._retired.update(exclude)
        self._pids = [p for p in find_stubs(self.proc, self.model, self.server_pid) if p not in self._retired]
        return len(self._pids)

    def alive(self, pids: Sequence[int]) -> list[int]:
        return [pid for pid in pids if self.proc.cmdline(pid)]

    def sample(self) -> int | None:
        values = [self.proc.kib_field(pid, "VmRSS") for pid in self._pids]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    def reset_peak(self) -> bool:
        self._hwm = bool(self._pids) and all(self.proc.reset_hwm(pid) for pid in self._pids)
        return self._hwm

    def peak(self) -> int | None:
        if not self._hwm:
            return None
        values = [self.proc.kib_field(pid, "VmHWM") for pid in self._pids]
        known = [v for v in values if v is not None]
        return sum(known) if known else None


class NvmlProbe:
    """Used memory of the given GPUs (device-wide: NVML has no per-instance view of a model)."""

    name = "nvml"

    def __init__(self, nvml: Nvml, indices: Sequence[int]) -> None:
        self.nvml = nvml
        self.indices = list(indices)
        self._handles = [nvml.handle(i) for i in self.indices]

    @classmethod
    def open(cls, indices: Sequence[int] | None = None, nvml: Any = None) -> "NvmlProbe | None":
        """A probe over `indices` (default: every GPU), or None without NVML or GPUs. `nvml` is
        the `pynvml` module or a fake with its functions (None: import pynvml)."""
        session = Nvml(nvml)
        try:
            session.init()
            count = session.count()
        except NvmlUnavailable:  # NVMLError_LibraryNotFound on a host without a driver, ImportError
            return None
        if count == 0:
            return None
        chosen = [i for i in (indices if indices else range(count)) if 0 <= i < count]
        return cls(session, chosen) if chosen else None

    @property
    def instances(self) -> list[int]:
        return list(self.indices)

    def refresh(self, exclude: Sequence[int] = ()) -> int:
        return len(self._handles)

    def sample(self) -> int | None:
        return sum(self.nvml.memory(h)[1] for h in self._handles)

    def reset_peak(self) -> bool:
        return False

    def peak(self) -> int | None:
        return None


class NullProbe:
    name = "none"

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    @property
    def instances(self) -> list[int]:
        return []

    def refresh(self, exclude: Sequence[int] = ()) -> int:
        return 0

    def sample(self) -> int | None:
        return None

    def reset_peak(self) -> bool:
        return False

    def peak(self) -> int | None:
        return None


def steady_value(probe: MemoryProbe, samples: int = 5, interval_s: float = 0.02) -> int | None:
    """Median of a few readings: an idle instance's memory, robust to one odd sample."""
    values = []
    for i in range(samples):
        value = probe.sample()
        if value is not None:
            values.append(value)
        if i + 1 < samples:
            time.sleep(interval_s)
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]


@dataclass
class PeakSampler:
    """Samples `probe` every `interval_s` in a thread; use as a context manager around a request.

    `peak` is the highest of the samples and, where the source keeps one, its own peak mark.
    """

    probe: MemoryProbe
    interval_s: float = 0.002
    peak: int | None = None
    samples: int = 0
    used_hwm: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _take(self, value: int | None) -> None:
        if value is not None:
            self.samples += 1
            self.peak = value if self.peak is None else max(self.peak, value)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take(self.probe.sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakSampler":
        self.used_hwm = self.probe.reset_peak()
        self._take(self.probe.sample())
        self._thread = threading.Thread(target=self._run, name="tritongen-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        self._take(self.probe.sample())
        if self.used_hwm:
            hwm = self.probe.peak()
            if hwm is not None:
                self.peak = hwm if self.peak is None else max(self.peak, hwm)
