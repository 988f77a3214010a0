"""A request's memory cost from what it asks for. Pure arithmetic over the policy's cost model.

LLM: for each sequence, (prompt tokens + requested output tokens), clamped to max_context and
rounded up to whole KV blocks, at the KV bytes a sequence of that length holds (`KVCost.bytes_at`),
plus the profiled prefill peak for the prompt length (held only until the first token). Classic: the
per-request memory the policy names. A request that can never run is marked (`Cost.never`) rather
than clamped, so it is refused at once instead of killed by the engine: output tokens of max_context
or more, or a footprint beyond one engine's whole pool. An engine that grows and preempts (vLLM) is
charged no KV bytes: nothing is reserved for it.

Each stated prompt's length in tokens (`Cost.prompt_lengths`) feeds the `sidecar_prompt_tokens`
histogram (doctor rule DR103): at the default 1.0 bytes per token they are bytes, which over-counts
a sub-word tokenizer by a roughly constant factor, and the spread P95 / P50 DR103 judges does not
change with that factor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sidecar.admission_types import EXCEEDS_BUDGET, EXCEEDS_CONTEXT, Cost
from tritongen.core.sidecar_policy.kv_cost import KVCost, PrefillPoint
from tritongen.core.sidecar_policy.sections import ModelPolicy


TokenCounter = Callable[[bytes], int]  # a prompt's UTF-8 bytes -> its tokens (the model's tokenizer)


@dataclass(frozen=True)
class LLMFacts:
    """What the request says about its sequences (None where it does not say)."""

    prompt_bytes: Sequence[int | None]  # UTF-8 bytes of each prompt; None: unknown (shared memory)
    max_tokens: Sequence[int | None]  # per sequence; None: not given
    # Each prompt's tokens counted by the model's tokenizer (sidecar/admission_prompts.py); None: not counted,
    # the policy's prompt_bytes_per_token ratio estimates them from the bytes.
    prompt_tokens: Sequence[int | None] | None = None
    # Each prompt's shareable block keys (sidecar/prefix_blocks.py), where the engine reuses blocks.
    prefix_keys: Sequence[tuple[bytes, ...]] | None = None

    def __post_init__(self) -> None:
        if len(self.max_tokens) not in (0, 1, len(self.prompt_bytes)):
            raise ValueError(
                f"{len(self.prompt_bytes)} prompts but {len(self.max_tokens)} max_tokens values; "
                "give one per prompt or one for all"
            )


def prefill_peak_bytes(points: Sequence[PrefillPoint], prompt_tokens: int) -> int:
    """The profiled prefill peak at a prompt length: linear between measured lengths, the first
    point's peak below it, and growing with the square of the length above the longest one
    (attention scores are prompt x prompt)."""
    if not points or prompt_tokens <= 0:
        return 0
    if prompt_tokens <= points[0].prompt_tokens:
        return points[0].peak_bytes
    last = points[-1]
    if prompt_tokens >= last.prompt_tokens:
        return math.ceil(last.peak_bytes * (prompt_tokens / last.prompt_tokens) ** 2)
    for lo, hi in zip(points, points[1:]):
        if lo.prompt_tokens <= prompt_tokens <= hi.prompt_tokens:
            span = hi.prompt_tokens - lo.prompt_tokens
            frac = (prompt_tokens - lo.prompt_tokens) / span
            return math.ceil(lo.peak_bytes + frac * (hi.peak_bytes - lo.peak_bytes))
    return last.peak_bytes  # pragma: no cover - the loop covers every length in range


def prompt_tokens_of(kv: KVCost, prompt_bytes: int, counted: int | None = None) -> int:
    """A prompt's tokens: the tokenizer's count where there is one, else its bytes at the policy's ratio."""
    return counted if counted is not None else math.ceil(prompt_bytes / kv.prompt_bytes_per_token)


def sequence_tokens(
    kv: KVCost, prompt_bytes: int | None, max_tokens: int | None, counted: int | None = None
) -> tuple[int, int]:
    """(prompt tokens, total tokens) one sequence may hold, clamped to max_context; `counted` is the
    prompt's exact token count when a tokenizer gave one."""
    if prompt_bytes is None:
        return kv.max_context, kv.max_context  # unknown prompt: assume the worst
    prompt = prompt_tokens_of(kv, prompt_bytes, counted)
    if max_tokens is None or max_tokens < 0:
        output = kv.default_max_tokens if kv.default_max_tokens is not None else kv.max_context - prompt
    else:
        output = max_tokens
    return min(prompt, kv.max_context), min(kv.max_context, prompt + max(0, output))


