"""Search batching, queueing and instance settings with the simulator instead of the server.
One file (over 700 lines): candidates, their simulated model and the ranking are one search loop;
splitting would pass its state between modules.

For each model of a deployment plan, `tune_model` enumerates candidates (max batch size,
preferred sizes, queue window, instance count, priority policy; for streaming LLMs the engine's
`max_num_seqs`), simulates each under the traffic with the model's profiled curve, and ranks them:

1. *Feasible* candidates meet every class's P99 target (time to first token for streaming
   models), lose at most `max_error_fraction` of any class to rejections or out-of-memory kills,
   and fit the memory budget (instances x per-instance memory within what the device has left).
2. Among feasible candidates the winner has the highest *capacity*: the largest multiple of the
   traffic's rate it still serves within every target (bisection on the rate, simulated), i.e.
   the best throughput that meets the targets. Ties go to fewer instances, then to more headroom
   (the smallest worst-class P99 / target).
3. When nothing is feasible, the candidate closest to its targets wins and the result says so.

The search is staged so hundreds of candidates fit in seconds: a coarse pass over max batch size x
instances with a middle window, then a fine pass over preferred sizes x windows x priority
policies around the best few coarse points. Pure: no I/O; `apply_candidate` turns a choice into a
plan entry the renderer writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tritongen.core.plan import (
    DeploymentPlan,
    DynamicBatchingView,
    InstanceGroupView,
    ModelEntryPlan,
    QueuePolicyView,
)
from tritongen.core.engine import EngineModel
from tritongen.core.simulator import (
    BatcherConfig,
    ModelSim,
    Overheads,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
    SimResult,
    simulate,
)
from tritongen.core.spec import MIB, DeploymentSpec, TrafficClass
from tritongen.core.traffic import Arrivals, scale_rate

PolicyName = Literal["strict", "strict-loose", "single"]
Objective = Literal["targets", "capacity"]


class Params(BaseModel):
    """One candidate's settings for one model entry."""

    model_config = ConfigDict(frozen=True)

    max_batch_size: int
    preferred: tuple[int, ...]
    delay_us: int
    instances: int
    policy: PolicyName
    max_num_seqs: int | None = None  # streaming LLMs: the engine's batch

    def label(self) -> str:
        pref = "/".join(str(p) for p in self.preferred) or "-"
        seqs = f" seqs={self.max_num_seqs}" if self.max_num_seqs else ""
        return (
            f"mbs={self.max_batch_size} pref={pref} delay={self.delay_us / 1000:g}ms "
            f"inst={self.instances} {self.policy}{seqs}"
        )


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


class TuneResult(BaseModel):
    model: str
    objective: Objective = "targets"
    winner: Evaluation
    runner_up: Evaluation | None
    table: list[Evaluation]
    candidates: int
    feasible: int
    notes: list[str] = Field(default_factory=list)


@dataclass
class TuneInputs:
    """Everything `tune_model` needs for one entry."""

    spec: DeploymentSpec
    entry: ModelEntryPlan
    arrivals: Arrivals  # the traffic this entry serves, class priorities set from the spec
    classes: list[TrafficClass]
    curve: ServiceCurve | None = None
    engine: EngineModel | None = None  # streaming LLMs: the engine as served (engine_sources.resolve_engine)
    overheads: Overheads = field(default_factory=Overheads)
    memory_available_bytes: int | None = None  # device memory this entry may use for instances
    instance_bytes: int = 0
    rate_limit: bool = False
    resources: dict[str, int] = field(default_factory=dict)
    max_error_fraction: float = 0.01
    seed: int = 0
    max_instances: int = 4
    device_curve: ServiceCurve | None = None  # the profile's instance scaling: the execution part a device serialises
    objective: Objective = "targets"


# ---------------------------------------------------------------------------------------------
# Candidates


def powers_of_two(lo: int, hi: int) -> list[int]:
    out = []
    p = 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p *= 2
    if hi >= lo and hi not in out:
        out.append(hi)
    return out


