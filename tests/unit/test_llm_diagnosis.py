"""doctor on LLM engines: windows from the engines' and the sidecar's metrics, and the rules over them.

Scrapes are written in each exporter's own names and labels (vLLM's `model_name`, Triton's vllm_backend
`model`, TensorRT-LLM's `request_type` / `kv_cache_block_type`, the sidecar's prometheus_client names),
so a rename on either side fails here, not in production.
"""

from __future__ import annotations

import pytest

from sidecar.accounting import upstream_outcome
from sidecar.metrics import SidecarMetrics
from tritongen.core.diagnosis import diagnose
from tritongen.core.diagnosis_inputs import ClassTarget, Headroom, ModelWindow, ServerSnapshot, Targets
from tritongen.core.engine_window import (
    SIDECAR_ADMITTED,
    SIDECAR_FINISHED,
    SIDECAR_QUEUE_WAIT,
    SIDECAR_REJECTED,
    SIDECAR_TTFT,
    Histogram,
    engine_windows,
    sidecar_windows,
)
from tritongen.core.llm_diagnosis import blind_spots, engine_knobs
from tritongen.doctor import parse_metrics

WINDOW_S = 10.0
VLLM_CONFIG = {"name": "llm", "backend": "vllm", "max_batch_size": 0, "model_transaction_policy": {"decoupled": True}}
PY_CONFIG = {"name": "llm", "backend": "python", "max_batch_size": 0, "model_transaction_policy": {"decoupled": True}}
TTFT_BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)  # the backend's own
UPSTREAM_LABELS = 'model="llm",version="1"'  # Triton's vllm_backend


def ttft_lines(name: str, labels: str, seconds: list[float], bounds: tuple[float, ...] = TTFT_BOUNDS,
               with_sum: bool = False) -> str:
    """A cumulative histogram of `seconds` in the vLLM backend's TTFT buckets (or `bounds`)."""
    rows = [f'{name}_bucket{{{labels},le="{le}"}} {sum(1 for s in seconds if s <= le)}' for le in bounds]
    rows.append(f'{name}_bucket{{{labels},le="+Inf"}} {len(seconds)}')
    rows.append(f"{name}_count{{{labels}}} {len(seconds)}")
    if with_sum:
        rows.append(f"{name}_sum{{{labels}}} {sum(seconds)}")
    return "\n".join(rows)


def upstream_scrape(ttft: list[float], e2e: list[float], with_sum: bool = True, gauges: str = "") -> dict:
    """What Triton's own vllm_backend exports, cumulative: token counters and histograms, no gauges
    (unless `gauges` adds some)."""
    return parse_metrics("\n".join([
        f"vllm:prompt_tokens_total{{{UPSTREAM_LABELS}}} {100 * len(e2e)}",
        f"vllm:generation_tokens_total{{{UPSTREAM_LABELS}}} {50 * len(e2e)}",
        ttft_lines("vllm:time_to_first_token_seconds", UPSTREAM_LABELS, ttft, with_sum=with_sum),
        ttft_lines("vllm:e2e_request_latency_seconds", UPSTREAM_LABELS, e2e, E2E_BOUNDS, with_sum),
        gauges,
    ]))


def upstream_window(ttft: list[float], e2e: list[float], with_sum: bool = True, gauges: str = "") -> list[dict]:
    """Two scrapes of the upstream backend: 50 quick requests before the window, then `ttft` / `e2e` in it."""
    before_ttft, before_e2e = [0.03] * 50, [0.5] * 50
    return [upstream_scrape(before_ttft, before_e2e, with_sum, gauges),
            upstream_scrape(before_ttft + ttft, before_e2e + e2e, with_sum, gauges)]


def vllm_scrape(running: float, waiting: float, usage: float, preemptions: float, ttft: list[float] | None = None,
                label: str = "model_name") -> dict:
    text = f"""
vllm:num_requests_running{{{label}="llm"}} {running}
vllm:num_requests_waiting{{{label}="llm"}} {waiting}
vllm:kv_cache_usage_perc{{{label}="llm"}} {usage}
vllm:num_preemptions_total{{{label}="llm"}} {preemptions}
nv_inference_request_success{{model="llm",version="1"}} 0
"""
    if ttft is not None:
        text += ttft_lines("vllm:time_to_first_token_seconds", f'{label}="llm"', ttft)
    return parse_metrics(text)


