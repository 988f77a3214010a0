"""Instances on one shared device: predicted against measured throughput, 1, 2 and 4 instances.

The classic stand-in `scorer` (examples/classic_standins) runs each execution as a host part that
overlaps across instances and a device part that all instances take in turns. `tritongen profile`
fits that device part from its own scaling levels (no dynamic batcher, requests of 1 and 64 rows).
This bench checks the fit where it was not measured: a config with dynamic batching and a smaller
`max_batch_size` (16 by default), single-row requests at 1.5x the predicted capacity (open loop, so
batches grow to the maximum), and 1, 2 and 4 instances. The simulator, given the profile's curve,
overheads and device part, predicts each throughput; the live server measures it.

    .venv/bin/python -m bench.bench_instance_scaling [--mbs 16] [--requests 3000] [--profile P]

Figures, not verdicts: the goal (issue 16) is every count within 10%.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.rig import ROOT
from bench.report import saved_report
from tritongen.client import tensors_from_config
from tritongen.core.profile_types import read_profile
from tritongen.core.served_overheads import choose_overheads, profile_device_curve
from tritongen.core.simulator import BatcherConfig, ModelSim, ServerSim, ServiceCurve, simulate
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.loadgen import LoadTarget
from tritongen.server import ServerOptions, TritonServer
from tritongen.tuner.verify import load_config, measure

REPOSITORY = ROOT / "examples" / "classic_standins" / "repository"


def config_text(instances: int, mbs: int) -> str:
    served = (REPOSITORY / "scorer" / "config.pbtxt").read_text()
    served = served.replace("max_batch_size: 64", f"max_batch_size: {mbs}")
    served = served.replace("instance_group { kind: KIND_CPU count: 1 }", f"instance_group {{ kind: KIND_CPU count: {instances} }}")
    return served + "dynamic_batching { }\n"


def arrivals(rate: float, n: int, seed: int):
    spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=n / rate, warmup_s=min(1.0, 0.2 * n / rate),
                       classes=[{"name": "all", "share": 1.0}])
    return generate_arrivals(spec, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbs", type=int, default=16)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--profile", type=Path, help="a scorer profile (default: profile it now, --quick)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        work = Path(tmp)
        repo = work / "repository"
        shutil.copytree(REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
        profile_path = args.profile
        if profile_path is None:
            out = work / "profiles"
            subprocess.run([str(ROOT / ".venv" / "bin" / "tritongen"), "profile", "-m", "scorer", "--repo", str(repo),
                            "-o", str(out), "--quick"], check=True, capture_output=True, text=True)
            profile_path = out / "scorer.json"
        profile = read_profile(profile_path.read_text())
        curve = ServiceCurve.from_profile(profile)
        device, note = profile_device_curve(profile)
        overheads, why = choose_overheads(None, profile)
        with saved_report("bench_instance_scaling"):
            print(f"profile: {profile_path.name}, device part: {device}, {note or ''}")
            print(f"overheads: {why}")
            options = ServerOptions(repository=repo, model_control="explicit", load_models=["scorer"])
            rows = []
            with TritonServer(options) as server:
                import httpx

                cfg = httpx.get(f"http://{server.http_url}/v2/models/scorer/config", timeout=10).json()
                target = LoadTarget("scorer", batched=True, inputs=tuple(tensors_from_config(cfg["input"])))
                for n in (1, 2, 4):
                    model = ModelSim(name="scorer", max_batch_size=args.mbs, dynamic_batching=BatcherConfig(), instances=n,
                                     curve=curve, device_curve=device)
                    probe = arrivals(2000.0, args.requests, 0)
                    predicted_cap = simulate(ServerSim(models=[model], overheads=overheads), probe).throughput_per_s
                    rate = 1.5 * predicted_cap
                    offered = arrivals(rate, args.requests, 1)
                    predicted = simulate(ServerSim(models=[model], overheads=overheads), offered).throughput_per_s
                    load_config(server.http_url, "scorer", config_text(n, args.mbs))
                    measured = []
                    for r in range(args.repeats):
                        warm = arrivals(rate, 200, 5 + r)
                        run = measure(server.http_url, arrivals(rate, args.requests, 10 + r), {"all": target}, {"scorer": n}, warmup=warm)
                        measured.append(run.throughput_per_s)
                    med = float(np.median(measured))
                    rows.append((n, rate, predicted, measured, med, predicted / med - 1.0))
            print()
            print("| instances | offered (/s) | predicted (/s) | measured (/s) | median | error |")
            print("|---:|---:|---:|---|---:|---:|")
            for n, rate, predicted, measured, med, err in rows:
                print(f"| {n} | {rate:.0f} | {predicted:.0f} | {' / '.join(f'{m:.0f}' for m in measured)} | {med:.0f} | {err:+.1%} |")
            linear = rows[0][4]
            print(f"\nlinear scaling would predict {linear * 2:.0f} and {linear * 4:.0f} for 2 and 4 instances "
                  f"({linear * 4 / rows[-1][4]:.1f}x the measured 4-instance throughput)")
            print(f"goal: every count within 10% -> {sum(abs(r[5]) <= 0.10 for r in rows)} of {len(rows)}")


if __name__ == "__main__":
    main()
