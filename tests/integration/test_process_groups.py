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