def snap_of(scrapes: list[dict], config: dict = VLLM_CONFIG, success: float = 200, sidecar=None,
            headroom=()) -> ServerSnapshot:
    engines = engine_windows(scrapes, WINDOW_S)
    return ServerSnapshot("triton:8000", WINDOW_S, {"llm": ModelWindow("llm", success=success)}, {"llm": config},
                          engines=engines, sidecar=sidecar or {}, headroom=headroom)


TARGETS = Targets(budget_ms={"llm": 200.0},
                  classes={"llm": {"interactive": ClassTarget(200.0, 0.3), "batch": ClassTarget(10_000.0, 0.7)}},
                  max_num_seqs={"llm": 32})


def codes(findings) -> list[str]:
    return sorted(f.code for f in findings)


# ---------------------------------------------------------------------------------------------
# Histograms


def test_histogram_quantiles_and_the_bounds_on_a_target() -> None:
    hist = Histogram(((0.1, 10.0), (0.5, 50.0), (1.0, 90.0), (float("inf"), 100.0)))
    assert hist.count == 100
    assert hist.quantile(0.5) == pytest.approx(0.5)
    assert hist.quantile(0.7) == pytest.approx(0.75)  # 20 of the 40 in (0.5, 1.0]
    assert hist.quantile(0.99) == 1.0  # in +Inf: "at least" the last bound
    # 0.2 s lies inside (0.1, 0.5]: between 10% and 50% came within it
    assert hist.share_within(0.2) == (0.1, 0.5)
    assert hist.share_within(0.5) == (0.5, 0.5)
    assert Histogram().quantile(0.5) is None and Histogram().share_within(1.0) == (0.0, 1.0)
    # without `_sum`, the mean from the midpoints; the +Inf bucket's at the last bound
    assert hist.bucket_mean() == pytest.approx((10 * 0.05 + 40 * 0.3 + 40 * 0.75 + 10 * 1.0) / 100)
    assert Histogram().bucket_mean() is None


# ---------------------------------------------------------------------------------------------
# Engine windows in each exporter's names


def test_vllm_gauges_are_summarised_over_every_scrape_and_counters_are_deltas() -> None:
    scrapes = [vllm_scrape(10, 0, 0.5, 100), vllm_scrape(32, 40, 0.97, 110), vllm_scrape(30, 20, 0.9, 130)]
    e = engine_windows(scrapes, WINDOW_S)["llm"]
    assert e.family == "vLLM" and "vllm:num_requests_waiting" in e.metrics
    assert e.waiting.mean == pytest.approx(20.0) and e.waiting.peak == 40 and e.waiting.last == 20
    assert e.kv_used.peak == pytest.approx(0.97)
    assert e.preemptions == 30 and e.preemptions_per_s == pytest.approx(3.0)
    # Triton's vllm_backend labels the same names `model`
    assert engine_windows([vllm_scrape(1, 0, 0.1, 0, label="model")], WINDOW_S)["llm"].running.last == 1


def test_tensorrt_llm_request_and_block_metrics() -> None:
    def scrape(active: float, waiting: float, used: float) -> dict:
        return parse_metrics(f"""
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} {active}
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="waiting",version="1"}} {waiting}
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="max",version="1"}} 64
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} {used}
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} 1000
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"}} 64
""")
    e = engine_windows([scrape(4, 0, 500), scrape(6, 9, 990)], WINDOW_S)["tensorrt_llm"]
    assert e.family == "TensorRT-LLM" and e.max_running == 64
    assert e.kv_used.peak == pytest.approx(0.99) and e.waiting.mean == pytest.approx(4.5)
    # KV full, 9 waiting, 5 of 64 running: requests too large, and the queue waits on KV
    config = {"name": "tensorrt_llm", "backend": "tensorrtllm", "model_transaction_policy": {"decoupled": True}}
    snap = ServerSnapshot("t:8000", WINDOW_S, {}, {"tensorrt_llm": config},
                          engines={"tensorrt_llm": e})
    findings = diagnose([snap], Targets())
    assert codes(findings) == ["DR108", "DR111"]
    assert all("parameters.kv_cache_free_gpu_mem_fraction" in f.fix for f in findings)


