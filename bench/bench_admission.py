"""What one admission decision costs the sidecar, against the length of its queue.

    .venv/bin/python bench/bench_admission.py [--policy PATH] [--repeat R]

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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import saved_report  # noqa: E402
from sidecar.admission import AdmissionState, Cost, Request  # noqa: E402
from sidecar.policy import load_policy  # noqa: E402

CALLS = 400


def llm_cost(prompt: int, output: int, bytes_per_token: float, block: int) -> Cost:
    tokens = prompt + output
    return Cost(kv_bytes=int(-(-tokens // block) * block * bytes_per_token), tokens=tokens,
                prompt_tokens=prompt, prompt_lengths=(prompt,))


def one_run(policy_path: Path, model: str, waiting: int) -> dict[str, float]:
    policy = load_policy(policy_path)
    entry = next(m for m in policy.models if m.name == model)
    assert entry.kv is not None, f"{model} is not an LLM in {policy_path}"
    classes = sorted(policy.classes, key=lambda c: c.priority)
    top, low = classes[0].name, classes[-1].name
    clock = [1000.0]
    state = AdmissionState(policy, lambda: clock[0])
    small = llm_cost(32, 16, entry.kv.bytes_per_token, entry.kv.block_tokens)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=ROOT / "model_repository" / "sidecar_policy.json")
    parser.add_argument("--model", default="tinyllm")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with saved_report("admission"):
        run(args)


def run(args: argparse.Namespace) -> None:
    print(f"policy {args.policy.relative_to(ROOT) if args.policy.is_relative_to(ROOT) else args.policy}, "
               f"model {args.model}; mean of {CALLS} calls, median of {args.repeat} repeats, microseconds per call")
    print("| waiting | submit us | tick us | release us |")
    print("|---|---|---|---|")
    for waiting in (0, 50, 150, 400):
        runs = [one_run(args.policy, args.model, waiting) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {waiting} | {med['submit']:.0f} | {med['tick']:.0f} | {med['release']:.0f} |")


if __name__ == "__main__":
    main()
