"""The engine model's prefix cache (`tritongen.core.prefix_cache`, `tritongen.core.engine`) against
cases worked out by hand: hits, a block shared once, eviction least recently freed first, the
policies with sharing, a thrashing cache; and where an engine's caching comes from
(`tritongen.core.engine_sources`)."""

from __future__ import annotations

import numpy as np
import pytest

from tritongen.core.engine import DONE, FIRST, EngineModel, EngineState, LLMCurve
from tritongen.core.engine_sources import EngineSourceError, MeasuredEngine, resolve_engine
from tritongen.core.kv import CappedLayers, KVFootprint
from tritongen.core.prefix_cache import CONVERSATION, PREFIX, PrefixCache, PromptSharing
from tritongen.core.simulator import ModelSim, Overheads, ServerSim, simulate, simulate_detail
from tritongen.core.spec import EngineSection
from tritongen.core.traffic import Arrivals, TrafficSpec, generate_arrivals

# prefill 1 ms + 0.1 ms/token; decode 2 ms + 1 ms per sequence (as test_engine.py)
COSTS = LLMCurve(prefill_fixed_ms=1.0, prefill_ms_per_token=0.1, decode_fixed_ms=2.0, decode_ms_per_seq=1.0)


def engine(policy: str = "grow_preempt", pool: int = 64, block: int = 4, seqs: int = 8, caching: bool = True, **kw) -> EngineModel:
    return EngineModel(kv_policy=policy, kv_block_tokens=block, kv_pool_blocks=pool, max_num_seqs=seqs, curve=COSTS,
                       prefix_caching=caching, **kw)


def sharing(prefix_id: list[int], prefix_tokens: list[int], conversation: list[int] | None = None) -> PromptSharing:
    return PromptSharing(prefix_id, prefix_tokens, conversation or [-1] * len(prefix_id))


def drain(state: EngineState, t: float = 0.0) -> tuple[float, list]:
    events: list = []
    while state.busy:
        t, happened = state.step(t)
        events.extend(happened)
        check_pool(state)
    return t, events


def check_pool(state: EngineState) -> None:
    """The pool adds up: free + each sequence's own blocks + every held cached block once."""
    cache = state.cache
    assert cache is not None and cache.free_blocks == state.free
    own = sum(state.held[r] - len(state.keys[r]) for r in state.held)
    held = sum(1 for n in cache.holders.values() if n > 0)
    assert state.free + own + held == state.model.kv_pool_blocks


def one_by_one(state: EngineState, requests: list[int]) -> list:
    """Each request alone on the engine (low load): submitted when the one before has finished."""
    t, events = 0.0, []
    for r in requests:
        state.submit(r)
        t, happened = drain(state, t)
        events.extend(happened)
    return events


# ---------------------------------------------------------------------------------------------
# The cache alone


def test_block_keys_are_the_prefixs_then_the_conversations_full_blocks() -> None:
    share = sharing([3, -1, 2], [10, 0, 8], [-1, 7, 5])
    assert share.block_keys(0, 4, 4) == [(PREFIX, 3, 0), (PREFIX, 3, 1)]  # block 2 holds the request's own text
    assert share.block_keys(1, 3, 4) == [(CONVERSATION, 7, i) for i in range(3)]
    assert share.block_keys(2, 3, 4) == [(PREFIX, 2, 0), (PREFIX, 2, 1), (CONVERSATION, 5, 2)]


def test_the_free_queue_evicts_the_oldest_freed_first_and_a_sequences_tail_before_its_head() -> None:
    cache = PrefixCache(4)
    a0, a1 = (PREFIX, 0, 0), (PREFIX, 0, 1)
    cache.take(3)
    assert cache.register(a0) and cache.register(a1) and not cache.register(a0)
    assert cache.release([a0, a1], own=1) == 3  # its own block and both cached ones are free now
    assert cache.free_blocks == 4 and cache.cached_free() == [a1, a0]  # the tail goes first
    assert cache.hits([a0, a1, (PREFIX, 0, 2)]) == (2, 2)
    cache.take(3)  # the never-used block, the sequence's own one, then a1 is evicted
    assert cache.evictions == 1 and cache.cached_free() == [a0] and cache.hits([a0, a1]) == (1, 1)
    cache.hold([a0])  # held again: out of the free queue, nothing left to take
    assert cache.free_blocks == 0 and cache.holders[a0] == 1
    with pytest.raises(ValueError, match="1 blocks asked of a cache with 0 free"):
        cache.take(1)


