"""The LLM engine model (`tritongen.core.engine`) and where its values come from
(`tritongen.core.engine_sources`): small cases worked out by hand."""

from __future__ import annotations

import pytest

from pydantic import ValidationError

from tritongen.core.engine import DONE, FIRST, KILLED, REFUSED, EngineModel, EngineState, LLMCurve
from tests.helpers import ServedIndex, write_hybrid_spec
from tritongen.core.engine_sources import (
    EngineSourceError,
    MeasuredEngine,
    entry_sources,
    resolve_engine,
    resolve_engine_limits,
)
from tritongen.core.kv import CappedLayers, KVFootprint
from tritongen.core.spec import EngineSection

# prefill 1 ms + 0.1 ms/token; decode 2 ms + 1 ms per sequence
COSTS = LLMCurve(prefill_fixed_ms=1.0, prefill_ms_per_token=0.1, decode_fixed_ms=2.0, decode_ms_per_seq=1.0)


def engine(policy: str, pool_blocks: int, block: int = 4, seqs: int = 8, **kw) -> EngineModel:
    return EngineModel(kv_policy=policy, kv_block_tokens=block, kv_pool_blocks=pool_blocks, max_num_seqs=seqs, curve=COSTS, **kw)


def run(model: EngineModel, prompt: list[int], output: list[int], limit: int = 1000) -> tuple[EngineState, list[tuple[int, str, float]]]:
    state = EngineState(model, prompt, output)
    for r in range(len(prompt)):
        state.submit(r)
    t, events = 0.0, []
    for _ in range(limit):
        if not state.busy:
            break
        t, happened = state.step(t)
        events.extend(happened)
    return state, events


def times(events, what: str) -> dict[int, float]:
    return {r: round(t * 1000, 6) for r, kind, t in events if kind == what}


def test_one_sequence_costs_its_prefill_then_one_decode_per_token() -> None:
    # prefill 1 + 0.1 x 10 = 2 ms -> first token at 2 ms; decode (2 + 1) ms per token: 5, 8 ms
    _state, events = run(engine("grow_kill", 64), [10], [3])
    assert times(events, FIRST) == {0: 2.0}
    assert times(events, DONE) == {0: 8.0}


def test_admitted_sequences_prefill_one_after_another_and_decode_together() -> None:
    # step 1: prefills 2 ms + 2 ms (first tokens at 2 and 4), decode of both (2 + 2) -> 8 ms
    _state, events = run(engine("grow_kill", 64), [10, 10], [2, 2])
    assert times(events, FIRST) == {0: 2.0, 1: 4.0}
    assert times(events, DONE) == {0: 8.0, 1: 8.0}


def test_reserve_wait_holds_the_head_until_its_whole_reservation_fits() -> None:
    # each needs ceil((4 + 5) / 4) = 3 blocks; the pool has 3: the second waits for the first
    state, events = run(engine("reserve_wait", 3), [4, 4], [5, 5])
    first, done = times(events, FIRST), times(events, DONE)
    assert first[1] >= done[0]
    assert state.killed == 0 and state.preemptions == 0
    assert [kind for _r, kind, _t in events].count(DONE) == 2


def test_reserve_kill_kills_what_does_not_fit_at_admission() -> None:
    state, events = run(engine("reserve_kill", 4), [4, 4, 3], [5, 5, 1])
    # 0 reserves ceil(9 / 4) = 3 of 4 blocks; 1 needs 3 -> killed; 2 needs ceil(4 / 4) = 1 -> fits
    assert times(events, KILLED) == {1: 0.0}
    assert set(times(events, DONE)) == {0, 2}
    assert state.killed == 1


def test_grow_kill_kills_the_sequence_that_finds_no_block() -> None:
    # prompts of 4 tokens take 1 block each (pool 2); the 5th cached token needs a second block
    state, events = run(engine("grow_kill", 2), [4, 4], [3, 3])
    assert state.killed >= 1
    assert KILLED in {kind for _r, kind, _t in events}