def test_a_python_backend_counts_its_own_kills() -> None:
    def scrape(kills: float) -> dict:
        return parse_metrics(f"""
llm_engine_kv_blocks_used{{model="llm",version="1"}} 10
llm_engine_kv_blocks_total{{model="llm",version="1"}} 40
llm_engine_running_sequences{{model="llm",version="1"}} 3
llm_engine_waiting_sequences{{model="llm",version="1"}} 0
llm_engine_oom_errors_total{{model="llm",version="1"}} {kills}
""")
    snap = snap_of([scrape(2), scrape(9)], config=PY_CONFIG)
    (kill,) = diagnose([snap], TARGETS)
    assert kill.code == "DR112" and kill.message.startswith("7 requests were killed")
    assert "tritongen sidecar" in kill.fix and "engine.max_num_seqs" in kill.fix


# ---------------------------------------------------------------------------------------------
# The rules on a vLLM engine


def test_a_drowning_vllm_engine_gets_kv_preemption_and_ttft_findings() -> None:
    slow = [4.0] * 60 + [8.0] * 20 + [0.05] * 2
    scrapes = [vllm_scrape(30, 150, 0.92, 0, ttft=[]), vllm_scrape(32, 200, 0.99, 298, ttft=slow)]
    findings = diagnose([snap_of(scrapes, success=298)], TARGETS)
    assert codes(findings) == ["DR108", "DR109", "DR110"]
    by = {f.code: f for f in findings}
    assert "gpu_memory_utilization in llm/1/model.json" in by["DR108"].fix
    assert "298 preemptions" in by["DR109"].message and "max_num_seqs in llm/1/model.json" in by["DR109"].fix
    assert "P99" in by["DR110"].message and "200 ms" in by["DR110"].message
    assert "past its capacity" in by["DR110"].message


def test_a_lightly_loaded_engine_gets_none() -> None:
    quick = [0.03] * 100
    scrapes = [vllm_scrape(2, 0, 0.1, 0, ttft=[]), vllm_scrape(3, 0, 0.12, 0, ttft=quick)]
    assert diagnose([snap_of(scrapes)], TARGETS) == []


def test_a_target_inside_a_bucket_is_never_called_missed() -> None:
    """200 ms lies inside (0.1, 0.25]: every first token in that bucket may have been in time."""
    scrapes = [vllm_scrape(2, 0, 0.1, 0, ttft=[]), vllm_scrape(2, 0, 0.1, 0, ttft=[0.24] * 100)]
    assert diagnose([snap_of(scrapes)], TARGETS) == []
    late = [vllm_scrape(2, 0, 0.1, 0, ttft=[]), vllm_scrape(2, 0, 0.1, 0, ttft=[0.3] * 100)]
    (finding,) = diagnose([snap_of(late)], TARGETS)
    assert finding.code == "DR110" and "prefill itself is slow" in finding.message
    assert "max_num_batched_tokens" in finding.fix


def test_an_engine_wide_histogram_is_judged_by_the_classes_shares() -> None:
    """Priority scheduling may serve the 30% interactive share in time and the batch share late: the
    engine-wide histogram only proves a miss when fewer first tokens came within a class's target
    than that share (x 0.99), or when the looser class's own target is missed."""
    ordered = [0.05] * 30 + [3.0] * 70  # interactive first, batch within its 10 s
    scrapes = [vllm_scrape(10, 0, 0.5, 0, ttft=[]), vllm_scrape(10, 0, 0.5, 0, ttft=ordered)]
    assert diagnose([snap_of(scrapes)], TARGETS) == []
    too_few = [0.05] * 20 + [3.0] * 80  # at most 20% within 200 ms: some interactive requests missed
    scrapes = [vllm_scrape(10, 0, 0.5, 0, ttft=[]), vllm_scrape(10, 0, 0.5, 0, ttft=too_few)]
    (finding,) = diagnose([snap_of(scrapes)], TARGETS)
    assert finding.code == "DR110" and "class interactive's target" in finding.message
    late_batch = [0.05] * 90 + [12.0] * 10  # the batch class's 10 s target missed by 10%
    scrapes = [vllm_scrape(10, 0, 0.5, 0, ttft=[]), vllm_scrape(10, 0, 0.5, 0, ttft=late_batch)]
    (finding,) = diagnose([snap_of(scrapes)], TARGETS)
    assert "class batch's target" in finding.message and "10000 ms" in finding.message


