"""The simulator over whole seeded runs, and what feeds it: the same seed gives the same result,
results hold together, summaries share one window, a config.pbtxt becomes the same model, fitted
overheads and hand-offs recover what was put in, and traffic is generated as its spec says.
Single scheduling rules against hand-computed scenarios are in test_simulator.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tritongen.core.simulator import (
    OK,
    QUEUE_FULL,
    BatcherConfig,
    LiveObservation,
    ModelSim,
    Overheads,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
    fit_overheads,
    measurement_window,
    model_sim_from_config,
    rate_limit_from_flags,
    simulate,
    simulate_detail,
    summarize_requests,
)
from tritongen.core.traffic import (
    Bursty,
    TrafficSpec,
    TraceError,
    bursty_rates,
    generate_arrivals,
    parse_trace_csv,
    scale_rate,
)
from tritongen.pbtxt import parse_model_config

POLICY = QueuePolicy(max_queue_size=100)  # any policy turns prefetching off: batches form on a free instance


def model(mbs=8, fixed=5.0, per_item=1.0, **kw) -> ModelSim:
    return ModelSim(name="m", max_batch_size=mbs, curve=ServiceCurve(fixed_ms=fixed, per_item_ms=per_item), **kw)


# ---------------------------------------------------------------------------------------------
# Determinism, outputs, conversions


def spec(rate=300.0, shape="poisson", **kw) -> TrafficSpec:
    return TrafficSpec(
        shape=shape, rate_per_s=rate, duration_s=20, warmup_s=1,
        classes=[{"name": "hi", "share": 0.3, "priority": 1}, {"name": "lo", "share": 0.7, "priority": 2}], **kw,
    )


def busy_server(jitter=0.05) -> ServerSim:
    b = BatcherConfig(preferred_batch_sizes=[4, 8], max_queue_delay_us=2000, priority_levels=2, default_priority_level=2,
                      default_queue_policy=QueuePolicy(timeout_us=200_000, max_queue_size=64))
    return ServerSim(
        models=[model(mbs=8, fixed=4.0, per_item=0.5, dynamic_batching=b)],
        overheads=Overheads(request_ms=1.0, batch_ms=0.5, jitter_cv=jitter, completion_wake_p=0.3, completion_wake_p_idle=0.7),
    )


def test_the_same_seed_gives_the_same_result_and_another_seed_another() -> None:
    arr = generate_arrivals(spec(), seed=3)
    a = simulate(busy_server(), arr, seed=1)
    b = simulate(busy_server(), arr, seed=1)
    c = simulate(busy_server(), arr, seed=2)
    assert a.model_dump() == b.model_dump()
    assert a.model_dump() != c.model_dump()
    assert generate_arrivals(spec(), seed=3).t.tolist() == arr.t.tolist()
    assert generate_arrivals(spec(), seed=4).t.tolist() != arr.t.tolist()


def test_results_hold_together() -> None:
    arr = generate_arrivals(spec(rate=500.0), seed=5)
    res = simulate(busy_server(), arr, seed=0)
    for c in res.classes:
        assert c.completed + c.rejected + c.oom_killed + c.other_errors == c.sent
        assert c.p50_ms <= c.p90_ms <= c.p99_ms
    hi, lo = res.klass("hi"), res.klass("lo")
    assert hi.p99_ms < lo.p99_ms  # priority buys the tail
    assert 0.0 < res.models[0].utilisation <= 1.0
    assert res.throughput_per_s == pytest.approx(sum(c.throughput_per_s for c in res.classes))
    assert res.throughput_per_s == pytest.approx(500.0 * (1 - sum(c.failed_fraction * c.sent for c in res.classes) / sum(c.sent for c in res.classes)), rel=0.1)


def test_summaries_use_one_window_and_one_definition() -> None:
    t = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    window = measurement_window(t, warmup_s=1.0)
    assert window[0] == 1.0 and 4.0 < window[1] < 5.0
    done = t + np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    status = np.array([OK, OK, QUEUE_FULL, OK, OK, OK])
    stats, total = summarize_requests(t, done, status, np.zeros(6, dtype=np.int64), ["a"], window)
    s = stats[0]
    assert s.sent == 4 and s.completed == 3 and s.rejected_queue_full == 1
    assert s.p50_ms == pytest.approx(400.0)


def test_a_config_pbtxt_becomes_the_same_model() -> None:
    text = """
