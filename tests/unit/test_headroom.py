"""Headroom sources with fake probes injected, and the chain that falls through when one fails."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import Reading
from sidecar.headroom import (
    PoolModel,
    HeadroomChain,
    NvmlSource,
    SourceFailed,
    SourceReading,
    StaticSource,
    TritonMetricsSource,
)
from tritongen.core.sidecar_policy.schema import parse_policy
from tests.sidecar_rigs import FakeClock, policy_doc


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------------
# NVML


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class FakeNvml:
    """The few pynvml functions the source calls, over a table of devices."""

    def __init__(self, devices: list[tuple[int, int]], util: list[int] | None = None,
                 init_error: Exception | None = None) -> None:
        self.devices = devices
        self.util = util
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.devices):
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        total, used = self.devices[handle]
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        if self.util is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=self.util[handle], memory=0)


def test_nvml_reads_every_gpu_with_utilisation() -> None:
    nvml = FakeNvml([(80, 30), (80, 50)], util=[40, 90])
    source = NvmlSource(["gpu0", "gpu1", "cpu"], nvml=nvml)
    got = run(source.read())
    assert got.readings == [Reading("gpu0", 80, 30, "nvml"), Reading("gpu1", 80, 50, "nvml")]
    assert got.gpu_utilization == {"gpu0": 0.4, "gpu1": 0.9}
    run(source.read())
    assert nvml.init_calls == 1  # initialised once
    source.close()
    assert nvml.shutdown_calls == 1


def test_nvml_without_utilisation_support_still_reads_memory() -> None:
    got = run(NvmlSource(["gpu0"], nvml=FakeNvml([(10, 1)])).read())
    assert got.readings[0].used_bytes == 1 and got.gpu_utilization == {}


def test_nvml_absent_degrades_and_retries_rarely() -> None:
    clock = FakeClock()
    nvml = FakeNvml([(10, 1)], init_error=NVMLError_LibraryNotFound())
    source = NvmlSource(["gpu0"], nvml=nvml, clock=clock, retry_init_s=30)
    with pytest.raises(SourceFailed, match="NVML unavailable: .*NVML Shared Library Not Found"):
        run(source.read())
    with pytest.raises(SourceFailed, match="NVML unavailable"):
        run(source.read())
    assert nvml.init_calls == 1  # not retried within 30 s
    clock.advance(31)
    nvml.init_error = None  # the driver came back
    assert run(source.read()).readings[0].scope == "gpu0"
    assert nvml.init_calls == 2


def test_nvml_device_that_vanished_is_a_failure() -> None:
    with pytest.raises(SourceFailed, match="cannot read gpu3"):
        run(NvmlSource(["gpu3"], nvml=FakeNvml([(10, 1)])).read())


def test_nvml_with_no_gpu_in_the_policy_is_a_failure() -> None:
    with pytest.raises(SourceFailed, match="no GPU devices"):
        run(NvmlSource(["cpu"], nvml=FakeNvml([])).read())


def test_real_pynvml_on_this_machine() -> None:
    """The real module: on a machine without a GPU it fails cleanly (NVMLError_LibraryNotFound or
    a driver error), never with an unhandled exception."""
    source = NvmlSource(["gpu0"], nvml=pynvml)
    try:
        got = run(source.read())
    except SourceFailed as err:
        assert str(err).startswith("NVML unavailable") or "cannot read gpu0" in str(err)
    else:
        assert got.readings and got.readings[0].total_bytes > 0
    finally:
        source.close()


# ------------------------------------------------------------------------------------------------
# Triton metrics


METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tinyllm",version="1"} 10
nv_inference_request_failure{model="tinyllm",reason="BACKEND",version="1"} 0
nv_inference_queue_duration_us{model="tinyllm",version="1"} 50000
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 8000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 3000
nv_gpu_memory_total_bytes{gpu_uuid="GPU-b"} 8000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 1000
nv_gpu_utilization{gpu_uuid="GPU-b"} 0.25
llm_engine_kv_blocks_used{instance="tinyllm_0_0",model="tinyllm",version="1"} 3
llm_engine_kv_blocks_used{instance="tinyllm_0_1",model="tinyllm",version="1"} 2
llm_engine_kv_blocks_total{instance="tinyllm_0_0",model="tinyllm",version="1"} 10
llm_engine_kv_blocks_total{instance="tinyllm_0_1",model="tinyllm",version="1"} 10
llm_engine_kv_bytes_per_token{instance="tinyllm_0_0",model="tinyllm",version="1"} 512
llm_engine_kv_block_tokens{instance="tinyllm_0_0",model="tinyllm",version="1"} 16
other_kv_blocks_used{model="other"} 1
"""