def kv_bytes_for(kv: KVCost, tokens: int) -> int:
    """KV bytes one sequence of `tokens` tokens is charged: its whole blocks at their footprint."""
    blocks = math.ceil(tokens / kv.block_tokens)
    return math.ceil(kv.bytes_at(blocks * kv.block_tokens))


def llm_cost(kv: KVCost, facts: LLMFacts) -> Cost:
    prompts = list(facts.prompt_bytes) or [None]
    if len(facts.max_tokens) == len(prompts):
        outputs = list(facts.max_tokens)
    else:
        outputs = [facts.max_tokens[0] if facts.max_tokens else None] * len(prompts)
    counted = list(facts.prompt_tokens or [])
    if len(counted) != len(prompts):
        counted = [None] * len(prompts)
    kv_total = prefill = tokens = prompt_total = prompt_bytes_total = 0
    lengths: list[int] = []
    never: tuple[str, str] | None = None
    shared_keys: dict[bytes, None] = {}  # ordered, each once (sequences of one request may share too)
    block_bytes = math.ceil(kv.bytes_per_token * kv.block_tokens) if kv.reserves and kv.prefix_caching else 0
    keys_of = list(facts.prefix_keys or []) if block_bytes else []
    if len(keys_of) != len(prompts):
        keys_of = [()] * len(prompts)
    for prompt_bytes, max_tokens, exact, keys in zip(prompts, outputs, counted, keys_of):
        if never is None and max_tokens is not None and max_tokens >= kv.max_context:
            never = (EXCEEDS_CONTEXT, f"max_tokens {max_tokens} leaves no room for a prompt in the model's "
                     f"{kv.max_context}-token context; ask for fewer than {kv.max_context} tokens")
        prompt_tokens, total = sequence_tokens(kv, prompt_bytes, max_tokens, exact)
        footprint = kv_bytes_for(kv, total)
        if never is None and kv.engine_pool_bytes is not None and footprint > kv.engine_pool_bytes:
            never = (EXCEEDS_BUDGET, f"the sequence needs {footprint} KV bytes ({total} tokens) but one engine's "
                     f"whole pool holds {kv.engine_pool_bytes}; it can never run")
        kv_total += footprint - len(keys) * block_bytes  # its shared blocks are the ledger's, once
        shared_keys.update(dict.fromkeys(keys))
        prefill += prefill_peak_bytes(kv.prefill_peak, prompt_tokens)
        tokens += total
        prompt_total += prompt_tokens
        if prompt_bytes is not None:  # an unreadable prompt is charged max_context, not measured
            lengths.append(prompt_tokens)
            prompt_bytes_total += prompt_bytes
    return Cost(kv_bytes=kv_total if kv.reserves else 0, prefill_bytes=prefill, tokens=tokens,
                prompt_tokens=prompt_total, prompt_bytes=prompt_bytes_total, sequences=len(prompts),
                prompt_lengths=tuple(lengths), never=never, shared_keys=tuple(shared_keys) if kv.reserves else (),
                shared_block_bytes=block_bytes if shared_keys and kv.reserves else 0)


def cost_for(model: ModelPolicy, facts: LLMFacts | None) -> Cost:
    """The cost of one request to `model`; LLMs without facts are charged a full context."""
    if model.kv is not None:
        return llm_cost(model.kv, facts or LLMFacts(prompt_bytes=[None], max_tokens=[]))
    return _classic_cost(model.request_bytes)


@functools.lru_cache(maxsize=1024)
def _classic_cost(request_bytes: int) -> Cost:
    """A classic request's cost, one frozen value per size: making a Cost of nine fields took 1.5 µs
    of every classic request, the pass-through's hot path."""
    return Cost(request_bytes=request_bytes)


def carried_stream_cost(model: ModelPolicy) -> Cost:
    """A gRPC stream nginx carries (sidecar/stream_path.py): its requests are unseen, so it is charged
    as one request of unknown prompt (a full context's tokens), but with no KV and no prefill peak
    reserved: streams are carried only to engines that queue when their KV is full, where a request
    the sidecar did not price waits in the engine instead of failing. Its slot still counts against
    the model's in-flight limits (the engine's sequence limit, the concurrency quotas)."""
    return replace(cost_for(model, None), kv_bytes=0, prefill_bytes=0, prompt_lengths=())
