"""Measure configs on a live Triton under the same traffic the simulator predicted for.

`LiveRun` is one measurement: the open-loop load's per-request records (`tritongen.loadgen`) and
Triton's own statistics over the same stretch (executions, batch sizes, compute and queue time),
summarised with the simulator's definitions so a prediction and a measurement compare field by
field. `verify_candidates` writes each candidate config into a temporary copy of the repository,
starts the embedded server once in explicit model-control mode, applies each candidate through the
model-load API, drives the traffic, and stops the server (always: context managers).

Utilisation of a classic model is Triton's instance time (compute_input + compute_infer +
compute_output summed over executions) divided by instances x window: what "GPU utilisation"
means for a model that owns its device. For a streaming engine it is the CPU time of the model's
stub processes over the window (tinyllm computes on the CPU), read from /proc.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tritongen.core.simulator import ClassStats, LiveObservation, percentile_ms
from tritongen.core.traffic import Arrivals, scale_rate
from tritongen.errors import RunFailed
from tritongen.load_result import LoadResult
from tritongen.loadgen import LoadTarget, run_load
from tritongen.pbtxt import config_to_json, parse_model_config
from tritongen.tuner.proc_cpu import ForeignLoad, cpu_seconds, stub_pids
from tritongen.tuner.triton_stats import StatsDelta, fetch_stats, stats_delta

# ---------------------------------------------------------------------------------------------
# One measured run


@dataclass
class LiveRun:
    """A live measurement, in the simulator's terms."""

    load: LoadResult
    stats: dict[str, StatsDelta]
    instances: dict[str, int]
    classes: list[ClassStats] = field(default_factory=list)
    throughput_per_s: float = 0.0
    utilisation: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    foreign_cores: float | None = None  # CPU other processes used during the run (see ForeignLoad)

    @property
    def window_s(self) -> float:
        w0, w1 = self.load.window
        return max(1e-9, w1 - w0)

    def klass(self, name: str) -> ClassStats:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def observation(self, model: str) -> LiveObservation:
        """For `fit_overheads`: client vs server latency and instance time per batch size."""
        delta = self.stats[model]
        res = self.load
        ok = res.status == 1
        client = float(np.mean(res.done_t[ok] - res.scheduled_t[ok]) * 1000.0) if ok.any() else 0.0
        return LiveObservation(
            client_mean_ms=client, server_mean_ms=delta.success_mean_ms or 0.0, batches=delta.batches
        )

    def window_latencies_s(self) -> np.ndarray:
        """Latencies of the successful requests sent inside the measurement window."""
        w0, w1 = self.load.window
        res = self.load
        keep = (res.status == 1) & (res.scheduled_t >= w0) & (res.scheduled_t <= w1)
        return res.done_t[keep] - res.scheduled_t[keep]

    def latency_percentile_ms(self, q: float) -> float | None:
        return percentile_ms(self.window_latencies_s(), q)


def measure(
    http_url: str,
    arrivals: Arrivals,
    targets: Mapping[str, LoadTarget],
    instances: Mapping[str, int],
    grpc_url: str | None = None,
    warmup: Arrivals | None = None,
    seed: int = 0,
    streaming_models: Sequence[str] = (),
    server_pid: int | None = None,
) -> LiveRun:
    """Send `arrivals` (after an optional `warmup` that is not counted) and read Triton's stats.

    `instances`: model -> instance count (for utilisation). Streaming models' utilisation is the
    CPU time of their stub processes over the measured stretch.
    """
    models = sorted({t.model for t in targets.values()})
    if warmup is not None and len(warmup):
        run_load(warmup, targets, http_url=http_url, grpc_url=grpc_url, seed=seed + 1)
    with httpx.Client() as client:
        before = {m: fetch_stats(http_url, m, client) for m in models}
        pids = {m: stub_pids(m) for m in streaming_models}
        cpu0 = {m: cpu_seconds(p) for m, p in pids.items()}
        with ForeignLoad(server_pid) as foreign:
            load = run_load(arrivals, targets, http_url=http_url, grpc_url=grpc_url, seed=seed)
        cpu1 = {m: cpu_seconds(p) for m, p in pids.items()}
        after = {m: fetch_stats(http_url, m, client) for m in models}
    deltas = {m: stats_delta(before[m], after[m]) for m in models}
    run = LiveRun(load=load, stats=deltas, instances=dict(instances), foreign_cores=foreign.cores if server_pid else None)
    run.classes, run.throughput_per_s = load.summary()
    span = max(1e-9, float(load.done_t[np.isfinite(load.done_t)].max() - load.scheduled_t[0])) if np.isfinite(load.done_t).any() else 1.0
    for m in models:
        if m in pids:
            run.cpu_seconds[m] = cpu1[m] - cpu0[m]
            run.utilisation[m] = min(1.0, run.cpu_seconds[m] / span)
        else:
            run.utilisation[m] = min(1.0, deltas[m].busy_ms / 1000.0 / (span * max(1, instances.get(m, 1))))
    return run


