"""The LLM engine's own knobs the tuner varies beside `max_num_seqs`, and where render writes each.

- the step's token budget (`Params.max_batched_tokens`): vLLM's `max_num_batched_tokens`, the
  LLM-API's `max_num_tokens`. More tokens per step let more newcomers prefill together (sooner
  first tokens under load), fewer keep each step short for the running streams. Tried around the
  served value (the engine's default where nothing states it, `core.vllm_defaults` /
  `core.trtllm_args`), at least what one step needs to make progress and at most the KV pool;
- the prefix cache (`Params.prefix_caching`): vLLM's `enable_prefix_caching`, the LLM-API's
  `kv_cache_config.enable_block_reuse`. Tried on and off only where the traffic shares prompts (a
  prefix, a conversation): where it shares nothing the cache cannot change a prediction, and the
  served value stays;
- the capacity policy (`Params.kv_policy`, the LLM-API's `scheduler_config.capacity_scheduler_policy`):
  GUARANTEED_NO_EVICT reserves a whole sequence at admission (`reserve_wait`), MAX_UTILIZATION
  admits what fits now and pauses sequences when the pool runs dry (`grow_preempt`).

A knob is varied only where the entry has a file render writes it in (`KNOB_KEYS`): vLLM's
model.json, the LLM-API's model.yaml, or a config parameter the backend reads (tritongen's
documented engine parameters, where the plan already writes that parameter).
"""

from __future__ import annotations

from typing import Literal

from tritongen.core.engine import EngineModel
from tritongen.core.llmapi_spec import KV_POLICY_TO_CAPACITY
from tritongen.core.plan import ModelEntryPlan
from tritongen.core.tune.inputs import Params, TuneInputs

Knob = Literal["max_batched_tokens", "prefix_caching", "kv_policy"]
Home = Literal["engine_args", "llm_args", "parameters"]

# Where each knob is written, per file (llm_args keys dotted as model.yaml nests them).
KNOB_KEYS: dict[Home, dict[Knob, str]] = {
    "engine_args": {"max_batched_tokens": "max_num_batched_tokens", "prefix_caching": "enable_prefix_caching"},
    "llm_args": {"max_batched_tokens": "max_num_tokens", "prefix_caching": "kv_cache_config.enable_block_reuse",
                 "kv_policy": "scheduler_config.capacity_scheduler_policy"},
    "parameters": {"max_batched_tokens": "max_batched_tokens", "prefix_caching": "prefix_caching"},
}
BUDGET_STEPS = (0.25, 0.5, 2.0, 4.0)  # multiples of the served budget tried beside it


def home_of(entry: ModelEntryPlan) -> Home | None:
    """The file render writes this entry's engine arguments in, or None (not an LLM engine)."""
    if entry.kind != "llm":
        return None
    if entry.engine_args is not None:
        return "engine_args"
    if entry.llm_args is not None:
        return "llm_args"
    return "parameters"


def knobs_of(entry: ModelEntryPlan) -> dict[Knob, str]:
    """The knobs the tuner may vary for this entry, each with the key render writes it under. A
    config parameter counts only where the plan writes it already (the backend reads it)."""
    home = home_of(entry)
    if home is None:
        return {}
    keys = KNOB_KEYS[home]
    if home == "parameters":
        return {k: key for k, key in keys.items() if key in entry.parameters}
    return dict(keys)


def budget_floor(inputs: TuneInputs, engine: EngineModel) -> tuple[int, str]:
    """The smallest step budget that lets every step make progress, and why: with chunked prefill a
    full batch of decode tokens (one per sequence; vLLM refuses a budget below max_num_seqs) and one
    block of prefill; without it, the longest prompt of the traffic in one step (and for vLLM its
    max_model_len, which it checks at start)."""
    decode = engine.max_num_seqs + engine.kv_block_tokens
    if engine.chunked_prefill:
        return decode, "max_num_seqs decode tokens and one block of prefill"
    longest = int(inputs.arrivals.prompt.max()) if len(inputs.arrivals) else 0
    if inputs.entry.engine_args is not None and engine.max_context:
        return max(decode, longest, engine.max_context), "max_model_len (chunked prefill off)"
    return max(decode, longest), "the traffic's longest prompt (chunked prefill off)"


def engine_for(inputs: TuneInputs, params: Params) -> EngineModel:
    """The served engine with a candidate's engine knobs (None: as served)."""
    assert inputs.engine is not None
    update: dict[str, object] = {}
    if params.max_num_seqs:
        update["max_num_seqs"] = params.max_num_seqs
    if params.max_batched_tokens is not None:
        update["max_batched_tokens"] = params.max_batched_tokens
    if params.prefix_caching is not None:
        update["prefix_caching"] = params.prefix_caching
    if params.kv_policy is not None:
        update["kv_policy"] = params.kv_policy
    return inputs.engine.model_copy(update=update) if update else inputs.engine


def budget_variants(inputs: TuneInputs, best: Params) -> list[Params]:
    """`best` with other step budgets: multiples of the served one within [floor, KV pool]."""
    if inputs.engine is None or "max_batched_tokens" not in knobs_of(inputs.entry):
        return []
    engine = engine_for(inputs, best)
    served = engine.max_batched_tokens
    if served is None:
        return []
    floor, _ = budget_floor(inputs, engine)
    top = engine.pool_tokens
    options = sorted({min(top, max(floor, int(served * f))) for f in BUDGET_STEPS} - {served})
    return [best.model_copy(update={"max_batched_tokens": b}) for b in options if floor <= b <= top]


def cache_policy_variants(inputs: TuneInputs, best: Params) -> list[Params]:
    """`best` with the prefix cache flipped (only where the traffic shares prompts and the pool is
    one of blocks) and the other capacity policy, and both: what the served engine is not."""
    if inputs.engine is None:
        return []
    knobs = knobs_of(inputs.entry)
    engine = engine_for(inputs, best)
    caches: list[bool | None] = [None]
    if "prefix_caching" in knobs and inputs.arrivals.shares_prompts and engine.kv_footprint is None:
        caches.append(not engine.prefix_caching)
    policies: list[str | None] = [None]
    if "kv_policy" in knobs:
        policies += [p for p in KV_POLICY_TO_CAPACITY if p != engine.kv_policy]
    return [best.model_copy(update={"prefix_caching": c, "kv_policy": p})
            for c in caches for p in policies if (c, p) != (None, None)]
