"""Traffic shapes and the arrival lists the simulator and the load generator replay.

A traffic file (`examples/traffic/*.yaml`) is a small strict schema, `TrafficSpec`: a shape
(poisson, bursty on/off, a daily curve, or replay of a CSV trace), a mean rate, a duration and a
mix of classes (share, Triton priority, rows per request, prompt/output lengths for LLMs, and
what LLM prompts share: a prefix, or a conversation's history, see `traffic_sharing`).
`generate_arrivals(spec, seed)` turns it into `Arrivals`: sorted send times and per-request
class, lengths and rows as numpy arrays. The same `Arrivals` drive the simulator and the live
load generator, so a prediction and a measurement see exactly the same requests.

Pure: no I/O. A trace is parsed from text the caller has read (`parse_trace_csv`).

Shapes (all have the same *mean* rate `rate_per_s`, so `scale_rate` and a capacity search mean
the same thing for each):
  poisson  homogeneous Poisson arrivals.
  bursty   on/off: for `on_s` seconds the rate is `burst_factor` times the off rate, then `off_s`
           seconds at the off rate; rates are chosen so the mean over a cycle is `rate_per_s`.
  daily    rate(t) = mean x (1 + a sin(2 pi (t/period - peak_at + 1/4))), a = (p - 1)/(p + 1) for
           a peak-to-trough ratio p; `period_s` may be compressed (600 s for a test "day").
  trace    the CSV's timestamps (shifted to start at 0, divided by `time_scale`); `rate_per_s`
           and `duration_s` are ignored.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from tritongen.core.lengths import Length, length_array
from tritongen.core.strict import Strict
from tritongen.core.traffic_sharing import Conversation, SharedPrefix, SharedPrompts, share_prompts


class ClassMix(Strict):
    """One class of requests in the traffic."""

    name: str = Field(min_length=1, description="Class name; `tune` matches it to the spec's traffic_classes.")
    share: float = Field(gt=0, le=1, description="Share of the requests, 0..1; shares add up to 1.")
    priority: int = Field(
        default=0, ge=0, le=16,
        description="Triton request priority (1 = highest); 0 = the model's default level. `tune` uses the spec's.",
    )
    model: str | None = Field(default=None, description="Model (spec name) these requests go to; default: every tuned model.")
    rows: int = Field(default=1, ge=1, description="Batch rows per request (the leading dimension).")
    prompt_tokens: Length = Field(
        default=0,
        description="LLMs: the prompt's own tokens, a number or a distribution: the whole prompt where the class "
        "shares nothing; with shared_prefix, what follows the prefix; in a conversation, each turn's new text "
        "(tritongen.core.traffic_sharing).",
    )
    output_tokens: Length = Field(default=0, description="LLMs: max_tokens, a number or a distribution.")
    shared_prefix: SharedPrefix | None = Field(
        default=None, description="LLMs: the prompts begin with one of a few shared texts (a system prompt, a document)."
    )
    conversation: Conversation | None = Field(
        default=None, description="LLMs: requests are turns of conversations, each carrying the history so far."
    )


class Bursty(Strict):
    on_s: float = Field(gt=0, description="Length of a burst, s.")
    off_s: float = Field(gt=0, description="Quiet time between bursts, s.")
    burst_factor: float = Field(ge=1, description="Rate during a burst divided by the quiet rate.")


class Daily(Strict):
    period_s: float = Field(default=86400.0, gt=0, description="Length of a 'day', s (compress it for tests).")
    peak_to_trough: float = Field(default=3.0, ge=1, description="Peak rate divided by the lowest rate.")
    peak_at: float = Field(default=0.5, ge=0, lt=1, description="Where the peak falls, as a fraction of the period.")


class Trace(Strict):
    path: str = Field(min_length=1, description="CSV file (timestamp,class,prompt_tokens,output_tokens), relative to the traffic file.")
    time_scale: float = Field(default=1.0, gt=0, description="Replay faster (>1) or slower (<1) than recorded.")


class TrafficSpec(Strict):
    """A traffic shape: what the simulator predicts for and the load generator sends."""

    shape: Literal["poisson", "bursty", "daily", "trace"] = Field(description="Arrival process.")
    rate_per_s: float | None = Field(default=None, gt=0, description="Mean request rate (not for trace).")
    duration_s: float = Field(default=60.0, gt=0, description="Length of the traffic, s (not for trace).")
    warmup_s: float = Field(default=0.0, ge=0, description="Leading seconds left out of the figures.")
    classes: list[ClassMix] = Field(min_length=1, description="Class mix.")
    bursty: Bursty | None = None
    daily: Daily | None = None
    trace: Trace | None = None

    @model_validator(mode="after")
    def _shape_fields(self) -> "TrafficSpec":
        names = [c.name for c in self.classes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"classes {dupes} appear more than once; class names must be unique")
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > 0.01:
            raise ValueError(f"class shares add up to {total:.3f}, not 1; rescale them")
        for name in ("bursty", "daily", "trace"):
            present = getattr(self, name) is not None
            if present and self.shape != name:
                raise ValueError(f"`{name}` is set but shape is {self.shape!r}; remove it or set shape: {name}")
            if self.shape == name and not present:
                raise ValueError(f"shape {name} needs a `{name}:` section")
        if self.shape != "trace" and self.rate_per_s is None:
            raise ValueError(f"shape {self.shape} needs `rate_per_s` (the mean request rate)")
        if self.warmup_s >= self.duration_s and self.shape != "trace":
            raise ValueError(f"warmup_s {self.warmup_s} is not below duration_s {self.duration_s}")
        return self

    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]


# Arrivals' per-request arrays: the original five, then what a prompt shares (traffic_sharing), which
# default to "nothing" (-1 ids, 0 tokens) so arrivals built without them mean what they always meant.
_REQUEST_ARRAYS = ("t", "cls", "prompt", "output", "rows", "prefix_id", "prefix_tokens", "conversation", "shared_tokens")
_NOTHING_SHARED = {"prefix_id": -1, "prefix_tokens": 0, "conversation": -1, "shared_tokens": 0}


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class Arrivals:
    """Requests in send order. Times in seconds from the start of the traffic."""

    t: np.ndarray  # float64, sorted
    cls: np.ndarray  # int64 index into class_names
    prompt: np.ndarray  # int64 whole prompt tokens, shared prefix and history included (0 for classic models)
    output: np.ndarray  # int64 max_tokens (0 for classic models)
    rows: np.ndarray  # int64 batch rows per request
    class_names: list[str]
    class_priority: list[int]  # Triton priority per class (0 = model default)
    class_model: list[str | None] = field(default_factory=list)
    warmup_s: float = 0.0
    # What each prompt shares with others (tritongen.core.traffic_sharing); left out: nothing.
    prefix_id: np.ndarray = field(default_factory=_empty)  # int64 shared prefix it starts with, -1 none
    prefix_tokens: np.ndarray = field(default_factory=_empty)  # int64 that prefix's tokens, 0 none
    conversation: np.ndarray = field(default_factory=_empty)  # int64 conversation it is a turn of, -1 none
    shared_tokens: np.ndarray = field(default_factory=_empty)  # int64 leading tokens shared with earlier requests

    def __post_init__(self) -> None:
        n = len(self.t)
        for name, nothing in _NOTHING_SHARED.items():
            if n and not len(getattr(self, name)):
                setattr(self, name, np.full(n, nothing, dtype=np.int64))
        for name in _REQUEST_ARRAYS:
            if len(getattr(self, name)) != n:
                raise ValueError(f"arrivals: `{name}` has {len(getattr(self, name))} entries, `t` has {n}")
        if not self.class_model:
            self.class_model = [None] * len(self.class_names)

    @property
    def shares_prompts(self) -> bool:
        """Whether any prompt shares its beginning with another (a prefix, or an earlier turn)."""
        return bool(len(self.t)) and bool((self.prefix_id >= 0).any() or (self.conversation >= 0).any())

    def __len__(self) -> int:
        return len(self.t)

    @property
    def span_s(self) -> float:
        return float(self.t[-1] - self.t[0]) if len(self.t) > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        return (len(self.t) - 1) / self.span_s if self.span_s > 0 else 0.0

    def priorities(self) -> np.ndarray:
        return np.asarray(self.class_priority, dtype=np.int64)[self.cls] if len(self.t) else np.zeros(0, np.int64)

    def take(self, mask: np.ndarray) -> "Arrivals":
        """The requests `mask` selects. What they share stays as it was: a turn whose earlier turn was
        left out still begins with that turn's text, which then is in no cache."""
        arrays = {name: getattr(self, name)[mask] for name in _REQUEST_ARRAYS}
        return Arrivals(
            **arrays, class_names=list(self.class_names), class_priority=list(self.class_priority),
            class_model=list(self.class_model), warmup_s=self.warmup_s,
        )

    def with_sharing(self, shared: SharedPrompts | None) -> "Arrivals":
        """These requests with their prompts' sharing (`traffic_sharing.share_prompts`); None: as they are."""
        if shared is None:
            return self
        out = self.take(np.ones(len(self.t), dtype=bool))
        out.prompt, out.prefix_id, out.prefix_tokens = shared.prompt, shared.prefix_id, shared.prefix_tokens
        out.conversation, out.shared_tokens = shared.conversation, shared.shared_tokens
        return out

    def with_priorities(self, priority_by_class: dict[str, int]) -> "Arrivals":
        """The same requests with the Triton priority of each named class replaced."""
        prio = [priority_by_class.get(n, p) for n, p in zip(self.class_names, self.class_priority)]
        out = self.take(np.ones(len(self.t), dtype=bool))
        out.class_priority = prio
        return out