def fetcher(*texts: str | Exception) -> Any:
    queue = list(texts)

    async def fetch() -> str:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        return item

    return fetch


def test_triton_metrics_skips_nan_samples() -> None:
    text = 'nv_gpu_memory_total_bytes{gpu_uuid="a"} 8000\nnv_gpu_memory_used_bytes{gpu_uuid="a"} NaN\n'
    got = run(TritonMetricsSource(fetcher(text), ["gpu0"], []).read())
    assert got.readings == []  # an unknown used figure is no reading


def test_triton_metrics_gpus_pools_and_utilisation() -> None:
    source = TritonMetricsSource(fetcher(METRICS), ["gpu0", "gpu1"], ["tinyllm", "absent"])
    got = run(source.read())
    by_scope = {r.scope: r for r in got.readings}
    assert by_scope["gpu0"] == Reading("gpu0", 8000, 3000, "triton_metrics")
    assert by_scope["gpu1"] == Reading("gpu1", 8000, 1000, "triton_metrics")
    # two instances: 20 blocks x 16 tokens x 512 B in all, 5 used
    assert by_scope["pool:tinyllm"] == Reading("pool:tinyllm", 20 * 16 * 512, 5 * 16 * 512, "triton_metrics")
    assert "pool:absent" not in by_scope
    assert got.gpu_utilization == {"gpu1": 0.25}
    assert got.queue_delay_s == {}  # the first reading has no previous one to difference


def test_triton_metrics_only_reports_gpus_the_policy_has() -> None:
    got = run(TritonMetricsSource(fetcher(METRICS), ["gpu1"], []).read())
    assert [r.scope for r in got.readings] == ["gpu1"]


def test_triton_metrics_queue_delay_between_readings() -> None:
    later = METRICS.replace("} 10\n", "} 14\n").replace("} 50000\n", "} 90000\n")
    idle = later
    source = TritonMetricsSource(fetcher(METRICS, later, idle), [], [])
    run(source.read())
    # 40 ms of queueing over 4 requests
    assert run(source.read()).queue_delay_s == {"tinyllm": pytest.approx(0.010)}
    assert run(source.read()).queue_delay_s == {"tinyllm": 0.0}  # no requests: no delay


def test_triton_metrics_unreachable_or_not_triton() -> None:
    with pytest.raises(SourceFailed, match="Triton metrics unreachable: ConnectionRefusedError"):
        run(TritonMetricsSource(fetcher(ConnectionRefusedError("refused")), [], []).read())
    with pytest.raises(SourceFailed, match="without any nv_"):
        run(TritonMetricsSource(fetcher("up 1\n"), [], []).read())


def test_static_source_is_the_plan() -> None:
    policy = parse_policy(policy_doc(devices=[
        {"id": "gpu0", "memory_bytes": 1000, "utilization_cap": 0.5, "static_used_bytes": 100},
    ]))
    got = run(StaticSource(policy).read())
    assert got.readings == [Reading("gpu0", 500, 100, "static", live=False)]


# ------------------------------------------------------------------------------------------------
# the chain


class Switchable:
    """A source whose answer a test changes: a reading, or an error."""

    def __init__(self, name: str, *readings: Reading) -> None:
        self.name = name
        self.readings = list(readings)
        self.error: Exception | None = None
        self.hang = False

    async def read(self) -> SourceReading:
        if self.hang:
            await asyncio.sleep(10)
        if self.error is not None:
            raise self.error
        return SourceReading(readings=list(self.readings))


