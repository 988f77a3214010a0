"""The demo's before/after run: the whole product on the embedded server, end to end.

Before: the example models under hand-written fixed-batch configs (`examples/naive_repository`),
clients straight to Triton. After: profile, tune, render, restart on the tuned configs behind the
policy sidecar. Both face the same bursty two-class traffic (the same arrival list), and the table
compares what clients saw: throughput, P99 per class, instance utilisation, out-of-memory kills
and rejections. Each step runs the real command (`tritongen profile`, `tritongen tune`,
`tritongen sidecar`) as a subprocess, exactly as a user would.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tritongen.server_flags import server_flags_from
from tritongen.core.simulator import OK, OOM
from tritongen.core.spec import DeploymentSpec
from tritongen.core.traffic import Arrivals, generate_arrivals, scale_rate
from tritongen.errors import RunFailed
from tritongen.core.profile_types import EngineMeasurement
from tritongen.client import tensors_from_config
from tritongen.load_result import LoadResult
from tritongen.llm_targets import llm_target
from tritongen.loadgen import LoadTarget, run_load
from tritongen.profiler.report import PALETTE, Chart, Series, svg_chart
from tritongen.render import SIDECAR_POLICY_FILE
from tritongen.server import ServerOptions, TritonServer
from tritongen.sidecar_process import SidecarProcess
from tritongen.specio import load_spec
from tritongen.traffic_files import read_traffic

Say = Callable[[str], None]
TUNE_REQUESTS = 4000  # requests per simulation in the demo's tuning step, as `tune --requests` defaults


@dataclass
class ModelRun:
    """What clients saw for one model in one configuration."""

    model: str
    setup: str  # "before" | "after"
    result: LoadResult
    utilisation: float | None  # busy fraction of the model's instances over the run
    streaming: bool = False  # a stream's latency is its time to first token
    targets_ms: Mapping[str, float] = field(default_factory=dict)  # each class's target (the spec's p99_ms)

    def stats(self):
        return self.result.summary()[0]

    @property
    def throughput(self) -> float:
        return sum(c.throughput_per_s for c in self.stats())

    @property
    def goodput(self) -> float:
        """Requests served within their class's target per second."""
        return self.result.goodput_per_s(self.targets_ms, first_token=self.streaming)

    @property
    def oom(self) -> int:
        return int((self.result.status == OOM).sum())

    @property
    def served(self) -> int:
        """Requests answered in full, whenever they finished (req/s counts only the window's)."""
        return int((self.result.status == OK).sum())

    @property
    def rejected(self) -> int:
        ok_or_oom = (self.result.status == OK) | (self.result.status == OOM)
        return int((~ok_or_oom).sum())


@dataclass(frozen=True)
class Workload:
    """One model's arrivals in a load phase. A stream's prompts are sized by `engine`, the profile's
    engine section (its bytes per token and the salt's surplus); without one, a byte a token."""

    arrivals: Arrivals
    streaming: bool
    engine: EngineMeasurement | None = None


@dataclass
class Showcase:
    runs: list[ModelRun] = field(default_factory=list)
    steps: list[tuple[str, float]] = field(default_factory=list)
    _clock: float = field(default_factory=time.perf_counter, repr=False)

    def lap(self, name: str) -> None:
        """Record the time since the last lap (or the start) as step `name`."""
        now = time.perf_counter()
        self.steps.append((name, now - self._clock))
        self._clock = now


def tritongen_cmd(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a tritongen command as the user would; its failure is the demo's failure."""
    proc = subprocess.run(
        [sys.executable, "-c", "from tritongen.cli.main import run; run()", *args],
        capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "COLUMNS": "120"},
    )
    if proc.returncode not in (0, 1):
        raise RunFailed(f"`tritongen {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr.strip()[-2000:]}")
    return proc


def class_targets_ms(spec: DeploymentSpec) -> dict[str, float]:
    """Each traffic class's latency target (the spec's p99_ms): what goodput counts against."""
    return {c.name: float(c.p99_ms) for c in spec.traffic_classes}


def copy_model_code(source: Path, into: Path) -> None:
    """Version folders (model code) of every model in `source`, without configs."""
    for model_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        for version in sorted(p for p in model_dir.iterdir() if p.name.isdigit()):
            target = into / model_dir.name / version.name
            if version.is_symlink():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(version.readlink())
            elif version.is_dir():
                shutil.copytree(version, target, ignore=shutil.ignore_patterns("__pycache__"))


def compute_busy_ns(http_url: str, model: str) -> int:
    """Sum of compute_infer time over the model's executions (Triton statistics)."""
    stats = httpx.get(f"http://{http_url}/v2/models/{model}/stats", timeout=10).json()
    return sum(int(b["compute_infer"]["ns"]) for s in stats["model_stats"] for b in s.get("batch_stats", []))