def scale_rate(arrivals: Arrivals, factor: float) -> Arrivals:
    """The same requests sent `factor` times as fast (time axis divided by `factor`)."""
    if factor <= 0:
        raise ValueError(f"a rate factor must be > 0, got {factor}")
    out = arrivals.take(np.ones(len(arrivals), dtype=bool))
    out.t = arrivals.t / factor
    out.warmup_s = arrivals.warmup_s / factor
    return out


# ---------------------------------------------------------------------------------------------
# Arrival processes


def _poisson_times(rng: np.random.Generator, rate: float, duration: float) -> np.ndarray:
    expected = rate * duration
    n = int(expected + 6 * math.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while times[-1] < duration:  # astronomically rare; extend rather than truncate the process
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))
        times = np.concatenate([times, more])
    return times[times < duration]


def bursty_rates(spec: Bursty, mean_rate: float) -> tuple[float, float]:
    """(on rate, off rate) whose cycle mean is `mean_rate`."""
    cycle = spec.on_s + spec.off_s
    off = mean_rate * cycle / (spec.burst_factor * spec.on_s + spec.off_s)
    return spec.burst_factor * off, off


def _bursty_times(rng: np.random.Generator, spec: Bursty, mean_rate: float, duration: float) -> np.ndarray:
    """Time-rescaling: unit-rate Poisson points mapped through the inverse cumulative intensity."""
    on_rate, off_rate = bursty_rates(spec, mean_rate)
    cycle = spec.on_s + spec.off_s
    per_cycle = on_rate * spec.on_s + off_rate * spec.off_s  # intensity mass of one cycle
    total = per_cycle * duration / cycle + per_cycle  # a cycle of slack
    n = int(total + 6 * math.sqrt(total) + 16)
    lam = np.cumsum(rng.exponential(1.0, size=n))
    k = np.floor(lam / per_cycle)
    r = lam - k * per_cycle
    on_mass = on_rate * spec.on_s
    within = np.where(r < on_mass, r / on_rate, spec.on_s + (r - on_mass) / off_rate)
    times = k * cycle + within
    return times[times < duration]


