"""The zoo's streaming LLMs, profiled as a new user starts (no spec), simulated against live runs.

For each decoupled model of `../shared/zoo/` (models this repository did not write, served from a
copy of the folder on the embedded server): profile it with nothing but its config (no spec, no
bytes per token, the KV capacity probe on, as the profile's gaps table advises a user who has no
metrics), resolve its engine from that profile alone (the probe's KV capacity and KV policy), then
flood it live for its measured capacity, then run Poisson traffic at 0.5x, 0.9x and 1.5x of that,
`--repeats` times live (real gRPC streams) and once simulated, side by side, and the simulation
against the live median (bench_llm_fidelity.one_model). Models that are not decoupled are profiled
and their static-batch probe printed; their simulation against live runs is not part of this
bench yet.

Goals (issue 43): completed/s within 10%, TTFT P50/P99 within 25% of the median of 3 live runs (or
inside their range where their own spread is wider). The sidecar's goals on the same models are
`make bench-zoo`'s second part: bench_llm_guard with the spec a user writes for each
(bench/zoo/*.yaml), direct against the sidecar running the policy rendered from its profile.

    .venv/bin/python -m bench.bench_zoo [--seconds 20] [--repeats 3] [--models textgen]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench.bench_llm_fidelity import one_model
from bench.rig import ROOT
from bench.report import saved_report
from tritongen.pbtxt import parse_model_config
from tritongen.profiler.run import Endpoints, Profiler, TritonAdmin, default_settings, resolve_targets
from tritongen.server import ServerOptions, TritonServer

ZOO = ROOT.parent / "shared" / "zoo"


def _decoupled(model_dir: Path) -> bool:
    config = parse_model_config((model_dir / "config.pbtxt").read_text())
    return bool(config.model_transaction_policy.decoupled)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--models", default="")
    ap.add_argument("--repeats", type=int, default=3, help="live runs per load; the simulation is judged against their median")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n] or sorted(p.name for p in ZOO.iterdir() if (p / "config.pbtxt").is_file())
    with saved_report("zoo"), tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        for name in names:
            shutil.copytree(ZOO / name, repo / name)
        with TritonServer(ServerOptions(repository=repo)) as server:
            for name in names:
                if _decoupled(repo / name):
                    case = {"spec": None, "bytes_per_token": None, "prompt": 32, "output": 32, "capacity_probe": True}
                    one_model(server, name, case, Path(tmp), args.seconds, repeats=args.repeats, live_capacity=True)
                else:
                    unary(server, name, Path(tmp))
    return 0


def unary(server: TritonServer, model: str, out: Path) -> None:
    endpoints = Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    admin = TritonAdmin(endpoints)
    try:
        profile = Profiler(admin, endpoints, default_settings(quick=True), out).run(resolve_targets(admin, [model], None))[0]
    finally:
        admin.close()
    llm = profile.llm
    print(f"\n## {model}: not decoupled")
    if llm is None:
        print("not recognised as an LLM: profiled as a classic model")
        return
    print(f"{llm.interface}; budget honoured: {llm.budget_honoured}; end-to-end by budget: {llm.latency_ms_by_budget}")
    print(f"static batch probe at {llm.probe_prompt_tokens} + {llm.probe_max_tokens} tokens: {llm.batch_fits}; "
          f"largest that fits {llm.largest_batch_that_fits}, smallest that fails {llm.smallest_batch_that_fails}"
          f" ({llm.failure_sample})")
    for level in profile.load_levels:
        print(f"| {level.concurrency} clients | {level.throughput_per_s:.1f} req/s | P50 {level.p50_ms} ms | P99 {level.p99_ms} ms | "
              f"{level.errors} errors |")
    for gap in profile.gaps:
        print(f"gap ({gap.measurement}): {gap.unseen}; taken instead: {gap.inferred}")


if __name__ == "__main__":
    raise SystemExit(main())
