"""tritongen against Triton Model Analyzer on the classic stand-in `scorer`: time to a config, and its goodput.
One unit (about 800 lines): one comparison run whose three steps (Model Analyzer, tritongen, the
goodput of each winner) share its work directory, the perf_analyzer it finds or installs and the
latency budget, and end in one table; what no other bench uses stays here, not in bench/rig/.

    .venv/bin/python -m bench.bench_vs_model_analyzer [--quick] [--keep] [--window-ms 2000]
                                                      [--ma-timeout 3600] [--no-wait]

The model is `scorer` of examples/classic_standins (Python backend, max_batch_size 64, no
dynamic_batching, one instance; each execution a host part that overlaps across instances and a
device part serialised across instances through a file lock), the spec beside it, and the traffic
file examples/classic_standins/traffic.yaml (Poisson, the spec's three classes). Three steps, one
run, each tool on its own copy of the repository in a temp dir:

1. **Model Analyzer** (`triton-model-analyzer` from PyPI; installed into the project venv with
   numpy pinned where it coexists with nvidia-pytriton's numpy<2, else into bench/.ma-venv):
   `model-analyzer profile` in brute mode (instance count 1..4, max_batch_size 1..64 in powers of
   two with dynamic batching on, MA's own concurrency sweep), `--latency-budget` = the interactive
   class's P99 target from the spec, against the embedded tritonserver: MA's local launch mode
   runs a `tritonserver` wrapper (a script in the temp dir, first on PATH) that execs the
   nvidia-pytriton binary with the environment tritongen.server uses and binds it to 127.0.0.1 on
   free ports. Its winner: the configuration MA ranks first (throughput under the latency budget),
   cross-checked against its results table.
2. **tritongen**: `tritongen profile` then `tritongen tune --objective capacity --verify`.
3. **Goodput**, the same way for the naive config, MA's winner and tritongen's: each served alone
   on the embedded tritonserver, perf_analyzer (gRPC, single-row requests, Poisson arrivals at a
   fixed rate) finds the highest rate at which no request fails, P99 <= the budget and at least 95%
   of the requests that arrived within its windows are served (doubling from 100 req/s to a
   bracket, then bisection). "Arrived" comes from Triton's own counts sampled during the run:
   perf_analyzer's Poisson schedule sends a few percent under its nominal rate, so its throughput
   against the nominal rate would fail configs that keep up. perf_analyzer stops at the first
   failed request, so a rejection (queue full, queue timeout) fails the point. Two runs, the
   second in reverse order; both figures and their median are printed.

perf_analyzer: $PERF_ANALYZER, else one on PATH, else the binary of the tritonclient 2.51.0 wheel
(the server's version) unpacked into bench/.perf-analyzer/ with the two libraries it lacks linked
from nvidia-pytriton's bundled ones. Later wheels (tritonclient 2.52+, the perf-analyzer package)
are built for glibc 2.38 and do not run on older hosts. Without Model Analyzer or perf_analyzer the
bench says why and exits 0 without figures. Full run: ~33 min on 2 cores (MA's sweep 24 of them, tritongen 2.3);
--quick: a 2-config sweep, short windows, a few minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.rig import ROOT
from bench.rig.perf_analyzer import find_perf_analyzer, run_cmd, tail, venv_bin
from tritongen.server_flags import server_flags_from
from tritongen.server import ServerOptions, TritonInstall, TritonServer
from tritongen.shared.processes import free_port
from tritongen.specio import load_spec

BENCH = Path(__file__).resolve().parent
STANDINS = ROOT / "examples" / "classic_standins"
SPEC = STANDINS / "deployment.yaml"
REPOSITORY = STANDINS / "repository"
TRAFFIC = STANDINS / "traffic.yaml"
MODEL = "scorer"
MA_VENV = BENCH / ".ma-venv"
MIN_SERVED = 0.95  # goodput: at least this share of the requests that arrived within the windows is served
TUNE_OBJECTIVE = ("--objective", "capacity")


# -- the tools --------------------------------------------------------------------------------------

def _numpy_of(python: Path) -> str:
    return run_cmd([str(python), "-c", "import numpy; print(numpy.__version__)"], 60).stdout.strip()


def find_model_analyzer() -> tuple[str | None, str]:
    """(model-analyzer executable, where it lives) or (None, why not). Installs it when missing."""
    here = venv_bin() / "model-analyzer"
    side = MA_VENV / "bin" / "model-analyzer"
    for exe, where in ((here, "the project venv"), (side, f"{MA_VENV.relative_to(ROOT)} (a separate venv)")):
        if exe.exists():
            r = run_cmd([str(exe), "--version"], 120)
            if r.returncode == 0:
                beside = f", beside numpy {_numpy_of(Path(sys.executable))}" if exe == here else ""
                return str(exe), f"Model Analyzer {r.stdout.strip()} in {where}{beside} (already installed)"
    numpy_before = _numpy_of(Path(sys.executable))
    pip = [str(venv_bin() / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    r = run_cmd(pip + ["triton-model-analyzer", f"numpy=={numpy_before}"], 1800)
    numpy_after = _numpy_of(Path(sys.executable))
    if r.returncode == 0 and numpy_after == numpy_before and here.exists():
        version = run_cmd([str(here), "--version"], 120).stdout.strip()
        return str(here), f"Model Analyzer {version} installed into the project venv (numpy {numpy_before} pinned, unchanged)"
    why = f"pip could not keep numpy {numpy_before}: {tail(r.stderr, 2)}" if r.returncode else \
        f"numpy went {numpy_before} -> {numpy_after}"
    if numpy_after != numpy_before:  # put the project venv back as nvidia-pytriton needs it
        run_cmd(pip + [f"numpy=={numpy_before}"], 600)
    r = run_cmd([sys.executable, "-m", "venv", str(MA_VENV)], 300)
    if r.returncode == 0:
        r = run_cmd([str(MA_VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                     "triton-model-analyzer"], 1800)
    if r.returncode != 0 or not side.exists():
        return None, f"triton-model-analyzer does not install here ({why}; separate venv: {tail(r.stderr, 2)})"
    version = run_cmd([str(side), "--version"], 120).stdout.strip()
    return str(side), f"Model Analyzer {version} installed into {MA_VENV.relative_to(ROOT)} ({why})"


def tritonserver_wrapper(into: Path) -> Path:
    """`into/tritonserver`: execs nvidia-pytriton's binary with the environment tritongen.server gives it
    (its venv first on PATH, libpython and the bundled libraries on LD_LIBRARY_PATH, one BLAS thread),
    the Python backend's directory, and every address on 127.0.0.1. Model Analyzer adds the rest."""
    install = TritonInstall.locate()
    backends = install.backend_dir(into / "backends")
    env = TritonServer(ServerOptions(repository=into)).environment(install)
    lines = ["#!/bin/sh", "# tritonserver of nvidia-pytriton, started as tritongen.server starts it"]
    for key in ("PATH", "LD_LIBRARY_PATH", "OPENBLAS_NUM_THREADS"):
        lines.append(f"export {key}={shlex.quote(env[key])}")
    lines.append(f"exec {shlex.quote(str(install.binary))} --backend-directory={shlex.quote(str(backends))} "
                 "--http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 "
                 "--allow-cpu-metrics=true \"$@\"")
    wrapper = into / "tritonserver"
    wrapper.write_text("\n".join(lines) + "\n")
    wrapper.chmod(0o755)
    return wrapper


