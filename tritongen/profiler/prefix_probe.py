"""The prefix-cache probe: fresh prompts against one prompt sent again and again, on an idle engine.

Every other measurement salts its prompts so that a cache cannot hide the prefill it measures;
this one repeats a prompt on purpose. At each length two streams run one after the other, each
sending PAIRS + 1 requests whose first only warms the path (a new stream's first request is slower):
one salts every prompt (fresh: nothing to reuse), the other sends one text whose start no earlier
prompt had, so its first request fills the cache and the rest are repeats that an engine hashing
blocks from the start (vLLM, TensorRT-LLM block reuse) serves from it. The verdict is
`core.prefix_evidence.judge_prefix_cache`'s.
"""

from __future__ import annotations

import itertools
import secrets
import statistics
from collections.abc import Callable, Sequence

from tritongen.client import RequestInputs, numpy_inputs
from tritongen.core.llm_interface import LLMInterface
from tritongen.core.prefix_evidence import judge_prefix_cache
from tritongen.core.profile_types import PrefixCacheProbe, PrefixCacheSample
from tritongen.core.prompts import prompt_of
from tritongen.profiler.load import StreamLoad

PAIRS = 3
LONGER_STEPS = 2  # longer prompts tried after a verdict other than "cached": x2 and x4 the longest probed
# salts of their own, from a random start: a second profile of the same server meets none of these
_SALTS = itertools.count(10**9 + secrets.randbelow(1000) * 10**6)


def _pair_inputs(interface: LLMInterface, prompt_tokens: int, bytes_per_token: float) -> RequestInputs:
    text = prompt_of(prompt_tokens, interface.sizing_bytes_per_token(bytes_per_token), salt=next(_SALTS))
    arrays = numpy_inputs(interface.request(text, 1, stream=True))
    return RequestInputs(arrays, interface.request_parameters(1))


def _first_token_ms(load: StreamLoad) -> list[float]:
    """The first tokens of PAIRS single requests (StreamLoad.singles) that did not fail."""
    return [r.ttft_s * 1000.0 for r in load.singles(PAIRS) if r.error is None and r.ttft_s is not None]


def probe_prefix_cache(grpc_url: str, model: str, interface: LLMInterface, bytes_per_token: float,
                       lengths: Sequence[int], prefill_ms_per_token: float,
                       update: Callable[[str], None] = lambda _w: None, longest: int = 0) -> PrefixCacheProbe:
    """At each length, fresh prompts and repeats of one prompt (medians), then the verdict; where it
    is not "served from a cache", longer prompts (`longer_lengths`, up to `longest`) until it is.

    Why longer: the lengths come from the traffic's typical prompt, and a short one makes a probe
    whose saving is within the noise or a single cache block. On the real vLLM with 8-token typical
    prompts (block 32) the probe said "not cached" from a 38-token prompt (one block, the saving
    within three samples' spread), which turned the simulated engine's cache off and put its capacity
    on a shared prompt at 0.59x the live one; at 128 tokens the same engine's repeat saves most of
    its prefill. "Not cached" is only said where no longer prompt fits to show otherwise."""
    samples: list[PrefixCacheSample] = []

    def probe(length: int) -> None:
        update(f"prefix cache at {length} prompt tokens")
        inputs = _pair_inputs(interface, length, bytes_per_token)
        fresh = _first_token_ms(StreamLoad.of(grpc_url, model, inputs, interface))
        repeat = _first_token_ms(StreamLoad.of(grpc_url, model, inputs, interface, salted=False))
        if fresh and repeat:
            samples.append(PrefixCacheSample(
                prompt_tokens=length, pairs=min(len(fresh), len(repeat)), fresh_ttft_ms=round(statistics.median(fresh), 3),
                repeat_ttft_ms=round(statistics.median(repeat), 3), fresh_spread_ms=round(max(fresh) - min(fresh), 3),
            ))

    for length in lengths:
        probe(length)
    verdict = judge_prefix_cache(samples, prefill_ms_per_token)
    for length in longer_lengths(max(lengths, default=0), longest):
        if verdict.caches:
            break
        probe(length)
        verdict = judge_prefix_cache(samples, prefill_ms_per_token)
    return verdict


def longer_lengths(probed: int, longest: int) -> list[int]:
    """The longer prompts a verdict other than "cached" is checked at: doubling from the longest
    probed, at most LONGER_STEPS of them, the last at `longest` (what the model's context holds)."""
    out: list[int] = []
    length = probed
    while len(out) < LONGER_STEPS and length < longest:
        length = min(longest, 2 * length)
        out.append(length)
    return out
