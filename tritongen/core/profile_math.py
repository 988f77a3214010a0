"""Pure arithmetic behind `tritongen profile`: curve fits, percentiles, knees, window agreement, pads.

No I/O: the profiler (tritongen/profiler/) measures and hands numbers here; tests feed synthetic
numbers with known answers.

The latency-versus-batch curve is Triton's compute time per execution as a function of the batch
size. Most models are close to `overhead + per_item x batch` (a fixed launch/IPC cost plus work
that grows with the rows); some bend once the hardware saturates (a GPU whose SMs are full, a CPU
whose cache spills), so a continuous two-segment fit is tried too and kept only when it is clearly
better.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tritongen.core.profile_types import CurveFit, CurvePoint, Knee

MIB = 1 << 20

# ---------------------------------------------------------------------------------------------
# Percentiles and windows


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default); None if empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def percentiles_ms(values_s: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> list[float | None]:
    """Percentiles of durations given in seconds, in milliseconds."""
    out = []
    for q in qs:
        p = percentile(values_s, q)
        out.append(None if p is None else p * 1000.0)
    return out


def windows_agree(a: float, b: float, tolerance: float = 0.10) -> bool:
    """Two window throughputs agree when they differ by at most `tolerance` of the larger one."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    top = max(abs(a), abs(b))
    if top == 0.0:
        return True
    return abs(a - b) <= tolerance * top


def level_done(throughputs: Sequence[float], min_windows: int, max_windows: int, tolerance: float = 0.10) -> tuple[bool, bool]:
    """(stop measuring this level?, did the last two windows agree?) after each window."""
    if min_windows < 1 or max_windows < min_windows:
        raise ValueError(f"need 1 <= min_windows <= max_windows, got {min_windows}, {max_windows}")
    agreed = len(throughputs) >= 2 and windows_agree(throughputs[-1], throughputs[-2], tolerance)
    if len(throughputs) < min_windows:
        return False, agreed
    return agreed or len(throughputs) >= max_windows, agreed


def window_counts(times: Iterable[float], start: float, window_s: float, windows: int) -> list[int]:
    """How many events (completion or token timestamps) fall in each window [start + i w, start + (i+1) w)."""
    counts = [0] * windows
    for t in times:
        i = math.floor((t - start) / window_s)
        if 0 <= i < windows:
            counts[i] += 1
    return counts


def inter_token_gaps(timestamps: Sequence[float]) -> list[float]:
    """Gaps between consecutive token arrivals of one stream (seconds)."""
    return [b - a for a, b in zip(timestamps, timestamps[1:])]


# ---------------------------------------------------------------------------------------------
# Triton's per-batch statistics


@dataclass(frozen=True)
class BatchDelta:
    count: int
    infer_ns: int
    total_ns: int


def _batch_index(batch_stats: Iterable[Mapping]) -> dict[int, tuple[int, int, int]]:
    out: dict[int, tuple[int, int, int]] = {}
    for item in batch_stats or ():
        size = int(item["batch_size"])
        infer = item.get("compute_infer") or {}
        count = int(infer.get("count", 0))
        infer_ns = int(infer.get("ns", 0))
        total_ns = infer_ns + sum(int((item.get(k) or {}).get("ns", 0)) for k in ("compute_input", "compute_output"))
        out[size] = (count, infer_ns, total_ns)
    return out


def batch_stats_delta(before: Iterable[Mapping], after: Iterable[Mapping]) -> dict[int, BatchDelta]:
    """Executions and times per batch size between two `model_stats[0].batch_stats` snapshots."""
    b, a = _batch_index(before), _batch_index(after)
    out: dict[int, BatchDelta] = {}
    for size, (count, infer_ns, total_ns) in a.items():
        c0, i0, t0 = b.get(size, (0, 0, 0))
        if count - c0 > 0:
            out[size] = BatchDelta(count - c0, infer_ns - i0, total_ns - t0)
    return dict(sorted(out.items()))


def merge_deltas(deltas: Iterable[Mapping[int, BatchDelta]]) -> dict[int, BatchDelta]:
    out: dict[int, BatchDelta] = {}
    for delta in deltas:
        for size, d in delta.items():
            prev = out.get(size, BatchDelta(0, 0, 0))
            out[size] = BatchDelta(prev.count + d.count, prev.infer_ns + d.infer_ns, prev.total_ns + d.total_ns)
    return dict(sorted(out.items()))


