"""What the sidecar costs: `ranker` on the embedded Triton, direct versus through the sidecar.

    .venv/bin/python bench/bench_sidecar.py [--seconds 4] [--levels 1,16,64] [--json out.json]
                                            [--queue-policies]

For each concurrency level, closed-loop clients (one request in flight each, one row per request,
HTTP/JSON) run for `--seconds` against Triton directly and for as long through the sidecar, in
`--rounds` alternating segments (after a short warm-up each), so a drift of the shared host
weighs on both paths alike. Reported: P50 and P99 latency of both, what the sidecar adds, the throughput ratio,
and the sidecar's resident memory (VmRSS). Targets: added P50 under 1 ms, throughput at least 90 %
of direct. A last run puts the sidecar in front of a null upstream (answers at once) at
concurrency 1: the proxy's own latency, without a model competing for the cores.

The sidecar runs as its own process (`tritongen sidecar`, as deployed) with the example
deployment's policy (ranker's concurrency quota opened to the highest level, so admission never
queues: this measures the pass-through), Triton as another process, the load generator in this
one; on a small machine they share the cores, which the numbers include. `ranker` keeps its
rendered config except its priority levels and queue policies, unless --queue-policies.
Bounded: about 2 x (seconds + warm-up + 0.3 x rounds) per level plus start-up; under 90 s by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tritongen.core.plan import plan_deployment
from tritongen.core.sidecar_policy import build_sidecar_policy
from tritongen.server import ServerOptions, TritonServer, free_port
from tritongen.sidecar_process import SidecarProcess
from tritongen.specio import load_spec

SPEC = ROOT / "examples" / "deployment.yaml"
REPOSITORY = ROOT / "model_repository"
TARGET_ADDED_P50_MS = 1.0
TARGET_THROUGHPUT_RATIO = 0.90


def ranker_repository(into: Path, queue_policies: bool) -> tuple[Path, list[str]]:
    """A repository holding only the committed `ranker` (its rendered config and code).

    Without `queue_policies`, its priority levels and queue policies are taken out: Triton 2.51
    stalls ~2-3 % of requests for ~500 ms when a model has them (README, "Known server
    behaviour"), on both paths alike, which would swamp the sidecar's own cost.
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
    flags_file = REPOSITORY / "server_flags.txt"
    flags = [ln.strip() for ln in flags_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if flags_file.is_file() else []
    return into, flags


def pin(root: int, cpus: set[int]) -> None:
    """Every thread of `root` and of its descendants onto `cpus` (sched_setaffinity is per thread)."""
    from tritongen.tuner.verify import _proc_tree

    for pid in _proc_tree(root):
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def write_policy(path: Path, most: int) -> None:
    """The example deployment's policy, with ranker's concurrency quota opened to the highest level:
    this measures the cost of the pass-through, not the admission limits (which would queue)."""
    loaded = load_spec(SPEC)
    policy = build_sidecar_policy(loaded.spec, plan_deployment(loaded.spec, loaded.architectures))
    for model in policy["models"]:
        if model["name"] == "ranker":
            model["max_inflight"] = max(model["max_inflight"], 2 * most)
    policy["concurrency"]["max"] = max(policy["concurrency"]["max"], 4 * most)
    path.write_text(json.dumps(policy, indent=2))


NULL_UPSTREAM = """
import asyncio, sys
from aiohttp import web
async def infer(request):
    await request.read()
    return web.Response(body=b'{"model_name":"ranker","model_version":"1","outputs":[]}', content_type="application/json")
async def ready(request):
    return web.Response()
async def main():
    app = web.Application()
    app.router.add_post("/v2/models/ranker/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


def proxy_floor(policy: Path, work: Path, seconds: float, warmup: float,
                rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sidecar against a null upstream (answers at once) at concurrency 1: its own latency,
    without a model's compute competing for the cores."""

    class Null:
        http_url = f"127.0.0.1:{free_port()}"
        metrics_url = f"http://{http_url}/metrics"

    port = int(Null.http_url.rsplit(":", 1)[1])
    upstream = subprocess.Popen([sys.executable, "-c", NULL_UPSTREAM, str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://{Null.http_url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with SidecarProcess(policy, Null, work / "sidecar-null.log") as sidecar:
            direct, through = interleaved(f"http://{Null.http_url}", f"http://{sidecar.http_url}", 1, seconds, warmup,
                                          rounds)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    return direct, through


def memory_of(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


async def closed_loop(base: str, concurrency: int, seconds: float, warmup: float) -> dict[str, Any]:
    body = json.dumps({"inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32",
                                   "data": [0.25] * 32}]}).encode()
    url = f"{base}/v2/models/ranker/infer"
    latencies: list[float] = []
    errors = refused = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors, refused
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    status = resp.status
            except aiohttp.ClientError:
                status = 0
            t1 = time.perf_counter()
            if t0 >= measure_from and t1 <= stop_at:
                if status == 200:
                    latencies.append(t1 - t0)
                elif status == 429:
                    refused += 1
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {"requests": len(latencies), "errors": errors, "refused": refused, "throughput": len(latencies) / seconds,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"), "latencies": latencies}


def pooled(runs: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One summary of several runs of the same path: latencies pooled, throughput over their time."""
    latencies = sorted(x for r in runs for x in r["latencies"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {"requests": len(latencies), "errors": sum(r["errors"] for r in runs),
            "refused": sum(r["refused"] for r in runs), "throughput": len(latencies) / seconds,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}


def interleaved(direct_url: str, sidecar_url: str, concurrency: int, seconds: float, warmup: float,
                rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Direct and through the sidecar in alternating segments (A B B A A B ...), so that a drift of
    the shared host (another process waking up, CPU frequency) weighs on both paths alike."""
    part = seconds / rounds
    direct: list[dict[str, Any]] = []
    through: list[dict[str, Any]] = []
    for i in range(rounds):
        order = [(direct_url, direct), (sidecar_url, through)]
        if i % 2:
            order.reverse()
        for url, out in order:
            out.append(asyncio.run(closed_loop(url, concurrency, part, warmup if i == 0 else min(warmup, 0.3))))
    return pooled(direct, seconds), pooled(through, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per path and level (default 8)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per run (default 1)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternating direct/sidecar segments the measured seconds are split into (default 4)")
    parser.add_argument("--levels", default="1,16,64", help="concurrency levels (default 1,16,64)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--pinned", action="store_true",
                        help="give the sidecar a CPU of its own (as its pod CPU request does); Triton and the "
                        "load generator share the others on both paths")
    parser.add_argument("--queue-policies", action="store_true",
                        help="keep ranker's priority levels and queue policies (Triton then stalls some requests)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]

    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    repo, flags = ranker_repository(work / "repo", args.queue_policies)
    policy = work / "sidecar_policy.json"
    write_policy(policy, max(levels))
    rows: list[dict[str, Any]] = []
    with TritonServer(ServerOptions(repository=repo, extra_args=flags)) as server:
        with SidecarProcess(policy, server, work / "sidecar.log") as sidecar:
            assert sidecar.proc is not None
            pid, sidecar_url = sidecar.proc.pid, f"http://{sidecar.http_url}"
            if args.pinned:
                # The pod's arrangement: the sidecar on a CPU of its own, Triton and the clients on the
                # rest, on both paths (the sidecar's CPU stays idle while the direct path runs).
                assert server.process is not None
                everything = set(range(os.cpu_count() or 1))
                pin(server.process.pid, everything - {max(everything)})
                pin(os.getpid(), everything - {max(everything)})
                pin(pid, {max(everything)})
            idle_rss = memory_of(pid)["VmRSS"]
            for c in levels:
                direct, through = interleaved(f"http://{server.http_url}", sidecar_url, c, args.seconds, args.warmup,
                                              args.rounds)
                mem = memory_of(pid)
                rows.append({
                    "concurrency": c, "direct": direct, "sidecar": through,
                    "added_p50_ms": through["p50_ms"] - direct["p50_ms"],
                    "added_p99_ms": through["p99_ms"] - direct["p99_ms"],
                    "throughput_ratio": through["throughput"] / direct["throughput"] if direct["throughput"] else 0.0,
                    "sidecar_rss_bytes": mem["VmRSS"], "sidecar_peak_rss_bytes": mem["VmHWM"],
                })
    null_direct, null_through = proxy_floor(policy, work, min(args.seconds, 3.0), args.warmup, args.rounds)
    shutil.rmtree(work, ignore_errors=True)

    header = (f"{'conc':>4} | {'direct p50':>10} {'p99':>7} {'req/s':>7} | {'sidecar p50':>11} {'p99':>7} "
              f"{'req/s':>7} | {'+p50 ms':>7} {'+p99 ms':>7} {'ratio':>6} | {'RSS MiB':>7}")
    where = ("the sidecar pinned to a CPU of its own, Triton and the load generator on the other(s)" if args.pinned
             else f"{os.cpu_count()} CPUs shared by Triton, the sidecar and the load generator")
    print(f"ranker, closed loop, {args.seconds:g} s per path and level, {where}; sidecar RSS at idle "
          f"{idle_rss / 2**20:.1f} MiB")
    print(header)
    print("-" * len(header))
    for r in rows:
        d, s = r["direct"], r["sidecar"]
        print(f"{r['concurrency']:>4} | {d['p50_ms']:>10.2f} {d['p99_ms']:>7.2f} {d['throughput']:>7.0f} | "
              f"{s['p50_ms']:>11.2f} {s['p99_ms']:>7.2f} {s['throughput']:>7.0f} | {r['added_p50_ms']:>7.2f} "
              f"{r['added_p99_ms']:>7.2f} {r['throughput_ratio']:>6.2f} | {r['sidecar_rss_bytes'] / 2**20:>7.1f}")
    print(f"proxy floor (null upstream, concurrency 1): direct P50 {null_direct['p50_ms']:.2f} ms, through the "
          f"sidecar {null_through['p50_ms']:.2f} ms: the sidecar itself adds "
          f"{null_through['p50_ms'] - null_direct['p50_ms']:.2f} ms")
    errors = sum(r["direct"]["errors"] + r["sidecar"]["errors"] for r in rows)
    refused = sum(r["sidecar"]["refused"] for r in rows)
    worst_p50 = max(r["added_p50_ms"] for r in rows)
    worst_ratio = min(r["throughput_ratio"] for r in rows)
    print(f"targets: added P50 < {TARGET_ADDED_P50_MS} ms (worst {worst_p50:.2f} ms: "
          f"{'met' if worst_p50 < TARGET_ADDED_P50_MS else 'MISSED'}); throughput >= "
          f"{TARGET_THROUGHPUT_RATIO:.0%} of direct (worst {worst_ratio:.0%}: "
          f"{'met' if worst_ratio >= TARGET_THROUGHPUT_RATIO else 'MISSED'}); errors {errors}, 429s {refused}")
    if args.json:
        args.json.write_text(json.dumps({"idle_rss_bytes": idle_rss, "levels": rows,
                                         "null_upstream": {"direct": null_direct, "sidecar": null_through}}, indent=2))
    return 0


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("sidecar-pinned" if "--pinned" in sys.argv else "sidecar"):
        code = main()
    sys.exit(code or 0)