def test_chain_first_answer_wins_and_failures_fall_through(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    nvml = Switchable("nvml", Reading("gpu0", 100, 10, "nvml"))
    metrics = Switchable("triton_metrics", Reading("gpu0", 100, 20, "triton_metrics"),
                         Reading("pool:llm", 50, 5, "triton_metrics"))
    static = Switchable("static", Reading("gpu0", 90, 0, "static", live=False))
    changes: list[tuple[str, str | None]] = []
    chain = HeadroomChain([nvml, metrics, static], clock, on_change=lambda n, f: changes.append((n, f)))
    snap = run(chain.sample())
    assert snap.readings["gpu0"].source == "nvml" and snap.readings["pool:llm"].source == "triton_metrics"
    assert snap.failures == {} and snap.taken_at == clock()

    nvml.error = SourceFailed("NVML unavailable: NVML Shared Library Not Found")
    with caplog.at_level(logging.WARNING, logger="tritongen.sidecar.headroom"):
        for _ in range(3):
            snap = run(chain.sample())
    assert snap.readings["gpu0"].source == "triton_metrics"
    assert snap.failures == {"nvml": "NVML unavailable: NVML Shared Library Not Found"}
    assert chain.failures_total["nvml"] == 3
    failed_logs = [r.message for r in caplog.records if "failed" in r.message]
    assert failed_logs == ["headroom source nvml failed: NVML unavailable: NVML Shared Library Not Found; "
                           "using triton_metrics, static"]  # logged once, not once per poll

    metrics.error = RuntimeError("boom")
    snap = run(chain.sample())
    assert snap.readings["gpu0"].source == "static" and "pool:llm" not in snap.readings
    assert set(snap.failures) == {"nvml", "triton_metrics"}

    nvml.error = metrics.error = None
    with caplog.at_level(logging.WARNING, logger="tritongen.sidecar.headroom"):
        snap = run(chain.sample())
    assert snap.failures == {} and snap.readings["gpu0"].source == "nvml"
    assert any("nvml is back" in r.message for r in caplog.records)
    assert ("nvml", None) in changes and changes[0] == ("nvml", None)


def test_chain_times_out_a_hanging_source() -> None:
    slow = Switchable("nvml", Reading("gpu0", 1, 0, "nvml"))
    slow.hang = True
    static = Switchable("static", Reading("gpu0", 9, 0, "static", live=False))
    chain = HeadroomChain([slow, static], FakeClock(), timeout_s=0.05)
    snap = run(chain.sample())
    assert snap.failures == {"nvml": "no answer within 0.05 s"} and snap.readings["gpu0"].source == "static"


def test_admission_uses_what_the_chain_found() -> None:
    clock = FakeClock()
    state = AdmissionState(parse_policy(policy_doc()), clock)
    nvml = NvmlSource(["gpu0"], nvml=FakeNvml([], init_error=NVMLError_LibraryNotFound()), clock=clock)
    metrics = TritonMetricsSource(fetcher(METRICS.replace("tinyllm", "llm")), ["gpu0"], ["llm"])
    chain = HeadroomChain([nvml, metrics, StaticSource(state.policy)], clock)
    state.observe_headroom(run(chain.sample()))
    status = state.status()
    assert status["headroom_failures"]["nvml"].startswith("NVML unavailable")  # type: ignore[index]
    assert status["scopes"]["gpu0"]["source"] == "triton_metrics"  # type: ignore[index]
    assert status["scopes"]["pool:llm"]["capacity_bytes"] == 20 * 16 * 512 - 5 * 16 * 512  # type: ignore[index]


ENGINE_METRICS = """# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 80000000000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 70000000000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 1000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 250
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
vllm:kv_cache_usage_perc{model="vllm_model",version="1"} 0.4
"""


def test_engine_pools_from_tensorrt_llm_blocks_and_vllm_usage() -> None:
    pools = {"tensorrt_llm": PoolModel(bytes_per_token=100.0, pool_bytes=None),
             "vllm_model": PoolModel(bytes_per_token=10.0, pool_bytes=5000)}
    got = run(TritonMetricsSource(fetcher(ENGINE_METRICS), ["gpu0"], pools).read())
    readings = {r.scope: r for r in got.readings}
    trt = readings["pool:tensorrt_llm"]  # blocks x tokens per block x the policy's bytes per token
    assert (trt.total_bytes, trt.used_bytes) == (1000 * 64 * 100, 250 * 64 * 100)
    vllm = readings["pool:vllm_model"]  # a fraction of the pool the policy knows
    assert (vllm.total_bytes, vllm.used_bytes) == (5000, 2000)
