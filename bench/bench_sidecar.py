"""What the sidecar costs, next to what nginx costs: Triton direct, through nginx, through the sidecar.
One unit (about 720 lines): one measurement in which the same load generator drives every path in
rotated rounds and the goals compare the paths with each other; the nginx setup, the clients and
the tables serve only this bench, so they stay here, not in bench/rig/.

    .venv/bin/python -m bench.bench_sidecar [--seconds 3] [--levels 1,16,64] [--protocols http,grpc]
                                            [--models ranker,identity] [--pinned] [--no-nginx]
                                            [--client perf_analyzer|python]
                                            [--queue-policies] [--json out.json]

Four paths to the same embedded Triton, in the same run: direct, through nginx configured as a
good proxy would be (one worker, upstream keep-alive pools, HTTP/1.1 upstream for REST, an HTTP/2
`grpc_pass` server for gRPC), through the sidecar as deployed (`tritongen sidecar`, its own
process, HTTP and gRPC upstreams, `--front native`: nginx with the fast lane in front, where nginx
and its Lua module are installed), and through the same sidecar with `--front python` (its own
listeners). Two models: `ranker` of the example deployment (a batched
numpy MLP, ~4 ms per execution), and `identity` of bench/models/deployment.yaml (max_batch_size 0,
2 instances, nothing computed): the issue-15 case, where the proxy's own cost is not hidden behind
the model's time.

For each protocol (HTTP/JSON and gRPC), model and concurrency level, closed-loop clients (one
request in flight each) run `--seconds` per path, split into `--rounds` segments whose order
rotates (D N S, N S D, S D N, ...), so a drift of the shared host weighs on every path alike.
Reported per path: P50, P99, throughput; for the proxies also the throughput ratio to direct and
the added P50. Goals, per protocol, model and level: the sidecar's throughput ratio within
RATIO_BAND of nginx's (no lower than nginx's less the band) and its added P50 at most 1 ms (issue
32), and its P99 at most 1 ms above nginx's (issue 45); MET or MISSED each. A last run puts both
proxies before a null upstream (answers at once) at concurrency 1: each proxy's own latency.

Load generator (`--client`): perf_analyzer by default, the C++ client users run (bench/rig/
perf_analyzer.py finds it or unpacks the tritonclient 2.51 wheel's), one run per path and round,
the median of the rounds per path; or Python clients in this process on uvloop (`--client python`,
and where perf_analyzer cannot run): aiohttp for HTTP, grpc.aio for gRPC with a pre-serialised
`ModelInferRequest` (tritonclient's service_pb2, what tritonclient.grpc.aio sends, without its
per-call object building), latencies pooled over the rounds. On a small machine Triton, the proxy and the clients share
the cores, which the numbers include; `--pinned` gives the proxy under test (sidecar or nginx) a
CPU of its own, as a pod's CPU request would.

The sidecar runs with a policy built by `build_sidecar_policy` from the two specs, with the
models' concurrency quotas (`max_inflight`) and the overall limit opened to the highest level so
admission never queues: this measures the pass-through (the output says so). `ranker` keeps its
rendered config except its priority levels and queue policies, unless --queue-policies.
Bounded: about 3 x (seconds + warm-up + 0.2 x rounds) per protocol, model and level, plus
start-up: under 4 minutes by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.rig import ROOT
from bench.rig.perf_analyzer import find_perf_analyzer, measure
from sidecar.nginx_front import find_nginx, process_preamble, temp_paths, upstream_block
from tritongen.core.plan import plan_deployment
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.render import render_repository, write_repository
from tritongen.server import ServerOptions, TritonServer
from tritongen.shared.processes import free_port, tied_to_parent
from tritongen.sidecar_process import SidecarProcess
from tritongen.specio import load_spec

SPEC = ROOT / "examples" / "deployment.yaml"
REPOSITORY = ROOT / "model_repository"
BENCH_MODELS = Path(__file__).resolve().parent / "models"
IDENTITY_SPEC = BENCH_MODELS / "deployment.yaml"
TARGET_ADDED_P50_MS = 1.0
TARGET_P99_BEYOND_NGINX_MS = 1.0  # issue 45: the sidecar's P99 at most 1 ms above plain nginx's
RATIO_BAND = 0.05  # issue 32: the sidecar's throughput ratio within 0.05 of plain nginx's
NGINX = "/usr/sbin/nginx"
PATHS = ("direct", "nginx", "sidecar", "python")
# "sidecar" is the sidecar as `--front auto` deploys it where nginx with Lua is installed: the native front
# (sidecar/nginx_front.py, the fast lane); "python" is the same sidecar with `--front python` (its own
# listeners: the lean HTTP front and grpc.aio), in the same run.
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
NATIVE_WHY = find_nginx()[1] or None
SIDECAR_FRONT = "python" if NATIVE_WHY else "native"


# -- the repository and the policy ------------------------------------------------------------------

def build_repository(into: Path, queue_policies: bool) -> tuple[Path, list[str], list[dict[str, Any]]]:
    """`ranker` (committed config and code) and `identity` (rendered from bench/models/deployment.yaml)
    in one repository; the example deployment's server flags; identity's sidecar policy entry.

    Without `queue_policies`, ranker's priority levels and queue policies are taken out: Triton 2.51
    stalls ~2-3 % of requests for ~500 ms when a model has them (README, "Known server
    behaviour"), on every path alike, which would swamp the proxies' own cost.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    shutil.copytree(REPOSITORY / "ranker", into / "ranker", ignore=shutil.ignore_patterns("__pycache__"))
    if not queue_policies:
        config_path = into / "ranker" / "config.pbtxt"
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
        batching = config.dynamic_batching
        batching.priority_levels = 0
        batching.default_priority_level = 0
        batching.ClearField("default_queue_policy")
        batching.ClearField("priority_queue_policy")
        config_path.write_text(text_format.MessageToString(config))
    rendered = render_repository(load_spec(IDENTITY_SPEC))
    write_repository(rendered, into / "rendered")
    shutil.copytree(into / "rendered" / "identity", into / "identity")
    shutil.copytree(BENCH_MODELS / "identity" / "1", into / "identity" / "1", ignore=shutil.ignore_patterns("__pycache__"))
    identity_policy = json.loads((into / "rendered" / "sidecar_policy.json").read_text())
    shutil.rmtree(into / "rendered")
    flags_file = REPOSITORY / "server_flags.txt"
    flags = [ln.strip() for ln in flags_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if flags_file.is_file() else []
    return into, flags, identity_policy["models"]


def write_policy(path: Path, most: int, extra_models: list[dict[str, Any]]) -> list[str]:
    """The example deployment's policy plus the bench models' entries (both from build_sidecar_policy),
    each model's concurrency quota opened to the highest level: this measures the pass-through, not
    the admission limits (which would queue); a model without a limit (`max_inflight` null) stays
    so. Returns what was widened, for the output."""
    loaded = load_spec(SPEC)
    policy = build_sidecar_policy(loaded.spec, plan_deployment(loaded.spec, loaded.architectures))
    policy["models"] = [m for m in policy["models"] if m["name"] not in {e["name"] for e in extra_models}]
    policy["models"] += extra_models
    widened = []
    for model in policy["models"]:
        limit = model.get("max_inflight")
        if model["name"] in ("ranker", "identity") and limit is not None and limit < 2 * most:
            widened.append(f"{model['name']} max_inflight {model['max_inflight']} -> {2 * most}")
            model["max_inflight"] = 2 * most
    if policy["concurrency"]["max"] < 4 * most:
        widened.append(f"concurrency.max {policy['concurrency']['max']} -> {4 * most}")
        policy["concurrency"]["max"] = 4 * most
    path.write_text(json.dumps(policy, indent=2))
    return widened


def pin(root: int, cpus: set[int]) -> None:
    """Every thread of `root` and of its descendants onto `cpus` (sched_setaffinity is per thread)."""
    from tritongen.tuner.proc_cpu import proc_tree

    for pid in proc_tree(root):
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def memory_of(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def sidecar_queued(metrics_url: str) -> int:
    """Requests that waited in the sidecar's admission queue (the bench means it to be none)."""
    text = httpx.get(metrics_url, timeout=5).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("sidecar_requests_queued_total")))


def wait_http_ready(url: str, proc: subprocess.Popen[bytes] | None, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during start-up")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready at {url} after {timeout:.0f} s")
        time.sleep(0.1)


# -- nginx ------------------------------------------------------------------------------------------

NGINX_SETTINGS = ("worker_processes 1; upstream keepalive 64 (keepalive_requests 1000000); HTTP: proxy_pass, "
                  "proxy_http_version 1.1, proxy_set_header Connection \"\"; gRPC: listen ... http2, "
                  "grpc_pass grpc://upstream; access_log off")


def nginx_missing() -> str | None:
    """Why nginx cannot run here (None: it can)."""
    if not os.access(NGINX, os.X_OK):
        return f"{NGINX} is not installed (Debian/Ubuntu: `apt-get install nginx-light`)"
    return None


def nginx_config(tmp: Path, http_upstream: str, http_port: int, grpc_upstream: str | None, grpc_port: int) -> str:
    """A plain proxy as a good operator would set it up (NGINX_SETTINGS); its process settings and
    upstream pools are the native front's (sidecar/nginx_front.py), without the lane."""
    grpc = "" if grpc_upstream is None else upstream_block("triton_grpc", grpc_upstream) + f"""    server {{
        listen 127.0.0.1:{grpc_port} http2;
        keepalive_requests 1000000;
        location / {{
            grpc_pass grpc://triton_grpc;
        }}
    }}
"""
    return f"""{process_preamble(tmp)}http {{
    access_log off;
{temp_paths(tmp)}    client_max_body_size 64m;
    client_body_buffer_size 1m;
{upstream_block("triton_http", http_upstream)}    server {{
        listen 127.0.0.1:{http_port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://triton_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
{grpc}}}
"""


class Nginx:
    """nginx in the foreground (`daemon off`, prefix, pid and logs in a temp dir), stopped by its PID."""

    def __init__(self, http_upstream: str, grpc_upstream: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        self.http_port, self.grpc_port = free_port(), free_port()
        self.conf = self.tmp / "nginx.conf"
        self.conf.write_text(nginx_config(self.tmp, http_upstream, self.http_port, grpc_upstream, self.grpc_port))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> Nginx:
        log = open(self.tmp / "stderr.log", "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            tied_to_parent([NGINX, "-p", str(self.tmp), "-c", str(self.conf), "-e", str(self.tmp / "error.log")], signal.SIGTERM),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        try:
            wait_http_ready(f"http://{self.http_url}/v2/health/ready", self.proc, "nginx")
        except BaseException as err:
            self.__exit__()
            logs = "".join(p.read_text(errors="replace") for p in (self.tmp / "stderr.log", self.tmp / "error.log")
                           if p.exists())
            raise RuntimeError(f"{err}:\n{logs[-2000:]}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM to the master: fast shutdown, its worker goes with it
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- the load ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    model: str
    json_body: bytes
    grpc_request: bytes


def workload(model: str) -> Workload:
    import numpy as np
    from tritonclient.grpc import service_pb2

    name = {"ranker": "FEATURES", "identity": "INPUT0"}[model]
    body = json.dumps({"inputs": [{"name": name, "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}]})
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, "FP32"
    tensor.shape.extend([1, 32])
    request.raw_input_contents.append(np.full((1, 32), 0.25, dtype=np.float32).tobytes())
    return Workload(model, body.encode(), request.SerializeToString())


Sender = Callable[[], Awaitable[int]]  # one request; 200 ok, 429 refused, anything else an error


class HttpTarget:
    def __init__(self, base: str, load: Workload) -> None:
        self.url = f"http://{base}/v2/models/{load.model}/infer"
        self.body = load.json_body
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=30))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def send(self) -> int:
        assert self.session is not None
        try:
            async with self.session.post(self.url, data=self.body,
                                         headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                return resp.status
        except aiohttp.ClientError:
            return 0


class GrpcTarget:
    """One channel (one HTTP/2 connection, as one tritonclient InferenceServerClient) for all clients."""

    def __init__(self, target: str, load: Workload) -> None:
        self.target = target
        self.request = load.grpc_request
        self.channel: Any = None
        self.call: Any = None

    async def open(self) -> None:
        import grpc

        self.channel = grpc.aio.insecure_channel(self.target, options=[("grpc.max_receive_message_length", -1)])
        self.call = self.channel.unary_unary(MODEL_INFER)  # bytes in, bytes out
        await asyncio.wait_for(self.channel.channel_ready(), 10)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()

    async def send(self) -> int:
        import grpc

        try:
            await self.call(self.request, timeout=30)
            return 200
        except grpc.aio.AioRpcError as err:
            return 429 if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else 0


async def closed_loop(send: Sender, concurrency: int, seconds: float, warmup: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = refused = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds

    async def client() -> None:
        nonlocal errors, refused
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            status = await send()
            t1 = time.perf_counter()
            if t0 >= measure_from and t1 <= stop_at:
                if status == 200:
                    latencies.append(t1 - t0)
                elif status == 429:
                    refused += 1
                else:
                    errors += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return {"requests": len(latencies), "errors": errors, "refused": refused, "latencies": latencies}


def pooled(runs: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One summary of several runs of the same path: latencies pooled, throughput over their time."""
    latencies = sorted(x for r in runs for x in r["latencies"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {"requests": len(latencies), "errors": sum(r["errors"] for r in runs),
            "refused": sum(r["refused"] for r in runs), "throughput": len(latencies) / seconds,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}


async def rotated(targets: dict[str, Any], concurrency: int, seconds: float, warmup: float,
                  rounds: int) -> dict[str, dict[str, Any]]:
    """Every path for `seconds` in all, in `rounds` segments whose order rotates (A B C, B C A, C A B,
    ...), so that a drift of the shared host (another process waking up, CPU frequency) weighs on
    every path alike. Each path's first segment is preceded by `warmup`, the others by 0.2 s."""
    names = list(targets)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for target in targets.values():
        await target.open()
    try:
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                runs[name].append(await closed_loop(targets[name].send, concurrency, seconds / rounds,
                                                    warmup if i == 0 else min(warmup, 0.2)))
    finally:
        for target in targets.values():
            await target.close()
    return {name: pooled(r, seconds) for name, r in runs.items()}


# perf_analyzer's --shape per model: identity has no batch dimension (max_batch_size 0), ranker batches
PA_SHAPES = {"identity": "INPUT0:1,32", "ranker": "FEATURES:32"}
# perf_analyzer's shortest window: each run starts its clients at once, and that ramp should stay a small
# part of what it reports
PA_WINDOW_MIN_MS = 500


def rotated_pa(perf_analyzer: str, urls: dict[str, str], protocol: str, model: str, concurrency: int,
               seconds: float, rounds: int) -> dict[str, dict[str, Any]]:
    """`rotated` with perf_analyzer as the clients: each path `rounds` times, in rotating order, each
    time three windows of a third of its share of `seconds` (at least PA_WINDOW_MIN_MS); per path the
    median of its rounds' throughput, P50 and P99 (perf_analyzer reports percentiles, not latencies
    to pool). A run that fails counts one error, with perf_analyzer's words in `failures`."""
    names = list(urls)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    failures: dict[str, list[str]] = {name: [] for name in names}
    window_ms = max(PA_WINDOW_MIN_MS, int(seconds / rounds / 3 * 1000))
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            try:
                runs[name].append(measure(perf_analyzer, urls[name], protocol, model, PA_SHAPES[model], concurrency,
                                          window_ms))
            except RuntimeError as err:
                failures[name].append(str(err))
    out = {}
    for name, done in runs.items():
        def median(key: str) -> float:
            return statistics.median(r[key] for r in done) if done else float("nan")
        out[name] = {"requests": 0, "errors": len(failures[name]), "refused": 0, "throughput": median("throughput"),
                     "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"), "failures": failures[name]}
    return out


def run_loop(coro: Awaitable[Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


# -- the null upstream ------------------------------------------------------------------------------

NULL_UPSTREAM = """
import asyncio, sys
from aiohttp import web
async def infer(request):
    await request.read()
    return web.Response(body=b'{"model_name":"identity","model_version":"1","outputs":[]}', content_type="application/json")
async def ready(request):
    return web.Response()
async def main():
    app = web.Application()
    app.router.add_post("/v2/models/identity/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


def proxy_floor(policy: Path, work: Path, seconds: float, warmup: float, rounds: int,
                with_nginx: bool) -> dict[str, dict[str, Any]]:
    """Both proxies before a null upstream (answers at once) at concurrency 1, HTTP: their own
    latency, without a model's compute competing for the cores."""

    class Null:
        http_url = f"127.0.0.1:{free_port()}"
        metrics_url = f"http://{http_url}/metrics"

    port = int(Null.http_url.rsplit(":", 1)[1])
    upstream = subprocess.Popen(tied_to_parent([sys.executable, "-c", NULL_UPSTREAM, str(port)], signal.SIGKILL))
    load = workload("identity")
    try:
        wait_http_ready(f"http://{Null.http_url}/v2/health/ready", upstream, "the null upstream")
        with SidecarProcess(policy, Null, work / "sidecar-null.log", front=SIDECAR_FRONT) as sidecar:
            nginx = Nginx(Null.http_url) if with_nginx else None
            try:
                if nginx is not None:
                    nginx.__enter__()
                targets = {"direct": HttpTarget(Null.http_url, load)}
                if nginx is not None:
                    targets["nginx"] = HttpTarget(nginx.http_url, load)
                targets["sidecar"] = HttpTarget(sidecar.http_url, load)
                return run_loop(rotated(targets, 1, seconds, warmup, rounds))
            finally:
                if nginx is not None:
                    nginx.__exit__()
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


# -- the report -------------------------------------------------------------------------------------

def derived(row: dict[str, Any]) -> None:
    direct = row["direct"]
    for name in ("nginx", "sidecar", "python"):
        path = row.get(name)
        if path is None:
            continue
        path["ratio"] = path["throughput"] / direct["throughput"] if direct["throughput"] else 0.0
        path["added_p50_ms"] = path["p50_ms"] - direct["p50_ms"]


def print_table(rows: list[dict[str, Any]], with_nginx: bool) -> None:
    proxies = ("nginx", "sidecar") if with_nginx else ("sidecar",)
    if any("python" in r for r in rows):
        proxies += ("python",)
    head = f"{'proto':<5} {'model':<8} {'conc':>4} | {'direct p50':>10} {'p99':>6} {'req/s':>6}"
    for name in proxies:
        head += f" | {name + ' p50':>11} {'p99':>6} {'req/s':>6} {'ratio':>5} {'+p50':>5}"
    print(head)
    print("-" * len(head))
    for r in rows:
        d = r["direct"]
        line = (f"{r['protocol']:<5} {r['model']:<8} {r['concurrency']:>4} | {d['p50_ms']:>10.2f} {d['p99_ms']:>6.2f} "
                f"{d['throughput']:>6.0f}")
        for name in proxies:
            p = r.get(name)
            if p is None:
                line += f" | {'-':>11} {'-':>6} {'-':>6} {'-':>5} {'-':>5}"
                continue
            line += (f" | {p['p50_ms']:>11.2f} {p['p99_ms']:>6.2f} {p['throughput']:>6.0f} {p['ratio']:>5.2f} "
                     f"{p['added_p50_ms']:>5.2f}")
        print(line)


def print_goals(rows: list[dict[str, Any]], with_nginx: bool) -> tuple[int, int]:
    """One line per protocol and model: each level's two goals, MET or MISSED. Returns (met, total)."""
    met = total = 0
    print(f"goals: sidecar throughput ratio >= nginx's - {RATIO_BAND:g} and its P99 <= nginx's + "
          f"{TARGET_P99_BEYOND_NGINX_MS:g} ms{'' if with_nginx else ' (no nginx: not judged)'}; "
          f"sidecar added P50 <= {TARGET_ADDED_P50_MS:g} ms")
    keys = sorted({(r["protocol"], r["model"]) for r in rows}, key=lambda k: (k[0] != "http", k[1] != "ranker"))
    for protocol, model in keys:
        parts = []
        for r in (x for x in rows if x["protocol"] == protocol and x["model"] == model):
            s = r["sidecar"]
            cell = f"c={r['concurrency']}: "
            if with_nginx:
                ok = s["ratio"] >= r["nginx"]["ratio"] - RATIO_BAND
                met, total = met + ok, total + 1
                cell += f"ratio {s['ratio']:.2f} vs {r['nginx']['ratio']:.2f} {'MET' if ok else 'MISSED'}, "
                ok = s["p99_ms"] - r["nginx"]["p99_ms"] <= TARGET_P99_BEYOND_NGINX_MS
                met, total = met + ok, total + 1
                cell += f"P99 {s['p99_ms'] - r['nginx']['p99_ms']:+.2f} ms vs nginx {'MET' if ok else 'MISSED'}, "
            ok = s["added_p50_ms"] <= TARGET_ADDED_P50_MS
            met, total = met + ok, total + 1
            cell += f"+P50 {s['added_p50_ms']:.2f} ms {'MET' if ok else 'MISSED'}"
            parts.append(cell)
        print(f"  {protocol:<4} {model:<8} " + "; ".join(parts))
    return met, total


# -- main -------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="measured seconds per path, protocol, model and level (default 3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds before each path's first segment")
    parser.add_argument("--rounds", type=int, default=3,
                        help="segments the measured seconds are split into, path order rotating (default 3)")
    parser.add_argument("--levels", default="1,16,64", help="concurrency levels (default 1,16,64)")
    parser.add_argument("--protocols", default="http,grpc", help="http, grpc or both (default)")
    parser.add_argument("--models", default="ranker,identity", help="ranker, identity or both (default)")
    parser.add_argument("--no-nginx", action="store_true", help="leave the nginx column out")
    parser.add_argument("--client", choices=("perf_analyzer", "python"), default="perf_analyzer",
                        help="the load generator: perf_analyzer (default; unpacked from the tritonclient 2.51 wheel "
                        "when none is found; Python clients where it cannot run) or this process's Python clients")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--pinned", action="store_true",
                        help="give the proxies (sidecar and nginx) a CPU of their own, as a pod CPU request does; "
                        "Triton and the load generator share the others on every path")
    parser.add_argument("--queue-policies", action="store_true",
                        help="keep ranker's priority levels and queue policies (Triton then stalls some requests)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    models = [x.strip() for x in args.models.split(",") if x.strip()]
    begun = time.monotonic()

    perf_analyzer, pa_how = find_perf_analyzer() if args.client == "perf_analyzer" else (None, "--client python")
    skip = "--no-nginx" if args.no_nginx else nginx_missing()
    with_nginx = skip is None
    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    repo, flags, identity_models = build_repository(work / "repo", args.queue_policies)
    policy = work / "sidecar_policy.json"
    widened = write_policy(policy, max(levels), identity_models)
    loads = {m: workload(m) for m in models}
    rows: list[dict[str, Any]] = []
    with TritonServer(ServerOptions(repository=repo, extra_args=flags)) as server:
        with SidecarProcess(policy, server, work / "sidecar.log", grpc_upstream=server.grpc_url,
                            front=SIDECAR_FRONT) as sidecar, \
                SidecarProcess(policy, server, work / "sidecar-python.log", grpc_upstream=server.grpc_url,
                               front="python") as plain:
            nginx = Nginx(server.http_url, server.grpc_url) if with_nginx else None
            try:
                if nginx is not None:
                    nginx.__enter__()
                assert sidecar.proc is not None
                pid = sidecar.proc.pid
                if args.pinned:
                    # The pod's arrangement: the proxy on a CPU of its own, Triton and the clients on the
                    # rest, on every path (the proxies' CPU stays idle while the direct path runs).
                    assert server.process is not None
                    everything = set(range(os.cpu_count() or 1))
                    pin(server.process.pid, everything - {max(everything)})
                    pin(os.getpid(), everything - {max(everything)})
                    pin(pid, {max(everything)})
                    assert plain.proc is not None
                    pin(plain.proc.pid, {max(everything)})
                    if nginx is not None and nginx.proc is not None:
                        pin(nginx.proc.pid, {max(everything)})
                idle_rss = memory_of(pid)["VmRSS"]
                for protocol in protocols:
                    for model in models:
                        for c in levels:
                            if perf_analyzer is not None:
                                urls = {"direct": server.http_url if protocol == "http" else server.grpc_url}
                                if nginx is not None:
                                    urls["nginx"] = nginx.http_url if protocol == "http" else nginx.grpc_url
                                urls["sidecar"] = sidecar.http_url if protocol == "http" else sidecar.grpc_url
                                urls["python"] = plain.http_url if protocol == "http" else plain.grpc_url
                                row = {"protocol": protocol, "model": model, "concurrency": c,
                                       **rotated_pa(perf_analyzer, urls, protocol, model, c, args.seconds, args.rounds)}
                                derived(row)
                                rows.append(row)
                                continue
                            if protocol == "http":
                                targets = {"direct": HttpTarget(server.http_url, loads[model])}
                                if nginx is not None:
                                    targets["nginx"] = HttpTarget(nginx.http_url, loads[model])
                                targets["sidecar"] = HttpTarget(sidecar.http_url, loads[model])
                                targets["python"] = HttpTarget(plain.http_url, loads[model])
                            else:
                                targets = {"direct": GrpcTarget(server.grpc_url, loads[model])}
                                if nginx is not None:
                                    targets["nginx"] = GrpcTarget(nginx.grpc_url, loads[model])
                                targets["sidecar"] = GrpcTarget(sidecar.grpc_url, loads[model])
                                targets["python"] = GrpcTarget(plain.grpc_url, loads[model])
                            row = {"protocol": protocol, "model": model, "concurrency": c,
                                   **run_loop(rotated(targets, c, args.seconds, args.warmup, args.rounds))}
                            derived(row)
                            rows.append(row)
                mem = memory_of(pid)
                queued = sidecar_queued(sidecar.metrics_url)
            finally:
                if nginx is not None:
                    nginx.__exit__()
    floor = proxy_floor(policy, work, min(args.seconds, 2.0), args.warmup, args.rounds, with_nginx)
    shutil.rmtree(work, ignore_errors=True)

    where = ("the proxy under test pinned to a CPU of its own, Triton and the load generator on the other(s)"
             if args.pinned else f"{os.cpu_count()} CPUs shared by Triton, the proxy and the load generator")
    print(f"closed loop, {args.seconds:g} s per path, protocol, model and level in {args.rounds} rotating "
          f"segments; {where}")
    if perf_analyzer is not None:
        window_ms = max(PA_WINDOW_MIN_MS, int(args.seconds / args.rounds / 3 * 1000))
        print(f"load generator: perf_analyzer ({pa_how}), one run per path and round, 3 windows of {window_ms} ms "
              "each; per path the median of its rounds' throughput, P50 and P99 (client-side)")
    else:
        print(f"load generator: Python clients in one process on uvloop (perf_analyzer: {pa_how}): aiohttp for "
              "HTTP/JSON, grpc.aio on one channel with a pre-serialised ModelInferRequest for gRPC")
    print(f"nginx: {NGINX_SETTINGS}" if with_nginx else f"nginx: column skipped: {skip}")
    print(f"sidecar: its own process, HTTP and gRPC upstreams; policy from build_sidecar_policy "
          f"(examples/deployment.yaml + bench/models/deployment.yaml), widened so admission never queues: "
          f"{', '.join(widened) or 'nothing to widen'}; RSS idle {idle_rss / 2**20:.1f} MiB, after the run "
          f"{mem['VmRSS'] / 2**20:.1f} MiB (peak {mem['VmHWM'] / 2**20:.1f})")
    print(f"latencies in ms; ratio = throughput / direct's; +p50 = P50 - direct's P50; sidecar: --front {SIDECAR_FRONT}"
          f"{'' if NATIVE_WHY is None else ' (' + NATIVE_WHY + ')'}; python: the same sidecar with --front python "
          "(its own listeners)")
    print_table(rows, with_nginx)
    met, total = print_goals(rows, with_nginx)
    fd, fs = floor["direct"], floor["sidecar"]
    line = (f"proxy floor (null upstream, HTTP, concurrency 1): direct P50 {fd['p50_ms']:.2f} ms; sidecar "
            f"{fs['p50_ms']:.2f} ms (adds {fs['p50_ms'] - fd['p50_ms']:.2f})")
    if "nginx" in floor:
        fn = floor["nginx"]
        line += f"; nginx {fn['p50_ms']:.2f} ms (adds {fn['p50_ms'] - fd['p50_ms']:.2f})"
    print(line)
    errors = {name: sum(r[name]["errors"] for r in rows if name in r) for name in PATHS}
    for r in rows:
        for name in PATHS:
            for failure in r.get(name, {}).get("failures", []):
                print(f"failed: {r['protocol']} {r['model']} c={r['concurrency']} {name}: {failure}")
    refused = sum(r["sidecar"]["refused"] for r in rows)
    print(f"goals met: {met} of {total}; errors {errors}, sidecar 429s {refused}, queued in the sidecar {queued}; "
          f"run took {time.monotonic() - begun:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"idle_rss_bytes": idle_rss, "rows": rows, "null_upstream": floor, "queued": queued,
                                         "nginx": NGINX_SETTINGS if with_nginx else None, "widened": widened},
                                        indent=2))
    return 0


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("sidecar-pinned" if "--pinned" in sys.argv else "sidecar"):
        code = main()
    sys.exit(code or 0)
