"""The search of one model entry: coarse candidates, the fine pass around the best, and the ranking
by the criteria of the package docstring (`tritongen.core.tune`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, Field

from tritongen.core.traffic import Arrivals, scale_rate
from tritongen.core.tune.candidates import coarse_candidates, fine_candidates
from tritongen.core.tune.engine_knobs import budget_variants, cache_policy_variants
from tritongen.core.tune.evaluation import Evaluation, capacity_factor, closeness, evaluate, needed_capacity, rank_key
from tritongen.core.tune.inputs import Objective, Params, TuneInputs


class TuneResult(BaseModel):
    model: str
    objective: Objective = "targets"
    winner: Evaluation
    runner_up: Evaluation | None
    table: list[Evaluation]
    candidates: int
    feasible: int
    notes: list[str] = Field(default_factory=list)



def engine_stages(inputs: TuneInputs, best: Params, score: Callable[[Params], Evaluation],
                  key: Callable[[Evaluation], tuple]) -> None:
    """An LLM engine's own knobs, staged around the best coarse point instead of crossed with every
    batch (`tune.engine_knobs`): its step budgets first, then the prefix cache and the capacity
    policy at the best of those. `score` evaluates a candidate (and keeps it); `key` ranks."""
    tried = [score(p) for p in budget_variants(inputs, best)]
    at = min([score(best), *tried], key=key).params
    for p in cache_policy_variants(inputs, at):
        score(p)


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
    if inputs.engine is not None:
        engine_stages(inputs, coarse[0].params, cap, by_capacity)
        coarse = sorted(seen.values(), key=by_capacity)
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
    """Search one entry; see the package docstring for the order of the criteria.

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

    def coarse_key(e: Evaluation) -> tuple:
        return rank_key(e) if e.feasible else (1, closeness(e), -e.throughput_per_s)

    def staged(p: Params) -> Evaluation:
        if p not in seen:
            seen[p] = ev(p)
            coarse.append(seen[p])
            if seen[p].feasible:
                cap(seen[p])
        return seen[p]

    coarse.sort(key=coarse_key)
    if inputs.engine is not None and coarse:
        engine_stages(inputs, coarse[0].params, staged, coarse_key)
        coarse.sort(key=coarse_key)
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
        ranked = sorted(table, key=lambda e: (closeness(e), -e.throughput_per_s, e.params.instances))
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
