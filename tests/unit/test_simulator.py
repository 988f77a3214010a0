"""The simulator against scenarios computed by hand, one scheduling rule at a time.

Unless a test says otherwise: no overheads, a curve of `fixed + per_item x rows` ms, and requests
given as explicit send times (seconds). Latencies are asserted to the microsecond. Whole seeded
runs, traffic generation and the hand-off model are in test_simulator_runs.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tritongen.core.engine import EngineModel, LLMCurve
from tritongen.core.simulator import (
    OK,
    OOM,
    QUEUE_FULL,
    TIMEOUT,
    TOO_LARGE,
    BatcherConfig,
    ModelSim,
    Overheads,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
    simulate_detail,
)
from tritongen.core.traffic import Arrivals

MS = 1e-3


def arrivals(times_ms, classes=None, names=("a",), priorities=(0,), prompt=None, output=None, models=None) -> Arrivals:
    n = len(times_ms)
    return Arrivals(
        t=np.asarray(times_ms, dtype=float) * MS,
        cls=np.asarray(classes if classes is not None else [0] * n, dtype=np.int64),
        prompt=np.asarray(prompt if prompt is not None else [0] * n, dtype=np.int64),
        output=np.asarray(output if output is not None else [0] * n, dtype=np.int64),
        rows=np.ones(n, dtype=np.int64),
        class_names=list(names),
        class_priority=list(priorities),
        class_model=list(models) if models else [],
    )


def model(name="m", mbs=8, fixed=5.0, per_item=1.0, **kw) -> ModelSim:
    return ModelSim(name=name, max_batch_size=mbs, curve=ServiceCurve(fixed_ms=fixed, per_item_ms=per_item), **kw)


def run(models, arr, overheads=None, **server_kw):
    server = ServerSim(models=models if isinstance(models, list) else [models], overheads=overheads or Overheads(), **server_kw)
    return simulate_detail(server, arr)


def lat_ms(sim, i) -> float:
    return round((sim.t_done[i] - sim.t_send[i]) * 1000.0, 6)


def start_ms(sim, i) -> float:
    return round(sim.t_start[i] * 1000.0, 6)


POLICY = QueuePolicy(max_queue_size=100)  # any policy turns prefetching off: batches form on a free instance


# ---------------------------------------------------------------------------------------------
# The dynamic batcher


def test_a_single_batch_forms_when_the_oldest_request_has_waited_max_queue_delay() -> None:
    m = model(mbs=8, dynamic_batching=BatcherConfig(max_queue_delay_us=10_000))
    sim = run(m, arrivals([0, 2, 4]))
    # preferred defaults to [8]; three requests never fill it, so the batch leaves at 0 + 10 ms
    assert [start_ms(sim, i) for i in range(3)] == [10.0, 10.0, 10.0]
    # exec = 5 + 3 x 1 = 8 ms -> done at 18 ms
    assert [lat_ms(sim, i) for i in range(3)] == [18.0, 16.0, 14.0]
    assert sim.result.models[0].executions == 1
    assert sim.result.models[0].mean_batch_rows == 3


def test_a_batch_leaves_at_once_when_it_reaches_a_preferred_size() -> None:
    m = model(mbs=8, dynamic_batching=BatcherConfig(preferred_batch_sizes=[2, 4], max_queue_delay_us=100_000, default_queue_policy=POLICY))
    sim = run(m, arrivals([0, 1]))
    assert [start_ms(sim, i) for i in range(2)] == [1.0, 1.0]  # not 100 ms later
    assert lat_ms(sim, 0) == 1.0 + 7.0


def test_the_batcher_takes_the_largest_preferred_size_it_can_fill() -> None:
    # r0, r1 fill preferred 2 at once and run 0..7 ms; r2..r6 queue meanwhile. At 7 ms the scan
    # reaches 2, then 4, then 5 > the largest preferred 4: the batch is the 4 oldest (the delay has
    # not expired), and r6, alone and below every preferred size, waits out its 100 ms delay.
    m = model(mbs=8, dynamic_batching=BatcherConfig(preferred_batch_sizes=[2, 4], max_queue_delay_us=100_000, default_queue_policy=POLICY))
    sim = run(m, arrivals([0, 0, 1, 2, 3, 4, 5]))
    assert [start_ms(sim, i) for i in range(7)] == [0.0, 0.0, 7.0, 7.0, 7.0, 7.0, 105.0]


def test_when_the_delay_has_expired_everything_up_to_max_batch_size_goes() -> None:
    # r0 executes 0..(5+1)=6 ms with a 1 ms window (r0 starts at 1 ms, ends at 7); r1..r9 queue;
    # at 7 ms the oldest waited 6 ms > 1 ms: the batch takes everything up to max_batch_size 8.
    m = model(mbs=8, dynamic_batching=BatcherConfig(preferred_batch_sizes=[2], max_queue_delay_us=1_000, default_queue_policy=POLICY))
    sim = run(m, arrivals([0] + [1.5 + 0.5 * i for i in range(9)]))
    assert start_ms(sim, 0) == 1.0
    second = [i for i in range(1, 10) if start_ms(sim, i) == 7.0]
    assert second == list(range(1, 9))  # 8 requests, beyond the preferred 2
    assert start_ms(sim, 9) == 7.0 + 5.0 + 8.0


def test_strict_priority_serves_level_one_first_whatever_the_arrival_order() -> None:
    b = BatcherConfig(max_queue_delay_us=0, priority_levels=2, default_priority_level=2, default_queue_policy=POLICY)
    m = model(mbs=1, fixed=10.0, per_item=0.0, dynamic_batching=b)
    # r0 (low) occupies the instance 0..10; r1 (low) at 1, r2 (high) at 2: r2 runs before r1
    sim = run(m, arrivals([0, 1, 2], classes=[0, 0, 1], names=("low", "high"), priorities=(2, 1)))
    assert start_ms(sim, 2) == 10.0
    assert start_ms(sim, 1) == 20.0


def test_a_priority_outside_the_levels_falls_to_the_default_level() -> None:
    b = BatcherConfig(max_queue_delay_us=0, priority_levels=2, default_priority_level=1, default_queue_policy=POLICY)
    m = model(mbs=1, fixed=10.0, per_item=0.0, dynamic_batching=b)
    # priority 0 -> default level 1 (high): r2 (priority 0) overtakes r1 (priority 2)
    sim = run(m, arrivals([0, 1, 2], classes=[0, 0, 1], names=("low", "none"), priorities=(2, 0)))
    assert start_ms(sim, 2) == 10.0 and start_ms(sim, 1) == 20.0


def test_strict_priority_starves_the_low_level_while_high_traffic_keeps_the_instance_busy() -> None:
    b = BatcherConfig(max_queue_delay_us=0, priority_levels=2, default_priority_level=2, default_queue_policy=POLICY)
    m = model(mbs=1, fixed=10.0, per_item=0.0, dynamic_batching=b)
    highs = [5.0 * i for i in range(100)]  # 200/s against 100/s of capacity: the high queue only grows
    times = sorted([1.0] + highs)
    classes = [0 if t == 1.0 else 1 for t in times]
    sim = run(m, arrivals(times, classes=classes, names=("low", "high"), priorities=(2, 1)))
    low = times.index(1.0)
    last_high_start = max(start_ms(sim, i) for i in range(len(times)) if i != low)
    assert start_ms(sim, low) > last_high_start  # served only after every high request
    assert start_ms(sim, low) == 1000.0  # 100 highs x 10 ms


def test_a_full_level_rejects_at_once() -> None:
    b = BatcherConfig(max_queue_delay_us=0, default_queue_policy=QueuePolicy(max_queue_size=2))
    m = model(mbs=1, fixed=10.0, per_item=0.0, dynamic_batching=b)
    sim = run(m, arrivals([0, 1, 2, 3, 4]), overheads=Overheads(request_ms=0.5))
    # r0 executes; r1, r2 fill the queue; r3, r4 are refused on arrival (+ the request overhead)
    assert [sim.status[i] for i in range(5)] == [OK, OK, OK, QUEUE_FULL, QUEUE_FULL]
    assert lat_ms(sim, 3) == 0.5 and lat_ms(sim, 4) == 0.5
    assert sim.result.classes[0].rejected_queue_full in (1, 2)  # the window drops the first and last sends


def test_reject_timeouts_are_enforced_when_the_batcher_looks_not_when_they_expire() -> None:
    b = BatcherConfig(max_queue_delay_us=0, default_queue_policy=QueuePolicy(timeout_us=100_000, action="REJECT"))
    m = model(mbs=1, fixed=300.0, per_item=0.0, dynamic_batching=b)
    sim = run(m, arrivals([0, 10]))
    # r1 expires at 110 ms but the batcher only scans it when the instance frees, at 300 ms
    assert sim.status[1] == TIMEOUT
    assert lat_ms(sim, 1) == 290.0


def test_a_long_execution_rejects_on_the_batchers_500_ms_tick() -> None:
    # The server observed here: a 100 ms timeout during a 1.5 s execution fired at ~1.0 s. The
    # batcher sleeps 500 ms on an empty queue (from 0), then waits for a slot in 500 ms ticks.
    b = BatcherConfig(max_queue_delay_us=0, default_queue_policy=QueuePolicy(timeout_us=100_000, action="REJECT"))
    m = model(mbs=1, fixed=1500.0, per_item=0.0, dynamic_batching=b)
    sim = run(m, arrivals([0, 10, 300, 700]))
    assert [sim.status[i] for i in (1, 2, 3)] == [TIMEOUT] * 3
    assert [round(sim.t_done[i] * 1000, 3) for i in (1, 2, 3)] == [1000.0, 1000.0, 1000.0]


def test_delay_timeouts_move_a_request_behind_the_live_ones_of_its_level() -> None:
    b = BatcherConfig(max_queue_delay_us=0, default_queue_policy=QueuePolicy(timeout_us=50_000, action="DELAY"))
    m = model(mbs=1, fixed=100.0, per_item=0.0, dynamic_batching=b)
    sim = run(m, arrivals([0, 1, 60]))
    # at 100 ms r1 (expired at 51) is delayed; r2 (live until 110) goes first
    assert [sim.status[i] for i in range(3)] == [OK, OK, OK]
    assert start_ms(sim, 2) == 100.0
    assert start_ms(sim, 1) == 200.0


def test_instances_execute_in_parallel() -> None:
    m = model(mbs=1, fixed=10.0, per_item=0.0, instances=2, dynamic_batching=BatcherConfig(max_queue_delay_us=0, default_queue_policy=POLICY))
    sim = run(m, arrivals([0, 0, 0]))
    assert sorted(lat_ms(sim, i) for i in range(3)) == [10.0, 10.0, 20.0]


def test_instances_sharing_a_device_take_turns_for_its_part() -> None:
    # 10 ms executions, 6 ms of them on the device: three requests at once on three instances.
    # Host parts (4 ms) overlap; device parts queue in the order host parts end.
    m = model(mbs=1, fixed=10.0, per_item=0.0, instances=3, device_curve=ServiceCurve(fixed_ms=6.0, per_item_ms=0.0),
              dynamic_batching=BatcherConfig(max_queue_delay_us=0, default_queue_policy=POLICY))
    sim = run(m, arrivals([0, 0, 0]))
    assert sorted(lat_ms(sim, i) for i in range(3)) == [10.0, 16.0, 22.0]


def test_a_shared_device_saturates_where_its_part_allows_whatever_the_instances() -> None:
    # Overloaded (2000 req/s against at most 1000/s): 4 ms executions, half of it on one device.
    # Linear scaling would give N / 4 ms; the device caps every N at 1 / 2 ms = 500/s, so 1 instance
    # gives 250/s, 2 give 500/s, and 4 or 8 give no more than 500/s.
    times = np.arange(0, 4000) * 0.5
    got = {}
    for n in (1, 2, 4, 8):
        m = model(mbs=1, fixed=4.0, per_item=0.0, instances=n, device_curve=ServiceCurve(fixed_ms=2.0, per_item_ms=0.0),
                  dynamic_batching=BatcherConfig(max_queue_delay_us=0))
        got[n] = run(m, arrivals(times)).result.throughput_per_s
    assert got[1] == pytest.approx(250.0, rel=0.02)
    assert got[2] == pytest.approx(500.0, rel=0.02)
    assert got[4] == pytest.approx(500.0, rel=0.02)
    assert got[8] == pytest.approx(500.0, rel=0.02)
    unshared = run(model(mbs=1, fixed=4.0, per_item=0.0, instances=4, dynamic_batching=BatcherConfig(max_queue_delay_us=0)),
                   arrivals(times)).result.throughput_per_s
    assert unshared == pytest.approx(1000.0, rel=0.02)


def test_the_device_part_grows_with_the_rows_of_the_batch() -> None:
    # Batches of 4 rows: execution 5 + 1 x 4 = 9 ms, device part 1 + 1.5 x 4 = 7 ms. Two instances,
    # two batches at once: the second waits for the first's device part (done at 9), ends at 16.
    m = model(mbs=4, fixed=5.0, per_item=1.0, instances=2, device_curve=ServiceCurve(fixed_ms=1.0, per_item_ms=1.5),
              dynamic_batching=BatcherConfig(max_queue_delay_us=10_000, default_queue_policy=POLICY))
    sim = run(m, arrivals([0, 0, 0, 0, 0, 0, 0, 0]))
    assert sorted({lat_ms(sim, i) for i in range(8)}) == [9.0, 16.0]


def test_models_on_one_device_share_it() -> None:
    # Two models, each all device (a device part as long as the execution, or longer: capped at
    # it), on the same device: one runs after the other.
    whole = ServiceCurve(fixed_ms=50.0, per_item_ms=0.0)
    a = model("a", mbs=1, fixed=10.0, per_item=0.0, device_curve=whole, route="a")
    b = model("b", mbs=1, fixed=10.0, per_item=0.0, device_curve=whole, route="b")
    arr = arrivals([0, 0], classes=[0, 1], names=("ca", "cb"), priorities=(0, 0), models=("a", "b"))
    sim = run([a, b], arr)
    assert sorted(lat_ms(sim, i) for i in range(2)) == [10.0, 20.0]
    other = run([a, b.model_copy(update={"devices": [1]})], arr)
    assert sorted(lat_ms(other, i) for i in range(2)) == [10.0, 10.0]


def test_the_rate_limiter_caps_executions_across_models() -> None:
    a = model("a", mbs=1, fixed=10.0, per_item=0.0, resources={"compute": 1}, route="a")
    b = model("b", mbs=1, fixed=10.0, per_item=0.0, resources={"compute": 1}, route="b")
    arr = arrivals([0, 0], classes=[0, 1], names=("ca", "cb"), priorities=(0, 0), models=("a", "b"))
    limited = run([a, b], arr, rate_limit=True, resources={"compute": 1})
    assert sorted(lat_ms(limited, i) for i in range(2)) == [10.0, 20.0]
    free = run([a, b], arr, rate_limit=False)
    assert sorted(lat_ms(free, i) for i in range(2)) == [10.0, 10.0]
    declared_two = run([a, b], arr, rate_limit=True, resources={"compute": 2})
    assert sorted(lat_ms(declared_two, i) for i in range(2)) == [10.0, 10.0]


def test_a_model_asking_for_more_than_the_server_declares_is_refused() -> None:
    a = model("a", mbs=1, resources={"compute": 3})
    with pytest.raises(ValueError, match="declares 2"):
        run(a, arrivals([0]), rate_limit=True, resources={"compute": 2})


def test_without_dynamic_batching_each_request_is_its_own_execution() -> None:
    m = model(mbs=8, fixed=10.0, per_item=1.0)
    sim = run(m, arrivals([0, 1, 2]))
    assert [lat_ms(sim, i) for i in range(3)] == [11.0, 21.0, 31.0]


def test_overheads_add_where_they_belong() -> None:
    m = model(mbs=8, fixed=5.0, per_item=1.0, dynamic_batching=BatcherConfig(max_queue_delay_us=0))
    ov = Overheads(request_ms=2.0, batch_ms=0.5, request_exec_ms=0.25)
    sim = run(m, arrivals([0]), overheads=ov)
    # 5 + 1 (curve) + 0.5 (batch) + 0.25 (one request) + 2 (outside the server)
    assert lat_ms(sim, 0) == 8.75


def test_a_lost_completion_wake_leaves_the_request_for_the_next_arrival() -> None:
    # Without prefetching Triton forms a batch only for a free instance, and the end of an
    # execution often fails to wake the batcher (measured: see EMBEDDED_CPU_OVERHEADS).
    m = model(mbs=4, fixed=10.0, per_item=0.0, dynamic_batching=BatcherConfig(max_queue_delay_us=0, default_queue_policy=POLICY))
    lost = Overheads(completion_wake_p=0.0, completion_wake_p_idle=0.0)
    sim = run(m, arrivals([0, 5, 30]), overheads=lost)
    assert start_ms(sim, 1) == 30.0  # free at 10 ms, noticed when r2 arrives
    alone = run(m, arrivals([0, 5]), overheads=lost)
    assert start_ms(alone, 1) == 500.0  # nobody else comes: the batcher's 500 ms wait ends
    prompt = run(m, arrivals([0, 5, 30]))
    assert start_ms(prompt, 1) == 10.0


def test_prefetching_forms_the_next_batch_while_the_instance_is_busy() -> None:
    # no queue policy at all: a second payload waits ahead and grows until the instance frees
    m = model(mbs=8, fixed=10.0, per_item=0.0, dynamic_batching=BatcherConfig(max_queue_delay_us=0))
    sim = run(m, arrivals([0, 2, 4, 6]), overheads=Overheads(completion_wake_p=0.0, completion_wake_p_idle=0.0))
    assert [start_ms(sim, i) for i in range(4)] == [0.0, 10.0, 10.0, 10.0]


# ---------------------------------------------------------------------------------------------
# Streaming LLMs: continuous batching and the KV budget

CURVE = LLMCurve(prefill_ms_per_token=0.1, decode_fixed_ms=1.0, decode_ms_per_seq=0.5)


def llm_model(policy: str, pool: int, seqs: int = 8) -> ModelSim:
    engine = EngineModel(max_num_seqs=seqs, kv_pool_blocks=pool, kv_block_tokens=16, kv_policy=policy, curve=CURVE)
    return ModelSim(name="llm", max_batch_size=8, llm=engine)


def test_continuous_batching_token_by_token() -> None:
    sim = run(llm_model("grow_kill", pool=64), arrivals([0], prompt=[10], output=[3]))
    # step 1: prefill 10 x 0.1 = 1 ms -> token 1 at 1 ms; decode (1 + 0.5) -> token 2 at 2.5 ms;
    # step 2: decode -> token 3 at 4 ms, done
    assert round(sim.t_first[0] * 1000, 6) == 1.0
    assert lat_ms(sim, 0) == 4.0


def test_kv_oom_policy_kills_a_request_when_the_pool_runs_dry() -> None:
    # each request: prompt 16 (1 block) + 40 tokens -> grows to 4 blocks; the pool has 6
    arr = arrivals([0, 0], prompt=[16, 16], output=[41, 41])
    sim = run(llm_model("grow_kill", pool=6), arr)
    assert sorted(sim.status[:2]) == [OK, OOM]
    assert sim.result.classes[0].oom_killed + sim.result.classes[0].completed <= 2


def test_kv_admission_policy_holds_a_request_back_instead() -> None:
    arr = arrivals([0, 0], prompt=[16, 16], output=[41, 41])
    sim = run(llm_model("reserve_wait", pool=6), arr)
    assert sim.status[:2] == [OK, OK]
    # the second is admitted only when the first has finished and freed its 4 blocks
    assert sim.t_first[1] >= sim.t_done[0] - 1e-12


def test_kv_admission_refuses_a_request_that_can_never_fit() -> None:
    sim = run(llm_model("reserve_wait", pool=2), arrivals([0], prompt=[16], output=[41]))
    assert sim.status[0] == TOO_LARGE


def test_max_num_seqs_caps_the_running_batch() -> None:
    sim = run(llm_model("grow_kill", pool=64, seqs=1), arrivals([0, 0], prompt=[4, 4], output=[2, 2]))
    # one at a time: the second's first token comes after the first finished
    assert sim.t_first[1] > sim.t_done[0] - 1e-12


def test_lanes_route_by_prompt_length() -> None:
    short = ModelSim(name="m_short", route="m", max_batch_size=8, llm=llm_model("grow_kill", 64).llm, prompt_tokens_max=32)
    long = ModelSim(name="m_long", route="m", max_batch_size=8, llm=llm_model("grow_kill", 64).llm)
    sim = run([short, long], arrivals([0, 0, 0], prompt=[10, 100, 32], output=[2, 2, 2]))
    assert sim.route == [0, 1, 0]


def test_a_static_batch_whose_tokens_pass_the_models_memory_fails_whole() -> None:
    """An LLM that is not decoupled (static batches from Triton's batcher) holds its batch's tokens
    at once: a batch past `static_batch_tokens` runs out of memory, every request in it, as the zoo's
    oneshot does live (bench-zoo 11:23: batches of 5 slightly longer prompts than its probe's)."""
    m = model(mbs=4, static_batch_tokens=200,
              dynamic_batching=BatcherConfig(max_queue_delay_us=50_000, default_queue_policy=POLICY))
    # four at once: 4 x (20 + 32) = 208 tokens > 200, one batch, all four fail; then two: 104, fit
    sim = run(m, arrivals([0, 0, 0, 0, 500, 500], prompt=[20] * 6, output=[32] * 6))
    assert [int(s) for s in sim.status] == [OOM] * 4 + [OK] * 2
    assert lat_ms(sim, 0) < lat_ms(sim, 4)  # the allocation fails as the batch starts: no service time spent
    # without the bound the same batch runs
    free = run(model(mbs=4, dynamic_batching=BatcherConfig(max_queue_delay_us=50_000, default_queue_policy=POLICY)),
               arrivals([0, 0, 0, 0], prompt=[20] * 4, output=[32] * 4))
    assert [int(s) for s in free.status] == [OK] * 4