# -- configs ----------------------------------------------------------------------------------------

@dataclass
class Config:
    """One config of `scorer` to serve: its text, where it came from, the server flags it needs."""

    label: str
    text: str
    flags: list[str] = field(default_factory=list)

    def parsed(self) -> Any:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        return text_format.Parse(self.text, model_config_pb2.ModelConfig())

    def summary(self) -> dict[str, Any]:
        c = self.parsed()
        batching = c.HasField("dynamic_batching")
        db = c.dynamic_batching
        return {
            "instances": sum(g.count or 1 for g in c.instance_group) or 1,
            "max_batch": c.max_batch_size,
            "dynamic_batching": batching,
            "preferred": list(db.preferred_batch_size) if batching else [],
            "delay_ms": db.max_queue_delay_microseconds / 1000 if batching else None,
            "priority_levels": db.priority_levels if batching else 0,
        }

    def describe(self) -> str:
        s = self.summary()
        if not s["dynamic_batching"]:
            batching = "no dynamic batching"
        else:
            batching = (f"pref {' '.join(map(str, s['preferred'])) or '-'}, delay {s['delay_ms']:g} ms"
                        + (f", {s['priority_levels']} prio levels" if s["priority_levels"] else ""))
        return f"{s['instances']} inst, max batch {s['max_batch']}, {batching}"

    def write_repository(self, into: Path) -> Path:
        """A repository holding this config as `scorer`, the model's code, and its server flags."""
        from google.protobuf import text_format

        model_dir = into / MODEL
        shutil.copytree(REPOSITORY / MODEL / "1", model_dir / "1", ignore=shutil.ignore_patterns("__pycache__"))
        config = self.parsed()
        config.name = MODEL  # MA's variants are named scorer_config_N
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        if self.flags:
            (into / "server_flags.txt").write_text("\n".join(self.flags) + "\n")
        return into


