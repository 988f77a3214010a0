"""Where live memory headroom comes from, behind one interface, and a chain that falls through.

Sources, in the policy's order (default `nvml`, `triton_metrics`, `static`): NVML through `pynvml`
(per-GPU memory and utilisation; with no GPU it fails cleanly and retries its init rarely), Triton's
Prometheus endpoint (GPU memory; a model's own KV-pool gauges, tritongen's `llm_engine_*` convention
or the engine's, tritongen.core.engine_metrics; the queueing delay Triton measured per model), and
the plan's arithmetic, which always answers. Each is given its I/O, so tests inject fakes. The chain
reads every source; per scope the first that answered wins, and a source that failed is named in the
snapshot (`failures`), the metrics and the log (once per change, not once per poll).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.admission_capacity import static_reading
from sidecar.admission_types import HeadroomSnapshot, Reading
from tritongen.core.engine_metrics import PROMPT_TOKENS_COUNTER, TRTLLM_BLOCK_TYPE, TRTLLM_KV_BLOCKS, VLLM_USAGE_GAUGES
from tritongen.core.prometheus import KV_GAUGE_SUFFIXES, Sample, kv_gauges, parse_prometheus
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.shared.nvml import Nvml, NvmlUnavailable

log = logging.getLogger("tritongen.sidecar.headroom")


class SourceFailed(Exception):
    """A headroom source could not answer; str() says why."""


@dataclass
class SourceReading:
    readings: list[Reading] = field(default_factory=list)
    gpu_utilization: dict[str, float] = field(default_factory=dict)
    queue_delay_s: dict[str, float] = field(default_factory=dict)
    prompt_tokens_total: dict[str, float] = field(default_factory=dict)  # model -> the engine's counter


class HeadroomSource(Protocol):
    name: str

    async def read(self) -> SourceReading:
        """One reading; raises (SourceFailed or anything else) when the source cannot answer."""
        ...


# ------------------------------------------------------------------------------------------------
# NVML


class NvmlSource:
    """Per-GPU memory and utilisation from NVML. `nvml` is the `pynvml` module (or a fake with the
    same functions); `tritongen.shared.nvml.Nvml` wraps it."""

    name = "nvml"

    def __init__(
        self,
        device_ids: Sequence[str],
        nvml: Any = None,
        clock: Callable[[], float] | None = None,
        retry_init_s: float = 30.0,
    ) -> None:
        self.device_ids = [d for d in device_ids if d.startswith("gpu")]
        self._nvml = Nvml(nvml)
        self._clock = clock
        self._retry_init_s = retry_init_s
        self._init_error: str | None = None
        self._init_failed_at: float | None = None

    def _ensure_init(self) -> None:
        if self._nvml.initialised:
            return
        now = self._clock() if self._clock else None
        if (self._init_error is not None and now is not None and self._init_failed_at is not None
                and now - self._init_failed_at < self._retry_init_s):
            raise SourceFailed(self._init_error)
        try:
            self._nvml.init()
        except NvmlUnavailable as err:
            self._init_error = str(err)
            self._init_failed_at = now
            raise SourceFailed(self._init_error) from None
        self._init_error = None

    async def read(self) -> SourceReading:
        if not self.device_ids:
            raise SourceFailed("no GPU devices in the policy")
        self._ensure_init()
        out = SourceReading()
        for device in self.device_ids:
            index = int(device[3:])
            try:
                handle = self._nvml.handle(index)
                total, used = self._nvml.memory(handle, index)
            except NvmlUnavailable as err:
                raise SourceFailed(str(err)) from None
            out.readings.append(Reading(device, total, used, self.name, live=True))
            util = self._nvml.utilization(handle)  # not supported on every device (MIG slices): not an error
            if util is not None:
                out.gpu_utilization[device] = util
        return out

    def close(self) -> None:
        self._nvml.shutdown()


# ------------------------------------------------------------------------------------------------
# Triton's metrics endpoint

_WANTED_EXACT = frozenset({
    "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_utilization",
    "nv_inference_queue_duration_us", "nv_inference_request_success", "nv_inference_request_failure",
})
_WANTED_EXACT |= {TRTLLM_KV_BLOCKS, *VLLM_USAGE_GAUGES, PROMPT_TOKENS_COUNTER}
_WANTED_SUFFIX = KV_GAUGE_SUFFIXES


def _wanted(name: str) -> bool:
    return name in _WANTED_EXACT or name.endswith(_WANTED_SUFFIX)


@dataclass(frozen=True)
class PoolModel:
    """What the policy knows of an LLM's pool, to turn an engine's block or fraction gauges into bytes."""

    bytes_per_token: float
    pool_bytes: int | None  # all engines together; None: unknown (a fraction gauge cannot be read)


class TritonMetricsSource:
    """GPU memory, model KV pools and queueing delay from Triton's /metrics. `fetch` returns the text."""

    name = "triton_metrics"

    def __init__(
        self, fetch: Callable[[], Awaitable[str]], device_ids: Sequence[str],
        pool_models: Sequence[str] | Mapping[str, PoolModel],
    ) -> None:
        self._fetch = fetch
        self.device_ids = [d for d in device_ids if d.startswith("gpu")]
        self.pool_models: dict[str, PoolModel | None] = (
            dict(pool_models) if isinstance(pool_models, Mapping) else dict.fromkeys(pool_models)
        )
        self._last_queue: dict[str, tuple[float, float]] = {}  # model -> (queue_us, requests)

    async def read(self) -> SourceReading:
        try:
            text = await self._fetch()
        except SourceFailed:
            raise
        except Exception as err:
            raise SourceFailed(f"Triton metrics unreachable: {type(err).__name__}: {err}") from None
        samples = [s for s in parse_prometheus(text, _wanted) if not math.isnan(s.value)]
        if not any(s.name.startswith("nv_") for s in samples) and "nv_" not in text:
            raise SourceFailed("the metrics endpoint answered without any nv_* family; is it Triton's?")
        out = SourceReading()
        gpus = self._gpu_order(samples)
        out.readings.extend(self._gpus(samples, gpus))
        out.readings.extend(self._pools(samples))
        out.queue_delay_s.update(self._queue_delay(samples))
        for s in samples:
            if s.name == PROMPT_TOKENS_COUNTER and s.labels.get("model") in self.pool_models:
                model = s.labels["model"]
                out.prompt_tokens_total[model] = out.prompt_tokens_total.get(model, 0.0) + s.value
        for s in samples:
            uuid = s.labels.get("gpu_uuid", "")
            if s.name == "nv_gpu_utilization" and uuid in gpus and f"gpu{gpus.index(uuid)}" in self.device_ids:
                out.gpu_utilization[f"gpu{gpus.index(uuid)}"] = s.value
        return out

    @staticmethod
    def _gpu_order(samples: list[Sample]) -> list[str]:
        """Triton labels GPUs by UUID only; they are numbered in the order Triton lists them."""
        order: list[str] = []
        for s in samples:
            if s.name == "nv_gpu_memory_total_bytes":
                uuid = s.labels.get("gpu_uuid", "")
                if uuid not in order:
                    order.append(uuid)
        return order

    def _gpus(self, samples: list[Sample], order: list[str]) -> list[Reading]:
        total = {s.labels.get("gpu_uuid", ""): s.value for s in samples if s.name == "nv_gpu_memory_total_bytes"}
        used = {s.labels.get("gpu_uuid", ""): s.value for s in samples if s.name == "nv_gpu_memory_used_bytes"}
        out = []
        for index, uuid in enumerate(order):
            device = f"gpu{index}"
            if device in self.device_ids and uuid in used:
                out.append(Reading(device, int(total[uuid]), int(used[uuid]), self.name, live=True))
        return out

    def _pools(self, samples: list[Sample]) -> list[Reading]:
        out = []
        for model in self.pool_models:
            mine = [s for s in samples if s.labels.get("model") == model]
            own = kv_gauges(mine, model)
            if own.blocks_used is not None and own.blocks_total is not None and own.bytes_per_token:
                per_block = (own.block_tokens or 1) * own.bytes_per_token
                out.append(Reading(f"pool:{model}", int(own.blocks_total * per_block), int(own.blocks_used * per_block), self.name, live=True))
                continue
            engine = self._engine_pool(model, mine)
            if engine is not None:
                out.append(engine)
        return out

    def _engine_pool(self, model: str, mine: list[Sample]) -> Reading | None:
        """The pool from the engine's own gauges (tritongen.core.engine_metrics): TensorRT-LLM's used
        and max blocks with its tokens per block, or vLLM's usage fraction of the policy's pool."""
        known = self.pool_models.get(model)
        if known is None:
            return None
        trt = {s.labels.get(TRTLLM_BLOCK_TYPE): s.value for s in mine if s.name == TRTLLM_KV_BLOCKS}
        if {"used", "max", "tokens_per"} <= trt.keys():
            per_block = trt["tokens_per"] * known.bytes_per_token
            return Reading(f"pool:{model}", int(trt["max"] * per_block), int(trt["used"] * per_block), self.name)
        fractions = [s.value for s in mine if s.name in VLLM_USAGE_GAUGES]
        if fractions and known.pool_bytes:
            fraction = min(1.0, max(0.0, sum(fractions) / len(fractions)))
            return Reading(f"pool:{model}", known.pool_bytes, int(fraction * known.pool_bytes), self.name)
        return None

    def _queue_delay(self, samples: list[Sample]) -> dict[str, float]:
        """Mean time requests spent in Triton's queue since the previous reading, per model."""
        queue_us: dict[str, float] = {}
        requests: dict[str, float] = {}
        for s in samples:
            model = s.labels.get("model")
            if model is None:
                continue
            if s.name == "nv_inference_queue_duration_us":
                queue_us[model] = queue_us.get(model, 0.0) + s.value
            elif s.name in ("nv_inference_request_success", "nv_inference_request_failure"):
                requests[model] = requests.get(model, 0.0) + s.value
        out: dict[str, float] = {}
        for model, q in queue_us.items():
            n = requests.get(model, 0.0)
            last = self._last_queue.get(model)
            self._last_queue[model] = (q, n)
            if last is None:
                continue
            dq, dn = q - last[0], n - last[1]
            if dn > 0 and dq >= 0:
                out[model] = dq / dn / 1e6
            elif dn == 0:
                out[model] = 0.0
        return out


