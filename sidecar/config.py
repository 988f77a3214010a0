"""What one sidecar process is told: its policy file, Triton's addresses, its own listeners and
front (the CLI's flags, or an embedding's arguments), read before anything binds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritongen.shared.fronts import DEFAULT_FRONT, checked_front
from tritongen.shared.reach import derived


def split_address(text: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'PORT' -> (host, port); the host defaults to 127.0.0.1."""
    text = text.strip()
    if "://" in text:
        text = text.split("://", 1)[1].split("/", 1)[0]
    if text.isdigit():
        return "127.0.0.1", int(text)
    host, sep, port = text.rpartition(":")
    if not sep:
        return text or "127.0.0.1", default_port
    if not port.isdigit():
        raise ValueError(f"{text!r}: the port must be a number")
    return (host.strip("[]") or "127.0.0.1"), int(port)


@dataclass
class SidecarConfig:
    policy_path: Path
    upstream: str  # Triton HTTP: host:port or http://host:port
    grpc_upstream: str | None = None  # Triton gRPC host:port; None: no gRPC proxy
    triton_metrics_url: str | None = None  # default: http://<upstream host>:8002/metrics
    listen: str = "127.0.0.1:9000"
    grpc_listen: str = "127.0.0.1:9001"
    metrics_listen: str = "127.0.0.1:9002"
    token: str | None = None
    front: str = DEFAULT_FRONT  # tritongen/shared/fronts.py: the choices, and why the default lives there
    watch_interval_s: float = 1.0
    health_interval_s: float = 1.0
    install_signal_handlers: bool = True

    def __post_init__(self) -> None:
        checked_front(self.front)  # a bad choice is refused before anything binds, for the CLI and the API alike

    def metrics_url(self) -> str:
        if self.triton_metrics_url:
            return self.triton_metrics_url
        host, _ = split_address(self.upstream, 8000)
        return f"http://{host}:8002/metrics"

    def metrics_how(self) -> str:
        """The option that sets `metrics_url` (the CLI's), for messages."""
        return "--metrics-url" if self.triton_metrics_url else derived("--metrics-url", "--url", "URL")
