"""Whether an engine caches prompt prefixes, judged from first-token times. Pure.

The probe (`profiler.prefix_probe`) sends a fresh prompt and then the same prompt again, at a few
lengths. An engine that caches serves the repeat's full blocks from memory, so its first token
comes sooner by about the prefill those tokens cost; one that does not takes as long both times.
What the repeat must save is not a threshold fitted anywhere: it is the model's own measured
prefill cost per token times the prompt's length, and it must stand clear of the fresh prompts'
own spread to say anything at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritongen.core.profile_types import PrefixCacheProbe, PrefixCacheSample

CLEAR_OF_NOISE = 2.0  # the prefill a cache would save must be this many times the fresh prompts' spread
SAVED_FRACTION = 0.5  # a repeat that saves at least half that prefill was served from a cache


def judge_prefix_cache(samples: Sequence[PrefixCacheSample], prefill_ms_per_token: float) -> PrefixCacheProbe:
    """The verdict from the longest length at which a cache's saving can be told from noise."""
    told = [s for s in samples
            if (cost := prefill_ms_per_token * s.prompt_tokens) > 0 and cost >= CLEAR_OF_NOISE * s.fresh_spread_ms]
    if not told:
        longest = max(samples, key=lambda s: s.prompt_tokens, default=None)
        detail = "no prompt length was probed" if longest is None else (
            f"at {longest.prompt_tokens} tokens the prefill costs {prefill_ms_per_token * longest.prompt_tokens:.2f} ms, "
            f"within the fresh prompts' own spread of {longest.fresh_spread_ms:.2f} ms")
        return PrefixCacheProbe(caches=None, evidence=f"could not be told: {detail}", samples=list(samples))
    best = max(told, key=lambda s: s.prompt_tokens)
    cost = prefill_ms_per_token * best.prompt_tokens
    saved = best.fresh_ttft_ms - best.repeat_ttft_ms
    caches = saved >= SAVED_FRACTION * cost
    said = "served from a cache" if caches else "not cached"
    return PrefixCacheProbe(
        caches=caches,
        evidence=(f"{said}: a repeated {best.prompt_tokens}-token prompt's first token in {best.repeat_ttft_ms:.2f} ms "
                  f"against {best.fresh_ttft_ms:.2f} ms fresh (saved {saved:.2f} ms of the {cost:.2f} ms its prefill costs; "
                  f"median of {best.pairs} pairs)"),
        samples=list(samples),
    )
