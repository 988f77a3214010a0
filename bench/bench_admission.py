"""What one admission decision costs the sidecar, against the length of its queue.

    .venv/bin/python -m bench.bench_admission [--policy PATH] [--repeat R]

Under overload the sidecar's queue holds hundreds of requests, and every arrival (submit), every
ticker pass (tick, every 20 ms while anything waits) and every finished request (release, which
pumps the queue) walks it. This bench fills the committed policy's LLM (`model_repository`'s
tinyllm) to its in-flight bound, queues N lower-class requests, and times, with the real
`AdmissionState` and a fake clock:
  * submit: a top-class arrival that must wait (then cancelled, so the queue stays at N);
  * tick: the ticker's pass over the queue;
  * release: a request ends, the queue is pumped (the head takes its place) and one more
    lower-class request joins the backlog, so it stays at N.
Each figure is the median over R repeats of the mean over 400 calls, in microseconds.

Then who is refused, and when: an LLM with 32 sequences (service 0.8-1.5 s, first token after
30-50 ms) behind the real `AdmissionState`, Poisson arrivals of three classes (20 / 50 / 30 %,
queue budgets 200 ms / 1 s / 10 s) for 60 s at 0.9x, 1.5x and 3x its capacity, an event
simulation with the ticker every 20 ms. Two settings side by side: lower classes queued on the
mean wait (WAIT_Z 0) and on its 98th percentile (the default). A refusal is late when it is told
more than 5 ms after the request arrived.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from pathlib import Path

from bench.rig import ROOT
from bench.report import saved_report, shown
from sidecar.admission import AdmissionState
from sidecar.admission_types import Action, Cost, Request
from sidecar.cost import LLMFacts, cost_for
from tritongen.core.admission_tuning import WAIT_Z
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.shared.policy_file import load_policy

CALLS = 400


def llm_cost(model, prompt_tokens: int, max_tokens: int) -> Cost:
    """What the sidecar charges a request of this size, through its own cost path (`cost_for`)."""
    prompt_bytes = round(prompt_tokens * model.kv.prompt_bytes_per_token)
    return cost_for(model, LLMFacts(prompt_bytes=[prompt_bytes], max_tokens=[max_tokens]))


def one_run(policy_path: Path, model: str, waiting: int) -> dict[str, float]:
    policy = load_policy(policy_path)
    entry = next(m for m in policy.models if m.name == model)
    assert entry.kv is not None, f"{model} is not an LLM in {policy_path}"
    classes = sorted(policy.classes, key=lambda c: c.priority)
    top, low = classes[0].name, classes[-1].name
    clock = [1000.0]
    state = AdmissionState(policy, lambda: clock[0])
    small = llm_cost(entry, 32, 16)
    ids = iter(range(10**9))
    running = []
    while True:  # fill the engine to its bound
        rid = next(ids)
        decision = state.submit(Request(rid, model, top, small))
        if not decision.admitted:
            state.cancel(rid)
            break
        running.append(rid)
    for _ in range(waiting):  # the backlog: no drain measured yet, so nothing is refused by estimate
        clock[0] += 1e-5
        state.submit(Request(next(ids), model, low, small))
    assert state.waiting == waiting, (state.waiting, waiting)

    def timed(step) -> float:
        started = time.perf_counter()
        for _ in range(CALLS):
            clock[0] += 1e-5
            step()
        return (time.perf_counter() - started) / CALLS * 1e6

    def submit() -> None:
        rid = next(ids)
        state.submit(Request(rid, model, top, small))
        state.cancel(rid)

    def release() -> None:
        state.release(running.pop(0), tokens=48)
        running.extend(d.request_id for d in state.take_events().granted)
        state.submit(Request(next(ids), model, low, small))  # the backlog back to N

    return {"submit": timed(submit), "tick": timed(state.tick), "release": timed(release)}


OVERLOAD_CLASSES = (("interactive", 1, 0.2, 200), ("normal", 2, 0.5, 1000), ("batch", 3, 0.3, 10_000))
SEQUENCES, SERVICE_S = 32, (0.8, 1.5)


def overload_policy(wait_z: float):
    classes = [{"name": n, "kind": n, "priority": pr, "p99_ms": ms, "max_queue_wait_ms": ms, "queue_cap": None,
                "budget_fraction": 1.0} for n, pr, _, ms in OVERLOAD_CLASSES]
    return parse_policy({
        "version": 1, "deployment": "bench", "default_class": "normal", "starvation_guard_ms": 200, "classes": classes,
        "devices": [{"id": "gpu0", "memory_bytes": 10**12, "utilization_cap": 1.0, "static_used_bytes": 0}],
        "models": [{"name": "llm", "kind": "llm", "devices": ["gpu0"], "memory_quota_bytes": None,
                    "max_inflight": SEQUENCES, "release_grace_ms": 100,
                    "kv": {"bytes_per_token": 10, "bytes_per_token_source": "analytic", "block_tokens": 16,
                           "max_context": 4096, "kv_policy": "grow_preempt", "engine_pool_bytes": 10**9}}],
        "concurrency": {"min": SEQUENCES, "max": SEQUENCES, "queue_delay_high_ms": 50, "queue_delay_low_ms": 20,
                        "adjust_interval_ms": 1000, "increase_hold_ms": 3000},
        "headroom": {"sources": ["static"], "safety_pad_bytes": 0}, "admission": {"wait_z": wait_z},
    })


def overload_run(load: float, seed: int, wait_z: float, seconds: float = 60.0) -> dict[str, float]:
    """One event simulation (see the module docstring); counts per class and refusal delays."""
    rng = random.Random(seed)
    clock = [0.0]
    state = AdmissionState(overload_policy(wait_z), lambda: clock[0])
    rate = load * SEQUENCES / (sum(SERVICE_S) / 2)
    events: list[tuple[float, int, str, int]] = []
    order = iter(range(10**9))
    arrived: dict[int, tuple[str, float]] = {}
    t, rid = 0.0, 0
    while t < seconds:
        t += rng.expovariate(rate)
        rid += 1
        pick, klass = rng.random(), OVERLOAD_CLASSES[-1][0]
        for name, _, share, _ in OVERLOAD_CLASSES:
            if pick < share:
                klass = name
                break
            pick -= share
        arrived[rid] = (klass, t)
        heapq.heappush(events, (t, next(order), "arrive", rid))
    for k in range(int((seconds + 20) / 0.02)):
        heapq.heappush(events, (k * 0.02, next(order), "tick", 0))
    cost = llm_cost(state.model_policy("llm"), 64, 48)
    served = {name: 0 for name, *_ in OVERLOAD_CLASSES}
    refusal_delays: list[float] = []

    def start(i: int) -> None:
        heapq.heappush(events, (clock[0] + rng.uniform(0.03, 0.05), next(order), "first", i))
        heapq.heappush(events, (clock[0] + rng.uniform(*SERVICE_S), next(order), "end", i))

    while events:
        t, _, kind, i = heapq.heappop(events)
        clock[0] = t
        if kind == "arrive":
            decision = state.submit(Request(i, "llm", arrived[i][0], cost))
            if decision.action is Action.ADMIT:
                start(i)
            elif decision.action is Action.REJECT:
                refusal_delays.append(0.0)
        elif kind == "first":
            state.end_prefill(i)
            served[arrived[i][0]] += 1
        elif kind == "end":
            state.release(i, tokens=112)
        else:
            state.tick()
        if state.has_events:
            happened = state.take_events()
            for d in happened.granted:
                start(d.request_id)
            refusal_delays += [t - arrived[d.request_id][1] for d in happened.expired]
    late = sum(1 for d in refusal_delays if d > 0.005)
    ordered = sorted(refusal_delays)
    return {"served": sum(served.values()), "interactive": served["interactive"], "refused": len(refusal_delays),
            "late": late, "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0}


def overload_table(seeds: int) -> None:
    print()
    print(f"Refusals under overload (event simulation, real AdmissionState, {seeds} seeds; medians):")
    print("| load | lower classes queued on | served | interactive served | refused | told late | refusal P99 ms |")
    print("|---|---|---|---|---|---|---|")
    for load in (0.9, 1.5, 3.0):
        for label, z in (("the mean (WAIT_Z 0)", 0.0), (f"the 98th percentile (WAIT_Z {WAIT_Z:g})", WAIT_Z)):
            runs = [overload_run(load, seed, z) for seed in range(1, seeds + 1)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"| {load:g}x | {label} | {med['served']:.0f} | {med['interactive']:.0f} | {med['refused']:.0f} | "
                  f"{med['late']:.0f} | {med['p99_ms']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=ROOT / "model_repository" / "sidecar_policy.json")
    parser.add_argument("--model", default="tinyllm")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3, help="event simulations per cell of the overload table")
    args = parser.parse_args()
    with saved_report("admission"):
        run(args)


def run(args: argparse.Namespace) -> None:
    print(f"policy {shown(args.policy)}, "
               f"model {args.model}; mean of {CALLS} calls, median of {args.repeat} repeats, microseconds per call")
    print("| waiting | submit us | tick us | release us |")
    print("|---|---|---|---|")
    for waiting in (0, 50, 150, 400):
        runs = [one_run(args.policy, args.model, waiting) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {waiting} | {med['submit']:.0f} | {med['tick']:.0f} | {med['release']:.0f} |")
    overload_table(args.seeds)


if __name__ == "__main__":
    main()