def copy_repository(into: Path) -> Path:
    shutil.copytree(REPOSITORY, into, ignore=shutil.ignore_patterns("__pycache__"))
    return into


# -- Model Analyzer ---------------------------------------------------------------------------------

@dataclass
class ToolResult:
    tool: str
    wall_s: float | None = None
    config: Config | None = None
    predicted: str = "-"
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def ma_config(work: Path, wrapper: Path, perf_analyzer: str, quick: bool) -> dict[str, Any]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    search = ({"run_config_search_max_instance_count": 2, "run_config_search_min_model_batch_size": 8,
               "run_config_search_max_model_batch_size": 8, "run_config_search_max_concurrency": 16}
              if quick else
              {"run_config_search_max_instance_count": 4, "run_config_search_min_model_batch_size": 1,
               "run_config_search_max_model_batch_size": 64})
    return {
        "model_repository": str(work / "repository"),
        "output_model_repository_path": str(work / "output_repository"),
        "override_output_model_repository": True,
        "checkpoint_directory": str(work / "checkpoints"),
        "export_path": str(work / "export"),
        "triton_launch_mode": "local",
        "triton_server_path": str(wrapper),
        "triton_output_path": str(work / "tritonserver.log"),
        "triton_http_endpoint": f"127.0.0.1:{http}",
        "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "perf_analyzer_path": perf_analyzer,
        "perf_output": True,
        "perf_output_path": str(work / "perf_analyzer.log"),
        "client_protocol": "grpc",
        "run_config_search_mode": "brute",
        "run_config_search_min_instance_count": 1,
        **search,
        "skip_detailed_reports": True,
        "profile_models": {MODEL: {"cpu_only": True}},
    }