def test_few_preemptions_among_many_requests_are_not_a_problem() -> None:
    scrapes = [vllm_scrape(10, 0, 0.5, 0), vllm_scrape(10, 0, 0.5, 6)]
    assert diagnose([snap_of(scrapes, success=1000)], TARGETS) == []  # 0.6% of the requests
    assert codes(diagnose([snap_of(scrapes, success=60)], TARGETS)) == ["DR109"]  # 10%


def test_kv_full_with_few_running_means_requests_too_large() -> None:
    scrapes = [vllm_scrape(4, 0, 0.95, 0), vllm_scrape(4, 0, 0.96, 0)]
    (finding,) = diagnose([snap_of(scrapes)], TARGETS)  # 4 of the spec's 32
    assert finding.code == "DR111" and "4.0 sequences running" in finding.message
    assert "max_model_len" in finding.fix
    unbounded = Targets(budget_ms={"llm": 200.0})  # no bound known: "few" cannot be judged
    assert diagnose([snap_of(scrapes)], unbounded) == []


def test_waiting_at_the_sequence_bound_with_kv_to_spare_calls_for_more_sequences() -> None:
    scrapes = [vllm_scrape(32, 10, 0.35, 0), vllm_scrape(32, 14, 0.4, 0)]
    (finding,) = diagnose([snap_of(scrapes)], TARGETS)  # 32 of the spec's 32 running, KV at 40%
    assert finding.code == "DR113" and "bound of 32 sequences" in finding.message
    assert "raise max_num_seqs in llm/1/model.json" in finding.fix and "about 32 more" in finding.fix
    below = [vllm_scrape(20, 10, 0.35, 0), vllm_scrape(20, 14, 0.4, 0)]  # below the bound: something else waits
    assert diagnose([snap_of(below)], TARGETS) == []


# ---------------------------------------------------------------------------------------------
# The sidecar's view


def sidecar_text(interactive_ttft: list[float], killed: int, admitted: int = 100, refused: int = 3) -> str:
    m = SidecarMetrics()
    for seconds in interactive_ttft:
        m.ttft.labels("interactive", "llm").observe(seconds)
        m.latency.labels("interactive", "llm").observe(seconds + 1)
        m.queue_wait.labels("interactive").observe(0.5)
    m.admitted.labels("interactive", "llm").inc(admitted)
    m.rejected.labels("batch", "llm", "queue_full").inc(refused)
    m.outcomes.labels("interactive", "llm", upstream_outcome("out of memory: 16 of 1920 tokens are free")).inc(killed)
    m.outcomes.labels("interactive", "llm", "ok").inc(admitted - killed)
    return m.exposition().decode()


def test_the_sidecar_names_are_the_ones_it_exports() -> None:
    samples = parse_metrics(sidecar_text([0.1], 1))
    exported = {name for name, _ in samples}
    assert {SIDECAR_TTFT, SIDECAR_QUEUE_WAIT, SIDECAR_REJECTED, SIDECAR_FINISHED, SIDECAR_ADMITTED} <= exported
    assert upstream_outcome(b'{"error":"out of memory: the request needs 112 tokens"}') == "oom"
    assert upstream_outcome("model not found") == "upstream_error"


def test_sidecar_classes_are_judged_against_their_own_targets_and_kills_counted() -> None:
    before = parse_metrics(sidecar_text([], 0, admitted=0, refused=0))
    after = parse_metrics(sidecar_text([0.9] * 30, 12, admitted=30))
    windows = sidecar_windows(before, after)
    w = windows["llm"]
    assert w.oom_kills == 12 and w.refused == 3
    assert w.classes["interactive"].ttft.count == 30
    snap = snap_of([], config=PY_CONFIG, sidecar=windows)
    findings = diagnose([snap], TARGETS)
    assert codes(findings) == ["DR110", "DR112"]
    by = {f.code: f for f in findings}
    assert "class interactive" in by["DR110"].message and "200 ms target" in by["DR110"].message
    assert "the sidecar held interactive requests 375 ms at the P50" in by["DR110"].message  # inside (0.25, 0.5]
    assert "overstates the pool" in by["DR112"].fix
    assert blind_spots(snap) == []  # the sidecar sees it