def daily_rate(spec: Daily, mean_rate: float, t: np.ndarray | float) -> np.ndarray | float:
    amp = (spec.peak_to_trough - 1.0) / (spec.peak_to_trough + 1.0)
    phase = 2.0 * math.pi * (np.asarray(t) / spec.period_s - spec.peak_at + 0.25)
    return mean_rate * (1.0 + amp * np.sin(phase))


def _daily_times(rng: np.random.Generator, spec: Daily, mean_rate: float, duration: float) -> np.ndarray:
    """Thinning (Lewis-Shedler) of a Poisson process at the peak rate."""
    amp = (spec.peak_to_trough - 1.0) / (spec.peak_to_trough + 1.0)
    peak = mean_rate * (1.0 + amp)
    candidates = _poisson_times(rng, peak, duration)
    keep = rng.random(len(candidates)) * peak < daily_rate(spec, mean_rate, candidates)
    return candidates[keep]


# A shape's arrival process: (rng, spec, duration_s) -> sorted send times below duration_s at the
# spec's mean rate. A new shape is a name in `TrafficSpec.shape`, its section (if it has
# parameters) and an entry here; `trace` is replayed, not generated.
ArrivalProcess = Callable[[np.random.Generator, TrafficSpec, float], np.ndarray]


def _bursty_process(rng: np.random.Generator, spec: TrafficSpec, duration: float) -> np.ndarray:
    assert spec.bursty is not None and spec.rate_per_s is not None
    return _bursty_times(rng, spec.bursty, spec.rate_per_s, duration)


