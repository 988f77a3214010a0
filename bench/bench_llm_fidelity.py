"""Live versus simulated, on LLM stand-ins tritongen did not write its engine model for.

For each stand-in of examples/llm_standins (the vLLM backend's interface with vLLM's semantics;
a hand-written Python backend that reserves prompt + max_tokens and kills what does not fit):
  1. profile it on the embedded server (`Profiler`: interface, request overhead, prefill, decode,
     KV capacity) and compare the measured step costs with what the stand-in is configured with
     (its 1/standin.json, which tritongen never reads);
  2. resolve its engine (the backend's files, the spec's `engine:` section, the profile);
  3. find the simulated capacity, then run Poisson traffic at 0.5x, 0.9x and 1.5x of it, live
     (real gRPC streams, `run_load`) and simulated, and print completed/s, TTFT P50/P99, kills and
     preemptions side by side.

Goals (issue 14): completed/s within 10%, TTFT P50/P99 within 25%, kills and preemptions within
25% or both zero; step costs within 15% of the configured ones.

    .venv/bin/python -m bench.bench_llm_fidelity [--seconds 20] [--models vllm_standin,reserve_llm]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.rig import ROOT
from bench.report import FLOOD_FACTOR, flooded_capacity, live_vs_sim, rel, saved_report
from tritongen.core.engine_sources import measured_from_profile, resolve_engine
from tritongen.core.spec import EngineSection
from tritongen.core.simulator import ModelSim, Overheads, ServerSim, simulate
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.engine_files import vllm_engine_args
from tritongen.llm_targets import llm_target
from tritongen.loadgen import run_load
from tritongen.core.prometheus import parse_prometheus
from tritongen.profiler.run import Endpoints, Profiler, TritonAdmin, default_settings, resolve_targets
from tritongen.server import ServerOptions, TritonServer

STANDINS = ROOT / "examples" / "llm_standins"
REPOSITORY = STANDINS / "repository"
PYTHON_BACKENDS = {"vllm": STANDINS / "backends" / "vllm"}

# What a user would write about each model: the vLLM stand-in needs nothing (model.json, its
# metrics and its token counts say it all); the hand-written one is described in the spec.
CASES = {
    "vllm_standin": {"spec": None, "bytes_per_token": None, "prompt": 64, "output": 48},
    "reserve_llm": {
        # what its config.pbtxt parameters pool_tokens / max_active say, in the spec's words
        "spec": EngineSection(kv_policy="reserve_kill", kv_pool_tokens=1920, max_num_seqs=48),
        "bytes_per_token": 3.0,
        "prompt": 48,
        "output": 48,
    },
}
# tinyllm, the model this repository wrote (real numpy maths, CPU-bound), as served by make demo
TINYLLM = {"spec": None, "bytes_per_token": 1.0, "prompt": 48, "output": 16}
LOADS = (0.5, 0.9, 1.5)


def configured_costs(model: str) -> dict:
    return json.loads((REPOSITORY / model / "1" / "standin.json").read_text())


def profile(server: TritonServer, model: str, case: dict, out: Path):
    endpoints = Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    admin = TritonAdmin(endpoints)
    try:
        targets = [replace(t, bytes_per_token=case["bytes_per_token"], prompt_tokens=case["prompt"], output_tokens=case["output"])
                   for t in resolve_targets(admin, [model], None)]
        profiler = Profiler(admin, endpoints, default_settings(quick=False).model_copy(update={"stream_concurrency_levels": [1, 4, 8, 16]}), out,
                            kv_capacity_probe=bool(case.get("capacity_probe")))
        return profiler.run(targets)[0]
    finally:
        admin.close()


def preemptions(server: TritonServer) -> float:
    import httpx

    text = httpx.get(server.metrics_url, timeout=10).text
    return sum(s.value for s in parse_prometheus(text) if s.name == "vllm:num_preemptions_total")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--models", default=",".join([*CASES, "tinyllm"]))
    args = ap.parse_args()
    with saved_report("llm_fidelity"), tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            if model == "tinyllm":
                from tritongen.server_flags import server_flags_from

                repo = ROOT / "model_repository"
                options = ServerOptions(repository=repo, extra_args=server_flags_from(repo))
                case = TINYLLM
            else:
                options = ServerOptions(repository=REPOSITORY, python_backends=PYTHON_BACKENDS)
                case = CASES[model]
            with TritonServer(options) as server:
                one_model(server, model, case, Path(tmp), args.seconds)
    return 0


def one_model(server: TritonServer, model: str, case: dict, tmp: Path, seconds: float, *, repeats: int = 1,
              live_capacity: bool = False) -> None:
    """Profile, resolve, then each load live and simulated. `live_capacity`: the loads are fractions
    of what the engine completed live when flooded (the issue-43 goal's "measured capacity"), not
    of the simulated capacity; `repeats` > 1 runs each load that many times live and ends with the
    simulator against the live median (bench_vllm_fidelity.print_against_the_median)."""
    repository = Path(server.options.repository)
    prof = profile(server, model, case, tmp)
    eng = prof.engine
    assert eng is not None
    truth = configured_costs(model) if (repository / model / "1" / "standin.json").is_file() else None
    print(f"\n## {model}: {eng.interface}")
    print(f"bytes/token {eng.bytes_per_token:g} ({eng.bytes_per_token_source}); request overhead {eng.request_overhead_ms:.2f} ms; "
          f"KV capacity {eng.kv_capacity_tokens} tokens ({eng.kv_capacity_source}: {eng.kv_capacity_detail})")
    for note in eng.notes:
        print(f"note: {note}")
    for gap in prof.gaps:
        print(f"gap ({gap.measurement}): {gap.unseen}; taken instead: {gap.inferred}")
    if eng.kv_policy_seen:
        print(f"KV policy seen by the capacity probe: {eng.kv_policy_seen} ({eng.kv_policy_evidence})")
    print("| prompt tokens | TTFT ms | queue ms | engine ms (prefill) | path ms |\n|---|---|---|---|---|")
    for p in eng.prefill:
        print(f"| {p.prompt_tokens} | {p.ttft_ms:.2f} | {p.queue_ms:.2f} | {p.engine_ms:.2f} | {p.path_ms:.2f} |")
    print("| streams | mean gap ms | decode step ms |\n|---|---|---|")
    for d in eng.decode:
        print(f"| {d.concurrency} | {d.mean_gap_ms:.2f} | {d.step_ms:.2f} |")
    print("| step cost | configured | measured | error |\n|---|---|---|---|")
    for name in ("prefill_fixed_ms", "prefill_ms_per_token", "decode_fixed_ms", "decode_ms_per_seq"):
        if truth is None:
            print(f"| {name} | (real maths: not configured) | {getattr(eng, name):.4g} | - |")
            continue
        print(f"| {name} | {truth[name]:g} | {getattr(eng, name):.4g} | {rel(truth[name], getattr(eng, name))} |")
    for length in (case["prompt"],) if truth is not None else ():
        c = truth["prefill_fixed_ms"] + truth["prefill_ms_per_token"] * length
        m = eng.prefill_fixed_ms + eng.prefill_ms_per_token * length
        print(f"| prefill at {length} tokens | {c:.3g} | {m:.3g} | {rel(c, m)} |")
    config = _config(server, model)
    engine = resolve_engine(
        model=model, backend=config.get("backend"), measured=measured_from_profile(eng),
        parameters={k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()},
        engine_args=vllm_engine_args(repository / model) if config.get("backend") == "vllm" else None,
        spec=case["spec"],
    )
    print(f"engine: {engine.kv_policy}, {engine.kv_pool_blocks} x {engine.kv_block_tokens} tokens, "
          f"max_num_seqs {engine.max_num_seqs}; sources: {engine.sources}")
    sim_server = ServerSim(models=[ModelSim(name=model, llm=engine)], overheads=Overheads(request_ms=eng.request_overhead_ms))
    def traffic(rate: float, seed: int = 5):
        spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=seconds, warmup_s=2.0,
                           classes=[{"name": "all", "share": 1.0, "priority": 1,
                                     "prompt_tokens": case["prompt"], "output_tokens": case["output"]}])
        return generate_arrivals(spec, seed=seed)

    # capacity: what the simulated engine completes per second when far more is offered
    capacity = simulate(sim_server, traffic(200.0), seed=1).throughput_per_s
    if capacity <= 0:
        print("the simulation completed nothing at 200 req/s: see the engine above")
        return
    print(f"simulated capacity {capacity:.1f} req/s")
    target = llm_target(model, config, eng)
    if live_capacity:
        sim_capacity = capacity
        capacity, _ = flooded_capacity(sim_capacity, lambda rate: run_load(
            traffic(rate, seed=3), {"all": target}, grpc_url=server.grpc_url, request_timeout_s=120.0))
        print(f"measured capacity {capacity:.1f} req/s (offered {FLOOD_FACTOR * sim_capacity:.0f}/s; the simulation's "
              f"{rel(capacity, sim_capacity)}): the loads below are fractions of it")
    print("\n| load | req/s | run | completed/s live / sim | TTFT P50 ms live / sim | TTFT P99 ms live / sim | kills live / sim | preemptions live / sim |")
    print("|---|---|---|---|---|---|---|---|")
    summary: list[tuple[float, list, object]] = []
    for factor in LOADS:
        arrivals = traffic(capacity * factor)
        sim = simulate(sim_server, arrivals, seed=2)
        sc, sim_pre = sim.classes[0], sim.models[0].preemptions
        lives: list = []
        summary.append((factor, lives, sc))
        for rep in range(repeats):
            before = preemptions(server)
            live = run_load(arrivals, {"all": target}, grpc_url=server.grpc_url, request_timeout_s=60.0)
            live_pre = preemptions(server) - before
            lc = live.summary()[0][0]
            lives.append(lc)
            print(
                f"| {factor:g}x | {arrivals.mean_rate:.1f} | {rep + 1} | {live_vs_sim(lc, sc)} "
                f"| {lc.oom_killed} / {sc.oom_killed} ({rel(lc.oom_killed, sc.oom_killed)}) "
                f"| {live_pre:.0f} / {sim_pre} ({rel(live_pre, sim_pre)}) |",
                flush=True,
            )
    if repeats > 1:
        from bench.bench_vllm_fidelity import print_against_the_median

        print_against_the_median(summary)


def _config(server: TritonServer, model: str) -> dict:
    import httpx

    return httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10).json()


if __name__ == "__main__":
    raise SystemExit(main())
