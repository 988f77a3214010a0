"""The simulator against queueing theory: results any correct build reproduces, whatever the host.

Each case sets the simulator up as the textbook queue (no overheads, no lost wakes) and compares
with the closed form. Arrivals and service draws are seeded, so a verdict never changes between
runs; the tolerances are several standard errors of the sample means (100k-request runs), so they
also hold for other seeds (`test_the_closed_forms_hold_for_other_seeds`).

- M/D/1: Pollaczek-Khinchine, mean wait rho D / (2 (1 - rho)); the chance to wait at all is rho.
- M/M/c: Erlang C, P(wait) = C(c, a), mean wait C / (c mu - lambda).
- A saturated dynamic batcher: every execution carries max_batch_size rows, so throughput is
  instances x B / curve(B).
- A recorded trace (CSV with Unix timestamps, three classes) replayed through the batcher, every
  request's latency worked out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tritongen.core.simulator import (
    OK,
    BatcherConfig,
    ModelSim,
    Overheads,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
    simulate_detail,
)
from tritongen.core.traffic import TrafficSpec, generate_arrivals, parse_trace_csv

REQUESTS = 100_000


def poisson(rate: float, seed: int, requests: int = REQUESTS):
    spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=requests / rate, classes=[{"name": "a", "share": 1.0}])
    return generate_arrivals(spec, seed=seed, requests=requests)


def unbatched(service_ms: float, instances: int = 1) -> ModelSim:
    """A model without dynamic batching: each request is its own execution, FIFO over instances."""
    return ModelSim(name="m", max_batch_size=0, instances=instances, curve=ServiceCurve(fixed_ms=service_ms, per_item_ms=0.0))


def waits_ms(sim) -> np.ndarray:
    """Queue waits (execution start - arrival) of the requests sent in the measurement window."""
    t_send, t_start = np.asarray(sim.t_send), np.asarray(sim.t_start)
    w0, w1 = sim.window
    keep = (np.asarray(sim.status) == OK) & (t_send >= w0) & (t_send <= w1)
    return (t_start - t_send)[keep] * 1000.0


def erlang_c(c: int, offered: float) -> float:
    """The chance that an arrival waits in M/M/c with offered load `offered` = lambda / mu (< c)."""
    top = offered**c / math.factorial(c) * c / (c - offered)
    return top / (sum(offered**k / math.factorial(k) for k in range(c)) + top)


# ---------------------------------------------------------------------------------------------
# M/D/1


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_m_d_1_mean_wait_is_pollaczek_khinchine(rho: float, seed: int = 1) -> None:
    service_ms = 10.0
    sim = simulate_detail(ServerSim(models=[unbatched(service_ms)]), poisson(rho / service_ms * 1000.0, seed))
    w = waits_ms(sim)
    expected = rho * service_ms / (2 * (1 - rho))  # 5 ms at 0.5, 20 ms at 0.8
    assert w.mean() == pytest.approx(expected, rel=0.08 if rho > 0.7 else 0.04)  # ~3 standard errors
    assert (w > 1e-9).mean() == pytest.approx(rho, abs=0.01)  # PASTA: an arrival waits iff the server is busy
    latency = (np.asarray(sim.t_done) - np.asarray(sim.t_send))[np.asarray(sim.status) == OK] * 1000.0
    assert latency.min() == pytest.approx(service_ms)  # no overheads: latency = wait + D exactly


# ---------------------------------------------------------------------------------------------
# M/M/c


def test_m_m_3_wait_is_erlang_c(seed: int = 2) -> None:
    c, mean_service_ms, rate = 3, 10.0, 240.0  # offered 2.4 erlang, 80% per instance
    exponential = Overheads(jitter_cv=1.0, jitter_shape="gamma")
    sim = simulate_detail(ServerSim(models=[unbatched(mean_service_ms, c)], overheads=exponential), poisson(rate, seed))
    w = waits_ms(sim)
    offered = rate * mean_service_ms / 1000.0
    p_wait = erlang_c(c, offered)  # 0.647
    mean_wait = p_wait / (c * 1000.0 / mean_service_ms - rate) * 1000.0  # 10.8 ms
    assert (w > 1e-9).mean() == pytest.approx(p_wait, abs=0.015)
    assert w.mean() == pytest.approx(mean_wait, rel=0.08)  # ~3 standard errors (seeds 2, 11-15: -4.5..+0.6%)
    assert sim.result.models[0].utilisation == pytest.approx(offered / c, abs=0.01)


def test_gamma_jitter_with_cv_1_is_exponential(seed: int = 3) -> None:
    """The M/M/c case rests on the service draws being exponential: mean 1, cv 1, P(X > 1) = 1/e."""
    sim = simulate_detail(ServerSim(models=[unbatched(1.0)], overheads=Overheads(jitter_cv=1.0, jitter_shape="gamma")),
                          poisson(1.0, seed, 20_000))
    draws = np.asarray([sim._jitter_factor() for _ in range(50_000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.02)
    assert draws.std() == pytest.approx(1.0, abs=0.03)
    assert (draws > 1.0).mean() == pytest.approx(math.exp(-1), abs=0.01)


# ---------------------------------------------------------------------------------------------
# A saturated batcher


@pytest.mark.parametrize("instances, policy", [(1, None), (2, None), (1, QueuePolicy(max_queue_size=0, timeout_us=0))])
def test_a_saturated_batcher_runs_full_batches_at_b_over_curve_of_b(instances: int, policy, seed: int = 4) -> None:
    mbs, fixed, per_item = 8, 10.0, 1.5  # a full batch takes 22 ms: 363.6 req/s per instance
    batching = BatcherConfig(max_queue_delay_us=2000, **({"default_queue_policy": policy} if policy else {}))
    model = ModelSim(name="m", max_batch_size=mbs, instances=instances, dynamic_batching=batching,
                     curve=ServiceCurve(fixed_ms=fixed, per_item_ms=per_item))
    capacity = instances * mbs / (fixed + per_item * mbs) * 1000.0
    sim = simulate_detail(ServerSim(models=[model]), poisson(2.5 * capacity, seed, 30_000))
    res = sim.result
    assert res.throughput_per_s == pytest.approx(capacity, rel=0.01)
    assert res.models[0].mean_batch_rows == pytest.approx(mbs, abs=0.01)
    assert res.models[0].utilisation == pytest.approx(1.0, abs=0.01)


# ---------------------------------------------------------------------------------------------
# Closed forms for other seeds: the tolerances are not fitted to one draw


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_closed_forms_hold_for_other_seeds(seed: int) -> None:
    test_m_d_1_mean_wait_is_pollaczek_khinchine(0.8, seed)
    test_m_m_3_wait_is_erlang_c(seed)


# ---------------------------------------------------------------------------------------------
# A recorded trace with a known answer

# Recorded with Unix timestamps (float64 holds them to ~0.1 us, so latencies are compared to the
# microsecond); the replay shifts them to start at 0. Three classes with Triton
# priorities 1-3 (the spec's), one instance, max batch 4, a 5 ms window, strict priority.
TRACE = """timestamp,class,prompt_tokens,output_tokens
1732870000.000,batch,0,0
1732870000.001,normal,0,0
1732870000.002,interactive,0,0
1732870000.030,batch,0,0
1732870000.030,batch,0,0
1732870000.030,batch,0,0
1732870000.031,batch,0,0
1732870000.032,interactive,0,0
1732870000.100,normal,0,0
"""
TRACE_SPEC = TrafficSpec(shape="trace", trace={"path": "recorded.csv"}, classes=[
    {"name": "interactive", "share": 0.3, "priority": 1},
    {"name": "normal", "share": 0.5, "priority": 2},
    {"name": "batch", "share": 0.2, "priority": 3},
])


def test_a_recorded_trace_replays_to_the_latencies_worked_out_by_hand() -> None:
    arrivals = parse_trace_csv(TRACE, TRACE_SPEC)
    batching = BatcherConfig(max_queue_delay_us=5000, priority_levels=3, default_priority_level=2,
                             preferred_batch_sizes=[4])
    model = ModelSim(name="m", max_batch_size=4, dynamic_batching=batching, curve=ServiceCurve(fixed_ms=10.0, per_item_ms=1.0))
    sim = simulate_detail(ServerSim(models=[model]), arrivals)
    # By hand (ms from the first request; exec = 10 + rows):
    #  0,1,2      three requests, below the preferred 4: the batch leaves when the oldest has waited
    #             5 ms, at 5; 3 rows -> done at 18.  Latencies 18, 17, 16.
    #  30 x3, 31  four batch-class requests fill the preferred size at 31: out at once, 4 rows ->
    #             done at 45.  Latencies 15, 15, 15, 14.
    #  32         interactive, alone behind a busy instance; its 5 ms window ends at 37, the instance
    #             frees at 45 (no prefetch with priority levels): starts at 45, 1 row -> done at 56.
    #             Latency 24.
    #  100        normal, alone, an idle instance: out at 105, done at 116.  Latency 16.
    latencies = [round((sim.t_done[i] - sim.t_send[i]) * 1000.0, 3) for i in range(len(arrivals))]
    assert latencies == [18.0, 17.0, 16.0, 15.0, 15.0, 15.0, 14.0, 24.0, 16.0]
    assert [arrivals.class_names[c] for c in arrivals.cls] == [
        "batch", "normal", "interactive", "batch", "batch", "batch", "batch", "interactive", "normal"]
    assert sim.result.models[0].executions == 4
