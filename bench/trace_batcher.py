"""Trace Triton's dynamic batcher hand-offs on the embedded server and compare them with the simulator.

    .venv/bin/python -m bench.trace_batcher [--config tuned] [--rate 100] [--runs 3] [--restarts 2]
    .venv/bin/python -m bench.trace_batcher --observer-effect [--runs 4] [--requests 2000]
    .venv/bin/python -m bench.trace_batcher --rate-limiter-effect [--runs 4] [--requests 2000]

Runs one of the fidelity test's `ranker` configs under its Poisson two-class traffic
with Triton's request tracing on (level TIMESTAMPS, every request), then classifies every batcher
hand-off from the trace (`tritongen.core.handoff`): an execution that ended with requests waiting,
and whether the next batch started promptly (and how soon) or only after the end's wake was lost
and an arrival or the batcher's tick woke it. The same arrivals are simulated with the embedded
server's overheads and classified the same way, side by side, with the queue-wait percentiles.
This is the evidence behind `Overheads.release_ms` and the lost-wake chances.

`--observer-effect` measures what tracing does to the race it watches: on one server start it
alternates traced and untraced runs of the same arrivals (which goes first swaps every pair) and
prints each run's latency percentiles and Triton's mean batch, then the medians per mode. On the
embedded server the mean batch was higher untraced in 10 pairs of 12 (by about 0.01 rows, about
one point more lost wakes); the P99 was higher untraced in 8 of 12 (all of a first 8, none of the
next 4), so no effect on the tail is established.

`--rate-limiter-effect` is the evidence behind `Overheads.rate_limited_wake_loss`: the config
against the same config without its rate-limiter resources, alternating on one traced server
start. For `tuned` at 100 req/s (2000 requests, 4 pairs) the instance holding resources lost 4.2%
of its hand-offs against 3.4% (3.3k hand-offs each) and batched 1.807 against 1.794 rows; untraced
(8 pairs, a /tmp script that alternated the same two configs), 1.825 against 1.814 rows and P99
45.4 against 41.9 ms on average.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bench.rig import fidelity as fid
from tritongen.core.handoff import HandoffStats, handoff_stats
from tritongen.core.simulator import EMBEDDED_CPU_OVERHEADS, Simulation, TracedRun, fit_handoff
from tritongen.server import ServerOptions, TritonServer
from tritongen.triton_trace import RequestTimes, read_trace, set_trace_level, stop_tracing, trace_flags


def traced_handoffs(mine: RequestTimes, name: str, arrivals, overheads, spec: dict | None = None) -> TracedRun:
    """The hand-offs of one run, out of its traced requests (`RequestTimes.between` the run's clock span)."""
    server = fid.sim_server(name, overheads, spec)
    window_s = server.models[0].batcher().max_queue_delay_us / 1e6
    return TracedRun(server, arrivals, handoff_stats(*mine, window_s, server.models[0].instance_count))


def describe(label: str, stats: HandoffStats, waits_ms: np.ndarray) -> str:
    return (
        f"{label:5s} hand-offs {stats.handoffs:4d}, lost {stats.lost:3d} ({stats.lost_share:5.1%}), prompt gap mean "
        f"{stats.gap_mean_ms:.2f} ms P90 {stats.gap_p90_ms:.2f}; queue wait P50/P90/P99/max "
        + "/".join(f"{np.percentile(waits_ms, q):.1f}" for q in (50, 90, 99)) + f"/{waits_ms.max():.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tuned", choices=sorted(fid.CONFIGS))
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3, help="runs per server start")
    ap.add_argument("--restarts", type=int, default=2, help="server starts")
    ap.add_argument("--keep", type=Path, help="copy the raw traces into this folder")
    ap.add_argument("--all-models", action="store_true", help="load every fidelity config, as the fidelity test does")
    ap.add_argument("--fit", action="store_true", help="fit the hand-off model (fit_handoff) to the traced runs")
    ap.add_argument("--observer-effect", action="store_true",
                    help="alternate traced and untraced runs (--runs pairs) on one server start, all models loaded")
    ap.add_argument("--rate-limiter-effect", action="store_true",
                    help="alternate --config and the same config without its rate-limiter resources (--runs pairs), traced")
    args = ap.parse_args()
    if args.observer_effect:
        observer_effect(args)
        return
    if args.rate_limiter_effect:
        rate_limiter_effect(args)
        return
    name = args.config
    arrivals = fid.traffic(args.rate, args.requests, args.seed)
    server_sim = fid.sim_server(name, EMBEDDED_CPU_OVERHEADS)
    print(f"{name} at {args.rate:.0f} req/s, {len(arrivals)} requests per run; {args.restarts} server starts x {args.runs} runs")
    all_traced = []
    for start in range(args.restarts):
        with tempfile.TemporaryDirectory(prefix="tritongen-trace-") as tmp:
            repo = fid.write_repository(Path(tmp), fid.CONFIGS if args.all_models else [name])
            trace = Path(tmp) / "trace.json"
            with TritonServer(ServerOptions(repository=repo, extra_args=[*fid.FLAGS, *trace_flags(trace)])) as server:
                runs = [fid.measure_model(server, name, arrivals, run) for run in range(args.runs)]
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(trace, args.keep / f"trace-{start}.json")
            times = read_trace(trace, name)
            for run, live in enumerate(runs):
                mine = times.between(*live.load.clock_span())
                traced = traced_handoffs(mine, name, arrivals, EMBEDDED_CPU_OVERHEADS)
                all_traced.append(traced)
                waits = (mine.start_s - mine.queue_s) * 1e3
                print(f"start {start} run {run}: P99 {live.latency_percentile_ms(99):.1f} ms, mean batch "
                      f"{live.stats[name].mean_batch_rows:.2f}, client send lag max {live.load.send_lag_ms(100):.1f} ms, "
                      f"foreign {live.foreign_cores or 0.0:.2f} cores")
                print("  " + describe("live", traced.live, waits))
    for seed in range(2):
        sim = Simulation(server_sim, arrivals, seed)
        res = sim.run()
        t_start = np.asarray(sim.t_start)
        ok = np.isfinite(t_start)
        print(f"sim seed {seed}: P99 {np.percentile(sim.window_latencies_s(), 99) * 1e3:.1f} ms, mean batch {res.models[0].mean_batch_rows:.2f}")
        print("  " + describe("sim", sim.handoff_stats(), (t_start[ok] - arrivals.t[ok]) * 1e3))
    if args.fit:
        # one load cannot tell how fast the loss grows with load: the doubling is held
        fitted = fit_handoff(all_traced, doubling_grid=(EMBEDDED_CPU_OVERHEADS.wake_loss_doubling_per_s,))
        print(f"hand-off model fitted to these traces: {fitted} (embedded: release_ms {EMBEDDED_CPU_OVERHEADS.release_ms})")


