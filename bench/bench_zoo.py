"""The zoo's streaming LLMs, profiled as a new user starts (no spec), simulated against live runs.

For each decoupled model of `../shared/zoo/` (models this repository did not write, served from a
copy of the folder on the embedded server): profile it with nothing but its config (no spec, no
bytes per token, the KV capacity probe on, as the profile's gaps table advises a user who has no
metrics), resolve its engine from that profile alone (the probe's KV capacity and KV policy), then
flood it live for its measured capacity, then run Poisson traffic at 0.5x, 0.9x and 1.5x of that,
`--repeats` times live (real gRPC streams) and once simulated, side by side, and the simulation
against the live median (bench_llm_fidelity.one_model). Models that are not decoupled are profiled
(their static-batch probe printed), then served with the max_batch_size render writes for them (the
largest batch the probe saw run whole), and that config is simulated with the profile's curve against
live Poisson runs of requests shaped as the profile's (its prompt, its budget in the model's own
place), at 0.5x, 0.9x and 1.5x of the live capacity: end-to-end time is their first token.

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
from types import SimpleNamespace

from bench.bench_llm_fidelity import one_model
from bench.bench_vllm_fidelity import print_against_the_median
from bench.report import FLOOD_FACTOR, flooded_capacity, live_vs_sim, rel, saved_report
from bench.rig import ROOT
from tritongen.core.llm_interface_config import interface_from_config
from tritongen.core.profile_types import Profile
from tritongen.core.served_overheads import choose_overheads
from tritongen.core.simulator import ServerSim, ServiceCurve, simulate
from tritongen.core.simulator.configs import model_sim_from_config
from tritongen.core.static_batch import measured_batch_bound
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.loadgen import LoadTarget, run_load
from tritongen.pbtxt import config_from_served, config_to_text, parse_model_config
from tritongen.profiler.engine import ASSUMED_BYTES_PER_TOKEN
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
        unary_profiles: dict[str, Profile] = {}
        with TritonServer(ServerOptions(repository=repo)) as server:
            for name in names:
                if _decoupled(repo / name):
                    case = {"spec": None, "bytes_per_token": None, "prompt": 32, "output": 32, "capacity_probe": True}
                    one_model(server, name, case, Path(tmp), args.seconds, repeats=args.repeats, live_capacity=True)
                else:
                    profile = unary(server, name, Path(tmp))
                    if profile is not None:
                        unary_profiles[name] = profile
        for name, profile in unary_profiles.items():
            bound = measured_batch_bound(profile, None)  # what render --profiles bounds max_batch_size by
            if profile.served_config is None:
                print(f"{name}: the profile holds no served config: nothing to simulate")
                continue
            config = config_from_served(profile.served_config, name)
            config.max_batch_size = min(config.max_batch_size, bound or config.max_batch_size)
            if config.HasField("dynamic_batching"):  # preferred sizes past the new bound, as render drops them
                kept = [b for b in config.dynamic_batching.preferred_batch_size if b <= config.max_batch_size]
                del config.dynamic_batching.preferred_batch_size[:]
                config.dynamic_batching.preferred_batch_size.extend(kept)
            (repo / name / "config.pbtxt").write_text(config_to_text(config))
            print(f"\n## {name}: its config with max_batch_size {config.max_batch_size} (render's, from the probe), "
                  "simulated against live runs")
            with TritonServer(ServerOptions(repository=repo, load_models=[name], model_control="explicit")) as server:
                simulated_against_live(server, name, profile, config, args.seconds, args.repeats)
    return 0


def simulated_against_live(server: TritonServer, model: str, profile: Profile, config, seconds: float,
                           repeats: int) -> None:
    """`config` simulated with the profile's latency-versus-batch curve, against live runs."""
    llm = profile.llm
    assert llm is not None
    if not profile.curve:
        print("the profile measured no latency-versus-batch curve: nothing to simulate")
        return
    overheads, used = choose_overheads(None, profile, None)
    sim_server = ServerSim(models=[model_sim_from_config(config, curve=ServiceCurve.from_profile(profile),
                                                         static_batch_tokens=llm.kv_capacity_tokens)],
                           overheads=overheads)
    print(f"static batches fail above {llm.kv_capacity_tokens} tokens (the probe's)")
    print(f"overheads: {used}")
    interface = interface_from_config(profile.served_config or {}, model=model)
    target = LoadTarget(model, streaming=False, batched=config.max_batch_size > 0, interface=interface,
                        bytes_per_token=ASSUMED_BYTES_PER_TOKEN)

    def traffic(rate: float, seed: int = 5):
        spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=seconds, warmup_s=2.0,
                           classes=[{"name": "all", "share": 1.0, "priority": 1, "prompt_tokens": llm.probe_prompt_tokens,
                                     "output_tokens": llm.probe_max_tokens}])
        return generate_arrivals(spec, seed=seed)

    sim_capacity = simulate(sim_server, traffic(400.0), seed=1).throughput_per_s
    capacity, flood = flooded_capacity(sim_capacity, lambda rate: run_load(
        traffic(rate, seed=3), {"all": target}, http_url=server.http_url, request_timeout_s=60.0))
    print(f"capacity: live {capacity:.1f} req/s (offered {FLOOD_FACTOR * sim_capacity:.0f}/s; failed {_failed(flood)}), "
          f"simulated {sim_capacity:.1f} ({rel(capacity, sim_capacity)})")
    print("| load | req/s | run | completed/s live / sim | P50 ms live / sim | P99 ms live / sim | failed live |")
    print("|---|---|---|---|---|---|---|")
    summary: list[tuple[float, list, object]] = []
    for factor in (0.5, 0.9, 1.5):
        arrivals = traffic(capacity * factor)
        sc = _as_first_token(simulate(sim_server, arrivals, seed=2).classes[0])
        lives: list = []
        summary.append((factor, lives, sc))
        for run in range(repeats):
            live = run_load(arrivals, {"all": target}, http_url=server.http_url, request_timeout_s=60.0)
            lc = _as_first_token(live.summary()[0][0])
            lives.append(lc)
            print(f"| {factor:g}x | {arrivals.mean_rate:.1f} | {run + 1} | {live_vs_sim(lc, sc)} | {_failed(live)} |",
                  flush=True)
    print_against_the_median(summary)


