"""Fleet arithmetic for `tritongen plan`: replicas, hot and cold pools, GPUs, a pre-warm schedule.

Pure: numbers in, numbers and the arithmetic as text out. Every decision is returned as a line a
human can redo by hand (`CapacityPlan.lines`), and the tests redo it.

The unit of scaling is one *pod*: one Triton server holding the whole rendered repository (every
model of the spec) on the GPUs of the spec's `hardware`. A profile measures one model on one such
server, so its throughput at the latency target is the capacity of one pod for that model:

    capacity per pod   = throughput at the P99 target x safety factor
    pods for model m   = ceil(peak_qps_m / capacity_m)
    pods               = max over models (the binding model sets the fleet; the others have slack)
    hot pods           = max over models of ceil(hot_fraction x peak_qps_m / capacity_m), at least 1
    cold pods (max)    = pods - hot pods
    GPUs               = pods x GPUs per pod

The safety factor (0.70 to 0.85) keeps each pod below the throughput it sustained within the
target: queueing delay grows like 1 / (1 - utilisation) near saturation, so the last 15-30 % of
measured throughput is exactly where a burst inside one second, a slower request mix, or
measurement noise turns a met P99 into a missed one.

The daily curve gives the load as a fraction of the daily peak over the day. Each stretch where the
hot pool is not enough needs cold pods, and they must be *warm* when the stretch starts: the
schedule raises the cold pool's floor `cold start` seconds before (rounded up to whole minutes,
because cron has minute resolution) and lets it fall when the stretch ends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import Field, field_validator, model_validator

from tritongen.core.strict import Strict
from tritongen.core.profile_types import Profile
from tritongen.errors import BadInput, Infeasible

SAFETY_FACTOR_RANGE = (0.70, 0.85)
DEFAULT_SAFETY_FACTOR = 0.80
DEFAULT_HOT_FRACTION = 0.70
DEFAULT_COLD_START_S = 300.0
MINUTES_PER_DAY = 24 * 60
_EPS = 1e-9


def ceil_div(numerator: float, denominator: float) -> int:
    """ceil(numerator / denominator), robust to float noise (2.0000000001 is 2, not 3)."""
    if denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    return max(0, math.ceil(numerator / denominator - _EPS))


def fmt_num(value: float) -> str:
    """A number for the arithmetic lines, to 4 decimals: 144, 2.6, 4.1667, 778.664."""
    value = round(value, 4)
    if value == int(value) and abs(value) < 1e12:
        return str(int(value))
    return f"{value:.12g}"


def fmt_time(minute: int) -> str:
    minute %= MINUTES_PER_DAY
    return f"{minute // 60:02d}:{minute % 60:02d}"


# ---------------------------------------------------------------------------------------------
# The daily curve


_TIME = re.compile(r"^([01]?\d|2[0-4]):([0-5]\d)$")


def parse_time(text: str) -> int:
    """'07:30' -> 450 (minutes after midnight); '24:00' is the end of the day."""
    match = _TIME.match(str(text).strip())
    if not match:
        raise ValueError(f"time {text!r} is not HH:MM (00:00 to 24:00)")
    hours, minutes = int(match.group(1)), int(match.group(2))
    total = hours * 60 + minutes
    if total > MINUTES_PER_DAY:
        raise ValueError(f"time {text!r} is past 24:00")
    return total


class CurvePoint(Strict):
    time: str = Field(description="HH:MM, local to the curve's timezone.")
    fraction: float = Field(ge=0, le=1, description="Load at that time as a fraction of the daily peak.")

    @field_validator("time")
    @classmethod
    def _valid_time(cls, value: str) -> str:
        parse_time(value)
        return value


class DailyCurve(Strict):
    """Load over one day as fractions of the daily peak: 24 hourly factors, or (time, fraction) points.

    `hourly[h]` is the highest load during hour h (h:00 to h+1:00). `points` are joined by straight
    lines (wrapping over midnight); each stretch between two points is sized for the higher of its
    two ends, which is the peak of the line between them.
    """

    timezone: str = Field(default="Etc/UTC", description="IANA timezone the times are in (cron schedules use it).")
    cold_start_s: float | None = Field(
        default=None, gt=0, description="Seconds from scale-up to a warm, ready pod (pull, start, load, warm-up)."
    )
    hourly: list[float] | None = Field(default=None, description="24 factors, hour 0 = 00:00-01:00.")
    points: list[CurvePoint] | None = Field(default=None, description="(time, fraction) points.")

    @field_validator("hourly")
    @classmethod
    def _hourly(cls, values: list[float] | None) -> list[float] | None:
        if values is None:
            return None
        if len(values) != 24:
            raise ValueError(f"hourly needs 24 factors (one per hour), got {len(values)}")
        bad = [(h, v) for h, v in enumerate(values) if not 0 <= v <= 1]
        if bad:
            raise ValueError(f"hourly factors must lie in [0, 1] (fractions of the daily peak); hour, value: {bad}")
        return values

    @model_validator(mode="after")
    def _one_shape(self) -> "DailyCurve":
        if (self.hourly is None) == (self.points is None):
            raise ValueError("give either `hourly` (24 factors) or `points` (time, fraction), not both or neither")
        if self.points is not None:
            if len(self.points) < 2:
                raise ValueError("points need at least two entries")
            times = [parse_time(p.time) % MINUTES_PER_DAY for p in self.points]
            if len(set(times)) != len(times):
                raise ValueError(f"points repeat a time: {[p.time for p in self.points]}")
        peak = max(self.hourly or [p.fraction for p in self.points or []])
        if peak <= 0:
            raise ValueError("the curve is zero all day; the daily peak should be 1.0 somewhere")
        return self

    def segments(self) -> list[tuple[int, int, float]]:
        """(start minute, end minute, fraction to size for), covering the day in order."""
        if self.hourly is not None:
            return [(h * 60, (h + 1) * 60, float(v)) for h, v in enumerate(self.hourly)]
        assert self.points is not None
        pts = sorted((parse_time(p.time) % MINUTES_PER_DAY, p.fraction) for p in self.points)
        out: list[tuple[int, int, float]] = []
        for i, (t, f) in enumerate(pts):
            t_next, f_next = pts[(i + 1) % len(pts)]
            end = t_next if i + 1 < len(pts) else t_next + MINUTES_PER_DAY
            out.append((t, end, max(f, f_next)))
        if pts[0][0] > 0:  # the last stretch wraps over midnight: split it at 24:00
            start, end, frac = out.pop()
            out.append((start, MINUTES_PER_DAY, frac))
            out.insert(0, (0, end - MINUTES_PER_DAY, frac))
        return out

    @property
    def peak_fraction(self) -> float:
        return max(f for _, _, f in self.segments())


# ---------------------------------------------------------------------------------------------
# Throughput at the target, from a profile


@dataclass(frozen=True)
class TargetThroughput:
    """What one pod sustains for one model within its latency target, and where the number came from."""

    requests_per_s: float
    target_ms: float
    source: str


def throughput_at_target(profile: Profile, target_ms: float) -> TargetThroughput:
    """The highest measured request rate whose P99 (TTFT P99 for streaming models) met `target_ms`.

    Only measured levels count (no extrapolation); levels with errors are skipped, because a
    throughput bought with failed requests is not capacity.
    """
    where = f"profile {profile.model!r}"
    candidates: list[tuple[float, str]] = []
    seen: list[str] = []
    if profile.kind == "streaming":
        levels = profile.streaming.levels if profile.streaming else []
        for lvl in levels:
            if lvl.ttft_p99_ms is None or lvl.duration_s <= 0:
                continue
            rate = lvl.requests / lvl.duration_s
            seen.append(f"{lvl.concurrency} streams: TTFT p99 {lvl.ttft_p99_ms:.1f} ms")
            if lvl.errors == 0 and lvl.rejected == 0 and lvl.ttft_p99_ms <= target_ms:
                candidates.append((rate, f"{lvl.concurrency} streams: {rate:.4g} req/s, TTFT p99 {lvl.ttft_p99_ms:.1f} ms"))
        metric = "TTFT P99"
    else:
        for lvl in profile.load_levels:
            if lvl.p99_ms is None:
                continue
            seen.append(f"concurrency {lvl.concurrency}: p99 {lvl.p99_ms:.1f} ms")
            if lvl.errors == 0 and lvl.rejected == 0 and lvl.p99_ms <= target_ms:
                candidates.append(
                    (lvl.throughput_per_s, f"concurrency {lvl.concurrency}: {lvl.throughput_per_s:.4g} req/s, p99 {lvl.p99_ms:.1f} ms")
                )
        metric = "P99"
    if not seen:
        raise BadInput(f"{where} has no measured load levels; run `tritongen profile` without stopping early")
    if not candidates:
        raise Infeasible(
            f"{where}: no measured load level met the {metric} target of {fmt_num(target_ms)} ms "
            f"({'; '.join(seen)}); more replicas do not lower latency: make one request faster "
            "(smaller batch or window, fewer instances per device) or relax the target"
        )
    rate, detail = max(candidates)
    return TargetThroughput(
        requests_per_s=rate, target_ms=target_ms, source=f"{detail} <= {fmt_num(target_ms)} ms target"
    )


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class ModelDemand:
    """One model entry's input to the fleet arithmetic."""

    model: str
    peak_qps: float
    throughput_per_s: float  # per pod, at the target
    target_ms: float
    source: str  # where the throughput came from, for the printout
    instances_per_pod: int
    gpus_per_pod: int  # GPUs this model occupies in one pod (0: CPU)


