"""Launching a local child process: a port for it to listen on, and its life tied to ours.

Shared by the Triton launcher (tritongen/server.py), the sidecar's nginx front, the child sidecar
(tritongen/sidecar_process.py) and the benches: the sidecar may not import the launcher, and a
second copy of these would drift.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Collection, Sequence


def tied_to_parent(argv: Sequence[str], sig: signal.Signals, cpus: Collection[int] | None = None) -> list[str]:
    """`argv` prefixed so that the child gets `sig` when the thread that started it dies, and runs on
    `cpus` when given, with nothing run between fork and exec.

    A server in its own session would otherwise outlive a killed parent (a test timeout, a SIGKILLed
    CLI) and keep its ports and memory. Why not a preexec_fn calling prctl there: with one, Python
    forks and runs code in the child, and a parent with gRPC's threads running (the sidecar, a test's
    client) can leave that child inside gRPC's fork handlers. nginx started that way by the sidecar
    aborted at start (SIGABRT, "Epoll1Poller ... epoll_wait error: Bad file descriptor", 2026-12-04,
    two test modules at once). util-linux's setpriv and taskset (Debian's essential set) set the same
    and exec the program, so the PID stays the program's. Without setpriv (not Linux) the child is not
    tied, and the PID-based stop still applies. As with prctl in a preexec_fn, a parent that dies
    before setpriv has run leaves the child untied; our parents wait for their child to be ready.
    """
    command = list(argv)
    if cpus:
        taskset = shutil.which("taskset")
        if taskset is None:
            raise FileNotFoundError("pinning a child process to CPUs needs util-linux's taskset on PATH")
        command = [taskset, "--cpu-list", ",".join(str(c) for c in sorted(cpus)), *command]
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        command = [setpriv, "--pdeathsig", signal.Signals(sig).name, "--", *command]
    return command


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (racy by nature, but collisions are rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    """Signal the process group `proc` leads (started with start_new_session), never another one.

    After the leader is reaped its number is free, and Linux hands it out again only once no
    process still has it as a group ID. So if a process with that number exists again, our group
    has no member left and the number now belongs to someone else: a vLLM engine's threads use up
    PIDs fast enough (pid_max 32768) for a server reaped early in a test session to have its number
    taken by a later session leader, which a blind killpg would kill (a vLLM-backed tritonserver died
    right after starting in 2 of 5 full suite runs, 2026-12-04). While the leader is unreaped (alive
    or a zombie) the number is still ours and the group is signalled.
    """
    pid = proc.pid
    if proc.returncode is not None and os.path.exists(f"/proc/{pid}"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
