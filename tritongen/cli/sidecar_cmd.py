"""`tritongen sidecar --policy POLICY --upstream URL`: admission control in front of Triton."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from tritongen.cli.app import app
from tritongen.errors import BadInput, RunFailed


@app.command("sidecar")
def sidecar(
    policy: Path = typer.Option(..., "--policy", help="The policy file `tritongen render` wrote (sidecar_policy.json)."),
    upstream: str = typer.Option(..., "--upstream", help="Triton's HTTP endpoint, e.g. 127.0.0.1:8000."),
    grpc_upstream: Optional[str] = typer.Option(None, "--grpc-upstream", help="Triton's gRPC endpoint; enables the gRPC proxy."),
    triton_metrics: Optional[str] = typer.Option(
        None, "--triton-metrics", help="Triton's metrics URL (default: http://<upstream host>:8002/metrics)."
    ),
    listen: str = typer.Option("127.0.0.1:9000", "--listen", help="HTTP listen address (HOST:PORT)."),
    grpc_listen: str = typer.Option("127.0.0.1:9001", "--grpc-listen", help="gRPC listen address (with --grpc-upstream)."),
    metrics_listen: str = typer.Option("127.0.0.1:9002", "--metrics-listen", help="Prometheus metrics listen address."),
    token_file: Optional[Path] = typer.Option(
        None, "--token-file", help="File holding the admin bearer token: /sidecar/status, /sidecar/reload and Triton's admin APIs (repository, logging, trace, shared memory), shut without it."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    front: str = typer.Option(
        "auto", "--front", help="Who faces clients: native (nginx with Lua in front: plain classic requests go "
        "straight to Triton on slots the sidecar grants, the rest through the sidecar), python (the sidecar's own "
        "listeners), or auto (native where nginx-light and libnginx-mod-http-lua are installed).",
    ),
) -> None:
    """Proxy Triton's HTTP and gRPC APIs; admit, queue or refuse each request by memory and class.

    The policy reloads on SIGHUP or when the file changes; an invalid policy is refused and the
    old one stays in force. Stops on SIGINT or SIGTERM.
    """
    from sidecar.app import SidecarConfig, serve, split_address
    from sidecar.loop import run as run_loop
    from sidecar.policy import load_policy

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter("use debug, info, warning or error", param_hint="--log-level")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for flag, value in (("--listen", listen), ("--grpc-listen", grpc_listen), ("--metrics-listen", metrics_listen),
                        ("--upstream", upstream)):
        try:
            split_address(value, 0)
        except ValueError as err:
            raise BadInput(f"{flag} {value!r}: {err}") from None
    if front not in ("auto", "native", "python"):
        raise typer.BadParameter("use auto, native or python", param_hint="--front")
    load_policy(policy)  # a bad policy is a usage error (exit 2) before anything binds
    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as err:
            raise BadInput(f"--token-file {token_file}: {err.strerror or err}") from None
        if len(token) < 16:
            raise BadInput(f"--token-file {token_file}: the token must be at least 16 characters")
    config = SidecarConfig(
        policy_path=policy,
        upstream=upstream,
        grpc_upstream=grpc_upstream,
        triton_metrics_url=triton_metrics,
        listen=listen,
        grpc_listen=grpc_listen,
        metrics_listen=metrics_listen,
        token=token,
        front=front,
    )
    try:
        run_loop(serve(config))
    except OSError as err:
        raise RunFailed(f"the sidecar could not start: {err}") from None