def curve_points(delta: Mapping[int, BatchDelta]) -> list[CurvePoint]:
    return [
        CurvePoint(
            batch_size=size,
            count=d.count,
            compute_infer_ms=d.infer_ns / d.count / 1e6,
            compute_total_ms=d.total_ns / d.count / 1e6,
        )
        for size, d in sorted(delta.items())
        if d.count > 0
    ]


def mean_batch_size(delta: Mapping[int, BatchDelta]) -> float | None:
    executions = sum(d.count for d in delta.values())
    if executions == 0:
        return None
    return sum(size * d.count for size, d in delta.items()) / executions


# ---------------------------------------------------------------------------------------------
# Curve fitting


def _solve(rows: list[list[float]], ys: list[float], ws: list[float]) -> list[float] | None:
    """Weighted least squares by the normal equations (2-3 unknowns); None if singular."""
    n = len(rows[0])
    ata = [[0.0] * n for _ in range(n)]
    aty = [0.0] * n
    for row, y, w in zip(rows, ys, ws):
        for i in range(n):
            aty[i] += w * row[i] * y
            for j in range(n):
                ata[i][j] += w * row[i] * row[j]
    # Gaussian elimination with partial pivoting.
    m = [ata[i] + [aty[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for v in m[pivot][:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


def _errors(fit: CurveFit, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    rel = [abs(fit.predict(x) - y) / abs(y) for x, y in zip(xs, ys) if y != 0]
    if not rel:
        return 0.0, 0.0
    return max(rel), sum(rel) / len(rel)


def _weights(counts: Sequence[int] | None, n: int) -> list[float]:
    # sqrt(count): a batch size seen 200 times counts more than one seen once, without letting the
    # busiest level's batch size decide the whole line.
    if counts is None:
        return [1.0] * n
    return [math.sqrt(max(1, c)) for c in counts]


def fit_linear(xs: Sequence[float], ys: Sequence[float], counts: Sequence[int] | None = None) -> CurveFit:
    """Least-squares `y = overhead + per_item x` (weighted by sqrt(count) when counts are given)."""
    if len(xs) != len(ys) or (counts is not None and len(counts) != len(xs)):
        raise ValueError("xs, ys (and counts) must have the same length")
    if len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct batch sizes, got {sorted(set(xs))}")
    coef = _solve([[1.0, float(x)] for x in xs], [float(y) for y in ys], _weights(counts, len(xs)))
    assert coef is not None  # two distinct xs make the system regular
    fit = CurveFit(kind="linear", overhead_ms=coef[0], per_item_ms=coef[1], max_rel_error=0.0, mean_rel_error=0.0, points=len(xs))
    mx, mean = _errors(fit, xs, ys)
    return fit.model_copy(update={"max_rel_error": mx, "mean_rel_error": mean})


def fit_piecewise(xs: Sequence[float], ys: Sequence[float], counts: Sequence[int] | None = None) -> CurveFit | None:
    """Best continuous two-segment fit `overhead + a x + c max(0, x - k)` over breakpoints k at the
    measured batch sizes with at least two points on each side (k itself counts on both sides),
    both slopes >= 0. None when there are too few distinct batch sizes (fewer than 4) or no
    breakpoint gives rising segments."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys must have the same length")
    distinct = sorted(set(xs))
    if len(distinct) < 4:
        return None
    ws = _weights(counts, len(xs))
    best: tuple[float, float, list[float]] | None = None
    for k in distinct[1:-1]:
        if sum(1 for x in distinct if x <= k) < 2 or sum(1 for x in distinct if x >= k) < 2:
            continue
        rows = [[1.0, float(x), max(0.0, float(x) - k)] for x in xs]
        coef = _solve(rows, [float(y) for y in ys], ws)
        if coef is None or coef[1] < 0 or coef[1] + coef[2] < 0:
            continue  # more rows never cost less: a falling segment is noise, not a bend
        sse = sum(w * (coef[0] + coef[1] * r[1] + coef[2] * r[2] - y) ** 2 for r, y, w in zip(rows, ys, ws))
        if best is None or sse < best[0]:
            best = (sse, k, coef)
    if best is None:
        return None
    _, k, coef = best
    fit = CurveFit(
        kind="piecewise",
        overhead_ms=coef[0],
        per_item_ms=coef[1],
        breakpoint=k,
        per_item_ms_after=coef[1] + coef[2],
        max_rel_error=0.0,
        mean_rel_error=0.0,
        points=len(xs),
    )
    mx, mean = _errors(fit, xs, ys)
    return fit.model_copy(update={"max_rel_error": mx, "mean_rel_error": mean})


def fit_curve(
    points: Sequence[CurvePoint],
    min_count: int = 3,
    linear_good_enough: float = 0.05,
    required_gain: float = 0.3,
) -> CurveFit | None:
    """Fit compute_infer_ms versus batch size; the line unless the bend is clearly better.

    Points seen fewer than `min_count` times are left out when at least two batch sizes remain
    (a batch size formed once is one noisy sample). The piecewise fit wins only when the line's
    max relative error exceeds `linear_good_enough` and the bend cuts it by `required_gain`.
    """
    use = [p for p in points if p.count >= min_count]
    if len({p.batch_size for p in use}) < 2:
        use = [p for p in points if p.count >= 1]
    if len({p.batch_size for p in use}) < 2:
        return None
    xs = [float(p.batch_size) for p in use]
    ys = [p.compute_infer_ms for p in use]
    counts = [p.count for p in use]
    line = fit_linear(xs, ys, counts)
    bent = fit_piecewise(xs, ys, counts)
    if bent is None:
        return line
    note_line = f"linear: max {line.max_rel_error:.1%}, mean {line.mean_rel_error:.1%}"
    note_bent = (
        f"piecewise at {bent.breakpoint:g}: max {bent.max_rel_error:.1%}, mean {bent.mean_rel_error:.1%}"
    )
    if line.max_rel_error > linear_good_enough and bent.max_rel_error < line.max_rel_error * (1.0 - required_gain):
        return bent.model_copy(update={"alternative": note_line})
    return line.model_copy(update={"alternative": note_bent})


# ---------------------------------------------------------------------------------------------
# Instance scaling on a shared device


def completion_rate(done: Sequence[float], span_s: float) -> float:
    """Completions per second of a closed loop: (k - 1) over the time from the first completion to
    the last, which a count per window quantises badly when executions are long; the count over
    the span when there are too few to space."""
    if len(done) >= 3 and done[-1] > done[0]:
        return (len(done) - 1) / (done[-1] - done[0])
    return len(done) / span_s if span_s > 0 else 0.0


@dataclass(frozen=True)
class ScalingFit:
    device_ms: float  # 0: linear scaling over the levels
    max_rel_error: float
    saturates_at: float | None  # instances where the device part binds (1 / (device_ms x X1))


def scaling_prediction(instances: int, one_rate: float, device_ms: float) -> float:
    """Executions per second of `instances` on one device: min(N x X1, 1 / device part)."""
    linear = instances * one_rate
    return linear if device_ms <= 0 else min(linear, 1000.0 / device_ms)


def fit_instance_scaling(levels: Sequence[tuple[int, float]], grid: int = 4000) -> ScalingFit:
    """The device part of an execution from (instances, executions/s) measured on one device.

    One instance's rate X1 is taken as measured; the device part D is the value whose prediction
    min(N x X1, 1/D) is closest in log terms over the levels (a grid over 1/D from X1 to twice the
    largest N x X1). When every level scaled linearly the answer is D = 0: the levels show no
    shared part, and saying more would be a guess.
    """
    pts = sorted((int(n), float(x)) for n, x in levels if n >= 1 and x > 0)
    ones = [x for n, x in pts if n == 1]
    if not ones or len({n for n, _ in pts}) < 2:
        raise ValueError("instance scaling needs a one-instance level and at least one more instance count")
    x1 = sum(ones) / len(ones)
    top = max(n for n, _ in pts)

    def error(device_ms: float) -> tuple[float, float]:
        logs = [math.log(scaling_prediction(n, x1, device_ms) / x) for n, x in pts]
        rel = max(abs(scaling_prediction(n, x1, device_ms) - x) / x for n, x in pts)
        return sum(v * v for v in logs), rel

    best_d, (best_sq, best_rel) = 0.0, error(0.0)
    for i in range(grid):
        cap = x1 * (1.0 + (2.0 * top - 1.0) * i / (grid - 1))  # saturated executions/s
        d = 1000.0 / cap
        sq, rel = error(d)
        if sq < best_sq - 1e-12:
            best_d, best_sq, best_rel = d, sq, rel
    if best_d > 0 and 1000.0 / best_d >= top * x1:  # never binds on the levels measured
        best_d, best_rel = 0.0, error(0.0)[1]
    saturates = None if best_d <= 0 else 1000.0 / best_d / x1
    return ScalingFit(device_ms=best_d, max_rel_error=best_rel, saturates_at=saturates)


# ---------------------------------------------------------------------------------------------
# The knee of the load curve


def _slope(y0: float | None, y1: float | None, x0: float, x1: float) -> float | None:
    if y0 is None or y1 is None or y0 <= 0 or y1 <= 0 or x0 <= 0 or x1 <= 0 or x0 == x1:
        return None
    return (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))


def find_knee(levels: Sequence[tuple[int, float, float | None]], tolerance: float = 0.0) -> Knee:
    """levels: (concurrency, throughput, p99) in rising concurrency.

    The knee is the first level whose p99 grew faster than its throughput since the previous
    level: d log p99 / d log c > d log thr / d log c + tolerance. Past it, more clients buy
    mostly queueing.
    """
    lat_slopes: list[float | None] = [None]
    thr_slopes: list[float | None] = [None]
    knee: int | None = None
    for prev, cur in zip(levels, levels[1:]):
        ls = _slope(prev[2], cur[2], prev[0], cur[0])
        ts = _slope(prev[1], cur[1], prev[0], cur[0])
        lat_slopes.append(ls)
        thr_slopes.append(ts)
        if knee is None and ls is not None and ts is not None and ls > ts + tolerance:
            knee = cur[0]
    return Knee(concurrency=knee, latency_slopes=lat_slopes, throughput_slopes=thr_slopes)


# ---------------------------------------------------------------------------------------------
# Memory


def relative_difference(measured: float | None, reference: float | None) -> float | None:
    if measured is None or reference is None or reference == 0:
        return None
    return (measured - reference) / reference


def bytes_per_token_from_delta(delta_bytes: float, delta_tokens: int) -> float:
    """Bytes per token from a memory difference across a change of `delta_tokens` KV slots."""
    if delta_tokens <= 0:
        raise ValueError(f"the probe must change the pool by at least one token, got {delta_tokens}")
    return delta_bytes / delta_tokens


def blocks_needed(token_counts: Iterable[int], block_tokens: int) -> int:
    """Blocks a paged cache holds for sequences of these lengths (each rounds up to whole blocks)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    return sum(-(-n // block_tokens) for n in token_counts if n > 0)


def paged_bytes_per_token(blocks_used: int, block_tokens: int, bytes_per_token: float, tokens: int) -> float | None:
    """Bytes the pool holds per token in flight: the per-token cost plus the partly filled blocks."""
    if tokens <= 0:
        return None
    return blocks_used * block_tokens * bytes_per_token / tokens


def probe_blocks(target_bytes: float, block_tokens: int, bytes_per_token: float) -> int:
    """Extra pool blocks that make a resize probe of about `target_bytes` (at least one)."""
    if block_tokens < 1 or bytes_per_token <= 0:
        raise ValueError("block_tokens and bytes_per_token must be positive")
    return max(1, math.ceil(target_bytes / (block_tokens * bytes_per_token)))


def peak_delta(steady: int, peak: int) -> int:
    return max(0, peak - steady)


def recommended_pad_mb(peak_delta_bytes: int, margin: float = 1.25) -> float:
    """Safety pad (MiB) for the KV budget: the prefill transient at the longest context x margin,
    rounded up to 0.01 MiB so the pad never rounds below what was measured."""
    if margin < 1.0:
        raise ValueError(f"the pad margin must be >= 1.0, got {margin}")
    if peak_delta_bytes < 0:
        raise ValueError(f"a peak delta is >= 0 bytes, got {peak_delta_bytes}")
    return math.ceil(peak_delta_bytes * margin / MIB * 100.0 - 1e-9) / 100.0


def prefill_lengths(max_prompt: int, count: int = 6, smallest: int = 16) -> list[int]:
    """Prompt lengths for the prefill scan: doubling from `smallest`, always ending at `max_prompt`."""
    if max_prompt < 1:
        raise ValueError(f"max_prompt must be >= 1, got {max_prompt}")
    out: list[int] = []
    n = min(smallest, max_prompt)
    while n < max_prompt and len(out) < count - 1:
        out.append(n)
        n *= 2
    out.append(max_prompt)
    return sorted(set(out))
