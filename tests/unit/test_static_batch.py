"""A static-batch LLM's rendered max_batch_size stays within the batch its profile measured to fit
(core.static_batch, issue 43)."""

from __future__ import annotations

from tests.helpers import EXAMPLE_PROFILES, EXAMPLES
from tritongen.core.plan import plan_deployment
from tritongen.core.profile_types import UnaryLLMMeasurement, read_profile
from tritongen.core.static_batch import cap_static_batches, measured_batch_bound
from tritongen.specio import load_spec


def _llm(fit: int, fail: int | None, prompt: int = 32, output: int = 32) -> UnaryLLMMeasurement:
    return UnaryLLMMeasurement(
        interface="generic (text_input, no stream input, parameters.max_tokens; not decoupled)", budget_honoured=True,
        probe_prompt_tokens=prompt, probe_max_tokens=output, batch_fits=[(fit, True)] + ([(fail, False)] if fail else []),
        largest_batch_that_fits=fit, smallest_batch_that_fails=fail, kv_capacity_tokens=fit * (prompt + output),
    )


def _profile(llm: UnaryLLMMeasurement | None):
    base = read_profile((EXAMPLE_PROFILES / "ranker.json").read_text())
    return base.model_copy(update={"llm": llm})


def test_the_bound_scales_from_the_probe_request_to_the_spec_request() -> None:
    profile = _profile(_llm(5, 6))  # 5 x 64 = 320 tokens fit
    assert measured_batch_bound(profile, None) == 5
    assert measured_batch_bound(profile, 32) == 10
    assert measured_batch_bound(profile, 1000) == 1  # never 0: one request per execution still runs
    assert measured_batch_bound(_profile(_llm(8, None)), None) is None  # nothing failed: nothing bounds it
    assert measured_batch_bound(_profile(None), None) is None


def test_a_classic_entry_is_capped_and_says_why_and_a_decoupled_one_is_not() -> None:
    loaded = load_spec(EXAMPLES / "deployment.yaml")
    plan = plan_deployment(loaded.spec, loaded.architectures)
    ranker = next(e for e in plan.entries if e.name == "ranker")
    streaming = next(e for e in plan.entries if e.decoupled)
    assert ranker.max_batch_size > 5
    capped = cap_static_batches(plan, {"ranker": _profile(_llm(5, 6)), streaming.name: _profile(_llm(1, 2))}, {})
    after = {e.name: e for e in capped.entries}
    assert after["ranker"].max_batch_size == 5
    assert all(s <= 5 for s in after["ranker"].dynamic_batching.preferred_batch_sizes)
    assert any("lowered to 5" in note for note in after["ranker"].notes)
    assert after[streaming.name] == streaming