def test_grow_preempt_preempts_the_newest_and_recomputes_it_later() -> None:
    # pool 3 blocks of 4: both admitted (1 block each); at their 5th cached token each needs a
    # second block: 0 gets the last free one and 1 (the newest) is preempted. 1 must recompute its
    # prompt and its first token (5 tokens, 2 blocks) and only 1 is free: it waits until 0 is done.
    state, events = run(engine("grow_preempt", 3), [4, 4], [6, 6])
    assert state.preemptions == 1 and state.killed == 0
    assert set(times(events, DONE)) == {0, 1}
    assert list(times(events, FIRST)) == [0, 1]  # the resumed one does not emit its first token again
    assert times(events, DONE)[1] > times(events, DONE)[0]


def test_a_resumed_sequence_pays_the_recompute_of_prompt_and_generated_tokens() -> None:
    model = engine("grow_preempt", 64)
    state = EngineState(model, [8], [10])
    state.submit(0)
    state.step(0.0)  # prefill 8 tokens + one decode: 2 tokens made, 9 cached
    state._preempt(0)
    t, events = state.step(1.0)
    # recompute prefill of the 8 + 2 tokens it holds: 1 + 1.0 = 2 ms, then one decode (3 ms)
    assert events == []
    assert t == pytest.approx(1.0 + (2.0 + 3.0) / 1000)


def test_max_batched_tokens_spreads_long_prefills_over_steps() -> None:
    model = engine("grow_kill", 64, max_batched_tokens=15)
    state = EngineState(model, [10, 10], [2, 2])
    state.submit(0)
    state.submit(1)
    _t, events = state.step(0.0)
    assert [r for r, kind, _t in events if kind == FIRST] == [0]  # 10 + 10 > 15: the second waits a step


def test_max_context_refuses_at_once() -> None:
    _state, events = run(engine("grow_preempt", 64, max_context=16), [10], [10])
    assert events == [(0, REFUSED, 0.0)]


def test_sequences_fitting_counts_whole_blocks() -> None:
    model = engine("reserve_wait", 100, block=16, seqs=64)
    assert model.sequences_fitting(48, 48) == 100 // 6


def test_the_tokens_an_engine_adds_to_every_prompt_are_prefilled_and_held() -> None:
    """A BOS token: prompts of 4 tokens and 5 out hold 8 tokens (the last one's KV is never stored),
    exactly 2 blocks of 4, so 2 sequences fit a pool of 4 blocks; with the engine's own token, each
    needs a 3rd block and one is preempted."""
    assert run(engine("grow_preempt", 4), [4, 4], [5, 5])[0].preemptions == 0
    added = engine("grow_preempt", 4, prompt_added_tokens=1)
    assert run(added, [4, 4], [5, 5])[0].preemptions >= 1
    assert run(added, [10], [1])[1][0][2] * 1000 == pytest.approx(1.0 + 0.1 * 11)  # prefill of 10 + 1 tokens
    assert added.sequences_fitting(4, 4) == 1 and engine("grow_preempt", 4).sequences_fitting(4, 4) == 2


# ---------------------------------------------------------------------------------------------
# Byte pools: models whose layers do not all grow alike

# 10 B/token on the growing layers, 10 B/token more on windowed layers that keep at most 8 tokens.
WINDOWED = KVFootprint(growing_layers=1, growing_bytes_per_token=10, all_full_bytes_per_token=20,
                       capped=(CappedLayers(kind="sliding_attention", layers=1, cap_tokens=8, bytes_per_token=10),))
# 10 B/token and a fixed 100 B state per sequence (a hybrid's recurrent layers).
STATEFUL = KVFootprint(growing_layers=1, growing_bytes_per_token=10, all_full_bytes_per_token=20,
                       state_kind="mamba2", state_layers=1, state_conv_bytes=20, state_ssm_bytes=80)
# Every layer windowed at 4 tokens (Mistral v0.1's shape): a sequence stops growing at its window.
CAPPED = KVFootprint(growing_layers=0, growing_bytes_per_token=0, all_full_bytes_per_token=10,
                     capped=(CappedLayers(kind="sliding_attention", layers=1, cap_tokens=4, bytes_per_token=10),))


