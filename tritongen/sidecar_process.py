"""`tritongen sidecar` as a child process: the demo, the sidecar integration tests and the sidecar
benchmark run it this way, as it is deployed (its own process, its own event loop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import httpx

from tritongen.errors import RunFailed
from tritongen.shared.fronts import DEFAULT_FRONT
from tritongen.shared.processes import free_port, kill_group, tied_to_parent


class Upstream(Protocol):
    """What the sidecar needs to know of Triton (a `TritonServer`, or a stand-in upstream)."""

    http_url: str
    metrics_url: str


class SidecarProcess:
    """Started on free ports on 127.0.0.1 by `__enter__` (which waits until it answers ready),
    stopped by `__exit__` with SIGTERM to its process group (SIGKILL after 10 s)."""

    def __init__(
        self,
        policy: Path,
        upstream: Upstream,
        log: Path,
        grpc_upstream: str | None = None,
        token_file: Path | None = None,
        log_level: str = "warning",
        env: dict[str, str] | None = None,
        front: str = DEFAULT_FRONT,  # as `tritongen sidecar` deploys: nginx in front where it is installed
    ) -> None:
        self.env = None if env is None else {**os.environ, **env}
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = log
        self.args = [
            "sidecar", "--policy", str(policy), "--url", upstream.http_url,
            "--metrics-url", upstream.metrics_url,
            "--listen", f"127.0.0.1:{self.http_port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--log-level", log_level, "--front", front,
        ]
        if grpc_upstream is not None:
            self.args += ["--grpc-url", grpc_upstream, "--grpc-listen", f"127.0.0.1:{self.grpc_port}"]
        if token_file is not None:
            self.args += ["--token-file", str(token_file)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def __enter__(self) -> SidecarProcess:
        handle = open(self.log, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            tied_to_parent([sys.executable, "-c", "from tritongen.cli.main import run; run()", *self.args], signal.SIGKILL),
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env=self.env,
        )
        handle.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RunFailed(f"the sidecar exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://{self.http_url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RunFailed(f"the sidecar was not ready after 30 s:\n{self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)
                self.proc.wait()
