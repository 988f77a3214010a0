"""What an LLM engine's outside shows, read as the facts the simulator needs, where the backend
exports no gauge for them (Triton's own vLLM backend: token counters and latency histograms only).

Pure: the profiler measures, these read the measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def bytes_per_token_from_counts(samples: Sequence[tuple[int, float]]) -> float | None:
    """Prompt bytes per token from (prompt bytes sent, prompt tokens the engine counted) pairs at
    two or more prompt sizes: the slope, so tokens the engine adds to every prompt (a BOS token, a
    chat template) do not count as prompt text. One size: bytes / tokens. None when the engine
    counted nothing or the counts do not grow with the prompt."""
    points = sorted((int(b), float(t)) for b, t in samples if t > 0)
    if not points:
        return None
    if len({b for b, _ in points}) < 2:
        b, t = points[-1]
        return b / t
    (b0, t0), (b1, t1) = points[0], points[-1]
    if t1 <= t0:
        return None
    return (b1 - b0) / (t1 - t0)


def tokens_added_per_prompt(samples: Sequence[tuple[int, float]]) -> int | None:
    """The tokens the engine adds to every prompt whatever its text (a BOS token, a chat template),
    from (prompt bytes sent, prompt tokens counted) at two or more sizes: what the counts hold beyond
    the text's own tokens at the slope (`bytes_per_token_from_counts`). The engine prefills them and
    holds them in its KV like the prompt's own: a prompt of exactly 5 blocks' tokens takes a 6th.
    The profile counts unsalted prompts, so a salt's own density is not in it (tritongen's salts,
    ten digit-words, tokenize denser than the filler: on bench-vllm-fidelity's tiny tokenizer a
    96-token prompt held 100-106 tokens, 2026-12-07). None with fewer than two sizes or counts that
    do not grow."""
    points = sorted((int(b), float(t)) for b, t in samples if t > 0)
    slope = bytes_per_token_from_counts(points)
    if slope is None or len({b for b, _ in points}) < 2:
        return None
    b0, t0 = points[0]
    return max(0, int(round(t0 - b0 / slope)))


def counter_delta(before: float | None, after: float | None) -> float | None:
    """A counter's growth between two reads (None when the counter is not exported)."""
    if before is None or after is None:
        return None
    return max(0.0, after - before)


USAGE_HELD_BLOCKS = 5  # blocks each usage-probe stream holds: a prompt of 4 full blocks, then its 5th


@dataclass(frozen=True)
class UsageRead:
    """One read of vLLM's KV usage gauge during the usage probe: its rise since the probe began
    (0..1 of the pool) and the tokens each stream had received when it was read."""

    rise: float
    tokens_seen: tuple[int, ...]