# ---------------------------------------------------------------------------------------------
# Hits and what they cost


def test_one_prompt_for_all_hits_every_full_shared_block_after_the_first_and_prefills_the_rest() -> None:
    # prefix 10 tokens in blocks of 4: 2 full blocks (8 tokens) cacheable, a prompt of 12 computes 4
    n = 5
    state = EngineState(engine(), [12] * n, [3] * n, sharing([0] * n, [10] * n))
    events = one_by_one(state, list(range(n)))
    sent = {r: t for r, kind, t in events if kind == DONE}
    first = {r: t for r, kind, t in events if kind == FIRST}
    assert round(first[0] * 1000, 6) == 2.2  # 1 + 0.1 x 12
    for r in range(1, n):
        assert round((first[r] - sent[r - 1]) * 1000, 6) == 1.4  # 1 + 0.1 x (12 - 8)
    assert state.cached_tokens == {0: 0, **{r: 8 for r in range(1, n)}}
    assert state.hit_rate(lambda r: True) == pytest.approx(4 * 8 / (5 * 12))
    assert state.hit_rate(lambda r: r > 0) == pytest.approx(8 / 12)


def test_a_prompt_wholly_cached_still_computes_its_last_block() -> None:
    # prompt = prefix = 8 tokens, 2 full blocks: at most (8 - 1) // 4 = 1 block is served
    state = EngineState(engine(), [8, 8], [2, 2], sharing([0, 0], [8, 8]))
    one_by_one(state, [0, 1])
    assert state.cached_tokens == {0: 0, 1: 4}


def _steps(model: EngineModel, prompt: list[int], output: list[int], share: PromptSharing | None) -> tuple[list, int, EngineState]:
    """Every step's end and events, all requests submitted at once, and the preemptions."""
    state = EngineState(model, prompt, output, share)
    for r in range(len(prompt)):
        state.submit(r)
    t, steps = 0.0, []
    while state.busy:
        t, happened = state.step(t)
        steps.append((t, happened))
    return steps, state.preemptions, state


PROMPTS, OUTPUTS = [12, 30, 7, 20, 12, 16] * 3, [5, 9, 3, 12, 4, 6] * 3
N = len(PROMPTS)


def test_no_sharing_or_no_cache_runs_exactly_as_before() -> None:
    # a pool tight enough to preempt: the cache off with sharing stated, the cache on with nothing
    # shared, and neither, step for step the same
    plain = _steps(engine(pool=14), PROMPTS, OUTPUTS, None)[:2]
    assert plain[1] > 0
    assert _steps(engine(pool=14, caching=False), PROMPTS, OUTPUTS, sharing([0] * N, [10] * N))[:2] == plain
    assert _steps(engine(pool=14), PROMPTS, OUTPUTS, sharing([-1] * N, [0] * N))[:2] == plain


def test_all_distinct_prompts_hit_nothing_and_run_as_without_the_cache() -> None:
    # every prompt its own 10-token prefix: cached, never shared (no preemption: a resumed
    # sequence would find its own blocks, as vLLM's does)
    steps, preempted, state = _steps(engine(pool=64), PROMPTS, OUTPUTS, sharing(list(range(N)), [10] * N))
    assert preempted == 0 and state.hit_rate(lambda r: True) == 0.0
    assert steps == _steps(engine(pool=64, caching=False), PROMPTS, OUTPUTS, None)[0]


def test_the_tokens_a_step_may_prefill_count_only_what_is_computed() -> None:
    # a budget of 6 tokens: two 10-token prompts whose first 8 are cached compute 2 each, one step
    model = engine(max_batched_tokens=6)
    state = EngineState(model, [10, 10, 10, 10], [2] * 4, sharing([0] * 4, [8] * 4))
    state.submit(0)
    drain(state)  # 10 > 6 but it is the step's first: it goes alone and caches the prefix
    state.submit(1)
    state.submit(2)
    _t, events = state.step(1.0)
    assert sorted(r for r, kind, _t in events if kind == FIRST) == [1, 2]
    plain = EngineState(engine(max_batched_tokens=6, caching=False), [10] * 3, [2] * 3)
    plain.submit(1)
    plain.submit(2)
    _t, events = plain.step(0.0)
    assert [r for r, kind, _t in events if kind == FIRST] == [1]


