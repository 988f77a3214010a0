"""Classic models: measure what simulate and tune need, whatever config the server runs.

Users start with `max_batch_size: 64` and no `dynamic_batching`, one instance, on a GPU that every
instance shares. A profile that only watched Triton's batches under that config would see batches of
one and nothing of how instances share the device. So, in this order:

1. **Batching variant** (only where the profile may load configs: `--repo`, or `--allow-reload` on a
   server in explicit model-control mode): a config with `max_batch_size > 0` and no dynamic batcher
   is loaded again with `dynamic_batching {}` added, through the model load API's config override,
   so the load levels form real multi-request batches (what a tuned config will run) and the
   overhead fit can tell per-execution from per-request costs.
2. **Load levels**: closed-loop single-row requests at rising concurrency; client-side latency,
   Triton's statistics per level.
3. **Client-side batch scan**: one request in flight carrying N rows, N doubling up to
   `max_batch_size`, so Triton's `batch_stats` hold every batch size whatever the served config
   does; with the levels' batches they give the latency-versus-batch curve.
4. **Overheads** from Triton's own statistics over the levels (`simulator.fit_overheads`): client
   latency less Triton's request duration, and instance time outside the curve per execution and
   per request.
5. **Instance scaling** (a loadable server only): 1, 2 and 4 instances on the same device, each
   with requests of one row and of `max_batch_size` rows, two per instance in flight and no
   dynamic batcher (every execution the same rows). `profile_math.fit_instance_scaling` finds the
   device part that caps each size; the line through them is the simulator's `device_curve`,
   which the instances of a device take in turns. A count the server cannot load (memory) ends
   the scaling there.

Every config loaded here is loaded back to the original afterwards, failure or not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tritongen.client import sample_input
from tritongen.core import profile_math as pm
from tritongen.core.profile_types import (
    CurveFit,
    CurvePoint,
    DevicePart,
    InstanceScaling,
    LoadLevel,
    MeasuredOverheads,
    ProfileSettings,
    ScalingLevel,
)
from tritongen.core.engine_metrics import is_out_of_memory
from tritongen.core.simulator import LiveObservation, Overheads, ServiceCurve, fit_overheads
from tritongen.errors import RunFailed, TritongenError
from tritongen.profiler.classic_load import ClassicLoad
from tritongen.profiler.load import ModelFailed, RequestRecord, Window

SCALING_INSTANCES = (1, 2, 4)
SCALING_EXECUTIONS_PER_WINDOW = 8  # one instance's executions a scaling window holds at least


def batch_scan_rows(max_batch_size: int, quick: bool) -> list[int]:
    """Doubling from 1 to max_batch_size (always included); quick runs every other size."""
    if max_batch_size <= 0:
        return []
    rows, n = [], 1
    while n < max_batch_size:
        rows.append(n)
        n *= 2
    rows.append(max_batch_size)
    if quick and len(rows) > 4:
        rows = sorted(set(rows[::2]) | {max_batch_size})
    return rows


def scaling_rows(max_batch_size: int) -> list[int]:
    """Rows per request of the scaling levels: one row and the largest batch, so the device part
    is known as a line in the rows (a GPU's kernels grow with the batch, the host's fixed costs not)."""
    return [1] if max_batch_size <= 1 else [1, max_batch_size]


def batching_variant(config: dict) -> dict:
    """The served config with Triton's default dynamic batcher (no window, no preferred sizes)."""
    out = json.loads(json.dumps(config))
    out["dynamic_batching"] = {}
    return out


def gathering_variant(config: dict, window_us: int) -> dict:
    """The served config with a dynamic batcher that waits `window_us` for a batch and prefers no
    size: requests sent together from one client all meet in one batch (the served window may be a
    couple of milliseconds, less than a loaded client takes to send a handful)."""
    out = batching_variant(config)
    out["dynamic_batching"] = {"max_queue_delay_microseconds": window_us}
    return out


def scaled_variant(config: dict, instances: int) -> dict:
    """The served config with `instances` per instance group (per device) and no dynamic batcher."""
    out = json.loads(json.dumps(config))
    out.pop("dynamic_batching", None)
    groups = out.get("instance_group") or [{"kind": "KIND_AUTO"}]
    for group in groups:
        group["count"] = instances
    out["instance_group"] = groups
    return out


def has_dynamic_batching(config: dict) -> bool:
    return isinstance(config.get("dynamic_batching"), dict)