# ---------------------------------------------------------------------------------------------
# Candidates on a live server


@dataclass(frozen=True)
class Candidate:
    """A config to try: the model's name in the repository and the full config.pbtxt text."""

    label: str
    model: str
    config_text: str


@dataclass
class VerifiedCandidate:
    candidate: Candidate
    run: LiveRun | None
    error: str | None = None


def copy_repository(source: Path, models: Sequence[str], into: Path) -> Path:
    """Copy the version folders of `models` (and their configs) into a fresh repository."""
    repo = into / "model_repository"
    repo.mkdir(parents=True)
    for name in models:
        src = source / name
        if not src.is_dir():
            raise RunFailed(f"model {name!r} is not in the repository {source}")
        dst = repo / name
        dst.mkdir()
        for child in src.iterdir():
            if child.name == "__pycache__":
                continue
            if child.is_dir():
                real = child.resolve()
                shutil.copytree(real, dst / child.name, ignore=shutil.ignore_patterns("__pycache__"))
            elif child.is_file():
                shutil.copy2(child, dst / child.name)
    return repo


def load_config(http_url: str, model: str, config_text: str, timeout_s: float = 120.0) -> None:
    """Apply a config through the model-load API (explicit model control)."""
    config = parse_model_config(config_text, f"{model}/config.pbtxt")
    body = {"parameters": {"config": config_to_json(config)}}
    try:
        response = httpx.post(f"http://{http_url}/v2/repository/models/{model}/load", json=body, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise RunFailed(f"loading a candidate config of {model!r} failed: {err}") from None
    if response.status_code != 200:
        raise RunFailed(f"the server refused a candidate config of {model!r}: {response.text[:300]}")


def _decoupled(config_text: str) -> bool:
    config = parse_model_config(config_text)
    return config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled


def verify_candidates(
    repository: Path,
    candidates: Sequence[Candidate],
    arrivals: Arrivals,
    targets_for: callable,
    server_flags: Sequence[str] = (),
    warmup: Arrivals | None = None,
    seed: int = 0,
    log=lambda message: None,
    fresh_server: bool | None = None,
) -> list[VerifiedCandidate]:
    """Run every candidate on the embedded server under `arrivals`; servers are always stopped.

    `targets_for(candidate) -> (targets by class, instances by model, streaming model names)`.
    """

    def run_one(server, cand: Candidate) -> VerifiedCandidate:
        log(f"verifying {cand.label}")
        return VerifiedCandidate(cand, _measure_on(server, cand, arrivals, targets_for, warmup, seed))

    return on_servers(repository, candidates, run_one, server_flags, fresh_server)


def _measure_on(server, cand: Candidate, arrivals: Arrivals, targets_for, warmup: Arrivals | None, seed: int) -> LiveRun:
    targets, instances, streaming = targets_for(cand)
    return measure(
        server.http_url, arrivals, targets, instances, grpc_url=server.grpc_url,
        warmup=warmup, seed=seed, streaming_models=streaming,
        server_pid=server.process.pid if server.process else None,
    )


def on_servers(repository: Path, candidates: Sequence[Candidate], body, server_flags: Sequence[str] = (), fresh_server: bool | None = None) -> list:
    """`body(server, candidate)` for every candidate on the embedded server; servers always stopped.

    Classic models share one server and switch configs through the model-load API (an in-place
    reload, ~1.5 s). Decoupled (streaming) models get a fresh server per candidate: reloading
    tinyllm through the load API corrupted tritonserver 2.51's heap here ("malloc(): unaligned
    tcache chunk detected", every later request unanswered), so a reload is not trusted for them.
    A candidate that fails (RunFailed) gives a VerifiedCandidate with its error.
    """
    from tritongen.server import ServerOptions, TritonServer

    models = sorted({c.model for c in candidates})
    if fresh_server is None:
        fresh_server = any(_decoupled(c.config_text) for c in candidates)
    out: list = []

    def one(server, cand: Candidate):
        try:
            return body(server, cand)
        except RunFailed as err:
            return VerifiedCandidate(cand, None, str(err))

    with tempfile.TemporaryDirectory(prefix="tritongen-verify-") as tmp:
        repo = copy_repository(Path(repository), models, Path(tmp))
        if fresh_server:
            for cand in candidates:
                (repo / cand.model / "config.pbtxt").write_text(cand.config_text)
                options = ServerOptions(repository=repo, extra_args=list(server_flags))
                try:
                    with TritonServer(options) as server:
                        out.append(one(server, cand))
                except RunFailed as err:
                    out.append(VerifiedCandidate(cand, None, str(err)))
            return out
        first = {c.model: c for c in reversed(candidates)}
        for name, cand in first.items():
            (repo / name / "config.pbtxt").write_text(cand.config_text)
        options = ServerOptions(
            repository=repo, model_control="explicit", load_models=models, extra_args=list(server_flags)
        )
        with TritonServer(options) as server:
            for cand in candidates:
                try:
                    load_config(server.http_url, cand.model, cand.config_text)
                except RunFailed as err:
                    out.append(VerifiedCandidate(cand, None, str(err)))
                    continue
                time.sleep(0.3)
                out.append(one(server, cand))
    return out


# ---------------------------------------------------------------------------------------------
# Capacity: the highest rate that meets every target, measured


@dataclass
class CapacityProbe:
    factor: float  # rate multiple of the traffic
    passed: bool
    throughput_per_s: float
    detail: str


@dataclass
class MeasuredCapacity:
    candidate: Candidate
    factor: float | None  # highest multiple that passed; None: the search failed
    probes: list[CapacityProbe] = field(default_factory=list)
    error: str | None = None


def search_capacity(probe, start: float, max_runs: int = 6, step: float = 1.15, resolution: float = 1.05) -> tuple[float, list[CapacityProbe]]:
    """The highest passing rate multiple, from `start` (the predicted capacity): up by `step` while
    it passes, down while it fails, then bisect between the last pass and the first failure until
    they are within `resolution`. `probe(factor) -> CapacityProbe`. 0 when nothing passed."""
    probes: list[CapacityProbe] = []
    lo: float | None = None
    hi: float | None = None
    f = start
    for _ in range(max_runs):
        p = probe(f)
        probes.append(p)
        if p.passed:
            lo = f if lo is None else max(lo, f)
        else:
            hi = f if hi is None else min(hi, f)
        if lo is not None and hi is not None:
            if hi / lo <= resolution:
                break
            f = math.sqrt(lo * hi)
        elif lo is not None:
            f = lo * step
        else:
            f = f / step
    return (lo or 0.0), probes


def measure_capacities(
    repository: Path,
    candidates: Sequence[Candidate],
    arrivals: Arrivals,
    targets_for,
    passes,
    starts: Sequence[float],
    server_flags: Sequence[str] = (),
    warmup: Arrivals | None = None,
    seed: int = 0,
    max_runs: int = 6,
    log=lambda message: None,
) -> list[MeasuredCapacity]:
    """Each candidate's measured capacity on the embedded server: `search_capacity` from its
    predicted multiple (`starts`), each probe `arrivals` at that multiple of its rate, judged by
    `passes(run, factor) -> (bool, detail)`."""
    start_of = {c.label: f for c, f in zip(candidates, starts)}

    def body(server, cand: Candidate) -> MeasuredCapacity:
        def probe(f: float) -> CapacityProbe:
            log(f"{cand.label}: {f:.2f}x the traffic's rate")
            run = _measure_on(server, cand, scale_rate(arrivals, f), targets_for, warmup, seed)
            ok, detail = passes(run, f)
            return CapacityProbe(factor=f, passed=ok, throughput_per_s=run.throughput_per_s, detail=detail)

        factor, probes = search_capacity(probe, max(1e-3, start_of[cand.label]), max_runs=max_runs)
        return MeasuredCapacity(cand, factor, probes)

    out = on_servers(repository, candidates, body, server_flags)
    return [m if isinstance(m, MeasuredCapacity) else MeasuredCapacity(m.candidate, None, error=m.error) for m in out]
