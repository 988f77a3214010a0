"""The LLM engine behind a decoupled Triton model: continuous batching over a KV pool.

Triton's dynamic batcher only queues and hands requests over; the engine (vLLM, TensorRT-LLM's
inflight batcher, tinyllm, a user's Python backend) decides which sequences run each step, and
its KV policy decides what overload looks like. Kept apart from the batcher so each can be read,
tested and fitted on its own; `tritongen.core.simulator` drives it inside the event loop.

One step (the same order the stand-ins and tinyllm follow):
  1. admit waiting requests in FIFO order while fewer than `max_num_seqs` run, the step's prefill
     tokens stay within `max_batched_tokens`, and the KV policy lets them in;
  2. prefill each admitted sequence one after another (`prefill_fixed_ms + prefill_ms_per_token x
     tokens`); a new sequence emits its first token when its prefill ends, a resumed (preempted)
     one recomputes prompt + generated tokens and emits nothing;
  3. one decode step for every running sequence (`decode_fixed_ms + decode_ms_per_seq x n +
     decode_ms_per_context_token x cached tokens`); each emits one token at its end.
With `curve.prefill_in_step` (vLLM V1, TensorRT-LLM in-flight batching) steps 2 and 3 are one
forward pass: it costs the decode of the running sequences and the newcomers together plus the
newcomers' prefills, and every token of the step, first tokens included, comes at its end.
With `chunked_prefill` too (vLLM V1, TensorRT-LLM's enable_chunked_prefill), a prompt longer than
what is left of the step's `max_batched_tokens` is prefilled over several steps, one chunk each
(chunks go before new admissions), and its first token comes at the end of its last chunk's step.

KV policies (what an engine does when the pool runs dry):
  reserve_wait  reserve prompt + max_tokens at admission; the head waits until it fits
                (TensorRT-LLM GUARANTEED_NO_EVICT). Nothing is killed or preempted.
  reserve_kill  reserve prompt + max_tokens at admission; a request that does not fit is killed
                with an out-of-memory error (a naive hand-written backend).
  grow_preempt  take blocks as tokens come; admit when the prompt fits; when a running sequence
                needs a block and none is free, the most recently admitted one is preempted and
                recomputed later (vLLM). Overload shows as queueing and preemptions.
  grow_kill     take blocks as tokens come; a sequence that needs a block when none is free is
                killed (tinyllm, most home-made engines).

A model whose layers do not all grow alike (sliding windows, chunks, a recurrent state: see
`tritongen.core.kv.KVFootprint`) cannot be pooled in token blocks: a token costs more below a
window than above it, and a sequence holds a fixed state before its first token. Its engine
model carries the footprint and a pool in bytes (`kv_footprint`, `kv_pool_bytes`), and each
sequence is charged `footprint.bytes_at(blocks x block_tokens)` for the blocks it holds, at
admission and as it grows; the policies above are unchanged. Without a footprint the pool is in
blocks and a sequence is charged its block count, as before.

With `prefix_caching` (vLLM's automatic prefix caching, TensorRT-LLM's block reuse) the block pool
keeps the full blocks of prompts that others may begin with (`tritongen.core.prefix_cache`): a
request admitted with its leading blocks cached holds them without computing them (its prefill
and its share of the step's token budget count only the rest), a block held by several running
sequences counts once, and a block nobody holds stays cached but free until the pool needs it
(least recently freed first). The policies are unchanged, in blocks: reserve_* reserve prompt +
max_tokens less the cached blocks it shares, grow_* take blocks as tokens come, and preemption
releases a sequence's blocks (the shared ones stay while others hold them; a resumed sequence
finds what is still cached). The cache serves only what `PromptSharing` says requests share;
traffic that shares nothing, or an engine without the cache, runs exactly as before.

Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field, model_validator

from tritongen.core.cached_prefill import CachedPrefillCost, fit_cached_prefill
from tritongen.core.kv import KVFootprint
from tritongen.core.prefix_cache import Key, PrefixCache, PromptSharing
from tritongen.core.profile_types import ArrivalBurst
from tritongen.core.strict import Strict

KVPolicy = Literal["reserve_wait", "reserve_kill", "grow_preempt", "grow_kill"]
KV_POLICIES: tuple[str, ...] = ("reserve_wait", "reserve_kill", "grow_preempt", "grow_kill")

# What happens to a request, as the engine reports it.
FIRST, DONE, KILLED, REFUSED = "first", "done", "killed", "refused"


class LLMCurve(Strict):
    """Step costs of a continuous-batching engine, in milliseconds."""

    prefill_fixed_ms: float = Field(default=0.0, ge=0, description="Fixed cost of one prefill.")
    prefill_ms_per_token: float = Field(ge=0, description="Prefill cost per prompt token.")
    decode_fixed_ms: float = Field(ge=0, description="Fixed cost of one decode step.")
    decode_ms_per_seq: float = Field(ge=0, description="Decode step cost per sequence in the batch.")
    decode_ms_per_context_token: float = Field(default=0.0, ge=0, description="Decode cost per cached token (attention).")
    prefill_in_step: bool = Field(
        default=False,
        description="Newcomers' prefills run inside the decode step (vLLM V1, TensorRT-LLM in-flight batching): "
        "the step costs the decode of every sequence, newcomers included, plus their prefills, and a newcomer's "
        "first token comes at the step's end. False: prefills run one after another before the decode, each "
        "newcomer's first token at its prefill's end. The profile measures which (first tokens that land with a "
        "running stream's token, or a step before it).",
    )

    cached_prefill: CachedPrefillCost | None = Field(
        default=None, description="An arrival whose prompt begins with cached blocks, priced on its own line "
        "(core.cached_prefill); None: the prefill line prices the tokens it computes.")

    def prefill_ms(self, tokens: int) -> float:
        return self.prefill_fixed_ms + self.prefill_ms_per_token * tokens

    def arrival_ms(self, computed: int, cached: int) -> float:
        """A newcomer's prefill that computes `computed` tokens, the cache serving `cached` more."""
        if cached > 0 and self.cached_prefill is not None:
            return self.cached_prefill.ms(computed, cached)
        return self.prefill_ms(computed)

    def decode_ms(self, seqs: int, context_tokens: int) -> float:
        return self.decode_fixed_ms + self.decode_ms_per_seq * seqs + self.decode_ms_per_context_token * context_tokens


