"""What the simulator predicts for a candidate, judged against the classes' targets: feasibility,
capacity (the largest rate multiple it carries within every target) and the ranking."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from tritongen.core.class_targets import held_to_target
from tritongen.core.simulator import SimResult, simulate
from tritongen.core.spec import MIB
from tritongen.core.traffic import Arrivals, scale_rate
from tritongen.core.tune.inputs import Params, TuneInputs
from tritongen.core.tune.simulated import server_for


class Evaluation(BaseModel):
    """A candidate and what the simulator predicts for it."""

    params: Params
    feasible: bool
    worst_ratio: float = Field(description="max over classes of P99 / target (TTFT for streaming).")
    error_fraction: float = Field(description="Largest share of a class lost to rejections or OOM kills.")
    throughput_per_s: float
    utilisation: float
    p99_ms: dict[str, float | None]
    capacity_factor: float | None = Field(default=None, description="Largest rate multiple still within targets.")
    memory_bytes: int = 0
    reason: str = ""

    @property
    def capacity_per_s(self) -> float | None:
        return None if self.capacity_factor is None else self.capacity_factor * self.offered_per_s

    offered_per_s: float = 0.0


def _targets(inputs: TuneInputs) -> dict[str, float]:
    return {c.name: c.p99_ms for c in inputs.classes}


def judge(inputs: TuneInputs, params: Params, result: SimResult) -> Evaluation:
    targets = _targets(inputs)
    streaming = inputs.entry.kind == "llm" and inputs.entry.decoupled
    worst = 0.0
    errors = 0.0
    p99: dict[str, float | None] = {}
    reasons = []
    for c in result.classes:
        if c.name not in targets or c.sent == 0:
            continue
        value = held_to_target(c, streaming)
        p99[c.name] = value
        ratio = math.inf if value is None else value / targets[c.name]
        worst = max(worst, ratio)
        lost = (c.sent - c.completed) / c.sent
        errors = max(errors, lost)
        if ratio > 1.0:
            reasons.append(f"{c.name} P99 {value if value is None else round(value, 1)} ms > {targets[c.name]:g} ms")
        if lost > inputs.max_error_fraction:
            reasons.append(f"{c.name} loses {lost:.1%}")
    memory = params.instances * inputs.instance_bytes
    if inputs.memory_available_bytes is not None and memory > inputs.memory_available_bytes:
        reasons.append(f"{memory / MIB:.1f} MiB of instances exceed the {inputs.memory_available_bytes / MIB:.1f} MiB left")
    model = result.models[0]
    return Evaluation(
        params=params,
        feasible=not reasons,
        worst_ratio=worst,
        error_fraction=errors,
        throughput_per_s=result.throughput_per_s,
        utilisation=model.busy_fraction if streaming else model.utilisation,
        p99_ms=p99,
        memory_bytes=memory,
        reason="; ".join(reasons),
        offered_per_s=inputs.arrivals.mean_rate,
    )


def evaluate(inputs: TuneInputs, params: Params, arrivals: Arrivals | None = None) -> tuple[Evaluation, SimResult]:
    arr = arrivals if arrivals is not None else inputs.arrivals
    result = simulate(server_for(inputs, params), arr, seed=inputs.seed)
    return judge(inputs, params, result), result


def capacity_bound(inputs: TuneInputs, params: Params) -> float:
    """An upper bound on the rate multiple a candidate can carry (full batches back to back)."""
    if inputs.entry.kind == "llm" or inputs.curve is None:
        return 8.0
    ov = inputs.overheads
    mbs = max(1, params.max_batch_size)
    exec_ms = inputs.curve.ms(mbs) + ov.batch_ms + ov.request_exec_ms * mbs
    rows_per_s = params.instances * mbs / max(1e-9, exec_ms / 1000.0)
    if inputs.device_curve is not None:  # the instances of a device take turns for its part
        rows_per_s = min(rows_per_s, mbs / max(1e-9, min(exec_ms, inputs.device_curve.ms(mbs)) / 1000.0))
    offered = inputs.arrivals.mean_rate * (float(inputs.arrivals.rows.mean()) if len(inputs.arrivals) else 1.0)
    return float(min(64.0, max(1.05, rows_per_s / max(1e-9, offered) * 1.1)))


def capacity_factor(
    inputs: TuneInputs, params: Params, arrivals: Arrivals, hi: float | None = None, steps: int = 5, below: bool = False
) -> float:
    """Largest rate multiple (bisection between 1 and an analytic bound) that stays feasible.

    `below`: a candidate that misses its targets at the traffic's rate gets the multiple under 1 it
    still carries (down to 1/16; 0 below that) instead of 0, so capacities compare across all."""
    if not evaluate(inputs, params, arrivals)[0].feasible:
        if not below:
            return 0.0
        if not evaluate(inputs, params, scale_rate(arrivals, 1.0 / 16.0))[0].feasible:
            return 0.0
        return _bisect_rate(inputs, params, arrivals, 1.0 / 16.0, 1.0, steps)
    hi = hi if hi is not None else capacity_bound(inputs, params)
    if evaluate(inputs, params, scale_rate(arrivals, hi))[0].feasible:
        return hi
    return _bisect_rate(inputs, params, arrivals, 1.0, hi, steps)


def _bisect_rate(inputs: TuneInputs, params: Params, arrivals: Arrivals, lo: float, hi: float, steps: int) -> float:
    """Geometric bisection between a feasible multiple `lo` and an infeasible `hi`."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if evaluate(inputs, params, scale_rate(arrivals, mid))[0].feasible:
            lo = mid
        else:
            hi = mid
    return lo


def needed_capacity(inputs: TuneInputs, params: Params, steps: int = 6) -> str:
    """When nothing meets the targets: the rate the closest candidate still serves within them
    (bisection below the traffic's rate), and how much more capacity the traffic needs."""
    offered = inputs.arrivals.mean_rate
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2 if lo > 0 else hi / 4
        if mid <= 0.01:
            break
        if evaluate(inputs, params, scale_rate(inputs.arrivals, mid))[0].feasible:
            lo = mid
        else:
            hi = mid
    if lo <= 0:
        return (
            f"even at a quarter of the offered {offered:.1f} req/s the closest candidate misses its targets: "
            "the targets need a faster engine (or looser targets), not more of this one"
        )
    return (
        f"the closest candidate meets every target up to about {lo * offered:.1f} req/s of the offered "
        f"{offered:.1f} req/s: the traffic needs about {1 / lo:.1f}x this capacity (replicas or a faster device)"
    )


def rank_key(e: Evaluation) -> tuple:
    """Feasible first; then capacity (throughput within targets); fewer instances; headroom."""
    cap = e.capacity_factor if e.capacity_factor is not None else 0.0
    return (
        0 if e.feasible else 1,
        -round(cap, 2),
        -round(e.throughput_per_s, 1) if not e.feasible else 0.0,
        e.params.instances,
        round(e.worst_ratio, 3),
        e.params.max_batch_size,
        e.params.delay_us,
    )


def closeness(e: Evaluation) -> tuple:
    """How near an infeasible candidate comes: its lost share, then its worst P99 / target."""
    return (round(e.error_fraction, 3), round(e.worst_ratio, 3))