def test_byte_pool_charges_each_sequence_its_footprint() -> None:
    # 4 + 12 = 16 tokens, 4 blocks of 4: 10 x 16 + 10 x min(16, 8) = 240 B. A 480 B pool holds 2;
    # at 20 B/token for all layers (320 B each) it would hold 1.
    model = engine("reserve_wait", 24, kv_footprint=WINDOWED, kv_pool_bytes=480)
    assert model.charge(4) == 240 and model.sequences_fitting(4, 12) == 2
    state = EngineState(model, [4, 4, 4], [12, 12, 12])
    for r in range(3):
        state.submit(r)
    state.step(0.0)
    assert (len(state.running), list(state.waiting), state.free) == (2, [2], 0)


def test_byte_pool_charges_the_state_up_front_and_growth_as_it_comes() -> None:
    # grow_kill, pool 200 B: the first sequence's 4-token prompt takes 10 x 4 + 100 = 140 B; the
    # second's 140 B do not fit the 60 left: killed. At its 5th token the first grows one block by
    # 10 x 4 = 40 B (not 140: the state is paid once).
    state, events = run(engine("grow_kill", 50, kv_footprint=STATEFUL, kv_pool_bytes=200), [4, 4], [3, 3])
    assert times(events, KILLED) == {1: 0.0} and set(times(events, DONE)) == {0}
    assert state.free == 200  # everything returned


def test_capped_growth_costs_nothing_past_the_window() -> None:
    # One 4-token window of 10 B/token: 40 B whatever the length, so a 40 B pool runs a 14-token
    # sequence to its end; a block pool of the same 40 B (1 block of 4 tokens at 10 B) kills it.
    _state, events = run(engine("grow_kill", 1, kv_footprint=CAPPED, kv_pool_bytes=40), [4], [10])
    assert set(times(events, DONE)) == {0}
    blocks, events = run(engine("grow_kill", 1), [4], [10])
    assert blocks.killed == 1


def test_footprint_and_byte_pool_go_together() -> None:
    with pytest.raises(ValidationError, match="kv_footprint and kv_pool_bytes go together"):
        engine("grow_kill", 4, kv_footprint=STATEFUL)


def test_limits_pool_bytes_from_the_plan_or_the_stated_blocks() -> None:
    where = dict(model="m", backend="python", parameters={"kv_policy": "grow_kill", "kv_block_tokens": "4"},
                 footprint=STATEFUL)
    planned = resolve_engine_limits(planned_pool_tokens=40, planned_pool_bytes=999, **where)
    assert (planned.kv_pool_bytes, planned.kv_footprint) == (999, STATEFUL)  # the plan's budget itself
    stated = resolve_engine_limits(**{**where, "parameters": {**where["parameters"], "kv_pool_blocks": "10"}},
                                   planned_pool_bytes=999)
    assert stated.kv_pool_bytes == 10 * 4 * 10  # 10 blocks of 4 tokens at the attention layers' 10 B/token
    uniform = KVFootprint(growing_layers=1, growing_bytes_per_token=10, all_full_bytes_per_token=10)
    classic = resolve_engine_limits(planned_pool_tokens=40, **{**where, "footprint": uniform})
    assert classic.kv_pool_bytes is None and classic.kv_footprint is None  # a block pool, as before


def test_a_planned_hybrid_engine_pools_its_budget_in_bytes(tmp_path) -> None:
    from tritongen.core.plan import plan_deployment
    from tritongen.specio import load_spec

    loaded = load_spec(write_hybrid_spec(tmp_path))
    entry = plan_deployment(loaded.spec, loaded.architectures).entry("nemotron-h-8b")
    model = resolve_engine(measured=MeasuredEngine(curve=COSTS), **entry_sources(entry, loaded.spec.models[0]))
    assert model.kv_pool_bytes == entry.kv.budget_bytes == 22_721_814_528
    # 8192-token sequences at 236355584 B each (512 blocks of vLLM's 16 tokens, no rounding): 96 fit,
    # as the plan said. A block pool of the attention layers' tokens (budget / (16 x 16384 B) = 86676
    # blocks) would hold 169 and leave out the 102137856 B of Mamba2 state each of them carries.
    assert model.sequences_fitting(4096, 4096) == 96 == entry.kv.max_sequences
    assert model.kv_pool_blocks == 22_721_814_528 // (16 * 16384) == 86676
    assert model.kv_pool_blocks // model.blocks_for(8192) == 169


# ---------------------------------------------------------------------------------------------
# Sources