name: "ranker"
backend: "python"
max_batch_size: 16
input { name: "FEATURES" data_type: TYPE_FP32 dims: [ 32 ] }
output { name: "SCORES" data_type: TYPE_FP32 dims: [ 1 ] }
instance_group { kind: KIND_CPU count: 2 rate_limiter { resources { name: "compute" count: 1 } } }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 3000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 9000 max_queue_size: 7 }
  priority_queue_policy { key: 1 value { timeout_action: REJECT default_timeout_microseconds: 5000 max_queue_size: 3 } }
}
"""
    m = model_sim_from_config(parse_model_config(text), curve=ServiceCurve(fixed_ms=1, per_item_ms=1))
    b = m.dynamic_batching
    assert m.max_batch_size == 16 and m.instances == 2 and m.resources == {"compute": 1}
    assert b.preferred_batch_sizes == [4, 8] and b.max_queue_delay_us == 3000 and not b.prefetching
    assert b.policy(1) == QueuePolicy(timeout_us=5000, action="REJECT", max_queue_size=3)
    assert b.policy(2) == QueuePolicy(timeout_us=9000, action="DELAY", max_queue_size=7)
    assert rate_limit_from_flags(["--rate-limit=execution_count", "--rate-limit-resource=compute:2"]) == (True, {"compute": 2})
    assert rate_limit_from_flags(["--rate-limit-resource=compute:4:1"]) == (False, {"compute:1": 4})


def test_no_preferred_size_means_max_batch_size_as_the_server_fills_it_in() -> None:
    m = model(mbs=12, dynamic_batching=BatcherConfig(max_queue_delay_us=1))
    assert m.batcher().preferred_batch_sizes == [12]


def test_fit_overheads_recovers_what_was_put_in() -> None:
    curve = ServiceCurve(fixed_ms=10.0, per_item_ms=1.5)
    batches = {rows: (100, curve.ms(rows) + 0.8 + 0.1 * rows) for rows in (1, 2, 4, 8)}
    obs = [LiveObservation(client_mean_ms=30.0, server_mean_ms=27.5, batches=batches)]
    ov = fit_overheads(obs, curve)
    assert ov.request_ms == pytest.approx(2.5)
    assert ov.batch_ms == pytest.approx(0.8, abs=1e-3)
    assert ov.request_exec_ms == pytest.approx(0.1, abs=1e-3)


def test_a_curve_that_already_holds_one_requests_cost_is_not_charged_it_twice() -> None:
    """A static-batch LLM: its curve (rows in one request) holds one request's decode; each further
    request in an execution adds one more. The live instance time is curve + 10 x (requests - 1),
    so the fit's intercept is -10: kept, not clipped to 0, so one request costs its curve."""
    curve = ServiceCurve(fixed_ms=100.0, per_item_ms=1.0)
    batches = {n: (50, curve.ms(n) + 10.0 * (n - 1)) for n in (1, 2, 3, 4, 5)}
    ov = fit_overheads([LiveObservation(client_mean_ms=120.0, server_mean_ms=119.0, batches=batches)], curve)
    assert ov.request_exec_ms == pytest.approx(10.0, abs=1e-3) and ov.batch_ms == pytest.approx(-10.0, abs=1e-3)
    assert ov.batch_ms + ov.request_exec_ms == pytest.approx(0.0, abs=1e-3)
    # rounded apart (3 and 4 decimals), the two must still make a valid pair (bench-zoo, 13:27:
    # -12.236 + 12.2357 was refused)
    odd = {n: (50, curve.ms(n) + 12.2357 * (n - 1)) for n in (1, 2, 3, 4, 5)}
    ov = fit_overheads([LiveObservation(client_mean_ms=120.0, server_mean_ms=119.0, batches=odd)], curve)
    Overheads.model_validate(ov.model_dump())
    assert ov.batch_ms + ov.request_exec_ms >= 0.0


