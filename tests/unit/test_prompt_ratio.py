"""Prompt bytes per token learnt from the engine's own counter (sidecar/admission_prompts.py), and the
sidecar counting prompts with it where the policy names no tokenizer."""

from __future__ import annotations

import asyncio

from sidecar.admission import AdmissionState
from sidecar.admission_types import HeadroomSnapshot, Request
from sidecar.cost import LLMFacts, cost_for
from sidecar.headroom import TritonMetricsSource
from tritongen.core.sidecar_policy.schema import parse_policy
from sidecar.admission_prompts import MIN_TOKENS, LearnedRatio
from tests.sidecar_rigs import FakeClock, policy_doc


def test_the_ratio_is_the_bytes_sent_over_the_tokens_the_engine_counted_once_enough_passed() -> None:
    learned = LearnedRatio()
    assert learned.observe(0, 5_000) is None  # the counter's value before the sidecar sent anything
    assert learned.observe(4_000, 5_000 + 1_000) is None  # too few tokens yet for a ratio of many prompts
    assert learned.observe(4 * MIN_TOKENS, 5_000 + MIN_TOKENS) == 4.0
    # The engine restarted (its counter went back): the window starts again, the last ratio stays.
    restart = 4 * MIN_TOKENS + 10
    assert learned.observe(restart, 3) == 4.0
    assert learned.observe(restart + 3 * 2 * MIN_TOKENS, 3 + 2 * MIN_TOKENS) == 3.0


def test_the_metrics_source_reads_the_engines_prompt_token_counter_per_model() -> None:
    text = ('nv_inference_count{model="llm",version="1"} 3\n'
            'vllm:prompt_tokens_total{model="llm",version="1"} 1200\n'
            'vllm:prompt_tokens_total{model="other",version="1"} 7\n')

    async def fetch() -> str:
        return text

    got = asyncio.run(TritonMetricsSource(fetch, ["cpu"], ["llm"]).read())
    assert got.prompt_tokens_total == {"llm": 1200.0}


def test_without_a_tokenizer_the_sidecar_counts_prompts_with_the_learnt_ratio() -> None:
    clock = FakeClock()
    state = AdmissionState(parse_policy(policy_doc()), clock)  # llm: 1 byte per token, the bound
    assert state.prompts.counter("llm") is None and "bound" in state.prompts.describe("llm")
    state.observe_headroom(HeadroomSnapshot(clock(), prompt_tokens_total={"llm": 100.0}))
    model = state.model_policy("llm")
    sent = 0
    for i in range(MIN_TOKENS // 10 + 1):
        request = Request(i, "llm", "batch", cost_for(model, LLMFacts(prompt_bytes=[40], max_tokens=[1])))
        assert state.submit(request).admitted
        state.release(request.id)
        sent += 40
    state.observe_headroom(HeadroomSnapshot(clock(), prompt_tokens_total={"llm": 100.0 + sent / 4}))
    counter = state.prompts.counter("llm")
    assert counter is not None and counter(b"x" * 400) == 100
    assert "4 bytes/token, learnt" in state.status()["models"]["llm"]["prompt_tokens_counted_by"]
