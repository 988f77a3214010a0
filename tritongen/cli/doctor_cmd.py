"""`tritongen doctor [SPEC] --url HOST:PORT [--url ...] [--window S] [--json]`: diagnose live servers.

Reads two scrapes of each server's /metrics `--window` seconds apart plus every ready model's
config, and names the classic failures with the fix for each (see tritongen/core/diagnosis.py);
LLM engines are judged from their own metrics and the sidecar's (tritongen/core/llm_diagnosis.py),
and a decoupled model doctor cannot see inside is named as such, never called healthy. Several
--url are replicas of one deployment: their configs must agree. Exit codes: 0 nothing found, 1
problems found (or a server could not be read), 2 bad flags. The spec is the first positional and
`--json` the machine output, as on every command; `--targets` and `--format` are the old spellings.
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

from tritongen.cli.app import app
from tritongen.cli.shared import output_from_format, renamed
from tritongen.core.diagnosis import CODES, busy_fraction, diagnose, idle_models
from tritongen.core.diagnosis_inputs import ServerSnapshot
from tritongen.core.engine_window import EngineWindow, Gauge, SidecarWindow
from tritongen.core.findings import Finding
from tritongen.core.llm_diagnosis import BlindSpot, blind_spots, kills_seen
from tritongen.doctor import TritonReader, endpoints, snapshot, targets_from_spec


class DoctorFormat(str, Enum):
    """The values of the deprecated `--format` (now `--json`, or nothing for text)."""

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


def _gauge(g: Gauge | None, percent: bool = False, inferred: bool = False) -> str:
    if g is None:
        return "-"
    if inferred:  # one mean over the window, no peak of its own
        return f"~{g.mean:.1f} (inferred)"
    return f"{g.mean:.0%} (peak {g.peak:.0%})" if percent else f"{g.mean:.1f} (peak {g.peak:.0f})"


def _ms_quantiles(hist) -> str:
    if hist is None or not hist.count:
        return "-"
    return f"{1000 * (hist.quantile(0.5) or 0):.0f} / {1000 * (hist.quantile(0.99) or 0):.0f}"


def _engine_table(snap: ServerSnapshot) -> Table:
    table = Table(title=f"{snap.url}: LLM engines (their own metrics and the sidecar's)", title_justify="left")
    for column in ("model", "seen through", "running", "waiting", "KV used", "preempt/s", "killed",
                   "TTFT P50 / P99 ms"):
        table.add_column(column, justify="left" if column in ("model", "seen through") else "right")
    for name in sorted(set(snap.engines) | set(snap.sidecar)):
        e: EngineWindow | None = snap.engines.get(name)
        s = snap.sidecar.get(name)
        through = ", ".join(([f"{e.family} metrics"] if e is not None else []) + (["the sidecar"] if s is not None else []))
        kills = max(kills_seen(e, s))
        rate = e.preemptions_per_s if e else None
        ttft = _ms_quantiles(e.ttft) if e is not None and e.ttft is not None else "-"
        if s is not None:
            ttft = "; ".join(f"{k} {_ms_quantiles(c.ttft)}" for k, c in sorted(s.classes.items()) if c.ttft.count) or ttft
        inferred = e.inferred if e else ()
        table.add_row(name, through, _gauge(e.running if e else None, inferred="running" in inferred),
                      _gauge(e.waiting if e else None, inferred="waiting" in inferred),
                      _gauge(e.kv_used if e else None, percent=True), "-" if rate is None else f"{rate:.1f}",
                      f"{kills:.0f}", ttft)
    return table


def _engine_json(e: EngineWindow | None) -> dict | None:
    if e is None:
        return None

    def gauge(g: Gauge | None) -> dict | None:
        return None if g is None else {"mean": g.mean, "peak": g.peak, "last": g.last}

    def quantiles(h) -> dict | None:
        return None if h is None or not h.count else {"count": h.count, "p50_s": h.quantile(0.5), "p99_s": h.quantile(0.99)}

    return {"family": e.family, "metrics": list(e.metrics), "running": gauge(e.running), "waiting": gauge(e.waiting),
            "kv_used": gauge(e.kv_used), "max_running": e.max_running, "preemptions": e.preemptions,
            "oom_kills": e.oom_kills, "ttft": quantiles(e.ttft), "queue_time": quantiles(e.queue_time),
            "inferred": list(e.inferred), "inference": e.inference}


def _sidecar_json(s: SidecarWindow | None) -> dict | None:
    if s is None:
        return None
    return {"oom_kills": s.oom_kills, "refused": s.refused, "classes": {
        k: {"admitted": c.admitted, "rejected": dict(c.rejected), "finished": dict(c.finished),
            "ttft_p50_s": c.ttft.quantile(0.5), "ttft_p99_s": c.ttft.quantile(0.99), "first_tokens": c.ttft.count}
        for k, c in sorted(s.classes.items())}}


def _blind_json(spots: list[BlindSpot]) -> list[dict]:
    return [{"model": b.model, "missing": list(b.missing), "why": b.why, "how": b.how, "inferred": list(b.inferred),
             "inference": b.inference} for b in spots]


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
    spec: Optional[Path] = typer.Argument(
        None, show_default=False,
        help="Deployment spec: each model's latency budget (class P99) and memory watermark (default: --budget-ms).",
    ),
    url: list[str] = typer.Option(..., "--url", help="Triton HTTP HOST:PORT; repeat for replicas of one deployment."),
    metrics_url: Optional[list[str]] = typer.Option(
        None, "--metrics-url", help="Metrics URL per --url, in order (default http://HOST:8002/metrics)."
    ),
    sidecar_metrics_url: Optional[list[str]] = typer.Option(
        None, "--sidecar-metrics-url", help="The sidecar's metrics URL per --url (headroom, prompt lengths)."
    ),
    window: float = typer.Option(10.0, "--window", min=0.5, help="Seconds of metrics to read."),
    sample_every: float = typer.Option(
        1.0, "--sample-every", min=0.1, help="Seconds between scrapes inside the window (the engines' gauges)."
    ),
    budget_ms: float = typer.Option(1000.0, "--budget-ms", min=0.001, help="Latency budget of models the spec does not name."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings and the servers' figures as one JSON object."),
    targets: Optional[Path] = typer.Option(None, "--targets", hidden=True, help="Deprecated: SPEC, the first positional."),
    output_format: Optional[DoctorFormat] = typer.Option(
        None, "--format", "-f", hidden=True, help="Deprecated: --json, or nothing for text."
    ),
) -> None:
    """Diagnose live Triton servers from their metrics and configs; exit 1 when problems are found."""
    spec = renamed(spec, targets, "SPEC", "--targets")
    as_json = output_from_format(None if output_format is None else output_format.value, {"json": as_json}) == "json"
    servers = endpoints(url, metrics_url or [], sidecar_metrics_url or [])
    goals = targets_from_spec(spec, budget_ms)
    console = Console(highlight=False, soft_wrap=True)
    with httpx.Client(timeout=10.0) as client:
        if not as_json:
            with Console(stderr=True).status(f"watching {len(servers)} server(s) for {window:g} s ..."):
                snaps = snapshot(servers, window, TritonReader(client, servers), every_s=sample_every)
        else:
            snaps = snapshot(servers, window, TritonReader(client, servers), every_s=sample_every)
    findings = diagnose(snaps, goals)
    idle = idle_models(snaps)
    blind = [spot for snap in snaps for spot in blind_spots(snap)]
    if as_json:
        typer.echo(json.dumps({
            "findings": [f.to_dict() for f in findings],
            "idle": idle,
            "unseen": _blind_json(blind),
            "budgets": {"source": goals.source, "default_ms": goals.default_budget_ms, "per_model_ms": dict(goals.budget_ms)},
            "servers": [{"url": s.url, "window_s": s.window_s,
                         "models": {m: {"success": w.success, "failure": w.failure, "mean_queue_ms": w.mean_queue_ms,
                                        "mean_request_ms": w.mean_request_ms, "mean_batch": w.mean_batch,
                                        "busy": busy_fraction(w, s.configs.get(m, {}), s.window_s),
                                        "pending": w.pending_end, "engine": _engine_json(s.engines.get(m)),
                                        "sidecar": _sidecar_json(s.sidecar.get(m))}
                                    for m, w in s.models.items()}} for s in snaps],
        }, indent=2))
    else:
        for snap in snaps:
            console.print(_summary_table(snap))
            if snap.engines or snap.sidecar:
                console.print(_engine_table(snap))
        console.print(f"latency budgets: {escape(goals.source)}")
        if idle:
            console.print(f"too little traffic in the window for the load rules: {escape(', '.join(idle))}")
        for finding in findings:
            for line in finding_lines(finding):
                console.print(escape(line))
        for spot in blind:
            console.print(escape(f"unseen {spot.text}"))
        if findings:
            console.print(f"[bold red]✗ {len(findings)} problem(s)[/]")
        elif blind:
            console.print(f"[bold yellow]? no problems in what doctor could see; it could not see inside "
                          f"{escape(', '.join(sorted({b.model for b in blind})))}[/]")
        else:
            console.print("[bold green]✓ no problems found[/]")
    if findings:
        raise typer.Exit(code=1)
