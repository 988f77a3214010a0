"""The engine's prefix cache: full KV blocks of prompts kept by what they hold, shared by every
sequence whose prompt begins the same way, and evicted least recently freed first.

As vLLM's (V1 `BlockPool` / `KVCacheManager`) and TensorRT-LLM's block reuse work, in the terms of
`tritongen.core.engine`'s block pool:
- a block is identified by what it holds: (prefix identity, block index), where the identity is
  the request's shared prefix for blocks wholly inside it, else its conversation
  (`PromptSharing.block_keys`). Only FULL blocks of a prompt are keyed; a partial block, a
  request's own text after its prefix, and generated tokens are not (nobody else sends them);
- at admission the request's leading keyed blocks that are cached are its hits: it holds them
  without computing them, at most all but the last prompt token (the engine must compute one
  token to sample from, vLLM's `max_cache_hit_length = prompt - 1`);
- a cached block counts once in the pool however many running sequences hold it;
- a block whose last holder finished or was preempted stays cached, but is free: it sits in the
  free queue, and taking a free block takes the queue's head. The queue is vLLM's: every block
  freed goes to its tail, a sequence's own (unkeyed) blocks first and its keyed ones in reverse
  order, so its prefix is evicted last; the pool's never-used blocks are at the head. Under
  pressure the oldest freed cached blocks go first (LRU), so a cache that thrashes shows as a hit
  rate that falls;
- blocks are registered when a request is admitted (vLLM caches them as it schedules them), so a
  request admitted in the same step as the one computing a prefix already shares it.

Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

Key = tuple[int, int, int]  # (0: a shared prefix | 1: a conversation, its id, block index)
PREFIX, CONVERSATION = 0, 1


@dataclass(frozen=True)
class PromptSharing:
    """Per request (the engine's request indices): what its prompt begins with (`Arrivals`'
    prefix_id, prefix_tokens and conversation; -1 and 0 for nothing)."""

    prefix_id: Sequence[int]
    prefix_tokens: Sequence[int]
    conversation: Sequence[int]

    def block_keys(self, r: int, blocks: int, block_tokens: int) -> list[Key]:
        """The keys of request r's first `blocks` full blocks that others may hold too, in order;
        they stop at its first block of its own. A block wholly inside the shared prefix is the
        prefix's; past it, a conversation's turns share every full block of their text (a later
        turn begins with the whole of the earlier one)."""
        prefix, tokens, conversation = self.prefix_id[r], self.prefix_tokens[r], self.conversation[r]
        in_prefix = min(blocks, tokens // block_tokens) if prefix >= 0 else 0
        keys: list[Key] = [(PREFIX, prefix, i) for i in range(in_prefix)]
        if conversation >= 0:
            keys += [(CONVERSATION, conversation, i) for i in range(in_prefix, blocks)]
        return keys


class PrefixCache:
    """Cached blocks, who holds them, and the free-block queue of a pool of `pool_blocks`
    (module docstring). The engine takes blocks here as it takes them from its own count, so
    `free_blocks` always equals the engine's free count."""

    def __init__(self, pool_blocks: int) -> None:
        self.holders: dict[Key, int] = {}  # cached block -> running sequences holding it (0: free)
        # Free blocks, head first: a run of blocks that hold nothing (a fresh int -> how many), or
        # a cached block nobody holds (its key -> 1).
        self._queue: OrderedDict[Key | int, int] = OrderedDict()
        self._runs = count()
        self._queue[next(self._runs)] = pool_blocks
        self.free_blocks = pool_blocks
        self.evictions = 0

    def hits(self, keys: Sequence[Key]) -> tuple[int, int]:
        """(how many of `keys`, from the first, are cached; how many of those are free)."""
        n = free = 0
        for key in keys:
            holders = self.holders.get(key)
            if holders is None:
                break
            n += 1
            free += holders == 0
        return n, free

    def hold(self, keys: Sequence[Key]) -> None:
        """A sequence holds these cached blocks: a free one leaves the free queue."""
        for key in keys:
            holders = self.holders[key]
            if holders == 0:
                del self._queue[key]
                self.free_blocks -= 1
            self.holders[key] = holders + 1

    def take(self, blocks: int) -> None:
        """Take `blocks` free blocks from the queue's head, evicting the cached ones found there."""
        if blocks > self.free_blocks:
            raise ValueError(f"{blocks} blocks asked of a cache with {self.free_blocks} free")
        self.free_blocks -= blocks
        while blocks:
            head, size = next(iter(self._queue.items()))
            if isinstance(head, int):
                used = min(size, blocks)
                if used == size:
                    del self._queue[head]
                else:
                    self._queue[head] = size - used
                blocks -= used
            else:
                del self._queue[head]
                del self.holders[head]
                self.evictions += 1
                blocks -= 1

    def register(self, key: Key) -> bool:
        """A block a sequence just took now holds `key`: cached, held by it. False when `key` is
        cached already (the sequence computed its own copy; it stays that sequence's alone)."""
        if key in self.holders:
            return False
        self.holders[key] = 1
        return True

    def release(self, keys: Sequence[Key], own: int) -> int:
        """A sequence lets go of its cached blocks `keys` (in prompt order) and of `own` blocks
        nobody else holds; returns how many blocks became free. Its own blocks go to the queue's
        tail first, then its cached blocks nobody holds any more, last block first."""
        freed = own
        if own:
            self._queue[next(self._runs)] = own
        for key in reversed(keys):
            holders = self.holders[key] - 1
            self.holders[key] = holders
            if holders == 0:
                self._queue[key] = 1
                freed += 1
        self.free_blocks += freed
        return freed

    def cached_free(self) -> list[Key]:
        """The free cached blocks, next to be evicted first (for tests and reports)."""
        return [k for k in self._queue if not isinstance(k, int)]
