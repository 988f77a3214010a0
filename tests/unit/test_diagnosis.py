"""doctor's pure rules on synthetic windows: each classic failure is named, healthy windows are not."""

from __future__ import annotations

import pytest

from tritongen.core.diagnosis import busy_fraction, diagnose, instance_count, rule_drift
from tritongen.core.diagnosis_inputs import (
    Device,
    Headroom,
    ModelWindow,
    ServerSnapshot,
    Targets,
    devices_from_samples,
    sidecar_headroom,
    window_from_samples,
)
from tritongen.core.engine_metrics import PY_ENGINE_FAMILY
from tritongen.core.engine_window import engine_windows
from tritongen.doctor import endpoints, normalise_http, parse_metrics
from tritongen.errors import BadInput

TARGETS = Targets(default_budget_ms=250.0, memory_cap=0.85)
WINDOW_S = 10.0


def config(delay_us: int = 1000, mbs: int = 32, levels: int = 0, instances: int = 1, policies: dict | None = None) -> dict:
    db: dict = {"max_queue_delay_microseconds": delay_us, "preferred_batch_size": []}
    if levels:
        db.update(priority_levels=levels, default_priority_level=levels,
                  default_queue_policy={"timeout_action": "REJECT", "default_timeout_microseconds": 0},
                  priority_queue_policy=policies or {})
    return {"name": "m", "max_batch_size": mbs, "dynamic_batching": db,
            "instance_group": [{"kind": "KIND_CPU", "count": instances, "gpus": []}]}


def window(success: float = 100, queue_ms: float = 1.0, exec_ms: float = 5.0, batch: float = 1.0,
           pending: tuple[float, float] = (0, 0), **extra) -> ModelWindow:
    executions = success / batch
    return ModelWindow(
        model="m", success=success, inferences=success, executions=executions,
        queue_us=queue_ms * 1000 * success, compute_infer_us=exec_ms * 1000 * success,
        request_us=(queue_ms + exec_ms) * 1000 * success, pending_start=pending[0], pending_end=pending[1], **extra,
    )


def snap(w: ModelWindow, cfg: dict, **extra) -> ServerSnapshot:
    return ServerSnapshot(url="s:8000", window_s=WINDOW_S, models={w.model: w}, configs={w.model: cfg}, **extra)


def codes(findings) -> list[str]:
    return sorted(f.code for f in findings)


def test_healthy_window_has_no_findings() -> None:
    assert diagnose([snap(window(), config())], TARGETS) == []