def preferred_options(mbs: int) -> list[tuple[int, ...]]:
    """No preferred size (the server then uses [mbs]), halves, and quarters-halves-full."""
    if mbs < 2:
        return [()]
    opts: list[tuple[int, ...]] = [(), (mbs // 2, mbs)]
    if mbs >= 4:
        opts.append((mbs // 4, mbs // 2, mbs))
    return [tuple(sorted(set(o))) for o in opts]


def delay_options(classes: Sequence[TrafficClass]) -> list[int]:
    """Queue windows up to a quarter of the tightest target (µs)."""
    tightest_ms = min(c.p99_ms for c in classes)
    grid_ms = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    return [int(ms * 1000) for ms in grid_ms if ms <= tightest_ms / 4.0]


def instance_options(inputs: TuneInputs) -> list[int]:
    top = inputs.max_instances
    if inputs.memory_available_bytes is not None and inputs.instance_bytes > 0:
        top = min(top, max(1, inputs.memory_available_bytes // inputs.instance_bytes))
    if inputs.rate_limit and inputs.entry.instance_groups and inputs.entry.instance_groups[0].compute_units:
        units = inputs.resources.get("compute")
        if units:
            top = min(top, max(1, units // inputs.entry.instance_groups[0].compute_units))
    if inputs.entry.kind == "llm":
        top = 1  # one engine owns the KV pool
    return list(range(1, max(1, top) + 1))


# ---------------------------------------------------------------------------------------------
# Building the simulated model from a candidate


def queue_policies(params: Params, classes: Sequence[TrafficClass], spec: DeploymentSpec) -> tuple[BatcherConfig, list[QueuePolicyView], QueuePolicyView, int, int]:
    """The batcher a candidate asks for, and the same as plan views for rendering."""
    depth = spec.policy.queue_depth_batches * params.max_batch_size * params.instances
    fraction = spec.policy.queue_timeout_fraction if params.policy == "strict" else 1.0
    ordered = sorted(classes, key=lambda c: c.priority)
    normal = [c for c in ordered if c.kind == "normal"]
    default = normal[0] if normal else ordered[-1]

    def view(klass: TrafficClass, level: int | None) -> QueuePolicyView:
        if params.policy == "single":
            return QueuePolicyView(level=level, class_name=klass.name, timeout_us=0, action="REJECT", max_queue_size=depth)
        timeout = int(klass.p99_ms * fraction * 1000)
        action = "DELAY" if klass.kind == "batch" else "REJECT"
        return QueuePolicyView(level=level, class_name=klass.name, timeout_us=timeout, action=action, max_queue_size=depth)

    if params.policy == "single" or len(ordered) < 2:
        levels, default_level = 0, 0
        per_level: list[QueuePolicyView] = []
        default_view = view(default, None)
    else:
        levels = len(spec.traffic_classes)
        default_level = default.priority
        per_level = [view(c, c.priority) for c in ordered]
        default_view = view(default, None)

    def pol(v: QueuePolicyView) -> QueuePolicy:
        return QueuePolicy(timeout_us=v.timeout_us, action=v.action, allow_timeout_override=True, max_queue_size=v.max_queue_size)

    batcher = BatcherConfig(
        preferred_batch_sizes=list(params.preferred),
        max_queue_delay_us=params.delay_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=pol(default_view),
        priority_queue_policy={v.level: pol(v) for v in per_level if v.level is not None},
    )
    return batcher, per_level, default_view, levels, default_level


def model_sim(inputs: TuneInputs, params: Params) -> ModelSim:
    entry = inputs.entry
    batcher, *_ = queue_policies(params, inputs.classes, inputs.spec)
    group = entry.instance_groups[0]
    resources = {"compute": group.compute_units} if group.compute_units else {}
    llm = None
    if entry.kind == "llm":
        if inputs.engine is None:
            raise ValueError(f"model {entry.name!r}: tuning a streaming LLM needs its engine (a streaming profile)")
        llm = inputs.engine
        if params.max_num_seqs:
            llm = llm.model_copy(update={"max_num_seqs": params.max_num_seqs})
    elif inputs.curve is None:
        raise ValueError(f"model {entry.name!r}: tuning needs its profiled latency curve")
    return ModelSim(
        name=entry.name,
        route=entry.spec_model,
        max_batch_size=params.max_batch_size,
        dynamic_batching=batcher if params.max_batch_size > 0 or entry.dynamic_batching is not None else None,
        instances=params.instances,
        devices=list(group.gpus) or [-1],
        resources=resources,
        device_curve=inputs.device_curve if llm is None else None,
        curve=inputs.curve if llm is None else None,
        llm=llm,
        prompt_tokens_max=entry.prompt_tokens_max if entry.lane == "short" else None,
    )


def server_for(inputs: TuneInputs, params: Params) -> ServerSim:
    return ServerSim(
        models=[model_sim(inputs, params)],
        rate_limit=inputs.rate_limit,
        resources=inputs.resources,
        overheads=inputs.overheads,
    )


# ---------------------------------------------------------------------------------------------
# Evaluation and ranking


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
        value = c.ttft_p99_ms if streaming else c.p99_ms
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


def _closeness(e: Evaluation) -> tuple:
    return (round(e.error_fraction, 3), round(e.worst_ratio, 3))


def llm_seq_options(engine: EngineModel, top: int) -> list[int]:
    """Engine batches to try: the served one, halves and doubles of it (within `top` where the
    served one is below it): more sequences share each decode step, fewer leave KV room."""
    base = engine.max_num_seqs
    cap = max(base, top)
    options = {base, max(1, base // 2), max(1, base // 4), min(cap, base * 2), min(cap, base * 4)}
    return sorted(options)


def useful_instances(inputs: TuneInputs, mbs: int) -> int:
    """Instances past which a shared device gives no more throughput at batches of `mbs`: enough to
    keep its part busy (execution / device part), and one more so a batch can wait on the host side."""
    if inputs.device_curve is None or inputs.curve is None:
        return 1 << 30
    ov = inputs.overheads
    exec_ms = inputs.curve.ms(mbs) + ov.batch_ms + ov.request_exec_ms * mbs
    device_ms = min(exec_ms, inputs.device_curve.ms(mbs))
    if device_ms <= 0:
        return 1 << 30
    return math.ceil(exec_ms / device_ms) + 1


def coarse_candidates(inputs: TuneInputs) -> list[Params]:
    entry = inputs.entry
    policy = inputs.spec.policy
    delays = delay_options(inputs.classes) or [0]
    mid_delay = delays[len(delays) // 2]
    multi = len(inputs.classes) > 1
    out = []
    if entry.kind == "llm" and inputs.engine is not None:
        for seqs in llm_seq_options(inputs.engine, policy.max_batch):
            # Triton's max_batch_size follows the engine's batch where Triton batches at all (the
            # vLLM backend takes requests one by one: max_batch_size 0).
            mbs = seqs if entry.max_batch_size > 0 else 0
            out.append(Params(max_batch_size=mbs, preferred=(), delay_us=0, instances=1,
                              policy="strict" if multi else "single", max_num_seqs=seqs))
        return out
    top = max(1, entry.max_batch_size)
    for mbs in powers_of_two(max(1, policy.min_batch), top):
        for inst in instance_options(inputs):
            if inst > useful_instances(inputs, mbs):
                continue
            pref = (max(1, mbs // 2), mbs) if mbs >= 2 else ()
            out.append(Params(max_batch_size=mbs, preferred=tuple(sorted(set(pref))), delay_us=mid_delay,
                              instances=inst, policy="strict" if multi else "single"))
    return out


def fine_candidates(inputs: TuneInputs, around: Sequence[Params]) -> list[Params]:
    delays = delay_options(inputs.classes) or [0]
    if inputs.entry.kind == "llm":
        delays = [d for d in delays if d <= 2000] or [0]  # the engine batches; a window only adds TTFT
    policies: list[PolicyName] = ["strict", "strict-loose", "single"] if len(inputs.classes) > 1 else ["single"]
    out: list[Params] = []
    for p in around:
        prefs = [()] if p.max_num_seqs else preferred_options(p.max_batch_size)
        for pref in prefs:
            for d in delays:
                for pol in policies:
                    out.append(p.model_copy(update={"preferred": pref, "delay_us": d, "policy": pol}))
    return out


CAPACITY_STEPS = 7  # bisection steps of --objective capacity's finalists: about 2% resolution on a bound of 10x
COARSE_CAPACITY_STEPS = 4  # the rest: about 15%, enough to pick the finalists


def tune_for_capacity(inputs: TuneInputs, top_coarse: int = 3, capacity_top: int = 5, progress=None) -> TuneResult:
    """`--objective capacity`: the candidate that carries the highest rate of this traffic's mix
    within every target, whether or not it meets them at the traffic's own rate.

    Coarse pass: every max batch size x instances gets its capacity (bisection above or below the
    traffic's rate). Fine pass around the best `top_coarse`: each variant is simulated at 0.9 x the
    best coarse capacity, and the `capacity_top` that hold up best get an exact capacity.
    """
    count = [0]
    seen: dict[Params, Evaluation] = {}
    exact: set[Params] = set()
    # The coarse and stress passes only rank candidates: half the requests do; finalists get all.
    n = len(inputs.arrivals)
    half = inputs.arrivals.take(np.arange(n) < max(n // 2, min(n, 1000)))

    def cap(p: Params, steps: int = COARSE_CAPACITY_STEPS) -> Evaluation:
        if p in seen and (p in exact or steps == COARSE_CAPACITY_STEPS):
            return seen[p]
        e = seen.get(p) or evaluate(inputs, p)[0]
        arrivals = inputs.arrivals if steps == CAPACITY_STEPS else half
        e.capacity_factor = capacity_factor(inputs, p, arrivals, steps=steps, below=True)
        count[0] += 2 + steps
        if progress is not None:
            progress(count[0])
        seen[p] = e
        if steps == CAPACITY_STEPS:
            exact.add(p)
        return e

    def by_capacity(e: Evaluation) -> tuple:
        return (-round(e.capacity_factor or 0.0, 3), e.params.instances, round(e.worst_ratio, 3), e.params.max_batch_size, e.params.delay_us)

    coarse = sorted((cap(p) for p in coarse_candidates(inputs)), key=by_capacity)
    around: list[Params] = []
    for e in coarse:
        if (e.params.max_batch_size, e.params.instances) not in {(a.max_batch_size, a.instances) for a in around}:
            around.append(e.params)
        if len(around) >= top_coarse:
            break
    best = coarse[0].capacity_factor or 0.0
    stress = scale_rate(half, 0.9 * best) if best > 0 else None
    held: dict[Params, tuple] = {}

    def hold(p: Params) -> None:
        if p in seen or p in held or stress is None:
            return
        count[0] += 1
        e = evaluate(inputs, p, stress)[0]
        held[p] = (0 if e.feasible else 1, round(e.worst_ratio, 3), p.instances)

    # Preferred sizes x windows first, each with its coarse point's policy; then the other policies
    # for the few that held up best.
    variants = fine_candidates(inputs, around)
    for p in variants:
        if p.policy == next(a.policy for a in around if (a.max_batch_size, a.instances) == (p.max_batch_size, p.instances)):
            hold(p)
    for best_p in sorted(held, key=held.__getitem__)[:top_coarse]:
        for p in variants:
            if (p.max_batch_size, p.instances, p.preferred, p.delay_us) == (best_p.max_batch_size, best_p.instances, best_p.preferred, best_p.delay_us):
                hold(p)
    for p, _ in sorted(held.items(), key=lambda x: x[1])[:capacity_top]:
        cap(p)
    for e in sorted(seen.values(), key=by_capacity)[:capacity_top]:  # the best get the fine bisection
        cap(e.params, CAPACITY_STEPS)
    ranked = sorted(seen.values(), key=by_capacity)
    winner = ranked[0]
    notes = []
    if (winner.capacity_factor or 0.0) <= 0.0:
        notes.append(
            f"no candidate of {inputs.entry.name!r} meets every target even at 1/16 of the traffic's rate: the targets "
            "need a faster model or device, not another config"
        )
    elif not winner.feasible:
        notes.append(
            f"the best candidate carries {winner.capacity_per_s:.1f} req/s within every target, below the traffic's "
            f"{inputs.arrivals.mean_rate:.1f} req/s: the traffic needs about {1 / winner.capacity_factor:.1f}x this "
            "capacity (replicas or a faster device)"
        )
    runner_up = next((e for e in ranked[1:] if e.params != winner.params), None)
    return TuneResult(
        model=inputs.entry.name, objective="capacity", winner=winner, runner_up=runner_up, table=ranked,
        candidates=count[0], feasible=sum(1 for e in ranked if e.feasible), notes=notes,
    )


def tune_model(inputs: TuneInputs, top_coarse: int = 3, capacity_top: int = 5, progress=None) -> TuneResult:
    """Search one entry; see the module docstring for the order of the criteria.

    Coarse pass: max batch size x instances at the traffic's rate, each feasible one's capacity
    by bisection. Fine pass around the best `top_coarse`: preferred sizes x windows x policies,
    each simulated at the traffic's rate (feasibility) and at a stress rate just under the best
    coarse capacity (which of them holds up); the `capacity_top` best get an exact capacity.
    `inputs.objective == "capacity"` searches by capacity alone (`tune_for_capacity`).
    """
    if inputs.objective == "capacity":
        return tune_for_capacity(inputs, top_coarse, capacity_top, progress)
    seen: dict[Params, Evaluation] = {}
    count = [0]

    def ev(p: Params, arr: Arrivals | None = None) -> Evaluation:
        count[0] += 1
        if progress is not None:
            progress(count[0])
        return evaluate(inputs, p, arr)[0]

    def cap(e: Evaluation) -> None:
        if e.capacity_factor is None:
            steps = capacity_factor(inputs, e.params, inputs.arrivals)
            count[0] += 6
            e.capacity_factor = steps

    coarse = []
    for p in coarse_candidates(inputs):
        e = ev(p)
        seen[p] = e
        coarse.append(e)
    for e in coarse:
        if e.feasible:
            cap(e)
    coarse.sort(key=lambda e: rank_key(e) if e.feasible else (1, _closeness(e), -e.throughput_per_s))
    around: list[Params] = []
    for e in coarse:
        key = (e.params.max_batch_size, e.params.instances, e.params.max_num_seqs)
        if key not in {(a.max_batch_size, a.instances, a.max_num_seqs) for a in around}:
            around.append(e.params)
        if len(around) >= top_coarse:
            break
    best_cap = max((e.capacity_factor or 0.0 for e in coarse if e.feasible), default=0.0)
    stress = max(1.0, 0.9 * best_cap)
    stressed = scale_rate(inputs.arrivals, stress) if stress > 1.0 else None
    stress_eval: dict[Params, Evaluation] = {}
    for p in fine_candidates(inputs, around):
        if p in seen:
            e = seen[p]
        else:
            e = ev(p)
            seen[p] = e
        if e.feasible and stressed is not None:
            stress_eval[p] = ev(p, stressed)
    table = list(seen.values())
    feasible = [e for e in table if e.feasible]
    notes = []
    if feasible:
        def held(e: Evaluation) -> tuple:
            s = stress_eval.get(e.params)
            if e.capacity_factor is not None:
                return (0, -e.capacity_factor, e.params.instances, e.worst_ratio)
            if s is None:
                return (1, 0.0, e.params.instances, e.worst_ratio)
            return (0 if s.feasible else 1, -stress if s.feasible else 0.0, e.params.instances, s.worst_ratio)

        for e in sorted(feasible, key=held)[:capacity_top]:
            cap(e)
        for e in feasible:
            if e.capacity_factor is None:
                s = stress_eval.get(e.params)
                e.capacity_factor = stress if s is not None and s.feasible else 1.0
        ranked = sorted(feasible, key=rank_key)
    else:
        ranked = sorted(table, key=lambda e: (_closeness(e), -e.throughput_per_s, e.params.instances))
        notes.append(
            f"no candidate meets every target for {inputs.entry.name!r}; the closest is shown "
            f"({ranked[0].reason})"
        )
        notes.append(needed_capacity(inputs, ranked[0].params))
    winner = ranked[0]
    runner_up = next((e for e in ranked[1:] if e.params != winner.params), None)
    return TuneResult(
        model=inputs.entry.name,
        winner=winner,
        runner_up=runner_up,
        table=ranked + [e for e in table if e not in ranked],
        candidates=count[0],
        feasible=len(feasible),
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# From a choice back to a plan


def apply_candidate(entry: ModelEntryPlan, params: Params, classes: Sequence[TrafficClass], spec: DeploymentSpec) -> ModelEntryPlan:
    """The plan entry with the candidate's settings, ready for the config template."""
    _, per_level, default_view, levels, default_level = queue_policies(params, classes, spec)
    batching = DynamicBatchingView(
        preferred_batch_sizes=list(params.preferred),
        max_queue_delay_us=params.delay_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=default_view,
        priority_queue_policies=per_level,
    )
    groups = [
        InstanceGroupView(kind=g.kind, count=params.instances if i == 0 else g.count, gpus=g.gpus, compute_units=g.compute_units)
        for i, g in enumerate(entry.instance_groups)
    ]
    parameters = dict(entry.parameters)
    notes = list(entry.notes)
    engine_args = dict(entry.engine_args) if entry.engine_args is not None else None
    if params.max_num_seqs is not None and "max_num_seqs" in parameters:
        parameters["max_num_seqs"] = str(params.max_num_seqs)
    if params.max_num_seqs is not None and engine_args is not None:
        engine_args["max_num_seqs"] = params.max_num_seqs
    notes.append(f"tuned by `tritongen tune`: {params.label()}")
    return entry.model_copy(
        update={
            "engine_args": engine_args,
            "max_batch_size": params.max_batch_size,
            "dynamic_batching": batching,
            "instance_groups": groups,
            "parameters": parameters,
            "notes": notes,
        }
    )


def apply_results(plan: DeploymentPlan, choices: Mapping[str, ModelEntryPlan]) -> DeploymentPlan:
    return plan.model_copy(update={"entries": [choices.get(e.name, e) for e in plan.entries]})


def baseline_params(entry: ModelEntryPlan) -> Params:
    """What the plan (or a hand-written config) already holds, as a candidate."""
    db = entry.dynamic_batching
    group = entry.instance_groups[0]
    seqs = entry.kv.max_sequences if entry.kind == "llm" and entry.kv is not None else None
    if db is None:
        return Params(max_batch_size=entry.max_batch_size, preferred=(), delay_us=0, instances=group.count, policy="single", max_num_seqs=seqs)
    policy: PolicyName = "strict" if db.priority_levels else "single"
    return Params(
        max_batch_size=entry.max_batch_size,
        preferred=tuple(db.preferred_batch_sizes),
        delay_us=db.max_queue_delay_us,
        instances=group.count,
        policy=policy,
        max_num_seqs=seqs,
    )


def memory_budget(plan: DeploymentPlan, entry: ModelEntryPlan) -> tuple[int | None, int]:
    """(bytes the entry's instances may use, bytes one instance needs) from the plan's placement.

    One instance needs its model's quota (weights + framework reserve for a classic model; the
    whole KV budget for an LLM engine). What the instances may use is the device memory under the
    utilisation cap minus every other model's quota on the same devices.
    """
    placements = {p.model: p for p in plan.placements}
    own = placements.get(entry.spec_model)
    if own is None:
        return None, 0
    lanes = sum(1 for e in plan.entries if e.spec_model == entry.spec_model)
    per_instance = own.quota_bytes // max(1, lanes)
    devices = own.gpus or [0]
    free = []
    for d in devices:
        if d >= len(plan.device_bytes):
            continue
        capacity = int(plan.device_bytes[d] * plan.utilization_cap)
        others = sum(p.quota_bytes for p in plan.placements if p.model != entry.spec_model and (d in (p.gpus or [0])))
        free.append(capacity - others)
    if not free:
        return None, per_instance
    return max(0, min(free)) // max(1, lanes), per_instance