def test_an_in_step_prefill_costs_only_its_uncached_tokens() -> None:
    curve = COSTS.model_copy(update={"prefill_in_step": True})
    model = EngineModel(kv_policy="grow_preempt", kv_block_tokens=4, kv_pool_blocks=64, max_num_seqs=8, curve=curve,
                        prefix_caching=True)
    state = EngineState(model, [12, 12], [1, 1], sharing([0, 0], [10, 10]))
    state.submit(0)
    t0, _ = state.step(0.0)
    state.submit(1)
    t1, _ = state.step(1.0)
    # decode of the one newcomer (2 + 1) + its prefill: 1 + 0.1 x 12, then 1 + 0.1 x 4
    assert round(t0 * 1000, 6) == 5.2 and round((t1 - 1.0) * 1000, 6) == 4.4


# ---------------------------------------------------------------------------------------------
# The pool: shared blocks once, policies, preemption


def test_a_shared_block_counts_once_so_reserve_policies_fit_more_sequences() -> None:
    # prompt 40 (32 shared) + 24 output = 64 tokens = 4 blocks of 16; the pool has 8
    model = engine("reserve_wait", pool=8, block=16)
    alone = EngineState(model, [40] * 5, [24] * 5, sharing([-1] * 5, [0] * 5))
    shared = EngineState(model, [40] * 5, [24] * 5, sharing([0] * 5, [32] * 5))
    for state in (alone, shared):
        for r in range(5):
            state.submit(r)
        state.step(0.0)
    assert len(alone.running) == 2 and len(shared.running) == 3  # 4 + 4 against 4 + 2 + 2
    assert shared.free == 0 and shared.cache.holders[(PREFIX, 0, 0)] == 3
    check_pool(shared)
    assert model.sequences_fitting(40, 24) == 2 and model.sequences_fitting(40, 24, shared_tokens=32) == 3
    assert engine("reserve_wait", pool=8, block=16, caching=False).sequences_fitting(40, 24, shared_tokens=32) == 2


def test_preemption_releases_only_what_nobody_else_holds_and_the_resumed_sequence_hits_again() -> None:
    # prompts of 9 tokens (8 shared) in blocks of 4: 3 blocks each, 2 of them shared; the pool has 5.
    # Both in: 3 + 1 blocks. At their 13th token each needs a 4th block: 0 takes the last free
    # one, 1 (the newest) is preempted, and the blocks it shared stay, held by 0.
    state = EngineState(engine(pool=5), [9, 9], [8, 8], sharing([0, 0], [8, 8]))
    state.submit(0)
    state.submit(1)
    t, _ = state.step(0.0)
    check_pool(state)
    while state.preemptions == 0 and state.busy:
        t, _ = state.step(t)
        check_pool(state)
    assert state.waiting[0] == 1 and state.cache.holders[(PREFIX, 0, 0)] == 1  # still held by 0
    assert state.cache.cached_free() == []
    _t, events = drain(state, t)
    assert [r for r, kind, _t in events if kind == DONE] == [0, 1]
    assert state.cached_tokens == {0: 0, 1: 8}  # counted at its first admission only


def test_a_kill_policy_still_kills_what_does_not_fit_after_sharing() -> None:
    # reserve_kill: 4 blocks for the first, 2 for each sharer; the pool of 8 kills the fourth
    state = EngineState(engine("reserve_kill", pool=8, block=16), [40] * 4, [24] * 4, sharing([0] * 4, [32] * 4))
    for r in range(4):
        state.submit(r)
    state.step(0.0)
    assert state.killed == 1 and len(state.running) == 3


# ---------------------------------------------------------------------------------------------
# Eviction


def test_eviction_takes_the_least_recently_freed_prefix_first() -> None:
    # blocks of 4, a pool of 8; prefixes A (id 0) and B (id 1) of 8 tokens, prompts of 9, one token out.
    # A, then B, then A again: B's blocks were freed before A's second time. A distinct 15-token
    # prompt (4 blocks) takes the 3 blocks holding nothing, then evicts B's tail block.
    ids = [0, 1, 0, -1, 1, 0]
    state = EngineState(engine(pool=8), [9, 9, 9, 15, 9, 9], [1] * 6, sharing(ids, [8 if i >= 0 else 0 for i in ids]))
    one_by_one(state, [0, 1, 2])
    assert state.cached_tokens[2] == 8
    one_by_one(state, [3])
    assert state.cache.evictions == 1
    assert state.cache.cached_free() == [(PREFIX, 1, 0), (PREFIX, 0, 1), (PREFIX, 0, 0)]
    # B again finds B's head block (4 tokens); the two blocks it then takes are the queue's next:
    # the block A's second request held as its own, then A's tail block. So A finds 4 tokens too.
    one_by_one(state, [4])
    assert state.cached_tokens[4] == 4 and state.cache.evictions == 2
    one_by_one(state, [5])
    assert state.cached_tokens[5] == 4


