"""`tritongen dashboard [SPEC] -o FILE`: the Grafana dashboard JSON (import it, or let deploy ship it).

The spec is the first positional, as on every command that reads one; `--spec` is its old spelling."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tritongen.cli.app import app
from tritongen.cli.shared import renamed
from tritongen.core.spec import MIB
from tritongen.dashboard import SIDECAR_METRICS, DashboardOptions, dashboard_json, dashboard_uid, write_text_atomic
from tritongen.errors import BadInput
from tritongen.specio import load_spec

console = Console(highlight=False, stderr=True)


@app.command("dashboard")
def dashboard(
    spec: Optional[Path] = typer.Argument(
        None, show_default=False, help="Deployment spec: title, the P99 target line and the memory pad threshold."
    ),
    out: Path = typer.Option(..., "-o", "--out", help="JSON file to write ('-' for stdout)."),
    title: Optional[str] = typer.Option(None, "--title", help="Dashboard title."),
    uid: Optional[str] = typer.Option(None, "--uid", help="Dashboard uid (letters, digits, '-', '_'; at most 40)."),
    sidecar_metric: Optional[list[str]] = typer.Option(
        None, "--sidecar-metric", help=f"Override a sidecar metric name, KEY=NAME; keys: {', '.join(SIDECAR_METRICS)}."
    ),
    spec_option: Optional[Path] = typer.Option(None, "--spec", hidden=True, help="Deprecated: SPEC, the first positional."),
) -> None:
    """Write a Grafana dashboard: GPU utilisation, TTFT, P99 latency, QPS, rejections, memory headroom, per model."""
    spec = renamed(spec, spec_option, "SPEC", "--spec")
    options = DashboardOptions()
    if spec is not None:
        loaded = load_spec(spec)
        options = DashboardOptions(
            title=f"Triton fleet: {loaded.spec.name}", uid=dashboard_uid(loaded.spec.name),
            p99_target_ms=min(c.p99_ms for c in loaded.spec.traffic_classes),
            memory_pad_bytes=loaded.spec.safety_pad_mb() * MIB,
        )
    overrides: dict[str, str] = {}
    for item in sidecar_metric or []:
        key, sep, name = item.partition("=")
        if not sep or key not in SIDECAR_METRICS or not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", name):
            raise BadInput(f"--sidecar-metric {item!r}: use KEY=metric_name with KEY one of {sorted(SIDECAR_METRICS)}")
        overrides[key] = name
    if uid is not None and not re.match(r"^[A-Za-z0-9_-]{1,40}$", uid):
        raise BadInput(f"--uid {uid!r}: Grafana uids are 1-40 letters, digits, '-' or '_'")
    options = DashboardOptions(
        title=title or options.title, uid=uid or options.uid, p99_target_ms=options.p99_target_ms,
        memory_pad_bytes=options.memory_pad_bytes, sidecar=overrides or None,
    )
    text = dashboard_json(options)
    if str(out) == "-":
        typer.echo(text, nl=False)
        return
    write_text_atomic(out, text)
    console.print(f"dashboard {options.title!r} ({options.uid}) written to {out}")