def test_busy_fraction_counts_executions_not_requests() -> None:
    # 1000 requests in batches of 4 at 20 ms: 250 executions x 20 ms = 5 s busy of 10 s on 1 instance.
    w = window(success=1000, exec_ms=20, batch=4)
    assert busy_fraction(w, config(), WINDOW_S) == pytest.approx(0.5)
    assert busy_fraction(w, config(instances=2), WINDOW_S) == pytest.approx(0.25)
    assert instance_count({"instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]}) == 4


def test_queueing_from_a_too_large_window() -> None:
    findings = diagnose([snap(window(success=60, queue_ms=390, exec_ms=3, batch=3), config(delay_us=400_000))], TARGETS)
    assert codes(findings) == ["DR101"]
    f = findings[0]
    assert f.field == "dynamic_batching.max_queue_delay_microseconds"
    assert "390.0 ms" in f.message and "125 ms" in f.message and "window is too large" in f.message
    assert "max_queue_delay_microseconds to about 25000" in f.fix  # 10% of the 250 ms budget


def test_queueing_from_a_too_large_batch() -> None:
    # 70 ms executions (> budget/4) with a short window: requests wait for the big batch ahead.
    findings = diagnose([snap(window(success=80, queue_ms=140, exec_ms=70, batch=8), config(delay_us=2000))], TARGETS)
    assert "DR101" in codes(findings)
    assert next(f for f in findings if f.code == "DR101").field == "max_batch_size"


def test_queueing_from_saturation_and_poor_p99() -> None:
    # 10 s window, 1 instance, 1900 executions x 5 ms = 95% busy; queue 200 ms; p99 400 ms > 250.
    w = window(success=1900, queue_ms=200, exec_ms=5, p99_request_us=400_000)
    findings = diagnose([snap(w, config(delay_us=1000))], TARGETS)
    assert codes(findings) == ["DR101", "DR102"]
    assert next(f for f in findings if f.code == "DR101").field == "instance_group"
    assert "P99 is 400.0 ms" in next(f for f in findings if f.code == "DR102").message


def test_a_standing_queue_behind_a_batching_window_is_not_saturation() -> None:
    # Requests pend at both scrapes because the batcher waits 400 ms, while the instance idles.
    w = window(success=75, queue_ms=400, exec_ms=3, batch=3, pending=(3, 3), p99_request_us=405_000)
    assert codes(diagnose([snap(w, config(delay_us=400_000, levels=2))], TARGETS)) == ["DR101"]


def test_high_utilisation_alone_is_not_a_problem() -> None:
    w = window(success=1900, queue_ms=2, exec_ms=5, p99_request_us=20_000)
    assert diagnose([snap(w, config())], TARGETS) == []


def test_gpu_utilisation_counts_as_saturation() -> None:
    w = window(success=100, queue_ms=10, exec_ms=5, p99_request_us=300_000)
    gpu = [Device("GPU-1", 0.97, 10e9, 80e9)]
    assert codes(diagnose([snap(w, config(), devices=gpu)], TARGETS)) == ["DR102"]
    assert diagnose([snap(w, config())], TARGETS) == []


def test_priority_starvation() -> None:
    policies = {"2": {"timeout_action": "DELAY", "default_timeout_microseconds": 0}}
    w = window(success=1300, queue_ms=50, exec_ms=20, batch=4, pending=(6, 7))  # 325 exec x 20 ms = 65% busy...
    # ...but the queue never emptied and requests wait longer than an execution: saturated.
    findings = diagnose([snap(w, config(levels=2, mbs=4, delay_us=0, policies=policies))], TARGETS)
    assert "DR106" in codes(findings)
    f = next(f for f in findings if f.code == "DR106")
    assert "no aging" in f.message and "[2] have no queue timeout" in f.message
    assert "starvation_guard_ms" in f.fix
    # Same load without priority levels: overload, not starvation.
    assert "DR106" not in codes(diagnose([snap(w, config(mbs=4, delay_us=0))], TARGETS))
    # Priority levels on an idle model: nothing starves.
    assert diagnose([snap(window(), config(levels=2))], TARGETS) == []


def test_length_spread_calls_for_lanes() -> None:
    wide = ((64.0, 50.0), (128.0, 80.0), (512.0, 85.0), (2048.0, 98.0), (float("inf"), 100.0))
    findings = diagnose([snap(window(prompt_tokens_buckets=wide), config())], TARGETS)
    assert codes(findings) == ["DR103"]
    assert "lanes: {split_prompt_tokens:" in findings[0].fix
    narrow = ((64.0, 40.0), (128.0, 100.0), (float("inf"), 100.0))
    assert diagnose([snap(window(prompt_tokens_buckets=narrow), config())], TARGETS) == []
    lane = ModelWindow(**{**window(prompt_tokens_buckets=wide).__dict__, "model": "m_short"})
    assert diagnose([ServerSnapshot("s", WINDOW_S, {"m_short": lane}, {"m_short": config()})], TARGETS) == []


def test_memory_near_the_watermark() -> None:
    near = [Device("GPU-a", 0.5, 0.84 * 80e9, 80e9), Device("GPU-b", 0.5, 0.5 * 80e9, 80e9)]
    findings = diagnose([snap(window(), config(), devices=near)], TARGETS)
    assert codes(findings) == ["DR104"] and "GPU-a" in findings[0].message
    rooms = [Headroom("gpu0", 10 * 2**30, 60 * 2**30), Headroom("pool:m", 1 * 2**20, 64 * 2**20)]
    low = diagnose([snap(window(), config(), headroom=rooms)], TARGETS)
    assert codes(low) == ["DR104"] and low[0].severity == "warning" and low[0].model == "m"
    assert "1.0 MiB more of 64 MiB on pool:m" in low[0].message


def test_failures() -> None:
    w = window(success=90, failure=10, failure_by_reason={"REJECTED": 10})
    findings = diagnose([snap(w, config())], TARGETS)
    assert codes(findings) == ["DR107"] and "REJECTED 10" in findings[0].message


def test_drift_between_replicas() -> None:
    a = snap(window(), config(delay_us=1000), index=[{"name": "m", "state": "READY"}, {"name": "x", "state": "READY"}])
    b = snap(window(), config(delay_us=3000, instances=2), index=[{"name": "m", "state": "READY"}])
    b = ServerSnapshot(url="t:8000", window_s=WINDOW_S, models=b.models, configs=b.configs, index=b.index)
    findings = rule_drift([a, b])
    assert [(f.model, f.code) for f in findings] == [("x", "DR105"), ("m", "DR105")]
    assert "not on t:8000" in findings[0].message
    m = findings[1]
    assert "dynamic_batching.max_queue_delay_microseconds: s:8000 = 1000, t:8000 = 3000" in m.message
    assert "instance_group[0].count" in m.message
    assert rule_drift([a, a]) == [] and rule_drift([a]) == []


METRICS_BEFORE = """
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 100
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 1
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 0
nv_inference_count{model="m",version="1"} 100
nv_inference_exec_count{model="m",version="1"} 50
nv_inference_queue_duration_us{model="m",version="1"} 1000
nv_inference_compute_infer_duration_us{model="m",version="1"} 5000
nv_inference_request_duration_us{model="m",version="1"} 7000
nv_inference_pending_request_count{model="m",version="1"} 3
sidecar_prompt_tokens_bucket{model="m",le="64"} 5
sidecar_prompt_tokens_bucket{model="m",le="+Inf"} 10
"""
METRICS_AFTER = """
nv_inference_request_success{model="m",version="1"} 300
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 5
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 0
nv_inference_count{model="m",version="1"} 300
nv_inference_exec_count{model="m",version="1"} 100
nv_inference_queue_duration_us{model="m",version="1"} 41000
nv_inference_compute_infer_duration_us{model="m",version="1"} 25000
nv_inference_request_duration_us{model="m",version="1"} 77000
nv_inference_pending_request_count{model="m",version="1"} 1
nv_inference_request_summary_us{model="m",version="1",quantile="0.99"} 950
llm_engine_kv_blocks_used{instance="i0",model="m",version="1"} 30
llm_engine_kv_blocks_total{instance="i0",model="m",version="1"} 40
sidecar_prompt_tokens_bucket{model="m",le="64"} 15
sidecar_prompt_tokens_bucket{model="m",le="+Inf"} 30
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 100
nv_gpu_memory_total_bytes{gpu_uuid="GPU-1"} 1000
sidecar_headroom_bytes{scope="gpu0",source="nvml"} 500
sidecar_headroom_bytes{scope="pool:m",source="triton_metrics"} 20
sidecar_memory_capacity_bytes{scope="pool:m",source="triton_metrics"} 640
"""


def test_window_from_two_scrapes() -> None:
    w = window_from_samples(parse_metrics(METRICS_BEFORE), parse_metrics(METRICS_AFTER))["m"]
    assert (w.success, w.failure, w.inferences, w.executions) == (200, 4, 200, 50)
    assert w.failure_by_reason == {"REJECTED": 4}
    assert w.mean_queue_ms == pytest.approx(0.2)  # 40000 us / 200
    assert w.compute_per_exec_ms == pytest.approx(0.1)
    assert w.mean_batch == 4
    assert (w.pending_start, w.pending_end) == (3, 1)
    assert w.p99_request_us == 950
    engine = engine_windows([parse_metrics(METRICS_BEFORE), parse_metrics(METRICS_AFTER)], 10.0)["m"]
    assert engine.family == PY_ENGINE_FAMILY and engine.kv_used.last == pytest.approx(0.75)
    assert w.prompt_tokens_buckets == ((64.0, 10.0), (float("inf"), 20.0))
    after = parse_metrics(METRICS_AFTER)
    assert sidecar_headroom(after) == [Headroom("gpu0", 500, None), Headroom("pool:m", 20, 640)]
    assert devices_from_samples(after) == [Device("GPU-1", 0.5, 100, 1000)]


def test_parse_metrics_keeps_triton_names_and_labels() -> None:
    samples = parse_metrics('nv_inference_request_success{model="a,b",version="1"} 3 1700000000\nnv_cpu_utilization 0.5\n')
    assert samples[("nv_inference_request_success", (("model", "a,b"), ("version", "1")))] == 3.0
    assert samples[("nv_cpu_utilization", ())] == 0.5


def test_endpoint_arguments() -> None:
    assert normalise_http("http://10.0.0.1:8000/") == "10.0.0.1:8000"
    (e,) = endpoints(["10.0.0.1:8000"], [])
    assert e.metrics == ["http://10.0.0.1:8002/metrics"]
    with pytest.raises(BadInput, match="one per server"):
        endpoints(["a:1", "b:1"], ["http://a:2/metrics"])
    with pytest.raises(BadInput, match="HOST:PORT"):
        normalise_http("localhost")