def _chat(rate: float) -> tuple[float, int]:
    """Conversations of 4 turns, 2 s apart, in a pool of 200 blocks of 16: a turn finds its history
    if the blocks taken since the previous turn was freed did not reach them in the free queue."""
    klass = {"name": "a", "share": 1.0, "prompt_tokens": 32, "output_tokens": 32,
             "conversation": {"turns": 4, "think_s": 2.0}}
    arrivals = generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=800 / rate,
                                             warmup_s=80 / rate, classes=[klass]), seed=1)
    llm = EngineModel(kv_policy="grow_preempt", kv_block_tokens=16, kv_pool_blocks=200, max_num_seqs=32,
                      curve=LLMCurve(prefill_ms_per_token=0.05, decode_fixed_ms=5.0, decode_ms_per_seq=0.2),
                      prefix_caching=True)
    result = simulate(ServerSim(models=[ModelSim(name="llm", max_batch_size=32, llm=llm)], overheads=Overheads()), arrivals)
    stats = result.model("llm")
    assert stats.prefix_cache_hit_rate is not None
    return stats.prefix_cache_hit_rate, stats.prefix_cache_evictions


def test_a_cache_that_thrashes_at_overload_shows_a_falling_hit_rate() -> None:
    # 2/s: 4 requests between two turns, the history stays. 100/s (past the engine's ~65/s): 200
    # requests come between two turns of a conversation, whose blocks push its history out.
    idle_rate, idle_evictions = _chat(2.0)
    busy_rate, busy_evictions = _chat(100.0)
    assert idle_rate > 0.5 and busy_rate < 0.1 and busy_evictions > 2 * idle_evictions


def test_the_simulation_reports_no_hit_rate_where_nothing_is_shared_or_nothing_cached() -> None:
    arrivals = Arrivals(t=np.array([0.0, 1.0]), cls=np.zeros(2, np.int64), prompt=np.array([20, 20]),
                        output=np.array([2, 2]), rows=np.ones(2, np.int64), class_names=["a"], class_priority=[0])
    llm = engine(block=16)
    result = simulate(ServerSim(models=[ModelSim(name="llm", max_batch_size=8, llm=llm)], overheads=Overheads()), arrivals)
    assert result.model("llm").prefix_cache_hit_rate is None and result.model("llm").prefix_cache_evictions == 0


# ---------------------------------------------------------------------------------------------
# Where an engine's caching comes from

MEASURED = MeasuredEngine(curve=COSTS, kv_capacity_tokens=4096)


def test_vllm_caches_unless_model_json_turns_it_off_and_says_which() -> None:
    default = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED, engine_args={})
    assert default.prefix_caching and "vLLM V1's default" in default.sources["prefix_caching"]
    for value in (False, "false", "0"):
        off = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED,
                             engine_args={"enable_prefix_caching": value})
        assert not off.prefix_caching and off.sources["prefix_caching"] == "model.json"
    with pytest.raises(EngineSourceError, match="enable_prefix_caching in model.json is 'sometimes', not true or false"):
        resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED, engine_args={"enable_prefix_caching": "sometimes"})


def test_a_spec_that_contradicts_model_json_on_caching_is_an_error_naming_both() -> None:
    with pytest.raises(EngineSourceError, match=r"prefix_caching is False in model.json but True in the spec's engine: section"):
        resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED,
                       engine_args={"enable_prefix_caching": False}, spec=EngineSection(prefix_caching=True))
    agreed = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED, engine_args={},
                            spec=EngineSection(prefix_caching=False))
    assert not agreed.prefix_caching and agreed.sources["prefix_caching"] == "the spec's engine: section"


def test_tensorrt_llm_reuses_blocks_only_when_its_config_says_so() -> None:
    where = dict(model="t", backend="tensorrtllm", measured=MEASURED, spec=EngineSection(kv_block_tokens=32))
    off = resolve_engine(parameters={}, **where)
    assert not off.prefix_caching and "enable_kv_cache_reuse unset" in off.sources["prefix_caching"]
    on = resolve_engine(parameters={"enable_kv_cache_reuse": "true"}, **where)
    assert on.prefix_caching and on.sources["prefix_caching"] == "enable_kv_cache_reuse (config.pbtxt parameters)"


