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
from tritongen.core.profile_types import ArrivalBurst, PrefixCacheProbe, PrefixCacheSample
from tritongen.core.prompts import prompt_of
from tritongen.profiler.first_output import first_output_int
from tritongen.profiler.load import ModelFailed, StreamLoad

PAIRS = 3
# Arrivals with a cached prefix (`probe_cached_arrivals`): BURST sent at once against one alone, as
# many times as the profile repeats each prefill length. Eight stand clear of one step's jitter
# (about 2 ms a step on vLLM-CPU against 7 ms or more an arrival) and fit in the smallest engines'
# sequence limits; an engine that runs fewer at once queues the rest, which the makespan still holds.
BURST = 8
LONGER_STEPS = 2  # longer prompts tried after a verdict other than "cached": x2 and x4 the longest probed
# salts of their own, from a random start: a second profile of the same server meets none of these
_SALTS = itertools.count(10**9 + secrets.randbelow(1000) * 10**6)


def _pair_inputs(interface: LLMInterface, prompt_tokens: int, bytes_per_token: float) -> RequestInputs:
    return text_inputs(interface, prompt_of(prompt_tokens, interface.sizing_bytes_per_token(bytes_per_token), salt=next(_SALTS)))


def text_inputs(interface: LLMInterface, text: str, count_input_tokens: bool = False) -> RequestInputs:
    """One request of exactly `text` (no salt) for one output token, in the model's interface."""
    return RequestInputs(numpy_inputs(interface.request(text, 1, stream=True, count_input_tokens=count_input_tokens)),
                         interface.request_parameters(1))


def _first_token_ms(load: StreamLoad) -> list[float]:
    """The first tokens of PAIRS single requests (StreamLoad.singles) that did not fail."""
    return [r.ttft_s * 1000.0 for r in load.singles(PAIRS) if r.error is None and r.ttft_s is not None]


def probe_prefix_cache(grpc_url: str, model: str, interface: LLMInterface, bytes_per_token: float,
                       lengths: Sequence[int], prefill_ms_per_token: float,
                       update: Callable[[str], None] = lambda _w: None, longest: int = 0,
                       salt_surplus: int = 0, rounds: int = 5) -> PrefixCacheProbe:
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
    if verdict.caches:
        told = max(s.prompt_tokens for s in samples)
        verdict.arrivals = probe_cached_arrivals(grpc_url, model, interface, bytes_per_token, told, update, salt_surplus, rounds)
    return verdict


def probe_cached_arrivals(grpc_url: str, model: str, interface: LLMInterface, bytes_per_token: float, length: int,
                          update: Callable[[str], None] = lambda _w: None, salt_surplus: int = 0,
                          rounds: int = 5) -> list[ArrivalBurst]:
    """Bursts of arrivals whose prompts begin with a prefix the engine has cached, at two prefix
    lengths and two tails of their own (`length` the longest the cache was told at): what one more
    such arrival costs the engine, for `core.cached_prefill`'s line. A burst that fails is left out.
    Each salted part is short by `salt_surplus` as a load's prompts are (`core.prompts.prompt_of`):
    the fit splits a prompt into cached and computed tokens by its nominal size, and a tail 10-16
    tokens longer than said moved a tiny Llama's computed tokens by half a 32-token block."""
    bpt = interface.sizing_bytes_per_token(bytes_per_token)
    quarter = max(1, length // 4)
    out: list[ArrivalBurst] = []
    for shared, own in ((length, 0), (quarter, 0), (quarter, 2 * quarter), (2 * quarter, 2 * quarter)):  # none past `length`
        update(f"arrivals with a cached prefix: {shared} cached + {own} own tokens")
        head = prompt_of(shared, bpt, salt=next(_SALTS), salt_surplus=salt_surplus)
        if own:  # the prefix, filler cut mid-word, ends in a newline so its last token does not merge with the tail
            head = head[:-1] + "\n"

        def texts(n: int) -> list[str]:
            return [head + prompt_of(own, bpt, salt=next(_SALTS), salt_surplus=salt_surplus) if own else head for _ in range(n)]

        if _makespan_ms(grpc_url, model, interface, texts(1)) is None:  # fills the cache with the prefix
            continue
        single = [m for _ in range(rounds) if (m := _makespan_ms(grpc_url, model, interface, texts(1))) is not None]
        burst = [m for _ in range(rounds) if (m := _makespan_ms(grpc_url, model, interface, texts(BURST))) is not None]
        if single and burst:
            whole, alone = counted_prompt_tokens(grpc_url, model, interface, texts(1)[0]), counted_prompt_tokens(grpc_url, model, interface, head)
            out.append(ArrivalBurst(shared_tokens=shared, own_tokens=own, burst=BURST, rounds=min(len(single), len(burst)),
                                    single_ms=round(statistics.median(single), 3), burst_ms=round(statistics.median(burst), 3),
                                    burst_spread_ms=round(max(burst) - min(burst), 3),
                                    counted_tokens=whole, counted_shared_tokens=alone if whole else None))
    return out


def counted_prompt_tokens(grpc_url: str, model: str, interface: LLMInterface, text: str) -> int | None:
    """The engine's count of `text`'s prompt tokens, where the model returns one (None: it does not).
    A text holds its nominal size only to within a few tokens, and a block boundary between the
    two moves a burst's cached tokens by a whole block."""
    output = interface.input_token_count_output
    if not output:
        return None
    inputs = text_inputs(interface, text, count_input_tokens=True)
    try:
        return first_output_int(grpc_url, model, inputs, output, parameters=inputs.parameters) or None
    except ModelFailed:  # a count is optional: the nominal sizes stand without it
        return None


def _makespan_ms(grpc_url: str, model: str, interface: LLMInterface, texts: Sequence[str]) -> float | None:
    """One stream per text, connected first and sent at once, one token each: from the first send
    to the last first token; None if any failed."""
    each = [text_inputs(interface, t) for t in texts]
    workers, stop = StreamLoad.of(grpc_url, model, each[0], interface, salted=False).start(
        len(each), limit=1, together=True, each=each)
    for w in workers:
        w.join(60.0)
    StreamLoad.finish(workers, stop)
    records = [w.records[0] for w in workers if w.records]
    if len(records) < len(texts) or any(r.error is not None or not r.token_times for r in records):
        return None
    return (max(r.token_times[0] for r in records) - min(r.start for r in records)) * 1000.0


def longer_lengths(probed: int, longest: int) -> list[int]:
    """The longer prompts a verdict other than "cached" is checked at: doubling from the longest
    probed, at most LONGER_STEPS of them, the last at `longest` (what the model's context holds)."""
    out: list[int] = []
    length = probed
    while len(out) < LONGER_STEPS and length < longest:
        length = min(longest, 2 * length)
        out.append(length)
    return out