def test_a_sidecar_that_reserves_more_than_the_engine_holds() -> None:
    rooms = [Headroom("pool:llm", 1 * 2**20, 64 * 2**20)]
    scrapes = [vllm_scrape(3, 0, 0.3, 0), vllm_scrape(3, 0, 0.3, 0)]
    findings = diagnose([snap_of(scrapes, headroom=rooms)], TARGETS)
    assert codes(findings) == ["DR104", "DR111"]  # the headroom is low; and the engine has room
    (finding,) = [f for f in findings if f.code == "DR111"]
    assert "policy.kv_safety_pad_mb" in finding.fix and "30% full" in finding.message


# ---------------------------------------------------------------------------------------------
# What doctor could not see


def test_a_decoupled_model_without_metrics_is_named_never_called_healthy() -> None:
    snap = ServerSnapshot("t:8000", WINDOW_S, {"llm": ModelWindow("llm", success=300)}, {"llm": PY_CONFIG})
    assert diagnose([snap], TARGETS) == []
    (spot,) = blind_spots(snap)
    assert spot.model == "llm" and "the engine's queue" in spot.missing and "--sidecar-metrics-url" in spot.how
    classic = ServerSnapshot("t:8000", WINDOW_S, {}, {"m": {"name": "m", "backend": "onnxruntime"}})
    assert blind_spots(classic) == []


def test_the_vllm_backends_own_histograms_leave_the_queue_unseen() -> None:
    """Triton's vllm_backend exports TTFT but no queue or KV gauges: doctor says what is missing."""
    text = ttft_lines("vllm:time_to_first_token_seconds", 'model="llm",version="1"', [0.03] * 10)
    snap = snap_of([parse_metrics(text)])
    (spot,) = blind_spots(snap)
    assert "time to first token" not in spot.missing and "its KV-cache usage" in spot.missing
    assert spot.why == "its vLLM metrics leave these out" and spot.inferred == ()
    assert "(its vLLM metrics leave these out). To see them, export" in spot.text


# ---------------------------------------------------------------------------------------------
# The upstream vLLM backend: the queue inferred by Little's law


OVERLOADED_TTFT = [0.05] * 10 + [3.0] * 90  # 10% found a slot at once, the rest waited about 3 s
OVERLOADED_E2E = [t + 3.0 for t in OVERLOADED_TTFT]  # then 3 s of decoding each


@pytest.mark.parametrize("with_sum", [True, False])
def test_an_overloaded_engine_behind_the_upstream_backend_is_past_its_capacity(with_sum: bool) -> None:
    """100 completions in 10 s, TTFT about 2.7 s on average against a P10 of 60 ms: Little's law puts
    about 26 requests in the engine's queue and 29 decoding; DR110 blames capacity, not long prompts."""
    scrapes = upstream_window(OVERLOADED_TTFT, OVERLOADED_E2E, with_sum)
    e = engine_windows(scrapes, WINDOW_S)["llm"]
    assert e.inferred == ("running", "waiting") and e.waiting.samples == 0 and e.kv_used is None
    assert e.waiting.mean >= 20 and e.waiting.peak == e.waiting.mean
    # 10/s x 3 s of decoding; the midpoints of the backend's coarse buckets (2.5-5 s, 5-10 s) read 3.75 s
    assert e.running.mean == pytest.approx(10 * 3.0, rel=0.01 if with_sum else 0.3)
    assert "10.0 completions/s" in e.inference and "above its P10 baseline" in e.inference
    snap = snap_of(scrapes)
    (finding,) = diagnose([snap], TARGETS)  # no KV gauge: DR108, DR111 and DR113 cannot be judged
    assert finding.code == "DR110" and "the engine is past its capacity" in finding.message
    assert "about " in finding.message and "inferred from its TTFT and latency histograms" in finding.message
    assert "the backend exports no running-sequence or queue gauge" in finding.message
    assert "prefill itself is slow" not in finding.message
    (spot,) = blind_spots(snap)
    assert spot.missing == ("its KV-cache usage", "preemptions or out-of-memory kills")
    assert spot.inferred == ("the engine's queue", "its running sequences") and spot.inference == e.inference
    assert spot.text.startswith("llm: could not see its KV-cache usage, preemptions or out-of-memory kills (its vLLM "
                                "metrics leave these out); inferred the engine's queue and its running sequences by "
                                "Little's law from its TTFT and end-to-end latency histograms: ")
    assert ". To see them, export the engine's state" in spot.text


