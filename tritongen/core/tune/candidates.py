"""The candidates a search tries: a coarse grid over max batch size x instances (or an LLM engine's
batch), and the preferred sizes, windows and priority policies around the best of it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tritongen.core.engine import EngineModel
from tritongen.core.spec import TrafficClass
from tritongen.core.tune.inputs import Params, PolicyName, TuneInputs


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