MEASURED = MeasuredEngine(curve=COSTS, kv_capacity_tokens=4096, kv_capacity_source="vllm metrics")


def test_vllm_values_come_from_model_json() -> None:
    args = {"max_num_seqs": 48, "block_size": 32, "num_gpu_blocks_override": 100, "max_model_len": 1024}
    model = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED, engine_args=args)
    assert (model.kv_policy, model.max_num_seqs, model.kv_block_tokens, model.kv_pool_blocks, model.max_context) == (
        "grow_preempt", 48, 32, 100, 1024,
    )
    assert model.sources["kv_pool_blocks"] == "model.json"


def test_vllm_without_a_block_override_takes_the_measured_pool() -> None:
    model = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED, engine_args={})
    assert model.kv_pool_blocks == 4096 // 16 and model.max_num_seqs == 256
    assert "vllm metrics" in model.sources["kv_pool_blocks"]


def test_trtllm_policy_and_pool_come_from_its_parameters() -> None:
    params = {"batch_scheduler_policy": "max_utilization", "max_tokens_in_paged_kv_cache": "6400"}
    model = resolve_engine(model="t", backend="tensorrtllm", parameters=params, measured=MEASURED,
                           spec=EngineSection(kv_block_tokens=64, max_num_seqs=32))
    assert (model.kv_policy, model.kv_pool_blocks, model.max_num_seqs) == ("grow_preempt", 100, 32)


def test_tritongen_engine_parameters_describe_a_python_backend() -> None:
    params = {"kv_policy": "grow_kill", "kv_pool_blocks": "428", "kv_block_tokens": "16", "max_num_seqs": "26"}
    model = resolve_engine(model="tinyllm", backend="python", parameters=params, measured=MEASURED)
    assert (model.kv_policy, model.kv_pool_blocks, model.max_num_seqs) == ("grow_kill", 428, 26)


def test_a_spec_that_contradicts_the_backend_files_is_an_error_naming_both() -> None:
    with pytest.raises(EngineSourceError, match=r"max_num_seqs is 48 in model.json but 64 in the spec's engine: section"):
        resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED,
                       engine_args={"max_num_seqs": 48}, spec=EngineSection(max_num_seqs=64))
    with pytest.raises(EngineSourceError, match=r"KV pool is 160 tokens in model.json but kv_pool_tokens 100"):
        resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED,
                       engine_args={"num_gpu_blocks_override": 10}, spec=EngineSection(kv_pool_tokens=100))
    # the same pool in blocks (10 x vLLM's 16 tokens) and in tokens agrees
    agreed = resolve_engine(model="m", backend="vllm", parameters={}, measured=MEASURED,
                            engine_args={"num_gpu_blocks_override": 10}, spec=EngineSection(kv_pool_tokens=160))
    assert agreed.kv_pool_blocks == 10


def test_the_plans_pool_keeps_its_tokens_at_the_engines_block_size() -> None:
    # The plan sized 8192 blocks of its 16 tokens: 131072 tokens, whatever block the engine pages in.
    where = dict(model="m", backend="python", parameters={}, planned_pool_tokens=8192 * 16)
    granular = resolve_engine_limits(spec=EngineSection(kv_policy="reserve_kill"), **where)
    assert (granular.kv_block_tokens, granular.kv_pool_blocks, granular.pool_tokens) == (1, 131072, 131072)
    assert granular.sources["kv_pool_blocks"].startswith("tritongen's KV plan")
    # re-blocked at a coarser block, rounding down to whole blocks: 131072 // 48 = 2730 blocks
    coarse = resolve_engine_limits(spec=EngineSection(kv_policy="grow_kill", kv_block_tokens=48), **where)
    assert (coarse.kv_pool_blocks, coarse.pool_tokens) == (2730, 2730 * 48)
    # a pool in the engine's own terms wins over the plan's
    stated = resolve_engine_limits(spec=EngineSection(kv_policy="reserve_kill", kv_pool_tokens=1920), **where)
    assert stated.pool_tokens == 1920
    with pytest.raises(EngineSourceError, match="holds no whole block of 64 tokens"):
        resolve_engine_limits(**{**where, "planned_pool_tokens": 48},
                              spec=EngineSection(kv_policy="grow_kill", kv_block_tokens=64))