# ------------------------------------------------------------------------------------------------
# Static fallback


class StaticSource:
    """The plan's arithmetic: device memory x utilisation cap, minus what the plan placed there."""

    name = "static"

    def __init__(self, policy: SidecarPolicy) -> None:
        self.policy = policy

    async def read(self) -> SourceReading:
        return SourceReading(readings=[static_reading(d) for d in self.policy.devices])


# ------------------------------------------------------------------------------------------------
# Sources by name


@dataclass(frozen=True)
class SourceInputs:
    """What a headroom source is built from: the policy and the sidecar's injected I/O."""

    policy: SidecarPolicy
    nvml: Any = None  # the pynvml module or a fake; None imports pynvml
    clock: Callable[[], float] | None = None
    fetch_triton_metrics: Callable[[], Awaitable[str]] | None = None

    @property
    def device_ids(self) -> list[str]:
        return [d.id for d in self.policy.devices]

    @property
    def pools(self) -> dict[str, PoolModel]:
        return {m.name: PoolModel(m.kv.bytes_per_token, m.kv.engine_pool_bytes * m.engines if m.kv.engine_pool_bytes
                                  else None) for m in self.policy.models if m.kv is not None}


def _triton_metrics(inputs: SourceInputs) -> TritonMetricsSource:
    if inputs.fetch_triton_metrics is None:
        raise ValueError("the triton_metrics headroom source needs a metrics fetcher")
    return TritonMetricsSource(inputs.fetch_triton_metrics, inputs.device_ids, inputs.pools)


