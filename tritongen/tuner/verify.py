"""Measure configs on a live Triton under the same traffic the simulator predicted for.
One file (over 500 lines): the live runs, the candidate servers and the capacity search share one
measurement (LiveRun) and one server life cycle.

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
import os
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
from tritongen.loadgen import LoadResult, LoadTarget, run_load
from tritongen.pbtxt import config_to_json, parse_model_config

# ---------------------------------------------------------------------------------------------
# Triton's statistics


@dataclass(frozen=True)
class StatsSnapshot:
    model: str
    raw: dict

    @property
    def executions(self) -> int:
        return int(self.raw.get("execution_count", 0))

    @property
    def inferences(self) -> int:
        return int(self.raw.get("inference_count", 0))

    def stat(self, name: str) -> tuple[int, int]:
        entry = (self.raw.get("inference_stats") or {}).get(name) or {}
        return int(entry.get("count", 0)), int(entry.get("ns", 0))

    def batches(self) -> dict[int, tuple[int, int]]:
        """batch size -> (executions, ns of compute_input + compute_infer + compute_output)."""
        out = {}
        for item in self.raw.get("batch_stats") or []:
            count = int((item.get("compute_infer") or {}).get("count", 0))
            ns = sum(int((item.get(k) or {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
            out[int(item["batch_size"])] = (count, ns)
        return out


@dataclass(frozen=True)
class StatsDelta:
    """What Triton counted between two snapshots."""

    model: str
    executions: int
    inferences: int
    success: int
    success_mean_ms: float | None
    queue_mean_ms: float | None
    batches: dict[int, tuple[int, float]]  # rows -> (executions, mean instance ms per execution)
    busy_ms: float  # instance time summed over executions

    @property
    def mean_batch_rows(self) -> float | None:
        return self.inferences / self.executions if self.executions else None


def fetch_stats(http_url: str, model: str, client: httpx.Client | None = None) -> StatsSnapshot:
    url = f"http://{http_url}/v2/models/{model}/stats"
    try:
        response = (client or httpx).get(url, timeout=10.0)
    except httpx.HTTPError as err:
        raise RunFailed(f"cannot read statistics of {model!r} from {http_url}: {err}") from None
    if response.status_code != 200:
        raise RunFailed(f"statistics of {model!r}: HTTP {response.status_code}: {response.text[:200]}")
    stats = response.json().get("model_stats") or []
    if not stats:
        raise RunFailed(f"statistics of {model!r}: the server reported none")
    return StatsSnapshot(model=model, raw=stats[0])


def stats_delta(before: StatsSnapshot, after: StatsSnapshot) -> StatsDelta:
    def mean(name: str) -> tuple[int, float | None]:
        c0, n0 = before.stat(name)
        c1, n1 = after.stat(name)
        count = c1 - c0
        return count, ((n1 - n0) / count / 1e6 if count > 0 else None)

    success, success_ms = mean("success")
    _, queue_ms = mean("queue")
    b0 = before.batches()
    batches: dict[int, tuple[int, float]] = {}
    busy_ns = 0
    for rows, (count, ns) in after.batches().items():
        c0, n0 = b0.get(rows, (0, 0))
        if count - c0 > 0:
            batches[rows] = (count - c0, (ns - n0) / (count - c0) / 1e6)
            busy_ns += ns - n0
    return StatsDelta(
        model=after.model,
        executions=after.executions - before.executions,
        inferences=after.inferences - before.inferences,
        success=success,
        success_mean_ms=success_ms,
        queue_mean_ms=queue_ms,
        batches=dict(sorted(batches.items())),
        busy_ms=busy_ns / 1e6,
    )


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


def _proc_tree(root: int) -> list[int]:
    """`root` and every process whose parent chain leads to it (the server and its stubs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    out = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in out and pid not in out:
                out.add(pid)
                changed = True
    return sorted(out)


def _host_busy_seconds() -> float:
    """CPU time the whole host has been busy (all cores), from /proc/stat."""
    try:
        parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in parts[:8]]
    except (OSError, ValueError, IndexError):
        return 0.0
    idle = values[3] + values[4]
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(values) - idle) / tick


class ForeignLoad:
    """How much CPU *other* processes used while a measurement ran, in cores.

    On a shared host another job's burst shows up as tail latency that no model of the server can
    predict; callers use this to discard and repeat such runs. Own = this process + the server's
    process tree (Triton and its Python stubs).
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def _own(self) -> float:
        pids = [os.getpid()] + (_proc_tree(self.server_pid) if self.server_pid else [])
        return _cpu_seconds(pids)

    def __enter__(self) -> "ForeignLoad":
        self.t0 = time.perf_counter()
        self.host0 = _host_busy_seconds()
        self.own0 = self._own()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(1e-9, time.perf_counter() - self.t0)
        host = _host_busy_seconds() - self.host0
        own = self._own() - self.own0
        self.cores = max(0.0, (host - own) / wall)


def _stub_pids(model: str) -> list[int]:
    """PIDs of the Python-backend stub processes serving `model` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and any(
            arg.decode(errors="replace").startswith(f"{model}_") for arg in cmd
        ):
            out.append(int(entry.name))
    return out


def _cpu_seconds(pids: Sequence[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


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
        pids = {m: _stub_pids(m) for m in streaming_models}
        cpu0 = {m: _cpu_seconds(p) for m, p in pids.items()}
        with ForeignLoad(server_pid) as foreign:
            load = run_load(arrivals, targets, http_url=http_url, grpc_url=grpc_url, seed=seed)
        cpu1 = {m: _cpu_seconds(p) for m, p in pids.items()}
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