def drive(
    model: str, setup: str, arrivals: Arrivals, server: TritonServer, streaming: bool,
    via: SidecarProcess | None, class_parameter: str | None, llm_protocol: str = "http",
    engine: EngineMeasurement | None = None, targets_ms: Mapping[str, float] | None = None,
) -> ModelRun:
    """One model's load, straight to Triton or through the sidecar. A stream's prompts are sized
    by `engine` (the profile's engine section; None: one byte per token)."""
    config = httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10).json()
    if streaming:  # the LLM interface the served config speaks
        target = llm_target(model, config, engine, class_parameter=class_parameter, protocol=llm_protocol)
    else:
        target = LoadTarget(model=model, streaming=False, batched=int(config.get("max_batch_size", 0)) > 0,
                            class_parameter=class_parameter, inputs=tuple(tensors_from_config(config.get("input") or [])))
    http_url = via.http_url if via else server.http_url
    grpc_url = via.grpc_url if via else server.grpc_url
    busy_before = compute_busy_ns(server.http_url, model)
    result = run_load(
        arrivals, {name: target for name in arrivals.class_names}, http_url=http_url, grpc_url=grpc_url,
        request_timeout_s=30, drain_s=20, max_in_flight=512,
    )
    busy = (compute_busy_ns(server.http_url, model) - busy_before) / 1e9
    instances = 1
    utilisation = None if streaming else min(1.0, busy / max(1e-9, result.wall_s * instances))
    return ModelRun(model=model, setup=setup, result=result, utilisation=utilisation, streaming=streaming,
                    targets_ms=dict(targets_ms or {}))


def load_phase(
    setup: str, repo: Path, workloads: Mapping[str, Workload], say: Say, workdir: Path,
    behind_sidecar: bool, llm_protocol: str = "http", targets_ms: Mapping[str, float] | None = None,
    options: ServerOptions | None = None, running: TritonServer | None = None,
) -> list[ModelRun]:
    """Serve `repo` (with `options`, else the repository's own server flags), optionally behind the
    sidecar its policy file configures, and drive each workload in turn. `running`: a server already
    serving `repo` (the one the profile measured), used as it is instead of a fresh start."""
    if running is not None:
        return _drive_workloads(setup, repo, running, workloads, say, workdir, behind_sidecar, llm_protocol, targets_ms)
    options = options or ServerOptions(repository=repo, extra_args=server_flags_from(repo))
    with TritonServer(options, log_path=workdir / f"triton-{setup}.log") as server:
        say(f"{setup}: tritonserver ready on {server.http_url}")
        return _drive_workloads(setup, repo, server, workloads, say, workdir, behind_sidecar, llm_protocol, targets_ms)


def _drive_workloads(
    setup: str, repo: Path, server: TritonServer, workloads: Mapping[str, Workload], say: Say, workdir: Path,
    behind_sidecar: bool, llm_protocol: str, targets_ms: Mapping[str, float] | None,
) -> list[ModelRun]:
    runs: list[ModelRun] = []
    if behind_sidecar:
        with SidecarProcess(repo / SIDECAR_POLICY_FILE, server, workdir / f"sidecar-{setup}.log",
                            grpc_upstream=server.grpc_url) as sidecar:
            say(f"{setup}: sidecar on {sidecar.http_url} (gRPC {sidecar.grpc_url}) in front of Triton")
            for model, load in workloads.items():
                say(f"{setup}: {len(load.arrivals)} bursty requests to {model} through the sidecar")
                runs.append(drive(model, setup, load.arrivals, server, load.streaming, sidecar, "traffic_class",
                                  llm_protocol, load.engine, targets_ms))
    else:
        for model, load in workloads.items():
            say(f"{setup}: {len(load.arrivals)} bursty requests to {model}, straight to Triton")
            runs.append(drive(model, setup, load.arrivals, server, load.streaming, None, None, llm_protocol,
                              load.engine, targets_ms))
    return runs