def test_overheads_refuse_an_execution_cheaper_than_its_curve() -> None:
    with pytest.raises(ValueError, match="batch_ms may be negative only as far as request_exec_ms"):
        Overheads(batch_ms=-2.0, request_exec_ms=1.0)


# ---------------------------------------------------------------------------------------------
# Traffic


def test_poisson_rate_and_class_mix() -> None:
    arr = generate_arrivals(spec(rate=200.0), seed=1)
    assert arr.mean_rate == pytest.approx(200.0, rel=0.05)
    share_hi = float(np.mean(arr.cls == 0))
    assert share_hi == pytest.approx(0.3, abs=0.03)
    assert np.all(np.diff(arr.t) >= 0)
    assert arr.priorities().tolist()[:5] == [1 if c == 0 else 2 for c in arr.cls[:5]]


def test_bursty_traffic_has_the_mean_rate_and_its_bursts() -> None:
    s = spec(rate=100.0, shape="bursty", bursty=Bursty(on_s=1.0, off_s=4.0, burst_factor=5.0))
    on, off = bursty_rates(s.bursty, 100.0)
    assert on == pytest.approx(5 * off) and (on * 1 + off * 4) / 5 == pytest.approx(100.0)
    arr = generate_arrivals(s.model_copy(update={"duration_s": 200.0}), seed=2)
    phase = np.mod(arr.t, 5.0)
    in_burst = float(np.mean(phase < 1.0))
    assert in_burst == pytest.approx(on * 1 / (on * 1 + off * 4), abs=0.03)
    assert arr.mean_rate == pytest.approx(100.0, rel=0.05)


def test_daily_traffic_peaks_where_asked() -> None:
    s = spec(rate=100.0, shape="daily", daily={"period_s": 100.0, "peak_to_trough": 4.0, "peak_at": 0.25})
    arr = generate_arrivals(s.model_copy(update={"duration_s": 400.0}), seed=3)
    counts = np.histogram(np.mod(arr.t, 100.0), bins=4, range=(0, 100))[0]
    assert int(np.argmax(counts)) == 0 or counts[0] + counts[1] > counts[2] + counts[3]
    peak = np.sum((np.mod(arr.t, 100.0) > 20) & (np.mod(arr.t, 100.0) < 30))
    trough = np.sum((np.mod(arr.t, 100.0) > 70) & (np.mod(arr.t, 100.0) < 80))
    assert peak / trough == pytest.approx(4.0, rel=0.35)


def test_requests_sets_the_count_and_scale_rate_compresses_time() -> None:
    arr = generate_arrivals(spec(rate=50.0), seed=1, requests=1234)
    assert len(arr) == 1234
    fast = scale_rate(arr, 2.0)
    assert fast.mean_rate == pytest.approx(2 * arr.mean_rate)
    assert fast.cls.tolist() == arr.cls.tolist()


def test_trace_replay_parses_sorts_and_checks() -> None:
    text = "timestamp,class,prompt_tokens,output_tokens\n100.5,lo,10,5\n100.0,hi,20,8\n# comment\n\n101.0,lo,30,2\n"
    s = TrafficSpec(shape="trace", trace={"path": "t.csv", "time_scale": 2.0},
                    classes=[{"name": "hi", "share": 0.5, "priority": 1}, {"name": "lo", "share": 0.5, "priority": 2}])
    arr = parse_trace_csv(text, s)
    assert arr.t.tolist() == [0.0, 0.25, 0.5]
    assert [arr.class_names[c] for c in arr.cls] == ["hi", "lo", "lo"]
    assert arr.prompt.tolist() == [20, 10, 30] and arr.output.tolist() == [8, 5, 2]
    assert generate_arrivals(s, trace_text=text).t.tolist() == arr.t.tolist()
    with pytest.raises(TraceError, match=":3: class 'mid'"):
        parse_trace_csv("timestamp,class,prompt_tokens,output_tokens\n1,hi,1,1\n2,mid,1,1\n", s)
    with pytest.raises(TraceError, match="lacks"):
        parse_trace_csv("time,class\n1,hi\n", s)
    with pytest.raises(TraceError, match=":2:"):
        parse_trace_csv("timestamp,class,prompt_tokens,output_tokens\nsoon,hi,1,1\n", s)


