"""`tritongen plan SPEC --profiles DIR --peak-qps Q [--daily-curve FILE]`: size the fleet, print the arithmetic.

For each model entry: the measured throughput at its latency target (from its profile), pods at the
peak, hot and cold pools, GPUs; with a daily curve, the pre-warm schedule. The arithmetic lines come
from tritongen.core.capacity and can be redone by hand. `tritongen deploy --profiles ... --peak-qps`
uses the same functions to size the pools it renders.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.core.capacity import DEFAULT_HOT_FRACTION, DEFAULT_SAFETY_FACTOR, CapacityPlan, fmt_time
from tritongen.fleet import DEFAULT_POD_OVERHEAD_S, capacity_from_options
from tritongen.specio import load_spec

console = Console(highlight=False)


def capacity_to_dict(capacity: CapacityPlan) -> dict:
    out = dataclasses.asdict(capacity)
    out["gpus"] = capacity.gpus
    out["prewarm"] = [
        {**dataclasses.asdict(s), "start": fmt_time(s.start_min), "end": fmt_time(s.end_min),
         "scale_up": fmt_time(s.scale_up_min)}
        for s in capacity.prewarm
    ]
    return out


# ---------------------------------------------------------------------------------------------
# The command


@app.command("plan")
def plan(
    spec: Path = typer.Argument(..., help="Deployment spec (YAML)."),
    profiles: Path = typer.Option(..., "--profiles", help="Directory of profile JSON files (`tritongen profile -o`)."),
    peak_qps: list[str] = typer.Option(
        ..., "--peak-qps", help="Daily peak in requests/s: Q for every model, or MODEL=Q (repeatable)."
    ),
    daily_curve: Optional[Path] = typer.Option(
        None, "--daily-curve", help="YAML: `hourly` (24 fractions of the peak) or `points` (time, fraction)."
    ),
    safety_factor: float = typer.Option(
        DEFAULT_SAFETY_FACTOR, "--safety-factor", help="Load each pod to this share of its measured throughput (0.70-0.85)."
    ),
    hot_fraction: float = typer.Option(
        DEFAULT_HOT_FRACTION, "--hot-fraction", help="Share of the daily peak the resident hot pool serves."
    ),
    cold_start_s: Optional[float] = typer.Option(
        None, "--cold-start-s", help="Seconds from scale-up to a warm pod (default: measured, the curve's, or 300)."
    ),
    measure_cold_start_repo: Optional[Path] = typer.Option(
        None, "--measure-cold-start", metavar="REPO",
        help="Measure the cold start: start the embedded Triton on REPO and time it until every model answered.",
    ),
    pod_overhead_s: float = typer.Option(
        DEFAULT_POD_OVERHEAD_S, "--pod-overhead-s", help="Added to a measured cold start: scheduling, image start."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of text."),
) -> None:
    """Size hot and cold pools from measured throughput at the latency target; print the arithmetic."""
    loaded = load_spec(spec)
    capacity = capacity_from_options(
        loaded, profiles, peak_qps, daily_curve, safety_factor, hot_fraction, cold_start_s,
        measure_cold_start_repo, pod_overhead_s,
    )
    if as_json:
        typer.echo(json.dumps(capacity_to_dict(capacity), indent=2, sort_keys=True))
        return
    console.rule(f"{loaded.spec.name}: fleet plan")
    for line in capacity.lines:
        typer.echo(line)
    table = Table(title="per model")
    for column in ("model", "peak req/s", "req/s per pod", "x safety", "pods", "hot", "instances", "GPUs"):
        table.add_column(column)
    for m in capacity.models:
        table.add_row(m.model, f"{m.peak_qps:g}", f"{m.throughput_per_s:.4g}", f"{m.capacity_per_pod:.4g}",
                      str(m.pods), str(m.hot_pods), str(m.instances), str(m.gpus))
    console.print(table)
    typer.echo(
        f"fleet: {capacity.pods} pods ({capacity.gpus} GPUs) = hot {capacity.hot_pods} resident + cold up to "
        f"{capacity.cold_max} elastic; binding model {capacity.binding_model}"
    )
    if capacity.prewarm:
        schedule = Table(title=f"pre-warm schedule ({capacity.timezone})")
        for column in ("stretch", "load", "pods", "cold pods", "scale up at"):
            schedule.add_column(column)
        for step in capacity.prewarm:
            schedule.add_row(f"{fmt_time(step.start_min)}-{fmt_time(step.end_min)}", f"{step.fraction:g}",
                             str(step.pods), str(step.cold_pods), fmt_time(step.scale_up_min))
        console.print(schedule)
