"""`tritongen doctor --url HOST:PORT [--url ...] [--window S] [--targets SPEC]`: diagnose live servers.

Reads two scrapes of each server's /metrics `--window` seconds apart plus every ready model's
config, and names the classic failures with the fix for each (see tritongen/core/diagnosis.py).
Several --url are replicas of one deployment: their configs must agree. Exit codes: 0 nothing
found, 1 problems found (or a server could not be read), 2 bad flags.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tritongen.cli.main import app
from tritongen.core.diagnosis import (
    CODES,
    ServerSnapshot,
    busy_fraction,
    diagnose,
    idle_models,
)
from tritongen.core.findings import Finding
from tritongen.doctor import TritonReader, endpoints, snapshot, targets_from_spec


class DoctorFormat(str, Enum):
    text = "text"
    json = "json"


def _summary_table(snap: ServerSnapshot) -> Table:
    table = Table(title=f"{snap.url}: {len(snap.models)} models, window {snap.window_s:.1f} s", title_justify="left")
    for column in ("model", "req/s", "failed", "queue ms", "compute ms/exec", "batch", "busy", "pending"):
        table.add_column(column, justify="right" if column != "model" else "left")
    for name, w in sorted(snap.models.items()):
        config = snap.configs.get(name, {})
        table.add_row(
            name,
            f"{w.success / snap.window_s:.1f}",
            f"{w.failure:.0f}",
            "-" if w.mean_queue_ms is None else f"{w.mean_queue_ms:.1f}",
            "-" if w.compute_per_exec_ms is None else f"{w.compute_per_exec_ms:.1f}",
            "-" if w.mean_batch is None else f"{w.mean_batch:.1f}",
            f"{busy_fraction(w, config, snap.window_s):.0%}",
            f"{w.pending_end:.0f}",
        )
    return table


def finding_lines(finding: Finding) -> list[str]:
    where = f"{finding.path} " if finding.path else ""
    subject = finding.model or "server"
    return [
        f"{finding.severity} {finding.code} {where}{subject}: {CODES.get(finding.code, '')}",
        f"  {finding.message}",
        f"  fix: {finding.fix}",
    ]


@app.command("doctor")
def doctor(
    url: list[str] = typer.Option(..., "--url", help="Triton HTTP HOST:PORT; repeat for replicas of one deployment."),
    metrics_url: Optional[list[str]] = typer.Option(
        None, "--metrics-url", help="Metrics URL per --url, in order (default http://HOST:8002/metrics)."
    ),
    sidecar_metrics_url: Optional[list[str]] = typer.Option(
        None, "--sidecar-metrics-url", help="The sidecar's metrics URL per --url (headroom, prompt lengths)."
    ),
    window: float = typer.Option(10.0, "--window", min=0.5, help="Seconds between the two scrapes."),
    targets: Optional[Path] = typer.Option(
        None, "--targets", help="Deployment spec: each model's latency budget (class P99) and memory watermark."
    ),
    budget_ms: float = typer.Option(1000.0, "--budget-ms", min=0.001, help="Latency budget of models the spec does not name."),
    output_format: DoctorFormat = typer.Option(DoctorFormat.text, "--format", "-f", help="text or json."),
) -> None:
    """Diagnose live Triton servers from their metrics and configs; exit 1 when problems are found."""
    servers = endpoints(url, metrics_url or [], sidecar_metrics_url or [])
    goals = targets_from_spec(targets, budget_ms)
    console = Console(highlight=False, soft_wrap=True)
    with httpx.Client(timeout=10.0) as client:
        if output_format is DoctorFormat.text:
            with Console(stderr=True).status(f"watching {len(servers)} server(s) for {window:g} s ..."):
                snaps = snapshot(servers, window, TritonReader(client, servers))
        else:
            snaps = snapshot(servers, window, TritonReader(client, servers))
    findings = diagnose(snaps, goals)
    idle = idle_models(snaps)
    if output_format is DoctorFormat.json:
        typer.echo(json.dumps({
            "findings": [f.to_dict() for f in findings],
            "idle": idle,
            "budgets": {"source": goals.source, "default_ms": goals.default_budget_ms, "per_model_ms": dict(goals.budget_ms)},
            "servers": [{"url": s.url, "window_s": s.window_s,
                         "models": {m: {"success": w.success, "failure": w.failure, "mean_queue_ms": w.mean_queue_ms,
                                        "mean_request_ms": w.mean_request_ms, "mean_batch": w.mean_batch,
                                        "busy": busy_fraction(w, s.configs.get(m, {}), s.window_s),
                                        "pending": w.pending_end}
                                    for m, w in s.models.items()}} for s in snaps],
        }, indent=2))
    else:
        for snap in snaps:
            console.print(_summary_table(snap))
        console.print(f"latency budgets: {escape(goals.source)}")
        if idle:
            console.print(f"too little traffic in the window for the load rules: {escape(', '.join(idle))}")
        for finding in findings:
            for line in finding_lines(finding):
                console.print(escape(line))
        if findings:
            console.print(f"[bold red]✗ {len(findings)} problem(s)[/]")
        else:
            console.print("[bold green]✓ no problems found[/]")
    if findings:
        raise typer.Exit(code=1)