def test_traffic_spec_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="add up"):
        TrafficSpec(shape="poisson", rate_per_s=1, classes=[{"name": "a", "share": 0.5}])
    with pytest.raises(ValueError, match="needs a `bursty:`"):
        TrafficSpec(shape="bursty", rate_per_s=1, classes=[{"name": "a", "share": 1}])
    with pytest.raises(ValueError, match="rate_per_s"):
        TrafficSpec(shape="poisson", classes=[{"name": "a", "share": 1}])
    with pytest.raises(ValueError):
        TrafficSpec(shape="poisson", rate_per_s=1, classes=[{"name": "a", "share": 1}], surprise=1)


def _policy_model(delay_us: int = 2000) -> ModelSim:
    b = BatcherConfig(preferred_batch_sizes=[4, 8], max_queue_delay_us=delay_us, default_queue_policy=POLICY)
    return model(mbs=8, fixed=10.0, per_item=1.0, dynamic_batching=b)


def _handoffs(server: ServerSim, arr, seeds: int = 3):
    stats = []
    for seed in range(seeds):
        sim = simulate_detail(server, arr, seed=seed)
        stats.append(sim.handoff_stats())
    return stats


def test_an_instance_that_comes_back_late_slows_every_hand_off_and_the_saturated_rate() -> None:
    # Saturated, one request per batch (max_batch_size 1): each cycle is the 10 ms execution plus
    # the release delay (mean 2 ms), so the rate falls from 100/s to ~83/s.
    m = model(mbs=1, fixed=10.0, per_item=0.0, dynamic_batching=BatcherConfig(default_queue_policy=POLICY))
    arr = generate_arrivals(spec(rate=150.0).model_copy(update={"duration_s": 20.0}), seed=2)
    prompt = simulate(ServerSim(models=[m], overheads=Overheads()), arr)
    late = simulate(ServerSim(models=[m], overheads=Overheads(release_ms=2.0)), arr)
    assert prompt.throughput_per_s == pytest.approx(100.0, rel=0.02)
    assert late.throughput_per_s == pytest.approx(1000.0 / 12.0, rel=0.03)
    # and a hand-off's delay is the release plus the batcher's wake-up
    # (exponential: with a 0.2 ms mean, one release in a thousand takes longer than LATE_S)
    stats = _handoffs(ServerSim(models=[m], overheads=Overheads(release_ms=0.2, wake_ms=0.1)), arr, seeds=1)[0]
    assert stats.handoffs > 1000 and stats.lost_share < 0.005
    assert stats.gap_mean_ms == pytest.approx(0.3, rel=0.1)


def test_lost_wakes_show_in_the_hand_offs_at_the_chance_given_and_grow_with_load() -> None:
    m = _policy_model()
    low = generate_arrivals(spec(rate=60.0).model_copy(update={"duration_s": 30.0}), seed=4)
    high = generate_arrivals(spec(rate=150.0).model_copy(update={"duration_s": 12.0}), seed=5)
    flat = ServerSim(models=[m], overheads=Overheads(completion_wake_p_idle=0.8))
    lost = [x.lost_share for x in _handoffs(flat, low)]
    # a lost wake recovered within LATE_S by a lucky arrival is not seen, so a little under 20%
    assert 0.13 < float(np.mean(lost)) < 0.21
    grows = ServerSim(models=[m], overheads=Overheads(completion_wake_p_idle=0.8, wake_loss_doubling_per_s=50.0))
    # below the reference rate (200/s) the load-dependent loss is smaller, and it grows with load
    low_share = float(np.mean([x.lost_share for x in _handoffs(grows, low)]))
    high_share = float(np.mean([x.lost_share for x in _handoffs(grows, high)]))
    assert low_share < 0.05 < high_share
    ideal = ServerSim(models=[m], overheads=Overheads())
    assert all(x.lost == 0 for x in _handoffs(ideal, low))