def test_another_backend_is_assumed_not_to_cache_unless_something_says_so() -> None:
    params = {"kv_policy": "grow_kill", "kv_block_tokens": "16"}
    assumed = resolve_engine(model="x", backend="python", parameters=params, measured=MEASURED)
    assert not assumed.prefix_caching and assumed.sources["prefix_caching"].startswith("assumed off")
    stated = resolve_engine(model="x", backend="python", parameters={**params, "prefix_caching": "true"}, measured=MEASURED)
    assert stated.prefix_caching and stated.sources["prefix_caching"] == "config.pbtxt parameters"
    probed = resolve_engine(model="x", backend="python", parameters=params, measured=MeasuredEngine(
        curve=COSTS, kv_capacity_tokens=4096, prefix_caching=True, prefix_caching_evidence="a repeated prompt's first token"))
    assert probed.prefix_caching and probed.sources["prefix_caching"] == "the profile (a repeated prompt's first token)"


def test_a_byte_pool_is_not_modelled_with_a_cache_and_says_so() -> None:
    # one full-attention and one windowed layer: a pool in bytes
    hybrid = KVFootprint(growing_layers=1, growing_bytes_per_token=10, all_full_bytes_per_token=20,
                         capped=(CappedLayers(kind="sliding_attention", layers=1, cap_tokens=8, bytes_per_token=10),))
    model = resolve_engine(model="m", backend="vllm", parameters={}, measured=MeasuredEngine(curve=COSTS),
                           engine_args={"block_size": 16}, footprint=hybrid, planned_pool_tokens=1024,
                           planned_pool_bytes=100_000)
    assert model.kv_pool_bytes == 100_000
    assert not model.prefix_caching and model.sources["prefix_caching"].startswith("not modelled: vLLM V1's default")
    with pytest.raises(ValueError, match="prefix_caching is modelled on a block pool only"):
        engine(kv_footprint=hybrid, kv_pool_bytes=1000)


def test_a_simulated_shared_system_prompt_costs_only_the_rest_after_the_first_request() -> None:
    # one 100-token prefix, 20 tokens of each request's own, blocks of 16: 96 tokens served, 24
    # prefilled (0.5 + 0.05 x 24 = 1.7 ms) on an idle engine; the first prefills all 120 (6.5 ms)
    klass = {"name": "a", "share": 1.0, "prompt_tokens": 20, "output_tokens": 4, "shared_prefix": {"tokens": 100}}
    arrivals = generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=1.0, duration_s=30, warmup_s=2, classes=[klass]), seed=2)
    llm = EngineModel(kv_policy="grow_preempt", kv_block_tokens=16, kv_pool_blocks=64, max_num_seqs=8, prefix_caching=True,
                      curve=LLMCurve(prefill_fixed_ms=0.5, prefill_ms_per_token=0.05, decode_fixed_ms=1.0, decode_ms_per_seq=0.1))
    sim = simulate_detail(ServerSim(models=[ModelSim(name="llm", max_batch_size=8, llm=llm)], overheads=Overheads()), arrivals)
    ttft = [round((first - sent) * 1000, 6) for first, sent in zip(sim.t_first, sim.t_send)]
    assert ttft[0] == 6.5 and set(ttft[1:]) == {1.7}
    assert sim.result.model("llm").prefix_cache_hit_rate == pytest.approx(96 / 120)  # the first is in the warm-up


def test_simulate_prints_the_hit_rate_where_an_engine_caches_shared_prompts() -> None:
    from rich.console import Console

    from tritongen.cli.simulate_cmd import results_table

    klass = {"name": "a", "share": 1.0, "prompt_tokens": 20, "output_tokens": 4, "shared_prefix": {"tokens": 100}}
    arrivals = generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=1.0, duration_s=30, warmup_s=2, classes=[klass]), seed=2)
    server = ServerSim(models=[ModelSim(name="llm", max_batch_size=8, llm=engine(block=16))], overheads=Overheads())
    plain = ServerSim(models=[ModelSim(name="llm", max_batch_size=8, llm=engine(block=16, caching=False))], overheads=Overheads())
    console = Console(width=200, record=True)
    console.print(results_table("t", ["cached", "not"], [simulate(server, arrivals), simulate(plain, arrivals)], streaming=True))
    row = next(line for line in console.export_text().splitlines() if "prefix cache hits" in line)
    assert [cell.strip() for cell in row.split("│")[2:4]] == ["80%", "-"]  # 96 of 120 tokens served; no cache: -