def ma_winner(work: Path, output: str, budget_ms: float) -> tuple[str, dict[str, Any] | None]:
    """MA's first-ranked variant (from the report command it prints, best first) and the best row of its
    results table for that variant; falls back to the table's best row under the budget."""
    rows: list[dict[str, str]] = []
    for path in sorted((work / "export").rglob("metrics-model-inference.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))

    def col(row: dict[str, str], *names: str) -> str:
        for key, value in row.items():
            if key and any(key.strip().lower().startswith(n) for n in names):
                return value
        return ""

    def num(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            return float("nan")

    ranked = re.search(r"--report-model-configs\s+(\S+)", output)
    pick = ranked.group(1).split(",")[0] if ranked else None
    ok = [r for r in rows if num(col(r, "p99 latency")) <= budget_ms]
    if pick is None:
        if not ok:
            raise RuntimeError("Model Analyzer ranked no configuration and none of its measurements met the budget")
        best_row = max(ok, key=lambda r: num(col(r, "throughput")))
        pick = col(best_row, "model config path")
    mine = [r for r in rows if col(r, "model config path") == pick]
    best = max([r for r in mine if r in ok] or mine, key=lambda r: num(col(r, "throughput")), default=None)
    top = max(ok, key=lambda r: num(col(r, "throughput")), default=None)
    info = None
    if best is not None:
        info = {"concurrency": col(best, "concurrency"), "throughput": num(col(best, "throughput")),
                "p99_ms": num(col(best, "p99 latency")), "configs": len({col(r, "model config path") for r in rows}),
                "measurements": len(rows),
                "table_best": col(top, "model config path") if top is not None else None}
    return pick, info


def stop_processes_naming(marker: str) -> list[int]:
    """SIGKILL, by PID, every process whose command line names `marker` (a temp dir this bench made, so
    only processes it started: MA's tritonserver and its Python stubs), other than this one."""
    stopped = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                stopped.append(int(entry.name))
            except ProcessLookupError:
                pass
    return stopped


def run_model_analyzer(ma: str, perf_analyzer: str, work: Path, budget_ms: float, quick: bool,
                       timeout_s: float) -> ToolResult:
    result = ToolResult("Model Analyzer")
    bindir = work / "bin"
    bindir.mkdir(parents=True)
    wrapper = tritonserver_wrapper(bindir)
    copy_repository(work / "repository")
    config = ma_config(work, wrapper, perf_analyzer, quick)
    import yaml

    (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [ma, "profile", "-f", str(work / "config.yaml"), "--latency-budget", f"{budget_ms:g}"]
    print(f"Model Analyzer sweep: brute; instance count {config['run_config_search_min_instance_count']}.."
          f"{config['run_config_search_max_instance_count']} x max_batch_size {config['run_config_search_min_model_batch_size']}.."
          f"{config['run_config_search_max_model_batch_size']} (powers of two, dynamic batching on), plus the config as "
          f"shipped; client concurrency 1..{config.get('run_config_search_max_concurrency', 1024)} (closed loop, batch 1); "
          f"objective throughput, constraint P99 <= {budget_ms:g} ms")
    print(f"$ {' '.join(cmd)}   (the tritonserver wrapper in {bindir}, first on PATH)", flush=True)
    started = time.perf_counter()
    log = open(work / "model-analyzer.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=work, env=env,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
        for _ in range(3):  # MA saves its checkpoint and stops its server on the third SIGINT
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(1)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        log.close()
        # MA starts its tritonserver in a session of its own: whatever names this work dir is ours
        left = stop_processes_naming(str(work))
    result.wall_s = time.perf_counter() - started
    output = (work / "model-analyzer.log").read_text(errors="replace")
    if left:
        result.notes.append(f"Model Analyzer left {len(left)} process(es) running (stopped: PIDs {left})")
    if "Perf Analyzer encountered an error" in output:
        result.notes.append("Model Analyzer: perf_analyzer failed on some measurements (see its perf_analyzer_error.log)")
    if code != 0:
        result.error = (f"model-analyzer {'ran past ' + str(int(timeout_s)) + ' s' if code is None else 'exited ' + str(code)}: "
                        + tail(output, 6))
        return result
    try:
        pick, info = ma_winner(work, output, budget_ms)
    except RuntimeError as err:
        result.error = str(err)
        return result
    text_path = work / "output_repository" / pick / "config.pbtxt"
    if not text_path.is_file():
        result.error = f"Model Analyzer ranked {pick} first, but {text_path} does not exist"
        return result
    result.config = Config(f"MA: {pick}", text_path.read_text())
    if info is not None:
        result.predicted = f"{info['throughput']:.0f}/s at c={info['concurrency']} (P99 {info['p99_ms']:.1f} ms)"
        result.notes.append(f"Model Analyzer measured {info['configs']} configs in {info['measurements']} measurements; "
                            f"it ranks {pick} first" + ("" if info["table_best"] in (None, pick) else
                                                        f" (its table's top throughput under the budget: {info['table_best']})"))
    return result


# -- tritongen --------------------------------------------------------------------------------------

def predicted_capacity(tune_output: str, report: Path) -> tuple[str, str | None]:
    """tritongen's predicted capacity for its chosen config (and the one tune --verify measured live):
    from tune's JSON report when it wrote one, else the chosen column of the 'capacity' row of its table."""
    try:
        entry = json.loads(report.read_text())["models"][MODEL]
        predicted, live = entry.get("predicted_capacity_per_s"), entry.get("measured_capacity_per_s")
        if isinstance(predicted, (int, float)):
            return f"{predicted:.0f}/s", None if not isinstance(live, (int, float)) else f"{live:.0f}/s"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for line in tune_output.splitlines():
        if "capacity" not in line.lower():
            continue
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        cells = [c for c in cells if c != ""]
        if len(cells) >= 3:  # label, plan (baseline), winner[, runner-up]
            rates = re.findall(r"([0-9][0-9,.]*)\s*(?:req)?/s", cells[2])
            if rates:
                return f"{float(rates[-1].replace(',', '')):.0f}/s", None
    return "- (not in tune's output)", None


def run_tritongen(work: Path, quick: bool, timeout_s: float) -> ToolResult:
    result = ToolResult("tritongen")
    exe = str(venv_bin() / "tritongen")
    repo = copy_repository(work / "repository")
    env = dict(os.environ, COLUMNS="240", NO_COLOR="1", TERM="dumb")
    # The profile's --quick levels and two live candidates: what fits the 90 s for profile +
    # tune + verify (a full profile adds ~25 s and measures the same curve and device part).
    profile = [exe, "profile", str(SPEC), "--repo", str(repo), "-o", str(work / "profiles"), "--quick"]
    report = work / "tune.json"
    tune = [exe, "tune", str(SPEC), "--profiles", str(work / "profiles"), "--traffic", str(TRAFFIC), *TUNE_OBJECTIVE,
            "--verify", "--verify-top", "2", "--repo", str(repo), "-o", str(work / "tuned"), "--report", str(report)]
    if quick:
        tune += ["--requests", "1000", "--verify-requests", "400"]
    outputs = []
    steps: list[str] = []
    started = time.perf_counter()
    for cmd in (profile, tune):
        print(f"$ {' '.join(cmd)}", flush=True)
        step_started = time.perf_counter()
        try:
            r = run_cmd(cmd, timeout_s, env=env, cwd=work)
            steps.append(f"{cmd[1]} {time.perf_counter() - step_started:.0f} s")
        except subprocess.TimeoutExpired:
            result.wall_s = time.perf_counter() - started
            result.error = f"{cmd[1]} ran past {timeout_s:.0f} s"
            return result
        outputs.append(r.stdout + r.stderr)
        (work / f"{cmd[1]}.log").write_text(outputs[-1])
        written = (work / "tuned" / MODEL / "config.pbtxt").is_file()
        if r.returncode != 0 and not (cmd is tune and r.returncode == 1 and written):
            result.wall_s = time.perf_counter() - started
            result.error = f"tritongen {cmd[1]} exited {r.returncode}: {tail(outputs[-1], 6)}"
            return result
        if cmd is tune and r.returncode == 1:
            result.notes.append("tune: its winner does not meet every target (exit 1); measured as written")
    result.wall_s = time.perf_counter() - started
    result.notes.append("tritongen: " + ", ".join(steps))
    tuned = work / "tuned"
    result.config = Config("tritongen", (tuned / MODEL / "config.pbtxt").read_text(), server_flags_from(tuned))
    predicted, live = predicted_capacity(outputs[-1], report)
    result.predicted = predicted + (f" (tune --verify measured {live})" if live else "")
    preferred = re.search(r"live measurement preferred (.+?) over", outputs[-1])
    if preferred:
        result.notes.append(f"tune --verify: the live measurement preferred {preferred.group(1)} over the simulator's pick")
    return result


# -- goodput ----------------------------------------------------------------------------------------

@dataclass
class Point:
    rate: float
    throughput: float
    p99_ms: float
    ok: bool
    why: str = ""
    served: float = float("nan")  # completed / arrived at the server within perf_analyzer's windows


class ServerCounts(threading.Thread):
    """Samples, every 0.2 s while perf_analyzer runs, the requests Triton has finished (success and
    failure counts of /v2/models/M/stats) and holds (nv_inference_pending_request_count): their sum is
    the requests that arrived. perf_analyzer's Poisson schedule sends a few percent fewer requests than
    its nominal rate within its windows (0.92-0.99 measured here), and it waits for every request
    before it exits, so neither its nominal rate nor counts taken around the run say whether the
    server kept up; these samples, taken at its window boundaries, do."""

    def __init__(self, server: TritonServer) -> None:
        super().__init__(daemon=True)
        self.stats_url = f"http://{server.http_url}/v2/models/{MODEL}/stats"
        self.metrics_url = server.metrics_url
        self.samples: list[tuple[int, int, int]] = []  # (time ns, finished, arrived)
        self.done = threading.Event()

    def run(self) -> None:
        import httpx

        pending = re.compile(r'^nv_inference_pending_request_count\{model="' + MODEL + r'".*\}\s+(\S+)', re.M)
        with httpx.Client(timeout=2) as client:
            while not self.done.is_set():
                try:
                    t = time.time_ns()
                    stats = client.get(self.stats_url).json()["model_stats"][0]["inference_stats"]
                    held = pending.search(client.get(self.metrics_url).text)
                    finished = stats["success"]["count"] + stats["fail"]["count"]
                    self.samples.append((t, stats["success"]["count"], finished + int(float(held.group(1)) if held else 0)))
                except (httpx.HTTPError, KeyError, IndexError, ValueError):
                    pass
                self.done.wait(0.2)

    def served_between(self, start_ns: int, end_ns: int) -> float:
        """Completed / arrived between the samples nearest to the two instants."""
        if len(self.samples) < 2:
            return float("nan")
        a = min(self.samples, key=lambda s: abs(s[0] - start_ns))
        b = min(self.samples, key=lambda s: abs(s[0] - end_ns))
        arrived = b[2] - a[2]
        return (b[1] - a[1]) / arrived if arrived > 0 else float("nan")


def measure_rate(pa: str, server: TritonServer, rate: float, window_ms: int, budget_ms: float, work: Path) -> Point:
    """perf_analyzer at one Poisson rate: three windows of `window_ms`, merged (the stability check is
    opened wide so an overloaded point is measured, not aborted); single-row requests over gRPC. A
    failed request (a rejection) makes perf_analyzer stop, and the point fail."""
    stem = work / f"pa-{rate:.0f}-{time.monotonic_ns()}"
    report, export = stem.with_suffix(".csv"), stem.with_suffix(".json")
    cmd = [pa, "-m", MODEL, "-u", server.grpc_url, "-i", "grpc", "-b", "1", "--async",
           f"--request-rate-range={rate:.1f}", "--request-distribution=poisson",
           "--measurement-mode=time_windows", f"--measurement-interval={window_ms}",
           "--stability-percentage=1000", "--max-trials=3", "--percentile=99", "--max-threads=8",
           "-f", str(report), "--profile-export-file", str(export)]
    counts = ServerCounts(server)
    counts.start()
    try:
        r = run_cmd(cmd, timeout=max(60, 10 * window_ms / 1000))
    except subprocess.TimeoutExpired:
        return Point(rate, 0.0, float("inf"), False, "perf_analyzer timed out")
    finally:
        counts.done.set()
        counts.join()
    if r.returncode != 0 or not report.is_file():
        output = r.stdout + r.stderr
        error = re.search(r"had error: (?:\[request id: \d+\] )?(.+)", output)
        return Point(rate, 0.0, float("inf"), False,
                     f"a request failed: {error.group(1).strip()}" if error else tail(output, 1))
    with open(report, newline="") as f:
        row = next(csv.DictReader(f))
    bounds = json.loads(export.read_text())["experiments"][0]["window_boundaries"]
    report.unlink()
    export.unlink()
    throughput = float(row["Inferences/Second"])
    p99_ms = float(row["p99 latency"]) / 1000
    served = counts.served_between(bounds[0], bounds[-1])
    ok = p99_ms <= budget_ms and not served < MIN_SERVED  # nan (no samples): judged on P99 alone
    why = "" if ok else ("P99 over budget" if p99_ms > budget_ms else f"served {served:.0%} of arrivals")
    return Point(rate, throughput, p99_ms, ok, why, served)


def find_goodput(measure: Callable[[float], Point], start: float, steps: int, cap: float = 6400) -> tuple[float, list[Point]]:
    """Highest passing rate: doubling from `start` (halving if it fails) to a pass/fail bracket, then
    `steps` bisections on a log scale."""
    points: list[Point] = []

    def probe(rate: float) -> bool:
        points.append(measure(rate))
        return points[-1].ok

    lo, hi = 0.0, None
    rate = start
    if probe(rate):
        lo = rate
        while rate < cap:
            rate *= 2
            if not probe(rate):
                hi = rate
                break
            lo = rate
    else:
        hi = rate
        while rate > 10:
            rate /= 2
            if probe(rate):
                lo = rate
                break
            hi = rate
    if hi is None or lo == 0.0:
        return lo, points
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, points


def goodput_run(pa: str, config: Config, work: Path, window_ms: int, budget_ms: float, steps: int) -> tuple[float, list[Point]]:
    repo = config.write_repository(Path(tempfile.mkdtemp(prefix="repo-", dir=work)))
    with TritonServer(ServerOptions(repository=repo, extra_args=config.flags)) as server:
        measure_rate(pa, server, 50, min(window_ms, 1000), budget_ms, work)  # warm-up, not counted
        found = find_goodput(lambda rate: measure_rate(pa, server, rate, window_ms, budget_ms, work), 100, steps)
    shutil.rmtree(repo, ignore_errors=True)
    return found


# -- main -------------------------------------------------------------------------------------------

def other_servers() -> list[str]:
    """tritonservers running on this host (call it while none of this bench's own runs)."""
    return [ln for ln in run_cmd(["pgrep", "-fa", "tritonserver"], 30).stdout.splitlines() if "pgrep" not in ln]


def wait_for_quiet_host(max_wait_s: float) -> None:
    """Wait (polling every 30 s) while another tritonserver runs on this host."""
    deadline = time.monotonic() + max_wait_s
    while True:
        others = other_servers()
        if not others:
            return
        if time.monotonic() > deadline:
            print(f"another tritonserver is still running after {max_wait_s:.0f} s; going ahead: {others[0][:120]}")
            return
        print(f"waiting: another tritonserver is running ({len(others)} process(es)): {others[0][:120]}", flush=True)
        time.sleep(30)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ["tool", "wall s", "chosen config", "predicted", "goodput run 1", "run 2", "median", "vs MA"]
    cells = [[str(r[k]) for k in ("tool", "wall", "config", "predicted", "run1", "run2", "median", "ratio")] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(c, widths)))


def main(args: argparse.Namespace, pa: str, pa_how: str, ma: str, ma_how: str) -> int:
    begun = time.monotonic()
    budget_ms = next(c.p99_ms for c in load_spec(SPEC).spec.traffic_classes if c.kind == "interactive")
    window_ms = args.window_ms or (1000 if args.quick else 2000)
    steps = 2 if args.quick else 4
    work = Path(tempfile.mkdtemp(prefix="bench-vs-ma-"))
    print(f"model: {MODEL} ({REPOSITORY.relative_to(ROOT)}), spec {SPEC.relative_to(ROOT)}, traffic {TRAFFIC.relative_to(ROOT)}; "
          f"latency budget {budget_ms:g} ms (the interactive class's P99 target){'; --quick' if args.quick else ''}")
    print(f"model analyzer: {ma_how}")
    print(f"perf_analyzer: {pa_how}")
    print(f"work dir: {work}", flush=True)
    crowded: list[str] = []  # when another tritonserver shared the host
    try:
        (work / "ma").mkdir()
        ma_result = run_model_analyzer(ma, pa, work / "ma", budget_ms, args.quick, args.ma_timeout)
        print(f"Model Analyzer: {ma_result.wall_s:.0f} s; " + (ma_result.error or ma_result.config.describe()), flush=True)
        if other_servers():
            crowded.append("after Model Analyzer")
        (work / "tg").mkdir()
        tg_result = run_tritongen(work / "tg", args.quick, args.tg_timeout)
        print(f"tritongen: {tg_result.wall_s:.0f} s; " + (tg_result.error or tg_result.config.describe()), flush=True)

        naive = ToolResult("naive (as shipped)", config=Config("naive", (REPOSITORY / MODEL / "config.pbtxt").read_text()))
        results = [naive, ma_result, tg_result]
        measured = [r for r in results if r.config is not None]
        goodputs: dict[str, list[float]] = {r.tool: [] for r in measured}
        print(f"goodput: perf_analyzer over gRPC, batch 1, Poisson arrivals at a fixed rate per point, 3 windows of "
              f"{window_ms} ms merged; pass = no failed request, P99 <= {budget_ms:g} ms and >= {MIN_SERVED:.0%} of the "
              f"requests that arrived in the windows served (Triton's counts); doubling from 100/s, then {steps} "
              "bisections; run 2 in reverse order. Each point: rate ✓/✗ (throughput, P99 ms)", flush=True)
        for run, order in ((1, measured), (2, list(reversed(measured)))):
            for r in order:
                if other_servers():
                    crowded.append(f"before goodput run {run} of {r.tool}")
                value, points = goodput_run(pa, r.config, work, window_ms, budget_ms, steps)
                goodputs[r.tool].append(value)
                trail = ", ".join(f"{p.rate:.0f}{'✓' if p.ok else '✗'}({p.throughput:.0f}/s, {p.p99_ms:.0f})"
                                  if p.throughput else f"{p.rate:.0f}✗({p.why[:60]})" for p in points)
                print(f"  run {run} {r.tool}: {value:.0f} req/s  [{trail}]", flush=True)
        ma_median = statistics.median(goodputs[ma_result.tool]) if ma_result.tool in goodputs else None
        rows = []
        for r in results:
            g = goodputs.get(r.tool)
            median = statistics.median(g) if g else None
            ratio = "-"
            if r is tg_result and median is not None and ma_median:
                ratio = f"{median / ma_median:.2f}"
            rows.append({
                "tool": r.tool,
                "wall": f"{r.wall_s:.0f}" if r.wall_s is not None else "-",
                "config": r.config.describe() if r.config is not None else f"failed: {r.error[:70]}",
                "predicted": r.predicted,
                "run1": f"{g[0]:.0f}" if g else "-",
                "run2": f"{g[1]:.0f}" if g and len(g) > 1 else "-",
                "median": f"{median:.0f}" if median is not None else "-",
                "ratio": ratio,
            })
        print()
        print(f"goodput in req/s (highest Poisson rate with P99 <= {budget_ms:g} ms and >= {MIN_SERVED:.0%} served); "
              "wall s: MA = `model-analyzer profile`; tritongen = profile + tune --objective capacity --verify")
        print("predicted: tritongen's capacity within targets from tune; MA's best measured throughput "
              "(closed loop, its concurrency) under the budget")
        print_table(rows)
        for r in results:
            for note in r.notes:
                print(f"note: {note}")
        if ma_result.error:
            print(f"skipped: the Model Analyzer column, as it did not run here: {ma_result.error}")
        if tg_result.error:
            print(f"tritongen failed: {tg_result.error}")
        if crowded:
            print(f"note: another tritonserver was running on this host {', '.join(crowded)}: figures may be low")
        print(f"run took {time.monotonic() - begun:.0f} s")
        return 1 if tg_result.error else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"(work dir kept: {work})")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: a 2-config MA sweep, short windows, quick profile")
    parser.add_argument("--window-ms", type=int, default=0, help="perf_analyzer window per goodput point (default 2000; quick 1000)")
    parser.add_argument("--ma-timeout", type=float, default=3600, help="seconds Model Analyzer may take (default 3600)")
    parser.add_argument("--tg-timeout", type=float, default=1800, help="seconds each tritongen command may take")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (MA's logs, tritongen's profiles)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for another tritonserver to finish")
    return parser.parse_args()


if __name__ == "__main__":
    from bench.report import saved_report

    arguments = parse_args()
    pa_path, pa_note = find_perf_analyzer()
    ma_path, ma_note = find_model_analyzer() if pa_path else (None, "")
    if pa_path is None or ma_path is None:
        print(f"skipped: {'perf_analyzer' if pa_path is None else 'Model Analyzer'} cannot run here: "
              f"{pa_note if pa_path is None else ma_note}")
        sys.exit(0)
    if not arguments.no_wait:
        wait_for_quiet_host(15 * 60)
    with saved_report("bench_vs_model_analyzer-quick" if arguments.quick else "bench_vs_model_analyzer"):
        code = main(arguments, pa_path, pa_note, ma_path, ma_note)
    sys.exit(code)