def observer_effect(args) -> None:
    name = args.config
    arrivals = fid.traffic(args.rate, args.requests, args.seed)
    print(f"{name} at {args.rate:.0f} req/s, {len(arrivals)} requests per run; {args.runs} traced/untraced pairs, one server start")
    p99 = {"traced": [], "untraced": []}
    batch = {"traced": [], "untraced": []}
    with tempfile.TemporaryDirectory(prefix="tritongen-trace-") as tmp:
        repo = fid.write_repository(Path(tmp), fid.CONFIGS)
        trace = Path(tmp) / "trace.json"
        with TritonServer(ServerOptions(repository=repo, extra_args=[*fid.FLAGS, *trace_flags(trace)])) as server:
            for pair in range(args.runs):
                for mode in ("traced", "untraced") if pair % 2 == 0 else ("untraced", "traced"):
                    if mode == "traced":
                        set_trace_level(server.http_url, "TIMESTAMPS")
                    else:
                        stop_tracing(server.http_url)
                    live = fid.measure_model(server, name, arrivals, pair)
                    p99[mode].append(live.latency_percentile_ms(99))
                    batch[mode].append(live.stats[name].mean_batch_rows or 0.0)
                    print(f"pair {pair} {mode:8s} P50/P90/P99 " + "/".join(f"{live.latency_percentile_ms(q):.1f}" for q in (50, 90, 99))
                          + f" ms, mean batch {batch[mode][-1]:.3f}, foreign {live.foreign_cores or 0.0:.2f} cores")
    for mode in ("traced", "untraced"):
        print(f"{mode:8s} median P99 {np.median(p99[mode]):.1f} ms, mean batch {np.mean(batch[mode]):.3f}")
    higher = sum(u > t for t, u in zip(p99["traced"], p99["untraced"]))
    print(f"untraced/traced P99 ratio {np.median(p99['untraced']) / np.median(p99['traced']):.2f}; untraced higher in {higher} of {args.runs} pairs")


def rate_limiter_effect(args) -> None:
    """How much more often an instance that holds rate-limiter resources loses the batcher's wake
    (`Overheads.rate_limited_wake_loss`): the config against itself without resources, alternating on
    one traced server start, the server rate-limiting throughout."""
    name, free = args.config, f"{args.config}_free"
    specs = {name: fid.CONFIGS[name], free: fid.without_rate_limiter(name)}
    arrivals = fid.traffic(args.rate, args.requests, args.seed)
    print(f"{name} with and without rate-limiter resources at {args.rate:.0f} req/s, {len(arrivals)} requests per run; "
          f"{args.runs} pairs, one traced server start")
    runs: dict[str, list] = {name: [], free: []}
    with tempfile.TemporaryDirectory(prefix="tritongen-trace-") as tmp:
        repo = fid.write_repository(Path(tmp), specs)
        trace = Path(tmp) / "trace.json"
        with TritonServer(ServerOptions(repository=repo, extra_args=[*fid.FLAGS, *trace_flags(trace)])) as server:
            for pair in range(args.runs):
                for model in (name, free) if pair % 2 == 0 else (free, name):
                    runs[model].append(fid.measure_model(server, model, arrivals, pair, specs[model]))
        for model, lives in runs.items():
            times = read_trace(trace, model)
            stats = [traced_handoffs(times.between(*live.load.clock_span()), model, arrivals, EMBEDDED_CPU_OVERHEADS,
                                     specs[model]).live
                     for live in lives]
            lost, handoffs = sum(x.lost for x in stats), sum(x.handoffs for x in stats)
            p99 = [live.latency_percentile_ms(99) for live in lives]
            batch = [live.stats[model].mean_batch_rows or 0.0 for live in lives]
            print(f"{model:12s} lost {lost}/{handoffs} hand-offs ({lost / max(1, handoffs):.2%}), mean batch {np.mean(batch):.3f}, "
                  f"P99 median {np.median(p99):.1f} mean {np.mean(p99):.1f} ms ({', '.join(f'{x:.1f}' for x in p99)})")
    print(f"embedded rate_limited_wake_loss: {EMBEDDED_CPU_OVERHEADS.rate_limited_wake_loss}")


if __name__ == "__main__":
    main()