def flat_fit(points: Sequence[CurvePoint]) -> CurveFit | None:
    """A model without a batch dimension runs one row per execution: its curve is one constant."""
    if not points:
        return None
    count = sum(p.count for p in points)
    mean = sum(p.compute_infer_ms * p.count for p in points) / count
    return CurveFit(kind="linear", overhead_ms=mean, per_item_ms=0.0, max_rel_error=0.0, mean_rel_error=0.0, points=1)


def _success(stats: dict) -> tuple[int, int]:
    ok = (stats.get("inference_stats") or {}).get("success") or {}
    return int(ok.get("count", 0)), int(ok.get("ns", 0))


@dataclass
class ClassicResult:
    """What the classic run measured, handed to the profile builder as it grows."""

    curve: list[CurvePoint] = field(default_factory=list)
    fit: CurveFit | None = None
    levels: list[LoadLevel] = field(default_factory=list)
    overheads: MeasuredOverheads | None = None
    scaling: InstanceScaling | None = None
    variant: str | None = None
    notes: list[str] = field(default_factory=list)


class ClassicProfiler:
    """The classic steps above, on one target; `admin` is the profiler's TritonAdmin."""

    def __init__(
        self,
        admin,
        http_url: str,
        settings: ProfileSettings,
        target,
        can_reload: bool,
        wait_ready: Callable[[str], None],
        update: Callable[[str, int], None],
        decide: Callable[[list[float]], bool],
        on_window: Callable[[str, str], Callable[[Window], None]],
        level_of: Callable[..., LoadLevel],
        result: ClassicResult,
    ) -> None:
        self.admin = admin
        self.http_url = http_url
        self.s = settings
        self.target = target
        self.can_reload = can_reload
        self.wait_ready = wait_ready
        self.update = update
        self.decide = decide
        self.on_window = on_window
        self.level_of = level_of
        self.result = result
        self.deltas: list[dict[int, pm.BatchDelta]] = []
        self.observations: list[LiveObservation] = []
        self.loaded_variant = False

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> None:
        t, r = self.target, self.result
        original = t.config
        try:
            if t.max_batch_size > 0 and not has_dynamic_batching(original):
                if self.can_reload:
                    try:
                        self._load(batching_variant(original))
                        r.variant = "the served config with dynamic_batching {} added (loaded through the model load API)"
                    except TritongenError as err:
                        self._restore(original)
                        self.loaded_variant = False
                        r.notes.append(f"the batching variant did not load ({err}): the load levels ran on the served config")
                else:
                    r.notes.append(
                        "the served config has no dynamic_batching: the load levels ran one request per execution, so "
                        "the overhead fit cannot tell per-request from per-execution costs (profile with --repo, or "
                        "--allow-reload on a server in explicit model-control mode, to measure a batching variant)"
                    )
            with ClassicLoad(self.http_url, t.name, self._inputs(1 if t.max_batch_size > 0 else None), [o.name for o in t.outputs]) as load:
                self._levels(load)
                self._batch_scan(load)
                self._fit_overheads()
                if self.can_reload:
                    self._scaling(load)
                else:
                    r.notes.append(
                        "instance scaling not measured: it loads 1, 2 and 4 instances through the model load API, done "
                        "only with --repo or --allow-reload; simulate and tune will scale instances linearly"
                    )
        finally:
            if self.loaded_variant:
                self._restore(original)

    # An LLM that is not decoupled is loaded with prompts of its typical size and its budget, where it
    # takes them (`unary_llm.unary_inputs`): random features would measure the model's default budget.
    llm_inputs: Callable[[int | None], dict[str, np.ndarray]] | None = None

    def _inputs(self, rows: int | None) -> dict[str, np.ndarray]:
        if self.llm_inputs is not None:
            return self.llm_inputs(rows)
        rng = np.random.default_rng(self.s.seed)
        return {x.name: sample_input(x, rows, rng, "hello", 8) for x in self.target.inputs if not x.optional}

    def _load(self, config: dict) -> None:
        self.loaded_variant = True
        self.admin.load(self.target.name, config)
        self.wait_ready(self.target.name)

    def _restore(self, original: dict) -> None:
        try:
            self.admin.load(self.target.name, original)
            self.wait_ready(self.target.name)
        except TritongenError as err:
            raise RunFailed(f"could not load the original config of {self.target.name!r} back after profiling: {err}") from None

    def _measure(self, load: ClassicLoad, concurrency: int, label: str, warmup_s: float, window_s: float, decide):
        before = self.admin.stats(self.target.name)
        records, windows, start, measured_from = load.run_level(concurrency, warmup_s, window_s, decide, self.on_window(label, "inf/s"))
        after = self.admin.stats(self.target.name)
        before = measured_from or before  # the warm-up's executions (a cold first call) stay out
        delta = pm.batch_stats_delta(before.get("batch_stats") or [], after.get("batch_stats") or [])
        return records, windows, start, before, after, delta

    def _grow_curve(self, delta: dict[int, pm.BatchDelta]) -> None:
        self.deltas.append(delta)
        r = self.result
        r.curve = pm.curve_points(pm.merge_deltas(self.deltas))
        r.fit = pm.fit_curve(r.curve) if self.target.max_batch_size > 0 else flat_fit(r.curve)

    # -- steps -------------------------------------------------------------------------------

    def _out_of_memory_ends(self, err: ModelFailed, what: str) -> bool:
        """An LLM's out-of-memory answer under load is a finding (its batches pass its memory), not a
        failed profile, once something was measured: say so and stop raising the load. False: raise."""
        if self.llm_inputs is None or not is_out_of_memory(str(err)) or not self.result.levels:
            return False
        self.result.notes.append(
            f"{what} ran out of memory ({err}): the profile stops raising the load there; Triton's batcher formed "
            f"batches the model's memory does not hold at this request size: lower max_batch_size "
            f"({self.target.max_batch_size} served)"
        )
        return True

    def _levels(self, load: ClassicLoad) -> None:
        for concurrency in self.s.concurrency_levels:
            label = f"{self.target.name}: concurrency {concurrency}"
            self.update(f"{label}: warming up", 0)
            try:
                records, windows, start, before, after, delta = self._measure(
                    load, concurrency, label, self.s.warmup_s, self.s.window_s, self.decide
                )
            except ModelFailed as err:
                if self._out_of_memory_ends(err, f"concurrency {concurrency}"):
                    break
                raise
            self._grow_curve(delta)
            self.result.levels.append(self.level_of(concurrency, records, windows, start, delta))
            self._observe(records, windows, start, before, after, delta)
            self.update(label, 1)

    def _observe(self, records: list[RequestRecord], windows: list[Window], start: float, before: dict, after: dict, delta) -> None:
        end = start + len(windows) * self.s.window_s
        ok = [x.latency_s for x in records if x.error is None and start <= x.end < end]
        c0, n0 = _success(before)
        c1, n1 = _success(after)
        if not ok or c1 <= c0 or not delta:
            return
        batches = {size: (d.count, d.total_ns / d.count / 1e6) for size, d in delta.items()}
        self.observations.append(
            LiveObservation(client_mean_ms=1000.0 * sum(ok) / len(ok), server_mean_ms=(n1 - n0) / (c1 - c0) / 1e6, batches=batches)
        )

    def _batch_scan(self, load: ClassicLoad) -> None:
        rows = batch_scan_rows(self.target.max_batch_size, self.s.quick)
        if not rows:
            return
        window = max(0.2, self.s.window_s / 2)
        for n in rows:
            label = f"{self.target.name}: batch scan, {n} row(s) per request"
            self.update(label, 0)
            load.inputs = self._inputs(n)
            try:
                *_, delta = self._measure(load, 1, label, min(self.s.warmup_s, 0.2), window, lambda rates: len(rates) >= 2)
            except ModelFailed as err:
                if self._out_of_memory_ends(err, f"a request of {n} rows"):
                    break
                raise
            self._grow_curve(delta)
        load.inputs = self._inputs(1)
        self.update(f"{self.target.name}: batch scan", 1)

    def _fit_overheads(self) -> None:
        r = self.result
        if r.fit is None or not self.observations:
            return
        curve = ServiceCurve.from_points(r.fit, r.curve)
        fitted: Overheads = fit_overheads(self.observations, curve, base=Overheads())
        multi = any(rows > 1 for o in self.observations for rows in o.batches)
        detail = (
            "request_ms: median over the levels of client mean - Triton's mean request duration; batch_ms and "
            "request_exec_ms: instance time beyond the curve against requests per execution"
        )
        if not multi:
            detail += "; every execution held one request, so all of that time is counted per execution"
        r.overheads = MeasuredOverheads(
            request_ms=fitted.request_ms, batch_ms=fitted.batch_ms, request_exec_ms=fitted.request_exec_ms,
            levels=len(self.observations), detail=detail,
        )

    def _scaling(self, load: ClassicLoad) -> None:
        t, r = self.target, self.result
        batched = t.max_batch_size > 0
        levels: list[ScalingLevel] = []
        try:
            for n in SCALING_INSTANCES:
                label = f"{t.name}: {n} instance(s) on one device"
                self.update(f"{label}: loading", 0)
                try:
                    self._load(scaled_variant(t.config, n))
                except TritongenError as err:
                    r.notes.append(f"instance scaling stopped before {n} instances: the server did not load them ({err})")
                    break
                for rows in scaling_rows(t.max_batch_size):
                    load.inputs = self._inputs(rows if batched else None)
                    levels.append(self._scaling_level(load, n, rows, f"{label}, {rows} row(s)"))
                self.update(label, 0)
        finally:
            load.inputs = self._inputs(1 if batched else None)
        self.update(f"{t.name}: instance scaling", 1)
        r.scaling = scaling_section(levels, r.notes)

    def _scaling_level(self, load: ClassicLoad, n: int, rows: int, label: str) -> ScalingLevel:
        # Closed-loop throughput with every instance busy settles at once: short windows, but each
        # long enough for several executions (the batch scan's curve says how long one takes), and
        # the rate read off the completions' own spacing, not a count per window.
        fit = self.result.fit
        exec_s = (fit.predict(rows) if fit is not None else 0.0) / 1000.0
        window = max(0.2, self.s.window_s / 2, SCALING_EXECUTIONS_PER_WINDOW * exec_s)
        records, windows, start, _before, _after, delta = self._measure(
            load, 2 * n, label, min(self.s.warmup_s, 0.3), window, self.decide
        )
        end = start + len(windows) * window
        measured = [x for x in records if start <= x.end < end]
        ok = [x.latency_s for x in measured if x.error is None]
        done = sorted(x.end for x in measured if x.error is None)
        executions = sum(d.count for d in delta.values())
        exec_ms = sum(d.total_ns for d in delta.values()) / executions / 1e6 if executions else None
        p50, _p90, p99 = pm.percentiles_ms(ok)
        return ScalingLevel(
            instances=n, rows=rows, concurrency=2 * n, requests=len(ok), errors=len(measured) - len(ok),
            executions_per_s=pm.completion_rate(done, end - start),
            execution_ms=exec_ms, p50_ms=p50, p99_ms=p99,
        )