class EngineModel(Strict):
    """What the simulator needs to know about one engine, with where each value came from."""

    kv_policy: KVPolicy = Field(description="What the engine does when its KV pool runs dry (module docstring).")
    kv_block_tokens: int = Field(ge=1, description="Tokens per KV block (1 for an engine that counts tokens).")
    kv_pool_blocks: int = Field(ge=1, description="Blocks in the KV pool.")
    max_num_seqs: int = Field(ge=1, description="Sequences that may run at once.")
    max_batched_tokens: int | None = Field(
        default=None, ge=1, description="Prefill tokens one step may take (vLLM max_num_batched_tokens); None = no limit."
    )
    max_context: int | None = Field(
        default=None, ge=1, description="Prompt + max_tokens above this is refused at once (vLLM max_model_len)."
    )
    curve: LLMCurve
    kv_footprint: KVFootprint | None = Field(
        default=None,
        description="How one sequence's cache grows per layer kind; with kv_pool_bytes, the pool is bytes "
        "and a sequence is charged its exact footprint (module docstring). None: a block pool.",
    )
    kv_pool_bytes: int | None = Field(default=None, ge=1, description="The pool in bytes, with kv_footprint.")
    chunked_prefill: bool = Field(
        default=False,
        description="A prompt longer than what is left of the step's budget (max_batched_tokens) is prefilled over "
        "several steps, a chunk each, its first token at the last chunk's step (vLLM V1, TensorRT-LLM's "
        "enable_chunked_prefill). Only with curve.prefill_in_step and a budget; False: a step's first newcomer "
        "prefills whole whatever the budget.",
    )
    prefix_caching: bool = Field(
        default=False,
        description="The engine keeps the full blocks of prompts (kv_block_tokens each) and serves a later "
        "prompt's identical leading blocks from them (vLLM enable_prefix_caching, TensorRT-LLM block reuse); "
        "module docstring. A block pool only.",
    )
    prompt_added_tokens: int = Field(
        default=0, ge=0, description="Tokens the engine adds to every prompt (a BOS token, a chat template): "
        "prefilled and held in the KV pool like the prompt's own (a traffic's prompt tokens are its text's).",
    )
    sources: dict[str, str] = Field(default_factory=dict, description="Field name -> where its value came from.")

    @model_validator(mode="after")
    def _byte_pool(self) -> EngineModel:
        if (self.kv_footprint is None) != (self.kv_pool_bytes is None):
            raise ValueError(
                "kv_footprint and kv_pool_bytes go together: a byte pool needs each sequence's footprint, "
                f"and a footprint a pool in bytes (got kv_pool_bytes={self.kv_pool_bytes})"
            )
        if self.prefix_caching and self.kv_footprint is not None:
            raise ValueError(
                "prefix_caching is modelled on a block pool only: a byte pool (kv_footprint) charges each sequence "
                "its own footprint, which shared blocks would not follow; set prefix_caching false for this model"
            )
        return self

    @property
    def pool_tokens(self) -> int:
        return self.kv_pool_blocks * self.kv_block_tokens

    @property
    def pool_units(self) -> int:
        """The pool in the units sequences are charged in: bytes with a footprint, else blocks."""
        return self.kv_pool_bytes if self.kv_pool_bytes is not None else self.kv_pool_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.kv_block_tokens)

    def charge(self, blocks: int) -> int:
        """What a sequence holding `blocks` blocks takes from the pool (`pool_units`)."""
        if self.kv_footprint is None:
            return blocks
        return self.kv_footprint.bytes_at(blocks * self.kv_block_tokens)

    def sequences_fitting(self, prompt_tokens: int, output_tokens: int, shared_tokens: int = 0) -> int:
        """Sequences of this size the pool holds at their longest (at most max_num_seqs). With the
        prefix cache, sequences whose first `shared_tokens` prompt tokens are the same hold those
        full blocks once (at most all but the last prompt token's, as admission serves them)."""
        if self.prompt_added_tokens:  # the engine's own tokens begin every prompt, shared or not
            prompt_tokens += self.prompt_added_tokens
            shared_tokens += self.prompt_added_tokens if shared_tokens else 0
        shared = self.cacheable_blocks(prompt_tokens, shared_tokens)
        per = max(1, self.charge(self.blocks_for(prompt_tokens + output_tokens) - shared))
        return max(0, min(self.max_num_seqs, (self.pool_units - shared) // per))

    def cacheable_blocks(self, prompt_tokens: int, shared_tokens: int) -> int:
        """Full blocks of a prompt's first `shared_tokens` the cache can serve: none without the
        cache; never the block of the prompt's last token, which the engine must compute."""
        if not self.prefix_caching or shared_tokens <= 0:
            return 0
        return min(shared_tokens, prompt_tokens - 1) // self.kv_block_tokens

    def with_cached_prefill(self, bursts: Sequence[ArrivalBurst]) -> EngineModel:
        """This engine pricing arrivals with a cached prefix on the line the profile's `bursts` give
        (`core.cached_prefill`), each burst's prompt split as this engine's blocks split it: by the
        engine's own token counts where the profile read them, else the nominal sizes and the tokens
        the engine adds to every prompt; unchanged without the cache or enough bursts."""
        if not self.prefix_caching or not bursts:
            return self
        added = self.prompt_added_tokens

        def split(b: ArrivalBurst) -> tuple[int, int]:
            if b.counted_tokens and b.counted_shared_tokens:
                prompt, shared = b.counted_tokens, b.counted_shared_tokens
            else:
                prompt, shared = b.shared_tokens + b.own_tokens + added, b.shared_tokens + added
            cached = self.cacheable_blocks(prompt, shared) * self.kv_block_tokens
            return prompt - cached, cached

        cost = fit_cached_prefill(bursts, split, self.curve.decode_ms_per_seq)
        if cost is None:
            return self
        return self.model_copy(update={"curve": self.curve.model_copy(update={"cached_prefill": cost}),
                                       "sources": {**self.sources, "cached prefill": cost.evidence}})


class EngineState:
    """The running state of one engine. The caller owns time: `step(now)` returns when the step
    ends and what happened to which request, and the caller schedules the next step there.

    Requests are caller indices; `prompt[r]` and `output[r]` are their token counts, and `sharing`
    (optional) says which of their prompts begin alike, for an engine with a prefix cache.
    """

    def __init__(self, model: EngineModel, prompt: Sequence[int], output: Sequence[int],
                 sharing: PromptSharing | None = None) -> None:
        self.model = model
        added = model.prompt_added_tokens  # the engine's own tokens at every prompt's start (a BOS token)
        self.prompt = [p + added for p in prompt] if added else prompt
        self.output = output
        if sharing is not None and added:  # they begin every prompt, so every shared prefix too
            sharing = PromptSharing(sharing.prefix_id, [t + added for t in sharing.prefix_tokens], sharing.conversation)
        self.sharing = sharing
        # The prefix cache, where the engine has one and some prompts share blocks with others.
        self.cache = PrefixCache(model.kv_pool_blocks) if model.prefix_caching and sharing is not None else None
        self.keys: dict[int, list[Key]] = {}  # the cached blocks each sequence holds, in prompt order
        self.cached_tokens: dict[int, int] = {}  # prompt tokens the cache served at a request's first admission
        self.waiting: deque[int] = deque()
        self.partial: dict[int, list[int]] = {}  # chunked prefills under way: request -> [tokens left, tokens held]
        self.running: list[int] = []  # in admission order: the last is preempted first
        self.free = model.pool_units  # what is left of the pool, in pool units (blocks or bytes)
        self.cache_len: dict[int, int] = {}
        self.generated: dict[int, int] = {}
        self.blocks: dict[int, int] = {}
        self.held: dict[int, int] = {}  # pool units each sequence holds (its blocks' charge)
        self.preemptions = 0
        self.killed = 0
        self.last_batch = 0  # sequences the last step worked on (decoded, else prefilled)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.partial)

    def hit_rate(self, counted: Callable[[int], bool]) -> float | None:
        """Prompt tokens the prefix cache served at first admission / their prompt tokens, over the
        admitted requests `counted` keeps (a run's window); None without a cache or such requests."""
        if self.cache is None:
            return None
        served = [(self.prompt[r], hit) for r, hit in self.cached_tokens.items() if counted(r)]
        total = sum(p for p, _ in served)
        return sum(hit for _, hit in served) / total if total else None

    def submit(self, r: int) -> None:
        self.waiting.append(r)

    def _release(self, r: int) -> None:
        self.blocks.pop(r, None)
        units = self.held.pop(r, 0)
        keys = self.keys.pop(r, None)
        if keys is None:
            self.free += units
        else:
            assert self.cache is not None
            self.free += self.cache.release(keys, units - len(keys))
        self.cache_len.pop(r, None)

    def _take(self, units: int) -> None:
        """Take `units` of the pool (the cache's free queue too, evicting its oldest free blocks)."""
        self.free -= units
        if self.cache is not None:
            self.cache.take(units)

    def _cached(self, r: int, tokens: int) -> tuple[list[Key], int, int]:
        """(the keys of r's full prompt blocks others may hold, how many of them from the first
        are cached and may be served, how many of those are free) for an admission that would
        compute `tokens`: never the block of its last token, which the engine must compute."""
        if self.cache is None or self.sharing is None:
            return [], 0, 0
        block = self.model.kv_block_tokens
        keys = self.sharing.block_keys(r, self.prompt[r] // block, block)
        if not keys:
            return keys, 0, 0
        hits, free = self.cache.hits(keys[: (tokens - 1) // block])
        return keys, hits, free

    def _hold(self, r: int, keys: list[Key], hits: int, blocks: int) -> None:
        """Admitted r holds its `hits` cached blocks and `blocks - hits` new ones, of which those
        of its keyed prompt blocks it computes are cached from now on (registered as scheduled)."""
        assert self.cache is not None
        self.cache.hold(keys[:hits])
        self.cache.take(blocks - hits)
        self.keys[r] = keys[:hits] + [k for k in keys[hits:] if self.cache.register(k)]
        if r not in self.generated:
            self.cached_tokens[r] = hits * self.model.kv_block_tokens

    def _admission_need(self, r: int) -> tuple[int, int]:
        """(blocks to take now, prefill tokens) for the head request."""
        m = self.model
        if m.kv_policy in ("reserve_wait", "reserve_kill"):
            return m.blocks_for(self.prompt[r] + self.output[r]), self.prompt[r]
        # a resumed sequence recomputes its prompt and every token it already sent
        tokens = self.prompt[r] + self.generated.get(r, 0)
        return m.blocks_for(tokens), tokens

    def step(self, now: float) -> tuple[float, list[tuple[int, str, float]]]:
        """Run one step starting at `now` (seconds). Returns (end time, events); events are
        (request, FIRST | DONE | KILLED | REFUSED, time)."""
        m = self.model
        curve = m.curve
        events: list[tuple[int, str, float]] = []
        t = now
        admitted: list[tuple[int, int, int]] = []  # (request, tokens its prefill computes, tokens it then holds)
        budget = m.max_batched_tokens
        chunked = m.chunked_prefill and curve.prefill_in_step and budget is not None
        carried: list[tuple[int, int, int]] = []  # chunks: (request, tokens this step, tokens held once prefilled)
        batched = 0
        for r, (left, held) in list(self.partial.items()) if chunked else ():
            take = min(left, budget - batched)  # type: ignore[operator]
            if take <= 0:
                break
            carried.append((r, take, held))
            batched += take
        while self.waiting and len(self.running) + len(admitted) + len(self.partial) < m.max_num_seqs:
            r = self.waiting[0]
            prompt, out = self.prompt[r], self.output[r]
            if out <= 0:
                self.waiting.popleft()
                events.append((r, DONE, t))
                continue
            if m.max_context is not None and prompt + out > m.max_context:
                self.waiting.popleft()
                events.append((r, REFUSED, t))
                continue
            need, tokens = self._admission_need(r)
            whole = need if m.kv_policy != "grow_preempt" else m.blocks_for(prompt + out)
            cost = m.charge(need)
            if m.charge(whole) > m.pool_units:  # could never run to its end (or would preempt itself forever)
                self.waiting.popleft()
                events.append((r, REFUSED, t))
                continue
            keys, hits, free_hits = self._cached(r, tokens)
            computed = tokens - hits * m.kv_block_tokens  # what its prefill computes; the cache serves the rest
            over = budget is not None and batched + computed > budget
            if over and ((admitted or carried) if not chunked else batched >= budget):  # type: ignore[operator]
                break  # the step's token budget is spent: the head goes in the next step
            take = cost - hits + free_hits  # cached blocks are in the pool already; a free one leaves the free queue
            if take > self.free:
                if m.kv_policy in ("reserve_kill", "grow_kill"):
                    self.waiting.popleft()
                    self.killed += 1
                    events.append((r, KILLED, t))
                    continue
                break  # held back until running sequences free their blocks
            self.waiting.popleft()
            self.free -= take
            if self.cache is not None:
                self._hold(r, keys, hits, need)
            self.blocks[r] = need
            self.held[r] = cost
            if over and chunked:  # its first chunk now, the rest in the next steps
                self.partial[r] = [computed, tokens]
                carried.append((r, budget - batched, tokens))  # type: ignore[operator]
                batched = budget  # type: ignore[assignment]
                continue
            batched += computed
            admitted.append((r, computed, tokens))
        if curve.prefill_in_step:
            return self._mixed_step(now, admitted, events, carried)
        for r, computed, tokens in admitted:
            t += curve.arrival_ms(computed, tokens - computed) / 1000.0
            self._enter(r, tokens, t, events)
        batch = self._grow(t, events)
        if batch:
            context = sum(self.cache_len[r] + 1 for r in batch)
            t += curve.decode_ms(len(batch), context) / 1000.0
            self._decoded(batch, t, events)
        self.last_batch = len(batch) or len(admitted)
        self._refuse_stuck(bool(admitted or batch), t, events)
        return t, events

    def _enter(self, r: int, tokens: int, t: float, events: list[tuple[int, str, float]]) -> None:
        """An admitted sequence whose prefill ended at `t` joins the running set; a newcomer's
        first token comes out then, a resumed (preempted) one already sent its tokens."""
        self.cache_len[r] = tokens
        if r in self.generated:
            self.running.append(r)
            return
        self.generated[r] = 1
        events.append((r, FIRST, t))
        if self.output[r] <= 1:
            self._retire(r, t, events)
        else:
            self.running.append(r)

    def _decoded(self, batch: list[int], t: float, events: list[tuple[int, str, float]]) -> None:
        """Each sequence of a decode batch made one token at `t`; the finished ones retire."""
        for r in batch:
            self.cache_len[r] += 1
            self.generated[r] += 1
            if self.generated[r] >= self.output[r]:
                self._retire(r, t, events)

    def _refuse_stuck(self, ran: bool, t: float, events: list[tuple[int, str, float]]) -> None:
        """Nothing ran and nothing can: the head can never be admitted (a safety net)."""
        if not ran and self.waiting and not self.running:
            r = self.waiting.popleft()
            events.append((r, REFUSED, t))

    def _mixed_step(self, now: float, admitted: list[tuple[int, int, int]], events: list[tuple[int, str, float]],
                    carried: Sequence[tuple[int, int, int]] = ()) -> tuple[float, list[tuple[int, str, float]]]:
        """One forward pass over the running sequences' next tokens, the newcomers' prompts and the
        chunks of prompts prefilled over several steps (`carried`, `EngineModel.chunked_prefill`);
        every token of it, first tokens included, comes at its end. A newcomer's prefill costs the
        tokens it computes; its attention reads all it holds (a chunk: the tokens of the chunk)."""
        curve = self.model.curve
        batch = self._grow(now, events)
        newcomers = [r for r, _, _ in admitted if r not in self.generated]
        context = (sum(self.cache_len[r] + 1 for r in batch) + sum(tokens for _, _, tokens in admitted)
                   + sum(take for _, take, _ in carried))
        cost = curve.decode_ms(len(batch) + len(newcomers) + len(carried), context) if (batch or admitted or carried) else 0.0
        cost += sum(curve.arrival_ms(computed, tokens - computed) for _, computed, tokens in admitted)
        cost += sum(curve.prefill_ms(take) for _, take, _ in carried)
        t = now + cost / 1000.0
        self._decoded(batch, t, events)
        for r, _, tokens in admitted:
            self._enter(r, tokens, t, events)
        for r, take, tokens in carried:  # a prompt whose last chunk ran joins the running set
            self.partial[r][0] -= take
            if self.partial[r][0] <= 0:
                del self.partial[r]
                self._enter(r, tokens, t, events)
        self.last_batch = len(batch) + len(admitted) + len(carried)
        self._refuse_stuck(bool(admitted or batch or carried), t, events)
        return t, events

    def _grow(self, t: float, events: list[tuple[int, str, float]]) -> list[int]:
        """The decode batch, after each sequence got the block its next token needs (a block
        costs one unit of a block pool; on a byte pool, what the footprint grows by, which is
        nothing once every growing layer is capped)."""
        m = self.model
        T = m.kv_block_tokens
        if m.kv_policy in ("reserve_wait", "reserve_kill"):
            return list(self.running)
        batch: list[int] = []
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if self.cache_len[r] // T >= self.blocks[r]:
                extra = m.charge(self.blocks[r] + 1) - self.held[r]
                if self.free < extra and m.kv_policy == "grow_kill":
                    self.running.pop(i)
                    self.killed += 1
                    self._release(r)
                    self.generated.pop(r, None)
                    events.append((r, KILLED, t))
                    continue
                while self.free < extra:
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim == r:
                        break
                if r not in self.blocks:  # preempted itself: nothing left to make room from
                    continue
                self._take(extra)
                self.held[r] += extra
                self.blocks[r] += 1
            batch.append(r)
            i += 1
        return batch

    def _preempt(self, r: int) -> None:
        self.running.remove(r)
        self._release(r)
        self.waiting.appendleft(r)
        self.preemptions += 1

    def _retire(self, r: int, t: float, events: list[tuple[int, str, float]]) -> None:
        if r in self.running:
            self.running.remove(r)
        self._release(r)
        self.generated.pop(r, None)
        events.append((r, DONE, t))