def _daily_process(rng: np.random.Generator, spec: TrafficSpec, duration: float) -> np.ndarray:
    assert spec.daily is not None and spec.rate_per_s is not None
    return _daily_times(rng, spec.daily, spec.rate_per_s, duration)


def _poisson_process(rng: np.random.Generator, spec: TrafficSpec, duration: float) -> np.ndarray:
    assert spec.rate_per_s is not None
    return _poisson_times(rng, spec.rate_per_s, duration)


ARRIVAL_PROCESSES: dict[str, ArrivalProcess] = {
    "poisson": _poisson_process,
    "bursty": _bursty_process,
    "daily": _daily_process,
}


def arrival_process(shape: str) -> ArrivalProcess:
    """The arrival process of a generated shape; an unknown one is an error that lists the known."""
    try:
        return ARRIVAL_PROCESSES[shape]
    except KeyError:
        raise ValueError(f"no arrival process for traffic shape {shape!r}; known: {', '.join(sorted(ARRIVAL_PROCESSES))}, trace") from None


def generate_arrivals(spec: TrafficSpec, seed: int = 0, trace_text: str | None = None, requests: int | None = None) -> Arrivals:
    """The arrivals of `spec`, reproducible from `seed`.

    `requests`: generate exactly this many (the duration grows or shrinks to fit; the warm-up
    keeps its share of the duration). A trace needs `trace_text` (the CSV the caller read) and is
    cut to `requests` when given. Classes that share prompts (`shared_prefix`, `conversation`) get
    their sharing from a stream of the seed's own: times, classes and lengths stay those of the
    same traffic without it (`traffic_sharing`).
    """
    rng = np.random.default_rng(seed)
    if spec.shape == "trace":
        if trace_text is None:
            raise ValueError("a trace traffic needs the CSV text (trace_text)")
        arrivals = parse_trace_csv(trace_text, spec)
        if requests is not None:
            arrivals = arrivals.take(np.arange(len(arrivals)) < requests)
        return _shared(arrivals, spec, seed)
    process = arrival_process(spec.shape)
    assert spec.rate_per_s is not None
    duration = spec.duration_s
    warmup = spec.warmup_s
    if requests is not None:
        if requests < 1:
            raise ValueError(f"requests must be >= 1, got {requests}")
        duration = requests / spec.rate_per_s * 1.05 + 1.0  # a little extra, cut to `requests` below
        warmup = spec.warmup_s / spec.duration_s * (requests / spec.rate_per_s)
    attempt = 0
    while True:
        times = process(rng, spec, duration)
        if requests is None or len(times) >= requests:
            break
        attempt += 1  # a quiet stretch (a daily trough): run the process for longer
        duration *= 1.5
        rng = np.random.default_rng([seed, attempt])
    if requests is not None:
        times = times[:requests]
    n = len(times)
    shares = np.array([c.share for c in spec.classes], dtype=float)
    cls = rng.choice(len(spec.classes), size=n, p=shares / shares.sum()).astype(np.int64)
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    rows = np.ones(n, dtype=np.int64)
    for i, klass in enumerate(spec.classes):
        mask = cls == i
        count = int(mask.sum())
        prompt[mask] = length_array(klass.prompt_tokens, rng, count)
        output[mask] = length_array(klass.output_tokens, rng, count)
        rows[mask] = klass.rows
    arrivals = Arrivals(
        t=times.astype(np.float64), cls=cls, prompt=prompt, output=output, rows=rows,
        class_names=spec.class_names(), class_priority=[c.priority for c in spec.classes],
        class_model=[c.model for c in spec.classes], warmup_s=warmup,
    )
    return _shared(arrivals, spec, seed)


