"""The engine measurement's fits: lines through samples and what a stream's token times say about
the engine's steps and prefills. Pure (records in, numbers out), apart from the live measurement
(`tritongen.profiler.engine`) that takes the records."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

import numpy as np

from tritongen.profiler.load import StreamRecord


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of a least-squares line, both clamped at 0 (costs are never negative)."""
    if len(set(xs)) < 2:
        return max(0.0, float(np.mean(ys))), 0.0
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    slope = max(0.0, float(slope))
    if intercept < 0:
        # refit through the origin with the slope alone
        slope = float(np.dot(xs, ys) / max(1e-12, np.dot(xs, xs)))
        intercept = 0.0
    return float(intercept), slope


def _decoded(records: Sequence[StreamRecord], start: float, end: float) -> list[StreamRecord]:
    """Streams that finished inside the measured windows with three or more tokens."""
    return [r for r in records if r.error is None and r.end is not None and start <= r.end < end and len(r.token_times) >= 3]


def mean_gap_ms(records: Sequence[StreamRecord], start: float, end: float) -> tuple[float | None, int]:
    """Median over finished streams of their mean token gap, and how many streams gave one."""
    gaps = []
    for r in _decoded(records, start, end):
        span = r.token_times[-1] - r.token_times[0]
        if span > 0:
            gaps.append(span / (len(r.token_times) - 1) * 1000.0)
    return (statistics.median(gaps) if gaps else None), len(gaps)


def gap_growth(runs: Sequence[Sequence[float]], single: StreamRecord) -> tuple[float, float] | None:
    """(growth, usual gap) in ms: how much longer than usual the long stream's gap that holds
    `single`'s first token is (the engine time `single`'s prefill took), and its usual gap.
    `runs`: the long stream's requests, token times each. None when no run spans it with a few
    tokens on both sides."""
    if single.ttft_s is None:
        return None
    first = single.token_times[0]
    for times in runs:
        if len(times) < 8 or not (times[0] < first <= times[-1]):
            continue
        after = next(i for i, t in enumerate(times) if t >= first)
        if after < 3 or after > len(times) - 3:
            return None
        gaps = [b - a for a, b in zip(times, times[1:])]
        usual = statistics.median(g for i, g in enumerate(gaps) if abs(i - (after - 1)) > 1)
        return max(0.0, (gaps[after - 1] - usual) * 1000.0), usual * 1000.0
    return None


def nearest_token_ms(runs: Sequence[Sequence[float]], single: StreamRecord) -> float | None:
    """ms from `single`'s first token to the nearest token of the long stream that ran meanwhile.
    Tokens of one forward pass leave together, in either order, so about 0 when the engine
    prefilled it inside the decode step; a prefill run before the decode lands its first token
    that prefill's time after the stream's last token and the decode's time before its next."""
    if not single.token_times:
        return None
    first = single.token_times[0]
    for times in runs:
        if times and times[0] < first <= times[-1]:
            return min(abs(t - first) for t in times) * 1000.0
    return None


def prefill_runs_in_step(lag_steps: Sequence[float | None]) -> bool:
    """First tokens that land with the running stream's token (within a quarter of its usual gap,
    the jitter of two responses of one step) came out of the decode step itself."""
    seen = [x for x in lag_steps if x is not None]
    return bool(seen) and statistics.median(seen) < 0.25


def decode_steps_ms(records: Sequence[StreamRecord], start: float, end: float) -> float | None:
    """Median over finished streams of their median step among the gaps that no other stream's first
    token fell in: a newcomer's prefill runs in the step (or before the decode) that ends with its
    first token, so the gaps that hold one hold a prefill too, and the others are decode alone.

    Why not the whole span less the prefills that landed in it: at a full batch those prefills are
    most of the span (14 running streams of 64 tokens met 13 newcomers of ~75 ms each in a span of
    ~1.1 s on the real vLLM), so the step read what the prefill estimate left over: three profiles
    of one engine 30 minutes apart put its 14-sequence step at 8.0, 11.1 and 16.9 ms, each with a
    different prefill slope (0.80, 0.68, 0.61 ms/token), 2026-12-07."""
    firsts = sorted(r.token_times[0] for r in records if r.token_times)
    steps = []
    for r in _decoded(records, start, end):
        times = r.token_times
        alone = [b - a for a, b in zip(times, times[1:])
                 if b > a and bisect.bisect_right(firsts, b) == bisect.bisect_right(firsts, a)]
        if len(alone) >= 2:
            steps.append(statistics.median(alone) * 1000.0)
    return statistics.median(steps) if steps else None


def decode_step_ms(gap_ms: float, concurrency: int, output_tokens: int, prefill_ms: float) -> float:
    """The decode step under `concurrency` streams of `output_tokens`: each other stream starts a
    newcomer about once per `output_tokens` steps, and its prefill runs inside one of our steps."""
    extra = (concurrency - 1) / max(1, output_tokens) * prefill_ms
    return max(0.0, gap_ms - extra)