@dataclass(frozen=True)
class ModelCapacity:
    model: str
    peak_qps: float
    throughput_per_s: float
    capacity_per_pod: float  # throughput x safety factor
    pods: int  # ceil(peak / capacity)
    hot_pods: int  # ceil(hot_fraction x peak / capacity)
    instances: int  # pods x instances per pod
    gpus: int  # pods x gpus per pod for this model


@dataclass(frozen=True)
class PrewarmStep:
    """Cold pods needed from `start` to `end` (minutes after midnight), warm by `start`."""

    start_min: int
    end_min: int
    fraction: float
    pods: int  # pods needed in total at that load
    cold_pods: int  # beyond the hot pool
    scale_up_min: int  # start - lead, modulo a day

    @property
    def scale_up_cron(self) -> str:
        return f"{self.scale_up_min % 60} {(self.scale_up_min // 60) % 24} * * *"

    @property
    def end_cron(self) -> str:
        end = self.end_min % MINUTES_PER_DAY
        return f"{end % 60} {end // 60} * * *"


@dataclass(frozen=True)
class CapacityPlan:
    safety_factor: float
    hot_fraction: float
    models: list[ModelCapacity]
    binding_model: str
    pods: int
    hot_pods: int
    cold_max: int
    gpus_per_pod: int
    cold_start_s: float
    lead_min: int
    prewarm: list[PrewarmStep]
    timezone: str
    lines: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def hot_gpus(self) -> int:
        return self.hot_pods * self.gpus_per_pod

    @property
    def cold_gpus(self) -> int:
        return self.cold_max * self.gpus_per_pod


