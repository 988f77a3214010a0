"""The cache blocks a prompt shares with others, as an engine that reuses prefix blocks keys them.

Why: an engine that reserves each request's KV at admission and reuses prefix blocks (TensorRT-LLM
with GUARANTEED_NO_EVICT and block reuse) holds a block that several running sequences begin with
once. Reserving every request's whole prompt charged a 2,000-token system prompt to each of them,
and refused work the engine had room for (issue 44: price what the engine will really hold).

A block is keyed like the engine keys it: by everything up to its end (a chain of digests), so two
prompts share block i only if their first i + 1 blocks are equal. Token boundaries are not visible
here, so blocks are cut in bytes at the prompt's own bytes per token (its tokenizer's count where the
sidecar has one, else the policy's ratio); the last block, and any block the prompt's last token
falls in, is never counted as shared (engines compute at least the last token again).
"""

from __future__ import annotations

import hashlib
import math

Key = bytes


def block_keys(prompt: bytes | memoryview, tokens: int, block_tokens: int) -> tuple[Key, ...]:
    """The keys of the prompt's whole blocks that an engine may share, first to last: (tokens - 1) //
    block_tokens blocks of `block_tokens` tokens, cut at the prompt's bytes per token."""
    blocks = (tokens - 1) // block_tokens if tokens > 0 and block_tokens > 0 else 0
    if blocks <= 0:
        return ()
    size = math.ceil(len(prompt) * block_tokens / tokens)  # bytes of one block at this prompt's ratio
    blocks = min(blocks, (len(prompt) - 1) // size) if size > 0 else 0
    keys: list[Key] = []
    digest = b""
    for i in range(blocks):
        digest = hashlib.blake2b(digest + bytes(prompt[i * size:(i + 1) * size]), digest_size=12).digest()
        keys.append(digest)
    return tuple(keys)