def _shared(arrivals: Arrivals, spec: TrafficSpec, seed: int) -> Arrivals:
    """`arrivals` with what their classes share (a trace's prompt_tokens are the new part, as a
    class's are); the same object where no class shares anything."""
    return arrivals.with_sharing(
        share_prompts(spec.classes, arrivals.t, arrivals.cls, arrivals.prompt, arrivals.output, seed))


# ---------------------------------------------------------------------------------------------
# Trace replay

TRACE_COLUMNS = ("timestamp", "class", "prompt_tokens", "output_tokens")


class TraceError(ValueError):
    """A trace CSV that cannot be replayed; the message names the line."""


def parse_trace_csv(text: str, spec: TrafficSpec | None = None, source: str = "trace.csv") -> Arrivals:
    """Parse `timestamp,class,prompt_tokens,output_tokens` (header required; `rows` optional).

    Timestamps are seconds (any origin, e.g. Unix time); they are shifted to start at 0, sorted
    (stable) and divided by the spec's `time_scale`. Classes must be in the spec when one is given
    (their priority, rows and model come from it); otherwise classes are taken in order of first
    appearance with priority 0.
    """
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip().lower() for h in next(reader)]
    except StopIteration:
        raise TraceError(f"{source}: empty file; expected a header {','.join(TRACE_COLUMNS)}") from None
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{source}:1: header {header} lacks {missing}; expected {','.join(TRACE_COLUMNS)}[,rows]")
    col = {name: header.index(name) for name in header}
    known = {c.name: i for i, c in enumerate(spec.classes)} if spec is not None else {}
    names: list[str] = [c.name for c in spec.classes] if spec is not None else []
    ts: list[float] = []
    cls: list[int] = []
    prompt: list[int] = []
    output: list[int] = []
    rows: list[int] = []
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
            continue
        if len(row) < len(header):
            raise TraceError(f"{source}:{lineno}: {len(row)} fields, the header has {len(header)}")
        try:
            t = float(row[col["timestamp"]])
            p = int(row[col["prompt_tokens"]])
            o = int(row[col["output_tokens"]])
            r = int(row[col["rows"]]) if "rows" in col and row[col["rows"]].strip() else None
        except ValueError as err:
            raise TraceError(f"{source}:{lineno}: {err}") from None
        if not math.isfinite(t) or p < 0 or o < 0 or (r is not None and r < 1):
            raise TraceError(f"{source}:{lineno}: timestamp must be finite, lengths >= 0, rows >= 1")
        name = row[col["class"]].strip()
        if name not in known:
            if spec is not None:
                raise TraceError(f"{source}:{lineno}: class {name!r} is not in the traffic's classes {names}")
            known[name] = len(names)
            names.append(name)
        index = known[name]
        ts.append(t)
        cls.append(index)
        prompt.append(p)
        output.append(o)
        default_rows = spec.classes[index].rows if spec is not None else 1
        rows.append(r if r is not None else default_rows)
    if not ts:
        raise TraceError(f"{source}: no requests after the header")
    order = np.argsort(np.asarray(ts), kind="stable")
    t_arr = np.asarray(ts, dtype=np.float64)[order]
    t_arr = t_arr - t_arr[0]
    scale = spec.trace.time_scale if spec is not None and spec.trace is not None else 1.0
    t_arr = t_arr / scale
    return Arrivals(
        t=t_arr,
        cls=np.asarray(cls, dtype=np.int64)[order],
        prompt=np.asarray(prompt, dtype=np.int64)[order],
        output=np.asarray(output, dtype=np.int64)[order],
        rows=np.asarray(rows, dtype=np.int64)[order],
        class_names=names,
        class_priority=[c.priority for c in spec.classes] if spec is not None else [0] * len(names),
        class_model=[c.model for c in spec.classes] if spec is not None else [None] * len(names),
        warmup_s=spec.warmup_s if spec is not None else 0.0,
    )
