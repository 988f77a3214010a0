"""The ranker setup that `bench/bench_sim_fidelity.py`, `bench/trace_batcher.py` and the suite's smoke
check (tests/integration/test_sim_fidelity.py) share: three configs, their two-class Poisson
traffic, the repository that serves them and the simulated server.

  plain   max_batch_size 8, a 2 ms window, no queue policy (Triton prefetches batches)
  tuned   the shape `render` writes: preferred 4/8/16, a 4 ms window, two priority levels with
          REJECT and DELAY timeouts, queue limits, a rate-limiter resource
  multi   two instances, max_batch_size 4, no window, priority levels; the top load is above
          capacity, so a small queue limit rejects and throughput is the server's own limit

The ranker runs 10 ms + 1.5 ms per row (its parameters), which is the curve the simulator gets.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from bench.rig import ROOT
from tritongen.core.simulator import ServerSim, ServiceCurve, model_sim_from_config
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.loadgen import LoadTarget
from tritongen.pbtxt import parse_model_config
from tritongen.server import TritonServer
from tritongen.tuner.verify import LiveRun, measure

RANKER_CODE = ROOT / "model_repository" / "ranker" / "1"
OVERHEAD_MS, PER_ITEM_MS = 10.0, 1.5
CURVE = ServiceCurve(fixed_ms=OVERHEAD_MS, per_item_ms=PER_ITEM_MS)
FLAGS = ["--rate-limit=execution_count", "--rate-limit-resource=compute:2"]
CLASSES = [{"name": "interactive", "share": 0.3, "priority": 1}, {"name": "batch", "share": 0.7, "priority": 2}]


def _policies(queue: int) -> str:
    return (
        "priority_levels: 2 default_priority_level: 2 "
        f"priority_queue_policy {{ key: 1 value {{ timeout_action: REJECT default_timeout_microseconds: 400000 allow_timeout_override: true max_queue_size: {queue} }} }} "
        f"priority_queue_policy {{ key: 2 value {{ timeout_action: DELAY default_timeout_microseconds: 800000 allow_timeout_override: true max_queue_size: {queue} }} }} "
        f"default_queue_policy {{ timeout_action: DELAY default_timeout_microseconds: 800000 allow_timeout_override: true max_queue_size: {queue} }}"
    )


CONFIGS = {
    "plain": {"mbs": 8, "count": 1, "rl": False, "batching": "max_queue_delay_microseconds: 2000", "loads": (100, 180, 260)},
    "tuned": {"mbs": 16, "count": 1, "rl": True, "loads": (100, 200, 300),
              "batching": "preferred_batch_size: [4, 8, 16] max_queue_delay_microseconds: 4000 " + _policies(96)},
    "multi": {"mbs": 4, "count": 2, "rl": False, "loads": (150, 300, 520),
              "batching": "max_queue_delay_microseconds: 0 " + _policies(24)},
}


def without_rate_limiter(name: str) -> dict:
    """`name`'s config with no rate-limiter resources (the server still rate-limits)."""
    return {**CONFIGS[name], "rl": False}


def config_text(name: str, spec: dict | None = None) -> str:
    """`name`'s config.pbtxt, from `spec` (a CONFIGS entry; CONFIGS[name] if not given)."""
    c = spec or CONFIGS[name]
    rl = 'rate_limiter { resources { name: "compute" count: 1 } }' if c["rl"] else ""
    return f"""name: "{name}"
backend: "python"
max_batch_size: {c["mbs"]}
input {{ name: "FEATURES" data_type: TYPE_FP32 dims: [ 32 ] }}
output {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 1 ] }}
instance_group {{ kind: KIND_CPU count: {c["count"]} {rl} }}
dynamic_batching {{ {c["batching"]} }}
parameters {{ key: "overhead_ms" value {{ string_value: "{OVERHEAD_MS}" }} }}
parameters {{ key: "per_item_ms" value {{ string_value: "{PER_ITEM_MS}" }} }}
"""


def traffic(rate: float, n: int, seed: int):
    spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=n / rate, warmup_s=min(1.0, 0.1 * n / rate), classes=CLASSES)
    return generate_arrivals(spec, seed=seed)


WARMUP = traffic(200.0, 40, 999)  # sent (not counted) before every measured run


def measure_model(server: TritonServer, name: str, arrivals, seed: int, spec: dict | None = None) -> LiveRun:
    """One measured open-loop run of `arrivals` (both classes) against model `name`, after WARMUP."""
    targets = {c["name"]: LoadTarget(name) for c in CLASSES}
    return measure(server.http_url, arrivals, targets, {name: (spec or CONFIGS[name])["count"]}, warmup=WARMUP,
                   seed=seed, server_pid=server.process.pid if server.process else None)


def sim_server(name: str, overheads, spec: dict | None = None) -> ServerSim:
    model = model_sim_from_config(parse_model_config(config_text(name, spec)), curve=CURVE)
    return ServerSim(models=[model], rate_limit=True, resources={"compute": 2}, overheads=overheads)


def write_repository(into: Path, models: Mapping[str, dict] | Iterable[str]) -> Path:
    """A model repository under `into` with the ranker code and each of `models`' configs (names of
    CONFIGS, or name -> spec)."""
    specs = dict(models) if isinstance(models, Mapping) else {name: CONFIGS[name] for name in models}
    repo = into / "repo"
    for name, spec in specs.items():
        (repo / name / "1").mkdir(parents=True)
        for f in ("model.py", "ranker_net.py"):
            shutil.copy(RANKER_CODE / f, repo / name / "1" / f)
        (repo / name / "config.pbtxt").write_text(config_text(name, spec))
    return repo
