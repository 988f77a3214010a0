"""`tritongen serve REPO`: the embedded tritonserver from the nvidia-pytriton wheel, on 127.0.0.1."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tritongen.cli.app import app
from tritongen.server import ServerOptions, TritonServer
from tritongen.server_flags import server_flags_from

console = Console(stderr=True)


@app.command("serve")
def serve(
    repo: Path = typer.Argument(..., help="Model repository."),
    http_port: int = typer.Option(0, help="HTTP port (0: pick a free one)."),
    grpc_port: int = typer.Option(0, help="gRPC port (0: pick a free one)."),
    metrics_port: int = typer.Option(0, help="Metrics port (0: pick a free one)."),
    model_control: str = typer.Option("none", help="'none' (load all) or 'explicit'."),
    log_file: Optional[Path] = typer.Option(None, help="Write the server log here (default: a temp file)."),
) -> None:
    """Start tritonserver, wait until it and every model are ready, run until Ctrl-C."""
    if model_control not in ("none", "explicit"):
        raise typer.BadParameter("must be 'none' or 'explicit'", param_hint="--model-control")
    options = ServerOptions(
        repository=repo.resolve(),
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_control=model_control,
        extra_args=server_flags_from(repo),
    )
    server = TritonServer(options, log_path=log_file)
    with console.status("starting tritonserver..."):
        server.start()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        console.print(
            f"[green]ready[/] http={server.http_url} grpc={server.grpc_url} metrics={server.metrics_url} "
            f"log={server.log_path} (Ctrl-C to stop)"
        )
        while not stop["now"] and server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
        ended = server.exit_report()
        if ended is not None:
            console.print(ended, style="red", markup=False)
            raise typer.Exit(code=1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        console.print("stopped")
