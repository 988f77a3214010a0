"""The prefix-cache verdict from first-token times (core.prefix_evidence), and the spec's
engine.prefix_caching reaching the files the engines read."""

from __future__ import annotations

from tritongen.core.engine_sources import measured_from_profile
from tritongen.core.prefix_evidence import judge_prefix_cache
from tritongen.core.profile_types import PrefixCacheSample


def _sample(tokens: int, fresh: float, repeat: float, spread: float = 0.5) -> PrefixCacheSample:
    return PrefixCacheSample(prompt_tokens=tokens, pairs=3, fresh_ttft_ms=fresh, repeat_ttft_ms=repeat,
                             fresh_spread_ms=spread)


def test_a_repeat_that_saves_its_prefill_is_cached_and_one_that_does_not_is_not() -> None:
    per_token = 0.1  # 256 tokens: 25.6 ms of prefill
    cached = judge_prefix_cache([_sample(128, 20.0, 9.0), _sample(256, 33.0, 9.5)], per_token)
    assert cached.caches is True and "256-token" in cached.evidence
    plain = judge_prefix_cache([_sample(128, 20.0, 19.5), _sample(256, 33.0, 32.1)], per_token)
    assert plain.caches is False and "not cached" in plain.evidence


def test_a_saving_inside_the_noise_cannot_be_told() -> None:
    probe = judge_prefix_cache([_sample(64, 5.0, 2.0, spread=4.0)], prefill_ms_per_token=0.01)
    assert probe.caches is None and "could not be told" in probe.evidence
    assert judge_prefix_cache([], 0.1).caches is None


def test_the_longest_length_that_can_be_told_decides() -> None:
    # at 512 tokens the spread swamps it; at 256 the repeat clearly saved its prefill
    probe = judge_prefix_cache([_sample(256, 30.0, 8.0, spread=1.0), _sample(512, 60.0, 59.0, spread=80.0)], 0.1)
    assert probe.caches is True and "256-token" in probe.evidence


def test_the_verdict_reaches_the_engine_model() -> None:
    from tritongen.core.profile_types import EngineMeasurement

    probe = judge_prefix_cache([_sample(256, 33.0, 9.5)], 0.1)
    engine = EngineMeasurement(
        interface="generic", interface_kind="generic", bytes_per_token=1.0, bytes_per_token_source="spec",
        request_overhead_ms=1.0, prefill_fixed_ms=1.0, prefill_ms_per_token=0.1, decode_fixed_ms=1.0,
        decode_ms_per_seq=0.1, decode_context_tokens=64, prefill_in_step=False, prefix_cache=probe,
    )
    measured = measured_from_profile(engine)
    assert measured.prefix_caching is True and measured.prefix_caching_evidence == probe.evidence


def test_a_probe_that_could_not_tell_is_a_gap_a_profile_can_hold() -> None:
    from tritongen.core.profile_types import MeasurementGap

    probe = judge_prefix_cache([_sample(64, 5.0, 2.0, spread=4.0)], prefill_ms_per_token=0.01)
    gap = MeasurementGap(measurement="prefix cache", unseen=probe.evidence, inferred="the engine's files")
    assert gap.measurement == "prefix cache"


def test_a_verdict_other_than_cached_is_checked_on_longer_prompts_within_the_context() -> None:
    """A short typical prompt makes short probe lengths; on the real vLLM (block 32) a 38-token
    prompt said "not cached" within its noise. Longer prompts follow, doubling, up to what fits."""
    from tritongen.profiler.prefix_probe import LONGER_STEPS, longer_lengths

    assert longer_lengths(64, 512) == [128, 256][:LONGER_STEPS]
    assert longer_lengths(300, 512) == [512]  # the last at the longest that fits
    assert longer_lengths(512, 512) == [] and longer_lengths(64, 0) == []
