"""`tritongen simulate --profile P --config C [--config C2 ...] --traffic T`: predict, side by side.

Each config.pbtxt is simulated under the same arrivals (same seed) with the service curve of the
profile, and the figures print in one table, one column per config: per-class P50/P90/P99 (time
to first token for streaming models), throughput, queue time, rejections and OOM kills, and the
model's utilisation and mean batch. Milliseconds of CPU per config, not minutes of server time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from rich.table import Table

from tritongen.cli.main import app
from tritongen.core.simulator import (
    EMBEDDED_CPU_OVERHEADS,
    LLMCurve,
    Overheads,
    ServerSim,
    ServiceCurve,
    SimResult,
    model_sim_from_config,
    rate_limit_from_flags,
    simulate,
)
from tritongen.core.traffic import Arrivals, TrafficSpec, TraceError, generate_arrivals
from tritongen.errors import BadInput
from tritongen.pbtxt import parse_model_config
from tritongen.specio import format_loc

console = Console()


# ---------------------------------------------------------------------------------------------
# Reading inputs (shared with `tune` and the benchmarks)


def read_traffic(path: Path) -> tuple[TrafficSpec, str | None]:
    """A traffic file and, for a trace, the CSV text it names (relative to the traffic file)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"--traffic {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise BadInput(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a traffic file is a mapping with `shape`, `rate_per_s`, `classes`, ...")
    if "shape" not in data and "hourly" in data:
        raise BadInput(f"{path}: this is a daily load curve for `tritongen plan`, not a traffic shape (no `shape:`)")
    try:
        spec = TrafficSpec.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in err.errors())
        raise BadInput(f"{path}: {problems}") from None
    text = None
    if spec.trace is not None:
        csv_path = Path(spec.trace.path)
        if not csv_path.is_absolute():
            csv_path = path.parent / csv_path
        try:
            text = csv_path.read_text()
        except OSError as err:
            raise BadInput(f"{path}: trace {csv_path}: {err}") from None
    return spec, text


def arrivals_from(spec: TrafficSpec, trace_text: str | None, seed: int, requests: int | None, source: str = "traffic") -> Arrivals:
    try:
        return generate_arrivals(spec, seed=seed, trace_text=trace_text, requests=requests)
    except TraceError as err:
        raise BadInput(str(err)) from None
    except ValueError as err:
        raise BadInput(f"{source}: {err}") from None


class CurveFile(BaseModel):
    """A hand-written service curve (e.g. a GPU-like one for what-if runs) instead of a profile."""

    model_config = ConfigDict(extra="forbid")
    curve: ServiceCurve | None = None
    llm: LLMCurve | None = None
    overheads: Overheads | None = None