def _failed(result) -> str:
    """How many requests failed, and the first error (the model's own words), for the table."""
    said = [m for m in result.messages if m]
    return f"{len(said)}" + (f" ({said[0][:120]})" if said else "")


def _as_first_token(stats):
    """A class's figures with its end-to-end times as its first token's (one response holds the
    whole completion), as print_against_the_median reads them."""
    return SimpleNamespace(throughput_per_s=stats.throughput_per_s, ttft_p50_ms=stats.p50_ms, ttft_p99_ms=stats.p99_ms)


def unary(server: TritonServer, model: str, out: Path) -> Profile | None:
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
        return None
    print(f"{llm.interface}; budget honoured: {llm.budget_honoured}; end-to-end by budget: {llm.latency_ms_by_budget}")
    print(f"static batch probe at {llm.probe_prompt_tokens} + {llm.probe_max_tokens} tokens: {llm.batch_fits}; "
          f"largest that fits {llm.largest_batch_that_fits}, smallest that fails {llm.smallest_batch_that_fails}"
          f" ({llm.failure_sample})")
    for level in profile.load_levels:
        print(f"| {level.concurrency} clients | {level.throughput_per_s:.1f} req/s | P50 {level.p50_ms} ms | P99 {level.p99_ms} ms | "
              f"{level.errors} errors |")
    for gap in profile.gaps:
        print(f"gap ({gap.measurement}): {gap.unseen}; taken instead: {gap.inferred}")
    return profile


if __name__ == "__main__":
    raise SystemExit(main())