def test_an_unknown_policy_or_pool_is_an_error_that_says_what_to_set() -> None:
    with pytest.raises(EngineSourceError, match="set engine.kv_policy"):
        resolve_engine(model="x", backend="python", parameters={}, measured=MEASURED)
    with pytest.raises(EngineSourceError, match="engine.kv_pool_tokens"):
        resolve_engine(model="x", backend="python", parameters={}, spec=EngineSection(kv_policy="reserve_kill"),
                       measured=MeasuredEngine(curve=COSTS))
    with pytest.raises(EngineSourceError, match="not an integer"):
        resolve_engine(model="x", backend="vllm", parameters={}, measured=MEASURED, engine_args={"max_num_seqs": "many"})


# ---------------------------------------------------------------------------------------------
# The profile's fits (tritongen.profiler.engine, pure parts)


def test_gap_growth_reads_the_prefill_off_the_running_stream() -> None:
    from tritongen.profiler.engine_fits import gap_growth
    from tritongen.profiler.load import StreamRecord

    # a stream with 10 ms gaps; one gap of 17 ms holds the single request's first token
    times = [0.010 * i for i in range(6)] + [0.050 + 0.017] + [0.067 + 0.010 * i for i in range(1, 6)]
    single = StreamRecord(start=0.045, token_times=[0.066])
    grown = gap_growth([times], single)
    assert grown is not None
    assert grown[0] == pytest.approx(7.0, abs=1e-6) and grown[1] == pytest.approx(10.0, abs=1e-6)
    assert gap_growth([times[:5]], single) is None  # the stream did not run across it


def test_decode_step_is_net_of_newcomers_prefills() -> None:
    from tritongen.profiler.engine_fits import decode_step_ms, decode_steps_ms, fit_line
    from tritongen.profiler.load import StreamRecord

    # a stream of 5 tokens 10 ms apart, except one 14 ms gap that held another stream's 4 ms prefill
    a = StreamRecord(start=0.0, token_times=[0.010, 0.020, 0.034, 0.044, 0.054], end=0.054)
    b = StreamRecord(start=0.015, token_times=[0.030, 0.040], end=0.060)  # its first token at 30 ms
    assert decode_steps_ms([a, b], 0.0, 1.0) == pytest.approx(10.0)
    # at a full batch most of a stream's span is other streams' prefills: the gaps that hold none
    # still read the step, whatever the prefills cost (35 ms each here, in 3 of 8 gaps)
    c = StreamRecord(start=0.0, token_times=[0.0, 0.010, 0.055, 0.065, 0.110, 0.120, 0.165, 0.175, 0.185], end=0.185)
    newcomers = [StreamRecord(start=t - 0.04, token_times=[t, t + 0.01], end=t + 0.01) for t in (0.050, 0.100, 0.160)]
    assert decode_steps_ms([c, *newcomers], 0.0, 1.0) == pytest.approx(10.0)

    # 8 streams of 32 tokens: each step also carries 7/32 of a 10 ms prefill
    assert decode_step_ms(12.0, 8, 32, 10.0) == pytest.approx(12.0 - 7 / 32 * 10.0)
    assert fit_line([1, 4, 8], [3.0, 6.0, 10.0]) == pytest.approx((2.0, 1.0), abs=0.1)
    intercept, slope = fit_line([1, 2], [0.5, 3.0])  # a negative intercept: refit through the origin
    assert intercept == 0.0 and slope > 0


