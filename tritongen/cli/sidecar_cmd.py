"""`tritongen sidecar --policy POLICY --url HOST:PORT`: admission control in front of Triton.

Triton's addresses are spelled as on every command (`--url`, `--grpc-url`, `--metrics-url`; see
tritongen/cli/vocabulary.py); `--upstream`, `--grpc-upstream` and `--triton-metrics` are their old
spellings, accepted hidden until the next release.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from tritongen.cli.app import app
from tritongen.cli.shared import renamed
from tritongen.errors import BadInput, RunFailed
from tritongen.shared.fronts import DEFAULT_FRONT


@app.command("sidecar")
def sidecar(
    policy: Path = typer.Option(..., "--policy", help="The policy file `tritongen render` wrote (sidecar_policy.json)."),
    url: Optional[str] = typer.Option(None, "--url", help="Triton's HTTP endpoint HOST:PORT, e.g. 127.0.0.1:8000 (required)."),
    grpc_url: Optional[str] = typer.Option(None, "--grpc-url", help="Triton's gRPC endpoint HOST:PORT; enables the gRPC proxy."),
    metrics_url: Optional[str] = typer.Option(
        None, "--metrics-url", help="Triton's metrics URL (default: http://<--url host>:8002/metrics)."
    ),
    upstream: Optional[str] = typer.Option(None, "--upstream", hidden=True, help="Deprecated: --url."),
    grpc_upstream: Optional[str] = typer.Option(None, "--grpc-upstream", hidden=True, help="Deprecated: --grpc-url."),
    triton_metrics: Optional[str] = typer.Option(None, "--triton-metrics", hidden=True, help="Deprecated: --metrics-url."),
    listen: str = typer.Option("127.0.0.1:9000", "--listen", help="HTTP listen address (HOST:PORT)."),
    grpc_listen: str = typer.Option("127.0.0.1:9001", "--grpc-listen", help="gRPC listen address (with --grpc-url)."),
    metrics_listen: str = typer.Option("127.0.0.1:9002", "--metrics-listen", help="Prometheus metrics listen address."),
    token_file: Optional[Path] = typer.Option(
        None, "--token-file", help="File holding the admin bearer token: /sidecar/status, /sidecar/reload and Triton's admin APIs (repository, logging, trace, shared memory), shut without it."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    front: str = typer.Option(
        DEFAULT_FRONT, "--front", help="Who faces clients: native (nginx with Lua in front: plain classic requests go "
        "straight to Triton on slots the sidecar grants, the rest through the sidecar), python (the sidecar's own "
        "listeners), or auto (native where nginx-light and libnginx-mod-http-lua are installed).",
    ),
) -> None:
    """Proxy Triton's HTTP and gRPC APIs; admit, queue or refuse each request by memory and class.

    The policy reloads on SIGHUP or when the file changes; an invalid policy is refused and the
    old one stays in force. Stops on SIGINT or SIGTERM.
    """
    from sidecar.config import SidecarConfig, split_address
    from sidecar.run import run_loop, serve
    from tritongen.shared.policy_file import load_policy

    url = renamed(url, upstream, "--url", "--upstream")
    grpc_url = renamed(grpc_url, grpc_upstream, "--grpc-url", "--grpc-upstream")
    metrics_url = renamed(metrics_url, triton_metrics, "--metrics-url", "--triton-metrics")
    if url is None:
        raise BadInput("give --url HOST:PORT: Triton's HTTP endpoint, the upstream the sidecar guards")
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter("use debug, info, warning or error", param_hint="--log-level")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for flag, value in (("--listen", listen), ("--grpc-listen", grpc_listen), ("--metrics-listen", metrics_listen),
                        ("--url", url)):
        try:
            split_address(value, 0)
        except ValueError as err:
            raise BadInput(f"{flag} {value!r}: {err}") from None
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
        upstream=url,
        grpc_upstream=grpc_url,
        triton_metrics_url=metrics_url,
        listen=listen,
        grpc_listen=grpc_listen,
        metrics_listen=metrics_listen,
        token=token,
        front=front,  # checked here (tritongen/shared/fronts.py), before anything binds: a bad choice exits 2
    )
    load_policy(policy)  # a bad policy is a usage error (exit 2) before anything binds
    try:
        run_loop(serve(config))
    except OSError as err:
        raise RunFailed(f"the sidecar could not start: {err}") from None
