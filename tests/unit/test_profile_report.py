"""The profile's HTML report says what the model did not show beside what it did: the gaps (what
was taken instead), the notes, and an LLM that is not decoupled gets its own section (issue 43)."""

from __future__ import annotations

from tests.helpers import EXAMPLE_PROFILES
from tritongen.core.profile_types import MeasurementGap, UnaryLLMMeasurement, read_profile
from tritongen.profiler.report import render_html


def test_the_report_names_each_gap_and_what_was_taken_instead() -> None:
    profile = read_profile((EXAMPLE_PROFILES / "tinyllm.json").read_text())
    gap = MeasurementGap(measurement="token counts", unseen="no num_output_tokens output <&>",
                         inferred="4 bytes per token, assumed")
    page = render_html([profile.model_copy(update={"gaps": [gap], "notes": ["a note of the run"]})])
    assert "What the model did not show" in page and "token counts" in page
    assert "no num_output_tokens output &lt;&amp;&gt;" in page  # escaped, verbatim
    assert "4 bytes per token, assumed" in page and "a note of the run" in page


def test_a_profile_without_gaps_has_no_gap_table() -> None:
    profile = read_profile((EXAMPLE_PROFILES / "ranker.json").read_text())
    assert "What the model did not show" not in render_html([profile.model_copy(update={"gaps": []})])


def test_an_llm_that_is_not_decoupled_shows_its_static_batches_and_the_models_error() -> None:
    profile = read_profile((EXAMPLE_PROFILES / "ranker.json").read_text())
    llm = UnaryLLMMeasurement(interface="generic (prompt, no stream input, parameters.max_tokens)", budget_honoured=True,
                              latency_ms_by_budget=[(1, 7.8), (32, 113.0)], probe_prompt_tokens=18, probe_max_tokens=32,
                              batch_fits=[(4, True), (5, True), (6, False)], largest_batch_that_fits=5,
                              smallest_batch_that_fails=6, kv_capacity_tokens=250, failure_sample="CUDA out of memory")
    page = render_html([profile.model_copy(update={"llm": llm})])
    assert "not decoupled" in page and "6 out of memory" in page and "250 tokens" in page
    assert "CUDA out of memory" in page
