"""Benchmark: the simulator's P99 and throughput against the embedded Triton serving `ranker`.

Three configs x three load levels of two-class Poisson traffic (30% interactive at priority 1,
70% batch at priority 2), each sent open-loop to the real server and simulated with the same
arrivals. The configs (`plain`, `tuned`, `multi`), their traffic and repository are in
`bench/rig/fidelity.py`, which `bench/trace_batcher.py` and the suite's smoke check
(`tests/integration/test_sim_fidelity.py`) share.

Calibration is on traffic of its own (other seeds, loads between the cells') and on the server
start the cells run on: how often wakes are lost moves between server starts and between runs,
so the calibration runs are interleaved with the cells' (`schedule`) and sample the same stretch of
the server's life. It uses what any deployed server reports, its statistics: the
per-request and per-batch overheads (`fit_overheads`), and how often the end of an execution fails
to wake the batcher, from Triton's mean batch (`fit_wake_chances`). How soon an instance is back
after an execution is the embedded server's `release_ms`, measured from Triton's request trace
(`bench/trace_batcher.py`). Nothing here is traced. Each cell is measured three times and its live
P99 is the median run's; the cell whose P99 rests on a handful of lost-wake episodes runs six
times as long (`LONG_CELL`). The simulator's P99 is likewise the median over seeds.

The host is shared: a run during which other processes took more than `QUIET_CORES` of CPU is
repeated after a pause (until `DEADLINE_S`); a cell still measured under heavy foreign load is
marked in the table ("host too busy"), its figures not evidence either way. This is a benchmark,
not a test: it prints figures and writes them to bench/results/sim_fidelity.md; the suite keeps a
wide-margin smoke check and the closed-form cases (tests/unit/test_simulator_closed_form.py).

    .venv/bin/python -m bench.bench_sim_fidelity        # about 6.5 minutes here
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.report import saved_report
from bench.rig.fidelity import CONFIGS, CURVE, FLAGS, measure_model, sim_server, traffic, write_repository
from tritongen.core.simulator import (
    EMBEDDED_CPU_OVERHEADS,
    BatchedRun,
    Handoff,
    Simulation,
    fit_overheads,
    fit_wake_chances,
)
from tritongen.server import ServerOptions, TritonServer
from tritongen.errors import RunFailed

REQUESTS = int(os.environ.get("TRITONGEN_FIDELITY_REQUESTS", "1000"))  # per run, at least 4 s of traffic
# The one cell whose P99 is noisy runs six times as long (60 s). The single-instance queue-policy
# config at its lowest load has a P99 that rests on a handful of lost-wake episodes: over 24 runs of
# 2000 requests on eight server starts its P99 had a standard deviation of 11% (35.1-52.9 ms), where
# every other cell's runs agree within 2-5%. The noise is in time, not in the run (the P99s of the
# two halves of one run are uncorrelated, 0.06), so length buys what repetitions would: six times the
# length cuts the median's spread from about 8% to about 3%, and the error budget of 15% then holds
# with the calibration's own noise on top. The other cells run REQUESTS (at least 4 s).
LONG_CELL, LONG_CELL_FACTOR = ("tuned", 100.0), 6
SEEDS = 15  # simulation seeds per cell; the simulator's P99 is their median (at most 0.1 s a seed)
RUNS_PER_CELL = 3  # the median: one run's P99 rests on its ten slowest requests
# Calibration runs, (config, load, runs), at loads between the cells'. The policy runs are repeated:
# Triton's mean batch, their witness, moves by about 0.02 rows between identical runs (a couple of
# points of lost wakes), and a single low-batch run at 250 req/s once dragged the fit to -24% at 100.
CALIBRATION = [("plain", 140.0, 1), ("tuned", 110.0, 3), ("tuned", 250.0, 2), ("multi", 230.0, 1)]
POLICY_CONFIGS = ("tuned", "multi")  # the configs with queue policies, whose batcher the hand-off model describes
P99_TOLERANCE, THROUGHPUT_TOLERANCE = 0.15, 0.10
QUIET_CORES = float(os.environ.get("TRITONGEN_FIDELITY_QUIET_CORES", "0.4"))  # other processes' CPU a run tolerates
CALIBRATION_QUIET_CORES = 0.2  # stricter: how often the batcher misses a wake depends on how busy the host is
NOISY_CORES = 0.6  # a cell measured with more than this is not evidence either way
DEADLINE_S = float(os.environ.get("TRITONGEN_FIDELITY_DEADLINE_S", "420"))  # stop waiting for a quiet host


def simulated(name: str, arrivals, overheads, seeds: int = SEEDS) -> tuple[float, float, float]:
    """(P99 ms over the measured window, throughput /s, mean batch rows): the first two are medians
    over several simulation seeds (the simulator draws execution noise and lost batcher wake-ups), as
    a cell's live figures are the medians over its runs; the mean batch is seed 0's."""
    p99s, thrs, batches = [], [], []
    for seed in range(seeds):
        sim = Simulation(sim_server(name, overheads), arrivals, seed)
        res = sim.run()
        p99s.append(float(np.percentile(sim.window_latencies_s(), 99) * 1000.0))
        thrs.append(res.throughput_per_s)
        batches.append(res.models[0].mean_batch_rows or 0.0)
    return statistics.median(p99s), statistics.median(thrs), batches[0]


@dataclass
class Cell:
    config: str
    rate: float
    live_p99: float
    sim_p99: float
    live_thr: float
    sim_thr: float
    runs: int
    live_batch: float
    sim_batch: float
    rejected: int
    foreign: float = 0.0

    @property
    def p99_error(self) -> float:
        return (self.sim_p99 - self.live_p99) / self.live_p99

    @property
    def thr_error(self) -> float:
        return (self.sim_thr - self.live_thr) / self.live_thr


@dataclass(frozen=True)
class Job:
    """One live run to make: `key` names what it measures (a calibration entry or a cell)."""

    key: tuple
    model: str
    arrivals: object
    seed: int
    quiet: float
    round: int


def calibration_round(k: int, repeats: int) -> int:
    """The round (of RUNS_PER_CELL) the k-th of a calibration entry's `repeats` runs goes in: spread
    evenly, a single run in the middle one."""
    return min(RUNS_PER_CELL - 1, int((k + 0.5) * RUNS_PER_CELL / repeats))


def schedule(jobs: list[Job]) -> list[Job]:
    """The order the runs are made in: by round, each round holding one run of every cell (and its
    share of the calibration), instead of each cell's runs back to back.

    How many wakes the batcher loses moves between runs, and the single-instance config's P99 at its
    lowest load follows it: over 18 runs of identical arrivals on six server starts, a run's P99
    went with its own mean batch (correlation 0.79; 35.1-50.7 ms for 1.784-1.829 rows). Back to
    back, a cell's three runs share one stretch of the server's life and the calibration another;
    interleaved, every cell and the calibration sample the same four minutes, at no extra cost."""
    return sorted(jobs, key=lambda job: job.round)  # stable: calibration first within a round


def run_fidelity(log=print) -> tuple[list[Cell], object, float]:
    import tempfile

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tritongen-fidelity-") as tmp:
        repo = write_repository(Path(tmp), CONFIGS)
        attempts = [0]

        def live(server: TritonServer, name: str, arrivals, seed: int, quiet: float = QUIET_CORES):
            """One measurement on a quiet host: a run during which other processes took more than
            QUIET_CORES of CPU is repeated after a pause, until DEADLINE_S; the quietest is kept."""
            best = None
            while True:
                attempts[0] += 1
                try:
                    run = measure_model(server, name, arrivals, seed)
                except RunFailed as exc:
                    alive = server.process is not None and server.process.poll() is None
                    raise RunFailed(f"{exc}\nserver {'alive' if alive else 'exited'}; its log:\n{server.failure_reason()}") from exc
                if best is None or (run.foreign_cores or 0.0) < (best.foreign_cores or 0.0):
                    best = run
                if (run.foreign_cores or 0.0) <= quiet or time.perf_counter() - started > DEADLINE_S:
                    break
                log(f"  {name}: other processes took {run.foreign_cores:.2f} cores during the run; measuring again")
                time.sleep(2.0)
            return best

        # Every live run first, calibration and cells interleaved in rounds (`schedule`), on one
        # server start; then the fits; then the simulations.
        calibration = [(name, traffic(rate, 900, 500 + i), repeats) for i, (name, rate, repeats) in enumerate(CALIBRATION)]
        cells_arrivals = []
        for name, c in CONFIGS.items():
            for j, rate in enumerate(c["loads"]):
                n = max(REQUESTS, int(4 * rate)) * (LONG_CELL_FACTOR if (name, rate) == LONG_CELL else 1)
                cells_arrivals.append((name, float(rate), traffic(float(rate), n, 10 * j + 7)))
        jobs = [Job(("cal", i), name, arrivals, 500 + i + 10 * k, CALIBRATION_QUIET_CORES, calibration_round(k, repeats))
                for i, (name, arrivals, repeats) in enumerate(calibration) for k in range(repeats)]
        jobs += [Job(("cell", i), name, arrivals, k, QUIET_CORES, k)
                 for i, (name, _, arrivals) in enumerate(cells_arrivals) for k in range(RUNS_PER_CELL)]
        measured: dict[tuple, list] = {}
        with TritonServer(ServerOptions(repository=repo, extra_args=FLAGS)) as server:
            for job in schedule(jobs):
                measured.setdefault(job.key, []).append(live(server, job.model, job.arrivals, job.seed, job.quiet))
        # 1. calibration: the per-request and per-batch overheads from Triton's stats, and how often
        #    the batcher's wake is lost, from Triton's mean batch in the configs with queue policies.
        cal_runs = [(name, arrivals, measured[("cal", i)]) for i, (name, arrivals, _) in enumerate(calibration)]
        overheads = fit_overheads([run.observation(name) for name, _, runs in cal_runs for run in runs], CURVE,
                                  base=EMBEDDED_CPU_OVERHEADS)
        handoff = Handoff.of(EMBEDDED_CPU_OVERHEADS)
        batched = [BatchedRun(sim_server(name, overheads), arrivals, run.stats[name].mean_batch_rows or 0.0)
                   for name, arrivals, runs in cal_runs if name in POLICY_CONFIGS for run in runs]
        for b in batched:
            log(f"{b.server.models[0].name}@{b.arrivals.mean_rate:.0f}/s: Triton's mean batch {b.live_mean_batch:.3f}")
        overheads = fit_wake_chances(batched, handoff).applied(overheads)
        log(f"fitted overheads: {overheads}")
        # 2. the cells
        cells = []
        for i, (name, rate, arrivals) in enumerate(cells_arrivals):
            runs = measured[("cell", i)]
            p99s = [r.latency_percentile_ms(99) for r in runs]
            thrs = [r.throughput_per_s for r in runs]
            live_p99 = statistics.median(p99s)
            live_thr = statistics.median(thrs)
            sim_p99, sim_thr, sim_batch = simulated(name, arrivals, overheads)
            cell = Cell(
                config=name, rate=rate, live_p99=live_p99, sim_p99=sim_p99, live_thr=live_thr,
                sim_thr=sim_thr, runs=len(runs),
                live_batch=statistics.median(r.stats[name].mean_batch_rows or 0.0 for r in runs),
                sim_batch=sim_batch,
                rejected=int(statistics.median(sum(k.rejected for k in r.classes) for r in runs)),
                foreign=max(r.foreign_cores or 0.0 for r in runs),
            )
            cells.append(cell)
            log(
                f"{name:6s} {rate:4.0f}/s  P99 live {live_p99:6.1f} sim {sim_p99:6.1f} ({cell.p99_error:+.0%})  "
                f"thr live {live_thr:6.1f} sim {sim_thr:6.1f} ({cell.thr_error:+.1%})  "
                f"batch {cell.live_batch:.2f}/{cell.sim_batch:.2f}  p99s {[round(p, 1) for p in p99s]} "
                f"foreign {[round(r.foreign_cores or 0.0, 2) for r in runs]}"
            )
        log(f"{attempts[0]} live runs")
    return cells, overheads, time.perf_counter() - started


def markdown(cells: list[Cell], overheads, seconds: float) -> str:
    lines = [
        "| config | load (req/s) | P99 measured (ms) | P99 simulated (ms) | error | throughput measured (/s) | throughput simulated (/s) | error | other load (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.config} | {c.rate:.0f} | {c.live_p99:.1f} | {c.sim_p99:.1f} | {c.p99_error:+.1%} | "
            f"{c.live_thr:.1f} | {c.sim_thr:.1f} | {c.thr_error:+.1%} | {c.foreign:.2f}"
            f"{' (host too busy)' if c.foreign > NOISY_CORES else ''} |"
        )
    lines.append("")
    lines.append(
        f"Fitted overheads: request {overheads.request_ms} ms, batch {overheads.batch_ms} ms + "
        f"{overheads.request_exec_ms} ms/request; {len(cells)} cells in {seconds:.0f} s."
    )
    return "\n".join(lines)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    with saved_report("sim_fidelity"):
        cells, overheads, seconds = run_fidelity(log=lambda m: print(m, file=sys.stderr))
        print(markdown(cells, overheads, seconds))
        p99_misses = [c for c in cells if c.foreign <= NOISY_CORES and abs(c.p99_error) > P99_TOLERANCE]
        thr_misses = [c for c in cells if c.foreign <= NOISY_CORES and abs(c.thr_error) > THROUGHPUT_TOLERANCE]
        busy = [c for c in cells if c.foreign > NOISY_CORES]
        print(f"\ntargets: P99 within {P99_TOLERANCE:.0%} in every cell "
              f"({'met' if not p99_misses else 'MISSED at ' + ', '.join(f'{c.config}@{c.rate:.0f}' for c in p99_misses)}); "
              f"throughput within {THROUGHPUT_TOLERANCE:.0%} "
              f"({'met' if not thr_misses else 'MISSED at ' + ', '.join(f'{c.config}@{c.rate:.0f}' for c in thr_misses)})"
              + (f"; host too busy, figures not evidence: {', '.join(f'{c.config}@{c.rate:.0f}' for c in busy)}" if busy else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