def run_showcase(
    spec: Path, code: Path, naive: Path, traffic: Path, out_dir: Path, workdir: Path, say: Say,
    requests: int = 1200, classic_rate_factor: float = 8.0, llm_rate_factor: float = 4.0,
    tune_requests: int = TUNE_REQUESTS,
    llm_protocol: str = "http", measured_profiles: Path | None = None,
) -> Showcase:
    """`measured_profiles`: profiles from `tritongen profile` to tune with instead of profiling here
    (copied to the report's folder); None: step 1 profiles the hand-written configs."""
    show = Showcase()
    before, after, profiles = workdir / "before", workdir / "after", out_dir / "profiles"
    copy_model_code(code, before)
    copy_model_code(code, after)
    for model_dir in naive.iterdir():
        if (model_dir / "config.pbtxt").is_file():
            shutil.copy(model_dir / "config.pbtxt", before / model_dir.name / "config.pbtxt")
    if measured_profiles is None:
        say(f"1/4 profile the models ({naive.name} configs, embedded server) -> {profiles}")
        tritongen_cmd("profile", str(spec), "--repo", str(before), "-o", str(profiles), "--quick")
    else:
        say(f"1/4 profiles from {measured_profiles} (--profiles: not measured here) -> {profiles}")
        shutil.copytree(measured_profiles, profiles, dirs_exist_ok=True)
    show.lap("profile")
    say(f"2/4 tune against {traffic.name} with the simulator, render the winner -> {after}")
    tuned = tritongen_cmd("tune", str(spec), "--profiles", str(profiles), "--traffic", str(traffic), "-o", str(after),
                          "--requests", str(tune_requests))
    (out_dir / "tune.txt").write_text(tuned.stdout)
    if not (after / SIDECAR_POLICY_FILE).is_file():
        raise RunFailed(f"`tritongen tune -o {after}` wrote no {SIDECAR_POLICY_FILE}:\n{tuned.stdout[-1500:]}")
    show.lap("tune + render")

    traffic_spec, trace = read_traffic(traffic)
    # The traffic file's shape and class mix, scaled so that each model's bursts exceed its capacity.
    llm_arrivals = scale_rate(generate_arrivals(traffic_spec, seed=1, trace_text=trace, requests=requests), llm_rate_factor)
    classic_arrivals = scale_rate(generate_arrivals(traffic_spec, seed=2, trace_text=trace, requests=requests), classic_rate_factor)
    loaded = load_spec(spec).spec
    streaming = {m.name: bool(m.streaming) for m in loaded.models}
    workloads = {name: Workload(llm_arrivals if streams else classic_arrivals, streams) for name, streams in streaming.items()}
    streamed = ", ".join(name for name, streams in streaming.items() if streams) or "none"
    classic = ", ".join(name for name, streams in streaming.items() if not streams) or "none"
    targets = class_targets_ms(loaded)
    say("3/4 before: the same bursty two-class load against the hand-written configs "
        f"({traffic.name}'s shape at {classic_rate_factor:g}x its rate for {classic} and {llm_rate_factor:g}x for {streamed}; "
        f"tune simulated it at 1x; {streamed} stream over {'HTTP generate_stream' if llm_protocol == 'http' else 'gRPC'})")
    show.runs += load_phase("before", before, workloads, say, workdir, behind_sidecar=False, llm_protocol=llm_protocol,
                            targets_ms=targets)
    show.lap("load before")
    say("4/4 after: the tuned configs behind the sidecar, the same load")
    show.runs += load_phase("after", after, workloads, say, workdir, behind_sidecar=True, llm_protocol=llm_protocol,
                            targets_ms=targets)
    show.lap("load after")
    return show


# ---------------------------------------------------------------------------------------------
# Report


def latency_series(run: ModelRun, klass: int, color: str, dashed: bool) -> Series:
    """Latency of each completed request (ms) against its send time: bursts show as spikes."""
    r = run.result
    first = r.first_t if run.streaming else r.done_t
    mask = (r.cls == klass) & (r.status == OK) & np.isfinite(first)
    points = sorted(zip(r.scheduled_t[mask].tolist(), ((first[mask] - r.scheduled_t[mask]) * 1000).tolist()))
    step = max(1, len(points) // 400)
    name = f"{run.setup} {r.class_names[klass]}"
    return Series(name=name, points=points[::step], color=color, lines=False, markers=True, dashed=dashed)


def write_report(all_runs: list[ModelRun], path: Path) -> None:
    charts = []
    for model in dict.fromkeys(r.model for r in all_runs):
        runs = [r for r in all_runs if r.model == model]
        series = []
        for i, run in enumerate(runs):
            for k in range(len(run.result.class_names)):
                series.append(latency_series(run, k, PALETTE[(2 * i + k) % len(PALETTE)], run.setup == "before"))
        what = "time to first token" if runs[0].streaming else "latency"
        charts.append(svg_chart(Chart(title=f"{model}: {what} per request", x_label="send time (s)",
                                      y_label=f"{what} (ms)", series=series), width=620, height=320))
    rows = "".join(
        f"<tr><td>{html.escape(r.model)}</td><td>{r.setup}</td>"
        + "".join(f"<td>{c.name}: {c.p99_ms or float('nan'):.0f}</td>" for c in r.stats())
        + f"<td>{r.throughput:.1f}</td><td>{r.goodput:.1f}</td><td>{'-' if r.utilisation is None else f'{r.utilisation:.0%}'}</td>"
        f"<td>{r.oom}</td><td>{r.rejected}</td></tr>"
        for r in all_runs
    )
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>tritongen demo: before and after</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:24px}td,th{border:1px solid #ccc;padding:3px 8px}"
        "table{border-collapse:collapse}svg{border:1px solid #ddd;margin:8px}</style></head><body>"
        "<h1>Before (hand-written configs) and after (tuned + sidecar)</h1>"
        "<table><tr><th>model</th><th>setup</th><th colspan=2>P99 ms per class</th><th>req/s</th><th>good/s</th>"
        f"<th>utilisation</th><th>OOM kills</th><th>rejected</th></tr>{rows}</table>"
        + "".join(charts) + "</body></html>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(page)
    os.replace(tmp, path)
