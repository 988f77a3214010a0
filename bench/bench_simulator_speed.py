"""How fast the simulator is: 100,000 requests through a tritongen-style config, wall time.

    .venv/bin/python -m bench.bench_simulator_speed [--requests N] [--repeat R]

Two scenarios: the classic dynamic batcher (ranker-like curve, two priority levels with queue
policies, a rate-limiter resource, Poisson at ~70% of capacity) and a streaming LLM engine
(continuous batching over a paged KV pool). The figure is the best of R runs (the host is shared),
with the median beside it; the tuner runs hundreds of such simulations, so this sets its speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tritongen.core.engine import EngineModel, LLMCurve
from tritongen.core.simulator import (
    EMBEDDED_CPU_OVERHEADS,
    BatcherConfig,
    ModelSim,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
    simulate,
)
from tritongen.core.traffic import TrafficSpec, generate_arrivals

CLASSES = [
    {"name": "interactive", "share": 0.3, "priority": 1, "prompt_tokens": 48, "output_tokens": 16},
    {"name": "batch", "share": 0.7, "priority": 2, "prompt_tokens": {"dist": "uniform", "min": 16, "max": 96}, "output_tokens": 16},
]


def classic() -> ServerSim:
    batcher = BatcherConfig(
        preferred_batch_sizes=[8, 16, 32], max_queue_delay_us=4000, priority_levels=2, default_priority_level=2,
        default_queue_policy=QueuePolicy(timeout_us=500_000, action="DELAY", max_queue_size=256),
        priority_queue_policy={1: QueuePolicy(timeout_us=125_000, action="REJECT", max_queue_size=256)},
    )
    model = ModelSim(name="ranker", max_batch_size=32, dynamic_batching=batcher, instances=2,
                     resources={"compute": 1}, curve=ServiceCurve(fixed_ms=4.3, per_item_ms=0.27))
    return ServerSim(models=[model], rate_limit=True, resources={"compute": 2}, overheads=EMBEDDED_CPU_OVERHEADS)


def llm() -> ServerSim:
    engine = EngineModel(max_num_seqs=32, kv_pool_blocks=400, kv_block_tokens=16, kv_policy="grow_kill",
                             curve=LLMCurve(prefill_ms_per_token=0.045, decode_fixed_ms=0.66, decode_ms_per_seq=0.39))
    model = ModelSim(name="tinyllm", max_batch_size=32, llm=engine,
                     dynamic_batching=BatcherConfig(priority_levels=2, default_priority_level=2,
                                                    default_queue_policy=QueuePolicy(max_queue_size=256)))
    return ServerSim(models=[model], overheads=EMBEDDED_CPU_OVERHEADS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for label, server, rate in (("classic dynamic batcher", classic(), 1800.0), ("streaming LLM engine", llm(), 60.0)):
        spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=args.requests / rate, warmup_s=1.0, classes=CLASSES)
        arrivals = generate_arrivals(spec, seed=1, requests=args.requests)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = simulate(server, arrivals, seed=0)
            times.append(time.perf_counter() - started)
        m = result.models[0]
        print(
            f"{label:24s} {len(arrivals):>7d} requests: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
            f"({len(arrivals) / min(times) / 1000:.0f}k requests/s; {m.executions} executions, mean batch {m.mean_batch_rows:.1f}, "
            f"utilisation {m.utilisation:.0%}, P99 {result.classes[0].p99_ms:.1f} ms)"
        )


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("simulator_speed"):
        code = main()
    sys.exit(code or 0)
