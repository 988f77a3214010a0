"""kill_group signals a child's process group only while the number is still the child's."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import pytest

from tritongen.shared import processes

pytestmark = pytest.mark.integration


@dataclass
class Reaped:
    """What kill_group reads from a Popen: its pid and whether it has been reaped."""

    pid: int
    returncode: int | None


def test_a_reaped_leader_whose_number_was_reused_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    # This test's own PID stands for a number taken again by another process after the reap.
    processes.kill_group(Reaped(os.getpid(), 0))  # type: ignore[arg-type]
    assert sent == []


def test_an_unreaped_leader_or_orphaned_group_is_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    processes.kill_group(Reaped(os.getpid(), None), signal.SIGTERM)  # type: ignore[arg-type]  # alive or a zombie: still ours
    processes.kill_group(Reaped(4242, -9))  # type: ignore[arg-type]  # reaped, number free: only our orphans can hold it
    assert sent == [(os.getpid(), signal.SIGTERM), (4242, signal.SIGKILL)]


def test_a_group_already_gone_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(os, "killpg", gone)
    processes.kill_group(Reaped(4242, None))  # type: ignore[arg-type]


def test_a_tied_child_gets_the_signal_when_its_parent_dies_and_runs_on_its_cpus() -> None:
    """tied_to_parent sets the parent-death signal and the CPUs with no code run in the child
    before exec: a parent that started a child that way and died takes the child with it."""
    import subprocess
    import sys
    import time

    cpu = min(os.sched_getaffinity(0))
    # The parent exits once the child runs `sleep` (setpriv has set the signal): a parent that dies
    # before that leaves an orphan the signal never reaches, a race a server's parent never runs
    # (it waits for the server to be ready).
    parent = (
        "import subprocess, signal, time\n"
        "from tritongen.shared.processes import tied_to_parent\n"
        f"child = subprocess.Popen(tied_to_parent(['sleep', '60'], signal.SIGTERM, {{{cpu}}}), stdout=subprocess.DEVNULL)\n"
        "deadline = time.monotonic() + 10\n"
        "while time.monotonic() < deadline and open(f'/proc/{child.pid}/comm').read().strip() != 'sleep':\n"
        "    time.sleep(0.01)\n"
        "print(child.pid, flush=True)\n"
    )
    started = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=30, check=True)
    pid = int(started.stdout.strip())
    deadline = time.monotonic() + 10
    state = ""
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as status:
                state = status.read()
        except FileNotFoundError:
            break  # gone and reaped
        if "\nState:\tZ" in state:
            break  # killed; its new parent has not reaped it yet
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the child outlived its parent: {state[:200]}")
    pinned = subprocess.run(processes.tied_to_parent(["grep", "Cpus_allowed_list", "/proc/self/status"], signal.SIGTERM, {cpu}),
                            capture_output=True, text=True, timeout=30, check=True)
    assert pinned.stdout.split()[-1] == str(cpu)
