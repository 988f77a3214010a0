"""Smoke check: the simulator still describes the embedded Triton, with margins noise cannot reach.

Two clearly different configs of `ranker` (the fidelity rig's `plain`, one instance, and the same
batcher on two instances) take the same two-class Poisson traffic at 150 req/s, alternating on one
server start, three short runs each (the median outvotes one run a neighbour disturbed: a CI run once
measured the two-instance config at 91 ms in one of two runs, against 55 ms for one instance). The simulator, calibrated on those runs' own statistics (the
per-request and per-batch overheads, `fit_overheads`; never their latencies), must:
- rank them as Triton does (the two-instance config's P99 is clearly lower, live and simulated);
- predict each P99 within 50% of the measured (median of the runs), and the throughput within 10%.

The precise figures (nine cells, every P99 within 15%) are a benchmark: `make bench-fidelity`
(bench/bench_sim_fidelity.py). On this host a run's P99 varies by about 11% between identical
runs and a calibrated simulator lands within 15%, so a 50% miss means a broken simulator, not a
noisy host. The simulator's exact behaviour is pinned by tests/unit/test_simulator*.py.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from bench.rig.fidelity import CONFIGS, CURVE, FLAGS, measure_model, sim_server, traffic, write_repository
from tritongen.core.simulator import EMBEDDED_CPU_OVERHEADS, Simulation, fit_overheads
from tritongen.server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration

RATE, REQUESTS, RUNS, SEEDS = 150.0, 450, 3, 5  # 3 s a run; three, so one run a neighbour disturbed is outvoted
# The configs as the rig writes them: `plain` and the same batcher on two instances.
SPECS = {"plain": CONFIGS["plain"], "plain_x2": {**CONFIGS["plain"], "count": 2}}
P99_MARGIN, THROUGHPUT_MARGIN = 0.50, 0.10
NOISY_CORES, RETRIES = 0.6, 3  # a run while other processes took more than this is made again (the quietest kept)


def quietest_run(server: TritonServer, name: str, arrivals, seed: int):
    best = None
    for _ in range(RETRIES):
        run = measure_model(server, name, arrivals, seed, SPECS[name])
        if best is None or (run.foreign_cores or 0.0) < (best.foreign_cores or 0.0):
            best = run
        if (best.foreign_cores or 0.0) <= NOISY_CORES:
            break
    return best


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Per config: its arrivals and live runs, alternated on one server start."""
    repo = write_repository(tmp_path_factory.mktemp("fidelity-smoke"), SPECS)
    arrivals = traffic(RATE, REQUESTS, 17)
    runs: dict[str, list] = {name: [] for name in SPECS}
    with TritonServer(ServerOptions(repository=repo, extra_args=FLAGS)) as server:
        for k in range(RUNS):
            for name in SPECS:
                runs[name].append(quietest_run(server, name, arrivals, k))
    return arrivals, runs


@pytest.fixture(scope="module")
def compared(measured):
    """Per config: (live median P99, simulated median P99, live median throughput, simulated), ms and /s."""
    arrivals, runs = measured
    overheads = fit_overheads([run.observation(name) for name, rs in runs.items() for run in rs], CURVE,
                              base=EMBEDDED_CPU_OVERHEADS)
    out = {}
    for name, rs in runs.items():
        sims = [Simulation(sim_server(name, overheads, SPECS[name]), arrivals, seed) for seed in range(SEEDS)]
        results = [sim.run() for sim in sims]
        sim_p99 = statistics.median(float(np.percentile(s.window_latencies_s(), 99) * 1000.0) for s in sims)
        out[name] = (
            statistics.median(r.latency_percentile_ms(99) for r in rs), sim_p99,
            statistics.median(r.throughput_per_s for r in rs), statistics.median(r.throughput_per_s for r in results),
        )
    print({name: tuple(round(x, 1) for x in v) for name, v in out.items()}, overheads)
    return out, overheads


def test_the_simulator_ranks_two_clearly_different_configs_as_triton_does(compared) -> None:
    figures, _ = compared
    (live_1, sim_1, _, _), (live_2, sim_2, _, _) = figures["plain"], figures["plain_x2"]
    assert live_2 < live_1 and sim_2 < sim_1, figures
    assert sim_1 > 1.3 * sim_2, f"the two configs must be clearly apart to be a ranking check: {figures}"


def test_the_simulated_p99_is_within_half_of_the_measured_one(compared) -> None:
    figures, _ = compared
    misses = {name: f"live {live:.1f} ms, simulated {sim:.1f} ms" for name, (live, sim, _, _) in figures.items()
              if abs(sim - live) > P99_MARGIN * live}
    assert not misses, f"P99 off by more than {P99_MARGIN:.0%}: {misses}"


def test_the_simulated_throughput_is_within_10_percent_of_the_measured_one(compared) -> None:
    figures, _ = compared
    misses = {name: (live, sim) for name, (_, _, live, sim) in figures.items() if abs(sim - live) > THROUGHPUT_MARGIN * live}
    assert not misses, misses


def test_the_fitted_overheads_are_plausible(compared) -> None:
    _, overheads = compared
    assert 0.2 < overheads.request_ms < 10.0
    assert 0.05 < overheads.batch_ms < 5.0
