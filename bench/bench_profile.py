"""Benchmark: a full (non-quick) `tritongen profile` of `ranker` on the embedded Triton.

Prints the wall time of the whole command (server start included) and the fitted latency-vs-batch
curve against Triton's measured per-batch compute times, with the median and max relative error.

    .venv/bin/python -m bench.bench_profile [--repo DIR] [--keep DIR]

Without --repo it uses model_repository/ when its configs are rendered, else renders
examples/deployment.yaml into a temp repository with the example models' code.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.rig import ROOT
from tritongen.core.profile_types import read_profile

SPEC = ROOT / "examples" / "deployment.yaml"


def _repository(work: Path) -> Path:
    committed = ROOT / "model_repository"
    if (committed / "ranker" / "config.pbtxt").is_file():
        return committed
    from tritongen.render import render_repository, write_repository
    from tritongen.specio import load_spec

    repo = work / "repo"
    write_repository(render_repository(load_spec(SPEC)), repo)
    for name in ("ranker", "tinyllm"):
        shutil.copytree(committed / name / "1", repo / name / "1", dirs_exist_ok=True)
    return repo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="model repository to serve (default: see above)")
    parser.add_argument("--keep", type=Path, help="write the profile and report here instead of a temp dir")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tritongen-bench-") as tmp:
        work = Path(tmp)
        repo = args.repo or _repository(work)
        out = args.keep or work / "profiles"
        cmd = [
            sys.executable, "-c", "from tritongen.cli.main import run; run()",
            "profile", str(SPEC), "--model", "ranker", "--repo", str(repo), "-o", str(out),
        ]
        start = time.perf_counter()
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - start
        if result.returncode != 0:
            console.print(result.stdout, result.stderr, markup=False)
            console.print(f"[red]profile failed with exit code {result.returncode}[/]")
            return 1
        profile = read_profile((out / "ranker.json").read_text())

    fit = profile.fit
    assert fit is not None, "the profile has no curve fit"
    table = Table(title=f"ranker: fitted vs measured compute_infer ({fit.kind} fit)")
    for col in ("batch", "executions", "measured ms", "fit ms", "rel. error"):
        table.add_column(col, justify="right")
    errors = []
    for point in profile.curve:
        predicted = fit.predict(point.batch_size)
        rel = abs(predicted - point.compute_infer_ms) / point.compute_infer_ms
        errors.append(rel)
        table.add_row(str(point.batch_size), str(point.count), f"{point.compute_infer_ms:.3f}", f"{predicted:.3f}", f"{rel:.1%}")
    console.print(table)

    levels = Table(title="ranker: load levels")
    for col in ("clients", "inf/s", "P50 ms", "P99 ms", "mean batch", "errors", "windows"):
        levels.add_column(col, justify="right")
    for lv in profile.load_levels:
        levels.add_row(
            str(lv.concurrency), f"{lv.throughput_per_s:,.0f}", f"{lv.p50_ms or 0:.1f}", f"{lv.p99_ms or 0:.1f}",
            f"{lv.mean_batch_size or 0:.1f}", str(lv.errors), str(lv.windows),
        )
    console.print(levels)

    summary = Table(title="bench_profile summary")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("wall time (server start + profile)", f"{wall:.1f} s")
    summary.add_row("profile duration (measuring)", f"{profile.duration_s:.1f} s")
    summary.add_row("fit", f"{fit.overhead_ms:.3f} ms + {fit.per_item_ms:.4f} ms x batch")
    summary.add_row("configured", "4.000 ms + 0.2500 ms x batch (plus the stub's IPC)")
    summary.add_row("median rel. error (all points)", f"{statistics.median(errors):.2%}")
    summary.add_row("max rel. error (all points)", f"{max(errors):.2%}")
    summary.add_row(f"max / mean rel. error (fitted {fit.points} points)", f"{fit.max_rel_error:.2%} / {fit.mean_rel_error:.2%}")
    summary.add_row("knee (clients)", str(profile.knee.concurrency if profile.knee else None))
    console.print(summary)
    return 0


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("profile"):
        code = main()
    sys.exit(code or 0)