# The names `headroom.sources` of a policy may list, each with how its source is built. A new
# source is a class above with `name` and `read()`, an entry here, and its name in the policy
# schema's `HeadroomPolicy.sources` (tests/unit/test_registries.py checks the two agree).
HEADROOM_SOURCES: dict[str, Callable[[SourceInputs], HeadroomSource]] = {
    "nvml": lambda inputs: NvmlSource(inputs.device_ids, nvml=inputs.nvml, clock=inputs.clock),
    "triton_metrics": _triton_metrics,
    "static": lambda inputs: StaticSource(inputs.policy),
}


def build_sources(names: Sequence[str], inputs: SourceInputs) -> list[HeadroomSource]:
    """The sources NAMES list, in order; an unknown name is an error that lists the known ones."""
    unknown = [n for n in names if n not in HEADROOM_SOURCES]
    if unknown:
        raise ValueError(f"unknown headroom source(s) {unknown}; known: {', '.join(HEADROOM_SOURCES)}")
    return [HEADROOM_SOURCES[n](inputs) for n in names]


# ------------------------------------------------------------------------------------------------
# The chain


class HeadroomChain:
    """Reads every source in order; per scope, the first answer wins; failures are recorded."""

    def __init__(
        self,
        sources: Sequence[HeadroomSource],
        clock: Callable[[], float],
        timeout_s: float = 2.0,
        on_change: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.sources = list(sources)
        self._clock = clock
        self._timeout_s = timeout_s
        self._on_change = on_change
        self.state: dict[str, str | None] = {}  # source -> None (ok) or the last failure
        self.failures_total: dict[str, int] = {s.name: 0 for s in self.sources}

    async def sample(self) -> HeadroomSnapshot:
        readings: dict[str, Reading] = {}
        failures: dict[str, str] = {}
        utilization: dict[str, float] = {}
        delays: dict[str, float] = {}
        prompt_tokens: dict[str, float] = {}
        for source in self.sources:
            try:
                got = await asyncio.wait_for(source.read(), self._timeout_s)
            except asyncio.CancelledError:
                raise
            except asyncio.TimeoutError:
                failures[source.name] = f"no answer within {self._timeout_s:g} s"
            except Exception as err:
                failures[source.name] = str(err) or type(err).__name__
            else:
                for reading in got.readings:
                    readings.setdefault(reading.scope, reading)
                for key, value in got.gpu_utilization.items():
                    utilization.setdefault(key, value)
                for key, value in got.queue_delay_s.items():
                    delays.setdefault(key, value)
                for key, value in got.prompt_tokens_total.items():
                    prompt_tokens.setdefault(key, value)
            self._record(source.name, failures.get(source.name))
        return HeadroomSnapshot(self._clock(), readings, failures, utilization, delays, prompt_tokens)

    def _record(self, name: str, failure: str | None) -> None:
        if failure is not None:
            self.failures_total[name] = self.failures_total.get(name, 0) + 1
        before = self.state.get(name, "unknown")
        self.state[name] = failure
        if before == failure or (before is not None and before != "unknown" and failure is not None):
            return  # unchanged (a failing source that keeps failing is logged once)
        if failure is None:
            if before not in (None, "unknown"):
                log.warning("headroom source %s is back", name)
        else:
            nxt = self._next_after(name)
            log.warning("headroom source %s failed: %s; using %s", name, failure, nxt)
        if self._on_change is not None:
            self._on_change(name, failure)

    def _next_after(self, name: str) -> str:
        names = [s.name for s in self.sources]
        later = names[names.index(name) + 1:] if name in names else []
        return ", ".join(later) or "nothing"
