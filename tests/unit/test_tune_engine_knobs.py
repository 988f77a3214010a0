"""The tuner's LLM engine knobs (`tritongen.core.tune.engine_knobs`): the step's token budget, the
prefix cache and the LLM-API's capacity policy, against cases worked out by hand, and the way back
into vLLM's model.json and the LLM-API's model.yaml."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import EXAMPLES
from tritongen.core.engine import EngineModel, EngineState, FIRST, LLMCurve
from tritongen.core.engine_sources import MeasuredEngine, resolve_engine
from tritongen.core.plan import plan_deployment
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.core.tune import Params, TuneInputs, apply_candidate, apply_results, capacity_factor, tune_model
from tritongen.core.tune.engine_knobs import budget_floor, budget_variants, cache_policy_variants
from tritongen.core.vllm_defaults import VLLM_SERVER_BATCHED_TOKENS, VLLM_SERVER_BATCHED_TOKENS_LARGE_DEVICE
from tritongen.render import render_plan
from tritongen.specio import load_spec

LOADED = load_spec(EXAMPLES / "gpu-deployment.yaml")
SPEC = LOADED.spec
PLAN = plan_deployment(SPEC, LOADED.architectures)
VLLM = PLAN.entry("qwen2.5-7b")
LLMAPI = PLAN.entry("qwen3-8b-trtllm")
INTERACTIVE = next(c for c in SPEC.traffic_classes if c.name == "interactive")  # TTFT P99 1500 ms

# prefill 1 ms + 0.05 ms/token inside the step; a step 4 ms + 0.5 ms per sequence
CURVE = LLMCurve(prefill_fixed_ms=1.0, prefill_ms_per_token=0.05, decode_fixed_ms=4.0, decode_ms_per_seq=0.5,
                 prefill_in_step=True)
ENGINE = EngineModel(kv_policy="grow_preempt", kv_block_tokens=16, kv_pool_blocks=4096, max_num_seqs=32,
                     max_batched_tokens=2048, prefix_caching=True, chunked_prefill=True, curve=CURVE)
BASE = Params(max_batch_size=0, preferred=(), delay_us=0, instances=1, policy="single", max_num_seqs=32)


def traffic(rate: float, prompt: int, prefix: int | None = None, n: int = 400):
    mix: dict[str, object] = {"name": "interactive", "share": 1.0, "priority": 1, "prompt_tokens": prompt, "output_tokens": 40}
    if prefix:
        mix["shared_prefix"] = {"tokens": prefix}
    spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=n / rate, warmup_s=0.5, classes=[mix])
    return generate_arrivals(spec, seed=1)


def inputs(arrivals, entry=VLLM, engine: EngineModel = ENGINE) -> TuneInputs:
    return TuneInputs(spec=SPEC, entry=entry, arrivals=arrivals, classes=[INTERACTIVE], engine=engine)


def test_one_shared_prefix_keeps_the_cache_on_and_it_carries_more_than_without() -> None:
    # 1500 shared tokens + 100 own: 80 ms of prefill each without the cache, about 6 ms with it
    result = tune_model(inputs(traffic(5.0, 100, prefix=1500)), top_coarse=1, capacity_top=1)
    winner = result.winner
    assert winner.params.prefix_caching in (None, True)  # served on (vLLM V1's default) and kept
    off = [e for e in result.table if e.params.prefix_caching is False]
    assert off, "the cache is varied where the traffic shares a prefix"
    assert all((e.capacity_factor or 0.0) < (winner.capacity_factor or 0.0) for e in off)
    assert winner.capacity_factor is not None and off[0].capacity_factor is not None
    assert winner.capacity_factor > 2 * off[0].capacity_factor


def test_traffic_that_shares_nothing_leaves_the_cache_as_served() -> None:
    plain = inputs(traffic(5.0, 100))
    assert cache_policy_variants(plain, BASE) == []
    result = tune_model(plain, top_coarse=1, capacity_top=1)
    assert all(e.params.prefix_caching is None for e in result.table)
    # the LLM-API's capacity policy is still tried: it does not depend on sharing
    policies = cache_policy_variants(inputs(traffic(5.0, 100), entry=LLMAPI), BASE)
    assert [p.kv_policy for p in policies] == ["reserve_wait"] and all(p.prefix_caching is None for p in policies)


def test_a_tight_step_budget_carries_less_of_long_prompts() -> None:
    # 3000-token prompts: a 256-token budget prefills each over 12 steps, every one paying the running
    # batch's decode; 4096 takes a prompt in one step
    long = inputs(traffic(2.0, 3000), engine=ENGINE.model_copy(update={"prefix_caching": False}))
    tight = capacity_factor(long, BASE.model_copy(update={"max_batched_tokens": 256}), long.arrivals)
    wide = capacity_factor(long, BASE.model_copy(update={"max_batched_tokens": 4096}), long.arrivals)
    assert 0 < tight < wide


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    engine = ENGINE.model_copy(update={"max_batched_tokens": 100, "prefix_caching": False})
    state = EngineState(engine, [250], [2])
    state.submit(0)
    t, firsts = 0.0, []
    for _ in range(3):
        t, events = state.step(t)
        firsts += [e for e in events if e[1] == FIRST]
    # 100 + 100 + 50 tokens: the first token at the third step's end; each step 4.5 ms for the
    # sequence in the pass and 1 ms + 0.05 ms/token for its chunk: 3 x 4.5 + 3 x 1 + 0.05 x 250 = 29 ms
    assert len(firsts) == 1 and not state.partial and state.running == [0]
    assert firsts[0][2] == pytest.approx(0.029)


def test_budget_options_stay_between_one_steps_progress_and_the_pool() -> None:
    tuned = inputs(traffic(5.0, 100))
    options = [p.max_batched_tokens for p in budget_variants(tuned, BASE)]
    floor, _ = budget_floor(tuned, ENGINE)
    assert floor == 32 + 16  # a decode token per sequence and one block
    assert options == [512, 1024, 4096, 8192] and all(floor <= b <= ENGINE.pool_tokens for b in options)
    unchunked = inputs(traffic(5.0, 3000), engine=ENGINE.model_copy(update={"chunked_prefill": False}))
    assert budget_floor(unchunked, unchunked.engine)[0] == 3000  # the longest prompt in one step
    stated = ENGINE.model_copy(update={"chunked_prefill": False, "max_context": 32768})
    floor, why = budget_floor(inputs(traffic(5.0, 3000), engine=stated), stated)
    assert floor == 32768 and "max_model_len" in why  # vLLM refuses a budget below it without chunking


def test_vllm_states_its_budget_default_once_by_gpu() -> None:
    measured = MeasuredEngine(curve=CURVE, kv_capacity_tokens=4096)
    small = resolve_engine(model="m", backend="vllm", parameters={}, measured=measured, engine_args={})
    assert small.max_batched_tokens == VLLM_SERVER_BATCHED_TOKENS and small.chunked_prefill
    assert "default max_num_batched_tokens" in small.sources["max_batched_tokens"]
    h100 = resolve_engine(model="m", backend="vllm", parameters={}, measured=measured, engine_args={},
                          device=(81559 * 2**20, "H100-SXM-80GB"))
    a100 = resolve_engine(model="m", backend="vllm", parameters={}, measured=measured, engine_args={},
                          device=(81920 * 2**20, "A100-SXM-80GB"))
    assert (h100.max_batched_tokens, a100.max_batched_tokens) == (VLLM_SERVER_BATCHED_TOKENS_LARGE_DEVICE, VLLM_SERVER_BATCHED_TOKENS)
    stated = resolve_engine(model="m", backend="vllm", parameters={}, measured=measured,
                            engine_args={"max_num_batched_tokens": 512, "enable_chunked_prefill": False})
    assert stated.max_batched_tokens == 512 and not stated.chunked_prefill


def test_apply_writes_the_knobs_where_render_takes_them() -> None:
    chosen = BASE.model_copy(update={"max_batched_tokens": 4096, "prefix_caching": False})
    vllm = apply_candidate(VLLM, chosen, [INTERACTIVE], SPEC)
    llmapi = apply_candidate(LLMAPI, chosen.model_copy(update={"kv_policy": "grow_preempt"}), [INTERACTIVE], SPEC)
    rendered = render_plan(apply_results(PLAN, {VLLM.name: vllm, LLMAPI.name: llmapi}), "gpu-deployment.yaml")
    args = json.loads(rendered.files[f"{VLLM.name}/1/model.json"])
    assert args["max_num_batched_tokens"] == 4096 and args["enable_prefix_caching"] is False
    config = rendered.files[f"{VLLM.name}/config.pbtxt"]
    assert "max_num_batched_tokens 4096 in 1/model.json: chosen by `tritongen tune`" in config
    text = rendered.files[f"{LLMAPI.name}/1/model.yaml"]
    data = yaml.safe_load(text)
    assert data["kv_cache_config"]["enable_block_reuse"] is False and data["max_num_tokens"] == 4096
    assert data["scheduler_config"]["capacity_scheduler_policy"] == "MAX_UTILIZATION"
    assert "# chosen by `tritongen tune`" in text.split("enable_block_reuse:")[0].splitlines()[-2]
    assert LLMAPI.llm_args is not None and LLMAPI.llm_args["kv_cache_config"]["enable_block_reuse"] is True  # plan untouched


def test_a_knob_the_spec_states_follows_the_tuned_files_and_the_user_is_told() -> None:
    """A spec whose engine: section states a knob tune changed contradicts the tuned model.json, which
    the sidecar's policy refuses (tune stopped on it, examples/llm_standins' max_batched_tokens): the
    policy is built from the spec as tuned, and a note names the line to change."""
    from tritongen.core.tune import spec_with_tuned_engines

    loaded = load_spec(EXAMPLES / "llm_standins" / "deployment.yaml")
    plan = plan_deployment(loaded.spec, loaded.architectures)
    model = next(m for m in loaded.spec.models if m.name == "vllm_standin")
    assert model.engine is not None and model.engine.max_batched_tokens == 2048
    entry = next(e for e in plan.entries if e.spec_model == "vllm_standin")
    chosen = Params(max_batch_size=0, preferred=(), delay_us=0, instances=1, policy="single",
                    max_num_seqs=model.engine.max_num_seqs, max_batched_tokens=512)
    tuned, notes = spec_with_tuned_engines(loaded.spec, plan, {entry.name: chosen})
    section = next(m for m in tuned.models if m.name == "vllm_standin").engine
    assert section is not None and section.max_batched_tokens == 512
    assert section.max_num_seqs == model.engine.max_num_seqs  # unchanged values stay as stated
    assert notes == ["vllm_standin: the spec's engine.max_batched_tokens is 2048, the tuned files run 512: change it "
                     "in the spec to render the same repository again"]
    assert model.engine.max_batched_tokens == 2048  # the user's spec is not changed in place