def test_tune_says_what_capacity_an_infeasible_llm_needs() -> None:
    from tritongen.core.plan import plan_deployment
    from tritongen.core.traffic import TrafficSpec, generate_arrivals
    from tritongen.core.tune import Params, TuneInputs, needed_capacity
    from tritongen.specio import load_spec
    from tests.helpers import EXAMPLES

    loaded = load_spec(EXAMPLES / "deployment.yaml")
    spec = loaded.spec
    entry = plan_deployment(spec, loaded.architectures).entry("tinyllm")
    # one decode step of 20 ms + 2 ms per sequence, 4 at a time: about 11 requests/s of 16 tokens
    slow = EngineModel(kv_policy="grow_kill", kv_block_tokens=16, kv_pool_blocks=400, max_num_seqs=4,
                       curve=LLMCurve(prefill_fixed_ms=5.0, prefill_ms_per_token=0.1, decode_fixed_ms=20.0, decode_ms_per_seq=2.0))
    traffic = TrafficSpec(shape="poisson", rate_per_s=40.0, duration_s=20, warmup_s=1,
                          classes=[{"name": c.name, "share": c.share, "priority": c.priority, "prompt_tokens": 32, "output_tokens": 16}
                                   for c in spec.traffic_classes])
    arrivals = generate_arrivals(traffic, seed=1).with_priorities({c.name: c.priority for c in spec.traffic_classes})
    inputs = TuneInputs(spec=spec, entry=entry, arrivals=arrivals, classes=list(spec.traffic_classes), engine=slow)
    note = needed_capacity(inputs, Params(max_batch_size=4, preferred=(), delay_us=0, instances=1, policy="strict", max_num_seqs=4))
    assert "needs about" in note
    # the targets held at some rate below 40/s, and the note says how much more is needed
    needed = float(note.split("needs about ")[1].split("x")[0])
    assert 1.5 < needed < 40


def test_simulate_engine_option_and_served_vllm_configs() -> None:
    from tritongen.cli.simulate_cmd import parse_engine_option
    from tritongen.engine_files import as_served
    from tritongen.errors import BadInput
    from tritongen.pbtxt import parse_model_config
    from pathlib import Path

    stated = parse_engine_option("kv_policy=reserve_kill,kv_pool_tokens=1920,max_num_seqs=48")
    assert stated is not None and (stated.kv_policy, stated.kv_pool_tokens, stated.max_num_seqs) == ("reserve_kill", 1920, 48)
    with pytest.raises(BadInput, match="kv_policy"):
        parse_engine_option("kv_policy=evict")
    with pytest.raises(BadInput, match="key=value"):
        parse_engine_option("max_num_seqs")
    # the vLLM backend's sample config states neither its name nor its decoupled policy
    config = as_served(parse_model_config('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n', "c"), Path("/r/my_llm"))
    assert config.name == "my_llm" and config.model_transaction_policy.decoupled and config.max_batch_size == 0


def test_the_sidecar_reads_max_tokens_sent_as_a_numeric_string() -> None:
    from sidecar.reading import BadRequest, Stated, budget

    assert budget(Stated(sampling='{"max_tokens": "100"}'), "max_tokens") == (100,)  # vLLM's own client sends strings
    assert budget(Stated(budget_parameter="7"), "max_tokens") == (7,)
    with pytest.raises(BadRequest, match="must hold integers"):  # one rule on every path (issue 45): a 400
        budget(Stated(budget_parameter=True), "max_tokens")