def check_safety_factor(value: float) -> float:
    lo, hi = SAFETY_FACTOR_RANGE
    if not lo - _EPS <= value <= hi + _EPS:
        raise BadInput(
            f"safety factor {value} is outside {lo}-{hi}: below {lo} buys idle GPUs, above {hi} runs pods "
            "so close to their measured limit that a burst breaks the P99 target; pick a value in the range"
        )
    return value


def safety_factor_explanation(value: float) -> str:
    return (
        f"safety factor {value:.2f} (allowed {SAFETY_FACTOR_RANGE[0]:.2f}-{SAFETY_FACTOR_RANGE[1]:.2f}): each pod is "
        f"loaded to {value:.0%} of the throughput it sustained within the target, because queueing delay grows "
        "like 1/(1 - utilisation) near saturation; the headroom absorbs bursts within a second, a slower "
        "request mix and measurement noise"
    )


def plan_capacity(
    demands: Sequence[ModelDemand],
    gpus_per_pod: int,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    hot_fraction: float = DEFAULT_HOT_FRACTION,
    curve: DailyCurve | None = None,
    cold_start_s: float = DEFAULT_COLD_START_S,
    cold_start_note: str = "given",
) -> CapacityPlan:
    """The fleet for the daily peak, its hot/cold split and (with a curve) the pre-warm schedule."""
    check_safety_factor(safety_factor)
    if not 0 < hot_fraction <= 1:
        raise BadInput(f"hot fraction {hot_fraction} must lie in (0, 1]: the share of the daily peak kept resident")
    if not demands:
        raise BadInput("no models to plan")
    if cold_start_s <= 0:
        raise BadInput(f"cold start {cold_start_s} s must be > 0")
    sf = safety_factor
    lines = [safety_factor_explanation(sf)]
    models: list[ModelCapacity] = []
    for d in demands:
        if d.throughput_per_s <= 0:
            raise BadInput(f"model {d.model!r}: throughput at the target is {d.throughput_per_s}; it must be > 0")
        if d.peak_qps < 0:
            raise BadInput(f"model {d.model!r}: peak QPS {d.peak_qps} must be >= 0")
        cap = d.throughput_per_s * sf
        pods = ceil_div(d.peak_qps, cap)
        hot_load = hot_fraction * d.peak_qps
        hot = ceil_div(hot_load, cap)
        models.append(
            ModelCapacity(
                model=d.model, peak_qps=d.peak_qps, throughput_per_s=d.throughput_per_s, capacity_per_pod=cap,
                pods=pods, hot_pods=hot, instances=pods * d.instances_per_pod, gpus=pods * d.gpus_per_pod,
            )
        )
        lines.append(
            f"{d.model}: throughput at the {fmt_num(d.target_ms)} ms target = {fmt_num(d.throughput_per_s)} req/s per pod "
            f"({d.source})"
        )
        lines.append(
            f"{d.model}: capacity per pod = {fmt_num(d.throughput_per_s)} x {fmt_num(sf)} = {fmt_num(cap)} req/s; "
            f"pods = ceil({fmt_num(d.peak_qps)} / {fmt_num(cap)}) = ceil({fmt_num(d.peak_qps / cap)}) = {pods}; "
            f"instances = {pods} x {d.instances_per_pod} = {pods * d.instances_per_pod}; "
            f"GPUs = {pods} x {d.gpus_per_pod} = {pods * d.gpus_per_pod}"
        )
        lines.append(
            f"{d.model}: hot = ceil({fmt_num(hot_fraction)} x {fmt_num(d.peak_qps)} / {fmt_num(cap)}) = "
            f"ceil({fmt_num(hot_load / cap)}) = {hot}"
        )
    binding = max(models, key=lambda m: (m.pods, m.model))
    pods = max(1, binding.pods)
    hot_pods = max(1, max(m.hot_pods for m in models))
    hot_pods = min(hot_pods, pods)
    cold_max = pods - hot_pods
    lines.append(
        f"fleet: every pod serves every model, so pods = max({', '.join(f'{m.model} {m.pods}' for m in models)}) = "
        f"{pods} (binding: {binding.model})"
    )
    lines.append(
        f"hot pool = max({', '.join(str(m.hot_pods) for m in models)}, 1) = {hot_pods} pods "
        f"({fmt_num(hot_fraction)} of the daily peak, resident); cold pool = {pods} - {hot_pods} = {cold_max} pods at most "
        "(elastic)"
    )
    lines.append(
        f"GPUs = {pods} pods x {gpus_per_pod} per pod = {pods * gpus_per_pod} "
        f"(hot {hot_pods * gpus_per_pod}, cold up to {cold_max * gpus_per_pod})"
    )
    lead_min = math.ceil(cold_start_s / 60 - _EPS)
    prewarm: list[PrewarmStep] = []
    timezone = "Etc/UTC"
    if curve is not None:
        timezone = curve.timezone
        peak = curve.peak_fraction
        if abs(peak - 1.0) > 0.01:
            lines.append(
                f"note: the curve's highest fraction is {fmt_num(peak)}, not 1.0; fractions are read as "
                "fractions of --peak-qps as given"
            )
        lines.append(
            f"cold start {fmt_num(cold_start_s)} s ({cold_start_note}) -> scale up ceil({fmt_num(cold_start_s)} / 60) = "
            f"{lead_min} min before each stretch that needs cold pods"
        )
        prewarm = prewarm_schedule(models, curve, hot_pods, lead_min)
        for step in prewarm:
            per_model = ", ".join(
                f"ceil({fmt_num(step.fraction)} x {fmt_num(m.peak_qps)} / {fmt_num(m.capacity_per_pod)}) = "
                f"{ceil_div(step.fraction * m.peak_qps, m.capacity_per_pod)}"
                for m in models
            )
            lines.append(
                f"{fmt_time(step.start_min)}-{fmt_time(step.end_min)} at {fmt_num(step.fraction)} of peak: pods = "
                f"max({per_model}) = {step.pods}; cold = {step.pods} - {hot_pods} = {step.cold_pods}; "
                f"scale up at {fmt_time(step.scale_up_min)} ({fmt_time(step.start_min)} - {lead_min} min), "
                f"release at {fmt_time(step.end_min)}"
            )
        if not prewarm:
            lines.append(f"the hot pool of {hot_pods} covers the whole curve; no pre-warm needed")
    return CapacityPlan(
        safety_factor=sf, hot_fraction=hot_fraction, models=models, binding_model=binding.model, pods=pods,
        hot_pods=hot_pods, cold_max=cold_max, gpus_per_pod=gpus_per_pod, cold_start_s=cold_start_s,
        lead_min=lead_min, prewarm=prewarm, timezone=timezone, lines=lines,
    )