def device_part(rows: int, levels: Sequence[ScalingLevel]) -> DevicePart | None:
    usable = [lv for lv in levels if lv.rows == rows and lv.executions_per_s > 0]
    one = next((lv for lv in usable if lv.instances == 1), None)
    if one is None or len({lv.instances for lv in usable}) < 2:
        return None
    fit = pm.fit_instance_scaling([(lv.instances, lv.executions_per_s) for lv in usable])
    return DevicePart(
        rows=rows, device_ms=round(fit.device_ms, 4), execution_ms=round(one.execution_ms or 1000.0 / one.executions_per_s, 4),
        one_instance_per_s=round(one.executions_per_s, 2),
        saturates_at=None if fit.saturates_at is None else round(fit.saturates_at, 3), max_rel_error=round(fit.max_rel_error, 4),
    )


def scaling_section(levels: list[ScalingLevel], notes: list[str]) -> InstanceScaling | None:
    """The fit of the scaling levels, or None (with a note) when they cannot carry one."""
    parts = [p for p in (device_part(rows, levels) for rows in sorted({lv.rows for lv in levels})) if p is not None]
    if not parts:
        notes.append("instance scaling not fitted: fewer than two instance counts were measured")
        return None
    if len(parts) == 1:
        fixed, per_row = parts[0].device_ms, 0.0
    else:
        (r0, d0), (r1, d1) = (parts[0].rows, parts[0].device_ms), (parts[-1].rows, parts[-1].device_ms)
        per_row = max(0.0, (d1 - d0) / (r1 - r0))
        fixed = max(0.0, d0 - per_row * r0)
    said = []
    for p in parts:
        if p.device_ms <= 0:
            said.append(f"{p.rows} row(s): throughput grew in proportion to instances, no shared part seen")
        else:
            said.append(
                f"{p.rows} row(s): a device part of {p.device_ms:.2f} ms of the {p.execution_ms:.2f} ms execution caps "
                f"the device at {1000.0 / p.device_ms:.0f} executions/s, {p.saturates_at:.2f}x one instance"
            )
    return InstanceScaling(
        levels=levels, parts=parts, device_fixed_ms=round(fixed, 4), device_per_row_ms=round(per_row, 5), detail="; ".join(said),
    )
