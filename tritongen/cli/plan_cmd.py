"""`tritongen plan SPEC --profiles DIR --peak-qps Q [--daily-curve FILE]`: size the fleet, print the arithmetic.

For each model entry: the measured throughput at its latency target (from its profile), pods at the
peak, hot and cold pools, GPUs; with a daily curve, the pre-warm schedule. The arithmetic lines come
from tritongen.core.capacity and can be redone by hand. `tritongen deploy --profiles ... --peak-qps`
uses the same functions to size the pools it renders.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from pathlib import Path
from typing import Optional

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tritongen.cli.main import app
from tritongen.core.capacity import (
    DEFAULT_COLD_START_S,
    DEFAULT_HOT_FRACTION,
    DEFAULT_SAFETY_FACTOR,
    CapacityPlan,
    DailyCurve,
    ModelDemand,
    fmt_time,
    peak_qps_per_model,
    plan_capacity,
    throughput_at_target,
)
from tritongen.core.plan import DeploymentPlan, plan_deployment
from tritongen.core.profile_types import Profile
from tritongen.errors import BadInput, RunFailed
from tritongen.profiles import read_profiles
from tritongen.specio import LoadedSpec, format_loc, load_spec

console = Console(highlight=False)
DEFAULT_POD_OVERHEAD_S = 60.0


# ---------------------------------------------------------------------------------------------
# Readers (the adapters around the pure arithmetic)


def read_daily_curve(path: Path) -> DailyCurve:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"--daily-curve {path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise BadInput(f"--daily-curve {path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"--daily-curve {path}: a mapping with `hourly` (24 factors) or `points` is expected")
    try:
        return DailyCurve.model_validate(data)
    except ValidationError as err:
        problems = "\n  ".join(
            f"{format_loc(tuple(e['loc']))}: {str(e['msg']).removeprefix('Value error, ')}" for e in err.errors()
        )
        raise BadInput(f"--daily-curve {path}:\n  {problems}") from None


def parse_peaks(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """['400', 'ranker=300'] -> (400.0, {'ranker': 300.0})."""
    default: float | None = None
    per_model: dict[str, float] = {}
    for text in values:
        name, sep, number = text.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            raise BadInput(f"--peak-qps {text!r}: give a number (every model) or MODEL=NUMBER") from None
        if value < 0:
            raise BadInput(f"--peak-qps {text!r}: must be >= 0")
        if sep:
            per_model[name] = value
        else:
            default = value
    return default, per_model


def demands_for(
    loaded: LoadedSpec, plan: DeploymentPlan, profiles: dict[str, Profile], peaks: dict[str, float]
) -> list[ModelDemand]:
    spec = loaded.spec
    missing = [e.name for e in plan.entries if e.name not in profiles]
    if missing:
        raise BadInput(
            f"no profile for model entries {missing} (profiles found: {sorted(profiles)}); run "
            f"`tritongen profile` for them"
        )
    demands = []
    models = {m.name: m for m in spec.models}
    for entry in plan.entries:
        model = models[entry.spec_model]
        target = min(c.p99_ms for c in spec.classes_of(model))
        measured = throughput_at_target(profiles[entry.name], target)
        # Rounded to 0.01 req/s so the printed arithmetic can be redone exactly from the printed numbers.
        rate = round(measured.requests_per_s, 2)
        gpus = 0 if spec.hardware.cpu_only else model.tensor_parallel * model.replicas
        instances = sum(g.count * max(1, len(g.gpus)) for g in entry.instance_groups)
        demands.append(
            ModelDemand(
                model=entry.name, peak_qps=peaks[entry.name], throughput_per_s=rate,
                target_ms=target, source=measured.source, instances_per_pod=instances, gpus_per_pod=gpus,
            )
        )
    return demands


def _selfcheck_module():
    from tritongen.render import builtin_templates_dir

    path = builtin_templates_dir() / "k8s" / "scripts" / "selfcheck.py"
    module_spec = importlib.util.spec_from_file_location("tritongen_selfcheck", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def measure_cold_start(repo: Path, plan: DeploymentPlan) -> float:
    """Seconds from starting the embedded tritonserver on REPO to every model answering its warm-up request."""
    from tritongen.cli.serve_cmd import server_flags_from
    from tritongen.k8s import warmup_requests
    from tritongen.server import ServerOptions, TritonServer

    selfcheck = _selfcheck_module()
    server = TritonServer(ServerOptions(repository=Path(repo).resolve(), extra_args=server_flags_from(repo)))
    start = time.monotonic()
    with server:
        problems = selfcheck.check(server.http_url, warmup_requests(plan), 60.0)
        took = time.monotonic() - start
    if problems:
        raise RunFailed(f"--measure-cold-start {repo}: the warm-up requests failed: {'; '.join(problems)}")
    return took


def capacity_from_options(
    loaded: LoadedSpec,
    profiles_dir: Path,
    peak_qps: list[str],
    daily_curve: Path | None,
    safety_factor: float,
    hot_fraction: float,
    cold_start_s: float | None,
    measure_repo: Path | None,
    pod_overhead_s: float,
) -> CapacityPlan:
    plan = plan_deployment(loaded.spec, loaded.architectures)
    profiles = read_profiles(profiles_dir)
    default, overrides = parse_peaks(peak_qps)
    peaks = peak_qps_per_model([e.name for e in plan.entries], default, overrides)
    demands = demands_for(loaded, plan, profiles, peaks)
    curve = read_daily_curve(daily_curve) if daily_curve is not None else None
    if cold_start_s is not None:
        cold, note = cold_start_s, "given with --cold-start-s"
    elif measure_repo is not None:
        measured = measure_cold_start(measure_repo, plan)
        cold = measured + pod_overhead_s
        note = (f"measured: {measured:.1f} s start-to-warm on the embedded server + {pod_overhead_s:g} s "
                "for scheduling and image start")
    elif curve is not None and curve.cold_start_s is not None:
        cold, note = curve.cold_start_s, f"from {daily_curve}"
    else:
        cold, note = DEFAULT_COLD_START_S, "assumed; measure it with --measure-cold-start REPO or pass --cold-start-s"
    gpus_per_pod = sum(g.count for g in loaded.spec.hardware.gpus)
    return plan_capacity(demands, gpus_per_pod, safety_factor, hot_fraction, curve, cold, note)


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
