"""Launching a local child process: a port for it to listen on, and its life tied to ours.

Shared by the Triton launcher (tritongen/server.py), the sidecar's nginx front, the child sidecar
(tritongen/sidecar_process.py) and the benches: the sidecar may not import the launcher, and a
second copy of these would drift.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
from collections.abc import Collection, Sequence
from pathlib import Path


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


# Listening ports are drawn from here up to the kernel's ephemeral range: above the well-known and
# commonly configured service ports (Triton's 8000-8002, Prometheus' 9090, ...), below the ports the
# kernel hands to outgoing connections.
LOW_PORT = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_draw = random.SystemRandom()  # never the seeded module-level generator: two processes must not draw alike


def _listening_range() -> tuple[int, int] | None:
    """[low, high) for ports to listen on, or None when the ephemeral range is unknown or leaves
    too little room below it."""
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (LOW_PORT, first) if first - LOW_PORT >= 1000 else None


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on 127.0.0.1 now. With SO_REUSEADDR, as servers bind
    (tritonserver, nginx): a closed connection's socket lingering in TIME_WAIT does not hold the
    port, a listener or a live connection does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a child to listen on. Racy by nature: it is free until the
    child binds it. Why not the kernel's `bind(0)`: that draws from the ephemeral range, which every
    outgoing connection on the host also draws from, and a server that takes 30 s to load its models
    (a vLLM engine) loses its port to a client's connection meanwhile ("failed to start GRPC
    service: Socket ... already in use", two test modules at once, 2026-12-05). A random free port
    below that range is only taken by another process that picks a listening port the same way."""
    bounds = _listening_range()
    if bounds is not None:
        for _ in range(64):
            port = _draw.randrange(*bounds)
            if port_free(port):
                return port
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