def capacity_from_usage(reads: Sequence[UsageRead], streams: int, block: int) -> int | None:
    """Pool tokens from reads of the usage gauge while `streams` streams each held exactly
    USAGE_HELD_BLOCKS blocks: from each stream's 2nd token (its 5th block taken) until the client
    saw half a block more (the client never runs ahead of the engine, and can lag it by a few tokens).

    The gauge lags the tokens: an engine publishes it after the step's tokens went out (vLLM's
    backend from a logger thread), so a read just after every stream showed its 2nd token can still
    hold an earlier step, when fewer streams held blocks (the vLLM stand-in's pool read 4x too large
    in CI, 2026-12-07: one stream's 5 blocks). Within the window the true count does not change, and
    every lagging read is lower, so the largest read is the one to believe; and only a window over
    which the streams made 2 more tokens counts, so the engine has stepped since they all began."""
    window = [r for r in reads if len(r.tokens_seen) == streams and min(r.tokens_seen) >= 2
              and max(r.tokens_seen) <= block // 2 + 2 and r.rise > 0]
    if not window or min(window[-1].tokens_seen) - min(window[0].tokens_seen) < 2:
        return None
    return int(round(streams * USAGE_HELD_BLOCKS / max(r.rise for r in window) * block))


@dataclass(frozen=True)
class ProbeRun:
    """One level of the capacity probe: `streams` requests of `prompt` + `output` tokens sent
    together, each with its token arrival times (seconds), and what the engine said."""

    streams: int
    prompt: int
    output: int
    token_times: tuple[tuple[float, ...], ...]
    out_of_memory: bool = False
    starts: tuple[float, ...] | None = None  # each stream's send time, in the order of token_times
    # whether a stream that got an out-of-memory answer had made tokens first (None: no such answer):
    # an engine that grows and kills fails a sequence mid-stream, one that reserves refuses it up front
    oom_after_tokens: bool | None = None
    preemptions: float | None = None  # the engine's preemption counter's growth, where it exports one
    # one prompt's time to first token on an idle engine (seconds): streams sent together prefill
    # one after another where the engine cannot batch them, which staggers first tokens and
    # stretches the others' gaps by up to (streams - 1) of it without any stream being parked
    prefill_s: float = 0.0


def stall_steps(run: ProbeRun) -> float | None:
    """The longest wait any stream of the run saw, in the run's usual token gaps: its start to
    first token against the others', or a gap inside it. A grow-and-preempt engine that runs out
    of blocks parks a sequence (preempted, or held back at admission) until another one finishes,
    which is many steps; with room for all, every stream advances every step, but for the others'
    prefills (`ProbeRun.prefill_s`), which are taken off."""
    gaps = [b - a for times in run.token_times for a, b in zip(times, times[1:])]
    if len(gaps) < 4:
        return None
    usual = statistics.median(gaps)
    if usual <= 0:
        return None
    # time to first token where the send times are known: a client that opens its streams one after
    # another staggers their first tokens without the engine holding any of them back
    if run.starts is not None and len(run.starts) == len(run.token_times):
        firsts = sorted(times[0] - start for times, start in zip(run.token_times, run.starts) if times)
    else:
        firsts = sorted(times[0] for times in run.token_times if times)
    longest_gap = max(gaps)
    first_spread = (firsts[-1] - firsts[0]) if len(firsts) > 1 else 0.0
    # a parked stream waits for another to finish on top of every prefill ahead of it, so taking
    # the prefills off still leaves it about the output's length in steps
    prefills = max(0, run.streams - 1) * run.prefill_s
    return max(0.0, max(longest_gap, first_spread) - prefills) / usual


def run_fits(run: ProbeRun) -> bool:
    """Whether every stream of a probe level ran without running out of KV memory: no
    out-of-memory answer, no preemption the engine counted, and, where it counts none (Triton's vLLM
    backend), no stream parked for more than a quarter of the output's steps. Prefills that share
    a step budget stagger first tokens by a few steps at most; a parked sequence waits for another
    to finish, which takes about the output's length."""
    if run.out_of_memory:
        return False
    if run.preemptions is not None and run.preemptions > 0:
        return False
    stall = stall_steps(run)
    if stall is None:
        return True
    return stall <= max(4.0, run.output / 4.0)


def only_timing_says_no(run: ProbeRun) -> bool:
    """Whether the run failed on a parked stream alone (no out-of-memory answer, no counted
    preemption). That is the weakest evidence: a busy host can pause one stream for as many steps as
    a parked one waits, once; an engine out of room parks one on every try. The probe repeats such a
    level and believes the repeat."""
    return not run.out_of_memory and not run.preemptions and not run_fits(run)


@dataclass(frozen=True)
class ProbeVerdict:
    capacity_tokens: int
    fits: int
    fails: int
    detail: str


def capacity_from_probe(runs: Sequence[ProbeRun]) -> ProbeVerdict | None:
    """KV capacity from probe levels: the most streams that all ran, times their tokens. None
    until one level fits and a larger one does not (the knee is then bracketed)."""
    fitting = [r for r in runs if run_fits(r)]
    failing = [r for r in runs if not run_fits(r)]
    if not fitting or not failing:
        return None
    best = max(fitting, key=lambda r: r.streams)
    above = [r for r in failing if r.streams > best.streams]
    if not above:
        return None
    worst = min(above, key=lambda r: r.streams)
    why = ("out-of-memory answer" if worst.out_of_memory else
           "preemptions counted" if worst.preemptions else
           f"a stream parked {stall_steps(worst) or 0:.0f} steps")
    return ProbeVerdict(
        capacity_tokens=best.streams * (best.prompt + best.output),
        fits=best.streams,
        fails=worst.streams,
        detail=f"{best.streams} streams of {best.prompt} + {best.output} tokens all ran, {worst.streams} did not ({why})",
    )


@dataclass(frozen=True)
class PolicySeen:
    """The KV policy a capacity probe's first failing level showed, with the evidence in words."""

    kv_policy: str
    evidence: str


def policy_from_probe(runs: Sequence[ProbeRun]) -> PolicySeen | None:
    """What the engine did when its KV memory ran out, read off the smallest probe level that did
    not run whole: an out-of-memory answer after tokens (grow and kill) or before any (reserve and
    kill); a counted preemption (grow and preempt); a stream held back before its first token while
    the others ran (reserve and wait) or parked mid-stream (grow and preempt). None: no level failed."""
    failing = sorted((r for r in runs if not run_fits(r)), key=lambda r: r.streams)
    if not failing:
        return None
    run = failing[0]
    at = f"at {run.streams} streams of {run.prompt} + {run.output} tokens"
    if run.out_of_memory:
        if run.oom_after_tokens:
            return PolicySeen("grow_kill", f"a stream got an out-of-memory answer after its first tokens {at}")
        return PolicySeen("reserve_kill", f"a stream got an out-of-memory answer before any token {at}")
    if run.preemptions:
        return PolicySeen("grow_preempt", f"the engine counted {run.preemptions:.0f} preemption(s) {at}")
    gaps = [b - a for times in run.token_times for a, b in zip(times, times[1:])]
    if run.starts is not None and len(run.starts) == len(run.token_times):
        firsts = [times[0] - start for times, start in zip(run.token_times, run.starts) if times]
    else:
        firsts = [times[0] for times in run.token_times if times]
    longest_gap = max(gaps) if gaps else 0.0
    first_spread = (max(firsts) - min(firsts)) if len(firsts) > 1 else 0.0
    if first_spread >= longest_gap:
        return PolicySeen("reserve_wait", f"a stream was held back before its first token while the others ran {at}")
    return PolicySeen("grow_preempt", f"a stream was parked mid-stream while the others ran {at}")


def double_until_fail(fits: Callable[[int], bool], ceiling: int) -> tuple[int, int | None]:
    """The first half of a capacity search: 1, 2, 4, ... (the last step capped at `ceiling`) until
    one size does not fit. (largest that fit, 0 for none; first that failed, None where `ceiling` fit)."""
    fit, n = 0, 1
    while fits(n):
        fit = n
        if n >= ceiling:
            return fit, None
        n = min(2 * n, ceiling)
    return fit, n


def bisect_fit(fits: Callable[[int], bool], low: int, high: int, slack: Callable[[int], int] = lambda low: 1) -> tuple[int, int]:
    """The second half: `low` fits and `high` does not; halve the bracket until it is within `slack(low)`."""
    while high - low > slack(low):
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low, high