def read_service(path: Path) -> tuple[ServiceCurve | None, LLMCurve | None, Overheads | None]:
    """A `tritongen profile` JSON, or a curve file (YAML/JSON with `curve:` and/or `llm:`)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"--profile {path}: no such file")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise BadInput(f"{path}: not valid JSON/YAML: {err}") from None
    if isinstance(data, dict) and "schema_version" in data:
        from tritongen.core.profile_types import read_profile

        try:
            profile = read_profile(text)
        except ValidationError as err:
            raise BadInput(f"{path}: not a profile this version reads: {err.errors()[0]['msg']}") from None
        try:
            if profile.kind == "streaming":
                return None, LLMCurve.from_profile(profile), None
            return ServiceCurve.from_profile(profile), None, None
        except ValueError as err:
            raise BadInput(f"{path}: {err}") from None
    try:
        cf = CurveFile.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg']}" for e in err.errors())
        raise BadInput(f"{path}: not a profile or curve file: {problems}") from None
    if cf.curve is None and cf.llm is None:
        raise BadInput(f"{path}: a curve file needs `curve:` (fixed_ms, per_item_ms) or `llm:`")
    return cf.curve, cf.llm, cf.overheads


def parse_overheads(text: str | None, fallback: Overheads | None) -> Overheads:
    """'embedded' (default), 'none', or key=value pairs over the embedded figures."""
    if text is None:
        return fallback or EMBEDDED_CPU_OVERHEADS
    if text == "embedded":
        return EMBEDDED_CPU_OVERHEADS
    if text == "none":
        return Overheads()
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise BadInput(f"--overheads: expected embedded, none or key=value pairs, got {part!r}")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise BadInput(f"--overheads: {key.strip()} takes a number, got {value!r}") from None
    try:
        return Overheads.model_validate({**EMBEDDED_CPU_OVERHEADS.model_dump(), **values})
    except ValidationError as err:
        first = err.errors()[0]
        raise BadInput(f"--overheads: {format_loc(tuple(first['loc']))}: {first['msg']}") from None


def flags_near(config: Path) -> list[str]:
    """server_flags.txt of the repository a config.pbtxt sits in (what `render` writes)."""
    candidate = config.resolve().parent.parent / "server_flags.txt"
    if candidate.is_file():
        return [ln.strip() for ln in candidate.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return []


# ---------------------------------------------------------------------------------------------
# Printing


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def results_table(title: str, labels: list[str], results: list[SimResult], streaming: bool) -> Table:
    table = Table(title=title, show_lines=False)
    table.add_column("", style="bold")
    for label in labels:
        table.add_column(label, justify="right")
    names = [c.name for c in results[0].classes]
    for name in names:
        cs = [r.klass(name) for r in results]
        table.add_row(f"[cyan]{name}[/] P50 / P90 / P99 ms", *[f"{_ms(c.p50_ms)} / {_ms(c.p90_ms)} / {_ms(c.p99_ms)}" for c in cs])
        if streaming:
            table.add_row("  TTFT P50 / P99 ms", *[f"{_ms(c.ttft_p50_ms)} / {_ms(c.ttft_p99_ms)}" for c in cs])
        table.add_row("  throughput /s", *[f"{c.throughput_per_s:.1f}" for c in cs])
        table.add_row("  queue P99 ms", *[_ms(c.queue_p99_ms) for c in cs])
        table.add_row("  rejected (full / timeout)", *[f"{c.rejected_queue_full} / {c.rejected_timeout}" for c in cs])
        if streaming:
            table.add_row("  OOM killed", *[str(c.oom_killed) for c in cs])
    table.add_row("[bold]total throughput /s", *[f"{r.throughput_per_s:.1f}" for r in results])
    table.add_row("utilisation", *[", ".join(f"{m.utilisation:.0%}" for m in r.models) for r in results])
    table.add_row("device busy", *[", ".join(f"{v:.0%}" for v in r.device_busy.values()) or "-" for r in results])
    table.add_row("mean batch", *[", ".join("-" if m.mean_batch_rows is None else f"{m.mean_batch_rows:.2f}" for m in r.models) for r in results])
    table.add_row("executions", *[", ".join(str(m.executions) for m in r.models) for r in results])
    return table


@app.command("simulate")
def simulate_cmd(
    profile: Path = typer.Option(..., "--profile", help="A profile JSON from `tritongen profile`, or a curve file (curve:/llm:)."),
    config: list[Path] = typer.Option(..., "--config", help="config.pbtxt to simulate; repeat to compare several."),
    traffic: Path = typer.Option(..., "--traffic", help="Traffic file (examples/traffic/*.yaml)."),
    requests: Optional[int] = typer.Option(None, "--requests", min=1, help="Simulate this many requests (default: the traffic's duration)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrivals and the simulation."),
    overheads: Optional[str] = typer.Option(
        None, "--overheads", help="'embedded' (the embedded server's fitted overheads, default), 'none', or key=value,..."
    ),
    server_flags: Optional[Path] = typer.Option(
        None, "--server-flags", help="Server flags file (rate limiter); default: server_flags.txt of the config's repository."
    ),
    kv_policy: str = typer.Option("oom", "--kv-policy", help="Streaming LLMs: 'oom' (kill when the KV pool runs dry) or 'admission'."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON instead of a table."),
) -> None:
    """Predict tail latency, throughput and utilisation of configs from a profile, in milliseconds."""
    if kv_policy not in ("oom", "admission"):
        raise typer.BadParameter("must be 'oom' or 'admission'", param_hint="--kv-policy")
    curve, llm_curve, file_overheads = read_service(profile)
    ov = parse_overheads(overheads, file_overheads)
    spec, trace_text = read_traffic(traffic)
    arrivals = arrivals_from(spec, trace_text, seed, requests, str(traffic))
    # One model per run: every class goes to the config under test.
    arrivals.class_model = [None] * len(arrivals.class_names)
    results: list[SimResult] = []
    labels: list[str] = []
    streaming = False
    started = time.perf_counter()
    for path in config:
        if not path.is_file():
            raise BadInput(f"--config {path}: no such file")
        parsed = parse_model_config(path.read_text(), str(path))
        try:
            model = model_sim_from_config(parsed, curve=curve, llm_curve=llm_curve, kv_policy=kv_policy)  # type: ignore[arg-type]
        except ValueError as err:
            raise BadInput(f"{path}: {err}") from None
        streaming = streaming or model.llm is not None
        flags = [ln.strip() for ln in server_flags.read_text().splitlines() if ln.strip()] if server_flags else flags_near(path)
        try:
            enabled, resources = rate_limit_from_flags(flags)
            server = ServerSim(models=[model], rate_limit=enabled, resources=resources, overheads=ov)
            results.append(simulate(server, arrivals, seed=seed))
        except ValueError as err:
            raise BadInput(f"{path}: {err}") from None
        label = path.parent.name if path.name == "config.pbtxt" else path.stem
        if label in labels and path.name == "config.pbtxt":
            label = f"{path.resolve().parent.parent.name}/{path.parent.name}"
        while label in labels:
            label += "'"
        labels.append(label)
    elapsed = time.perf_counter() - started
    if as_json:
        print(json.dumps({lab: r.model_dump() for lab, r in zip(labels, results)}, indent=2))
        return
    title = (
        f"{len(arrivals)} requests, {spec.shape} at {arrivals.mean_rate:.0f}/s (seed {seed}), "
        f"{len(config)} config(s) simulated in {elapsed * 1000:.0f} ms"
    )
    console.print(results_table(title, labels, results, streaming))
    console.print(
        f"[dim]overheads: request {ov.request_ms} ms, batch {ov.batch_ms} ms + {ov.request_exec_ms} ms/request; "
        f"figures over the window after the {spec.warmup_s:g} s warm-up[/]"
    )