def test_a_light_load_behind_the_upstream_backend_queues_nothing() -> None:
    """Every first token near the baseline: under one request waits, and within target nothing fires."""
    scrapes = upstream_window([0.03] * 100, [1.0] * 100)
    e = engine_windows(scrapes, WINDOW_S)["llm"]
    assert e.inferred == ("running", "waiting") and e.waiting.mean < 1.0
    assert e.running.mean == pytest.approx(10 * 0.97)
    snap = snap_of(scrapes)
    assert diagnose([snap], TARGETS) == []
    (spot,) = blind_spots(snap)
    assert "the engine's queue" not in spot.missing and "the engine's queue" in spot.inferred


def test_a_uniformly_slow_first_token_with_no_inferred_queue_is_a_long_prefill() -> None:
    """Every first token at 300 ms, none faster: the baseline is slow itself, so nothing waits."""
    scrapes = upstream_window([0.3] * 100, [1.0] * 100)
    (finding,) = diagnose([snap_of(scrapes)], TARGETS)
    assert finding.code == "DR110" and "so the prefill itself is slow" in finding.message
    assert "inferred from its TTFT and latency histograms" in finding.message


def test_real_gauges_win_over_the_inference() -> None:
    gauges = f"vllm:num_requests_running{{{UPSTREAM_LABELS}}} 7\nvllm:num_requests_waiting{{{UPSTREAM_LABELS}}} 0"
    e = engine_windows(upstream_window(OVERLOADED_TTFT, OVERLOADED_E2E, gauges=gauges), WINDOW_S)["llm"]
    assert e.inferred == () and e.inference == ""
    assert e.running.mean == 7 and e.waiting.mean == 0 and e.waiting.samples == 2
    # only the gauge that is missing is inferred
    running_only = f"vllm:num_requests_running{{{UPSTREAM_LABELS}}} 7"
    e = engine_windows(upstream_window(OVERLOADED_TTFT, OVERLOADED_E2E, gauges=running_only), WINDOW_S)["llm"]
    assert e.inferred == ("waiting",) and e.running.mean == 7 and e.running.samples == 2 and e.waiting.mean >= 20
    (finding,) = diagnose([snap_of(upstream_window(OVERLOADED_TTFT, OVERLOADED_E2E, gauges=running_only))], TARGETS)
    assert "the backend exports no queue gauge" in finding.message and "and 7.0 ran" in finding.message


def test_too_few_completions_infer_nothing() -> None:
    e = engine_windows(upstream_window([3.0] * 4, [6.0] * 4), WINDOW_S)["llm"]
    assert e.running is None and e.waiting is None and e.inferred == () and e.inference == ""
    # the TTFT histogram alone (no end-to-end one) infers nothing either
    only_ttft = parse_metrics(ttft_lines("vllm:time_to_first_token_seconds", UPSTREAM_LABELS, [3.0] * 100))
    assert engine_windows([only_ttft], WINDOW_S)["llm"].inferred == ()


def test_the_knobs_follow_the_backend() -> None:
    assert engine_knobs("m", {"backend": "vllm"}).file == "m/1/model.json"
    assert "kv_cache_free_gpu_mem_fraction" in engine_knobs("m", {"backend": "tensorrtllm"}).kv
    rendered = {"backend": "python", "parameters": {"kv_pool_blocks": {"string_value": "64"}}}
    assert "rendered into m/config.pbtxt" in engine_knobs("m", rendered).file
    assert engine_knobs("m", {"backend": "python"}).seqs == "engine.max_num_seqs"