def test_fit_handoff_recovers_the_hand_offs_that_made_the_trace() -> None:
    from tritongen.core.simulator import Handoff, fit_handoff

    m = _policy_model()
    truth = Handoff(release_ms=0.4, completion_wake_p=1.0, completion_wake_p_idle=0.7, wake_loss_doubling_per_s=50.0)
    runs = []
    for rate, seed in ((60.0, 4), (150.0, 5)):
        arr = generate_arrivals(spec(rate=rate).model_copy(update={"duration_s": 10.0}), seed=seed)
        live = simulate_detail(ServerSim(models=[m], overheads=truth.applied(Overheads())), arr, seed=99).handoff_stats()
        runs.append((ServerSim(models=[m], overheads=Overheads()), arr, live))
    grid = dict(release_grid=(0.0, 0.4, 1.0), p_slot_grid=(1.0,), p_idle_grid=(0.7, 0.95), doubling_grid=(0.0, 50.0), seeds=2)
    assert fit_handoff(runs, **grid) == truth
    # one load alone cannot tell how fast the loss grows; holding the doubling still finds the rest
    held = dict(grid, doubling_grid=(50.0,))
    assert fit_handoff(runs[:1], **held) == truth


def test_fit_wake_chances_finds_the_lost_wakes_from_the_mean_batch_alone() -> None:
    from tritongen.core.simulator import BatchedRun, Handoff, fit_wake_chances

    m = _policy_model()
    truth = Handoff(release_ms=0.3, completion_wake_p=1.0, completion_wake_p_idle=0.75, wake_loss_doubling_per_s=0.0)
    arr = generate_arrivals(spec(rate=60.0).model_copy(update={"duration_s": 30.0}), seed=4)
    res = simulate(ServerSim(models=[m], overheads=truth.applied(Overheads())), arr, seed=99)
    live_batch = res.models[0].mean_batch_rows
    # the witness moves with the lost share: a server that loses no wake batches less
    ideal = simulate(ServerSim(models=[m], overheads=truth._replace(completion_wake_p_idle=1.0).applied(Overheads())), arr, seed=99)
    assert ideal.models[0].mean_batch_rows < live_batch - 0.02
    start = truth._replace(completion_wake_p_idle=1.0)  # what a trace under another race would have said
    run = BatchedRun(ServerSim(models=[m], overheads=Overheads()), arr, live_batch)
    fitted = fit_wake_chances([run], start, p_slot_grid=(1.0,), p_idle_grid=(0.5, 0.75, 0.95))
    assert fitted == truth  # release and doubling kept from the trace, the chance found
    assert fit_wake_chances([], start) == start


def test_an_instance_holding_rate_limiter_resources_loses_more_wakes() -> None:
    b = BatcherConfig(preferred_batch_sizes=[4, 8], max_queue_delay_us=2000, default_queue_policy=POLICY)
    limited = model(mbs=8, fixed=10.0, per_item=1.0, dynamic_batching=b, resources={"compute": 1})
    free = model(mbs=8, fixed=10.0, per_item=1.0, dynamic_batching=b)
    arr = generate_arrivals(spec(rate=60.0).model_copy(update={"duration_s": 30.0}), seed=4)

    def lost(m: ModelSim, rate_limit: bool, factor: float) -> float:
        ov = Overheads(completion_wake_p_idle=0.8, rate_limited_wake_loss=factor)
        server = ServerSim(models=[m], rate_limit=rate_limit, resources={"compute": 2}, overheads=ov)
        return float(np.mean([x.lost_share for x in _handoffs(server, arr)]))

    base = lost(free, True, 1.5)
    assert 0.13 < base < 0.21  # no resources held: the plain chance (as in the test above)
    assert lost(limited, True, 1.5) > base * 1.3  # holding resources: half as much loss again
    assert lost(limited, True, 1.0) == pytest.approx(base, rel=0.15)  # the factor off
    assert lost(limited, False, 1.5) == pytest.approx(base, rel=0.15)  # a server that does not rate-limit