def test_a_profile_carries_the_engine_section_its_spec_states() -> None:
    from tests.helpers import EXAMPLES
    from tritongen.profiler.profile_builder import ProfileBuilder
    from tritongen.profiler.run import default_settings
    from tritongen.profiler.targets import resolve_targets
    from tritongen.specio import load_spec

    loaded = load_spec(EXAMPLES / "deployment.yaml")
    streamed = {"max_batch_size": 23, "model_transaction_policy": {"decoupled": True},
                "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
                "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}]}
    batched = {"max_batch_size": 32, "input": [{"name": "FEATURES", "dims": [32]}], "output": [{"name": "SCORES", "dims": [1]}]}
    targets = {t.name: t for t in resolve_targets(ServedIndex({"ranker": batched, "tinyllm": streamed}), [], loaded)}  # type: ignore[arg-type]
    assert targets["ranker"].stated_engine is None  # a classic model states no engine
    profile = ProfileBuilder(targets["tinyllm"], default_settings(quick=True), "2.51.0", "http://x").build(True, None)
    assert profile.stated_engine is not None and profile.stated_engine.section.kv_policy == "grow_kill"
    assert profile.stated_engine.source == f"{loaded.path}, model 'tinyllm'"


def test_simulate_resolves_the_kv_policy_a_profile_carried_and_engine_overrides_it(tmp_path) -> None:
    from tests.helpers import EXAMPLE_PROFILES
    from tritongen.cli.simulate_cmd import parse_engine_option, read_service
    from tritongen.core.profile_types import StatedEngine, read_profile
    from tritongen.errors import BadInput
    from tritongen.pbtxt import parse_model_config

    # a Python backend's config that does not say its KV policy (tinyllm's, less its engine parameters)
    config_path = tmp_path / "llm" / "config.pbtxt"
    config_path.parent.mkdir()
    config_path.write_text('name: "llm"\nbackend: "python"\nmax_batch_size: 8\n'
                           'model_transaction_policy { decoupled: true }\n')
    config = parse_model_config(config_path.read_text(), str(config_path))
    old = (EXAMPLE_PROFILES / "tinyllm.json").read_text()
    assert read_profile(old).stated_engine is None  # a profile written before the field still loads
    with pytest.raises(BadInput, match="its KV policy is unknown"):
        read_service(EXAMPLE_PROFILES / "tinyllm.json").engine_for(config, config_path)

    carried = StatedEngine(section=EngineSection(kv_policy="grow_kill", max_num_seqs=6), source="spec.yaml, model 'llm'")
    profile_path = tmp_path / "llm.json"
    profile_path.write_text(read_profile(old).model_copy(update={"stated_engine": carried}).model_dump_json())
    service = read_service(profile_path)
    model = service.engine_for(config, config_path)
    assert (model.kv_policy, model.max_num_seqs) == ("grow_kill", 6)
    assert model.sources["kv_policy"] == "the spec's engine: section (spec.yaml, model 'llm'), carried by the profile"
    assert model.kv_pool_blocks * model.kv_block_tokens == 6848  # the pool the profile measured

    stated = parse_engine_option("kv_policy=reserve_kill")
    overridden = service.engine_for(config, config_path, stated)
    assert (overridden.kv_policy, overridden.sources["kv_policy"]) == ("reserve_kill", "--engine")
    assert overridden.max_num_seqs == 6  # what --engine does not state still comes from the profile


# -- prefill inside the decode step (vLLM V1, TensorRT-LLM in-flight batching) ---------------------

MIXED = COSTS.model_copy(update={"prefill_in_step": True})


def mixed(policy: str, pool_blocks: int, block: int = 4, seqs: int = 8) -> EngineModel:
    return EngineModel(kv_policy=policy, kv_block_tokens=block, kv_pool_blocks=pool_blocks, max_num_seqs=seqs, curve=MIXED)


def test_an_in_step_prefill_emits_its_first_token_at_the_end_of_the_forward_pass() -> None:
    # one forward pass: decode of the newcomer (2 + 1 x 1) + its prefill (1 + 0.1 x 10) = 5 ms;
    # then a decode step (3 ms) per further token: 8, 11 ms
    _state, events = run(mixed("grow_preempt", 64), [10], [3])
    assert times(events, FIRST) == {0: 5.0}
    assert times(events, DONE) == {0: 11.0}


def test_a_newcomer_waits_for_the_step_under_way_and_shares_the_next_one() -> None:
    model = mixed("grow_preempt", 64)
    state = EngineState(model, [10, 10], [4, 2])
    state.submit(0)
    t, events = state.step(0.0)  # request 0 alone: first token at 5 ms
    state.submit(1)  # arrives while request 0 runs
    t, more = state.step(t)  # one pass: decode of both (2 + 1 x 2) + the newcomer's prefill (2) = 6 ms
    events += more
    assert times(events, FIRST) == {0: 5.0, 1: 11.0}
    assert state.last_batch == 2


def test_in_step_and_before_step_prefills_cost_the_same_tokens() -> None:
    out_a = run(engine("grow_preempt", 64), [10, 20, 30], [5, 5, 5])[1]
    out_b = run(mixed("grow_preempt", 64), [10, 20, 30], [5, 5, 5])[1]
    assert len(times(out_a, DONE)) == len(times(out_b, DONE)) == 3


def test_in_step_preemption_resumes_without_a_second_first_token() -> None:
    # 3 blocks of 4 tokens: two sequences of 4 + 6 tokens cannot both grow to their ends
    state, events = run(mixed("grow_preempt", 3, block=4), [4, 4], [6, 6])
    assert sorted(times(events, DONE)) == [0, 1]
    assert len(times(events, FIRST)) == 2 and state.preemptions >= 1
