"""Launching a local child process: a port for it to listen on, and its life tied to ours.

Shared by the Triton launcher (tritongen/server.py), the sidecar's nginx front, the child sidecar
(tritongen/sidecar_process.py) and the benches: the sidecar may not import the launcher, and a
second copy of these would drift.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def signal_with_parent(sig: int) -> None:
    """In a preexec_fn: the child gets `sig` when the process that started it dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:  # not glibc/Linux: the PID-based stop still applies
        pass


def term_with_parent() -> None:
    """preexec_fn for nginx: its master gets SIGTERM (nginx's fast shutdown, which takes its workers
    down too) when the process that started it dies; `die_with_parent`'s SIGKILL would orphan the
    workers, which keep the ports."""
    signal_with_parent(signal.SIGTERM)


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the process that started it dies.

    A server in its own session would otherwise outlive a killed parent (a test timeout, a
    SIGKILLed CLI) and keep its ports and memory.
    """
    signal_with_parent(signal.SIGKILL)


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