def pods_for_fraction(models: Sequence[ModelCapacity], fraction: float) -> int:
    return max(ceil_div(fraction * m.peak_qps, m.capacity_per_pod) for m in models)


def prewarm_schedule(
    models: Sequence[ModelCapacity], curve: DailyCurve, hot_pods: int, lead_min: int
) -> list[PrewarmStep]:
    """Stretches of the day that need cold pods, merged where the cold count stays the same."""
    raw: list[list] = []  # [start, end, fraction, pods, cold]
    for start, end, fraction in curve.segments():
        pods = pods_for_fraction(models, fraction)
        cold = max(0, pods - hot_pods)
        if raw and raw[-1][4] == cold and raw[-1][1] == start:
            raw[-1][1] = end
            raw[-1][2] = max(raw[-1][2], fraction)
            raw[-1][3] = max(raw[-1][3], pods)
        else:
            raw.append([start, end, fraction, pods, cold])
    # The day wraps: a stretch ending at 24:00 continues one starting at 00:00.
    if len(raw) > 1 and raw[0][0] == 0 and raw[-1][1] == MINUTES_PER_DAY and raw[0][4] == raw[-1][4]:
        first = raw.pop(0)
        raw[-1] = [raw[-1][0], MINUTES_PER_DAY + first[1], max(raw[-1][2], first[2]), max(raw[-1][3], first[3]), first[4]]
    steps = [
        PrewarmStep(
            start_min=s % MINUTES_PER_DAY, end_min=e % MINUTES_PER_DAY if e != MINUTES_PER_DAY else MINUTES_PER_DAY,
            fraction=f, pods=p, cold_pods=c, scale_up_min=(s - lead_min) % MINUTES_PER_DAY,
        )
        for s, e, f, p, c in raw
        if c > 0
    ]
    return sorted(steps, key=lambda st: st.start_min)


def peak_qps_per_model(names: Sequence[str], default: float | None, overrides: Mapping[str, float]) -> dict[str, float]:
    """`--peak-qps 400` for every model, `--peak-qps ranker=300` for one; unknown names are refused."""
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise BadInput(f"--peak-qps names {unknown}, which are not models of the spec {sorted(names)}")
    out: dict[str, float] = {}
    for name in names:
        if name in overrides:
            out[name] = overrides[name]
        elif default is not None:
            out[name] = default
        else:
            raise BadInput(f"no peak QPS for model {name!r}: pass --peak-qps Q (every model) or --peak-qps {name}=Q")
    return out
