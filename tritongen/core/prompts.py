"""Prompts of a given size in tokens for measurements and loads, each with a unique start so an
engine's prefix cache does not serve it from memory."""

from __future__ import annotations


_FILLER = "Triton serves models; tritongen measures them before it configures them. "


_SALT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def prompt_of(tokens: int, bytes_per_token: float, salt: int | None = None) -> str:
    """An ASCII prompt of about `tokens` tokens for a tokenizer of `bytes_per_token` bytes per token;
    with `salt`, its start is unique (see `salted`)."""
    size = max(1, int(round(tokens * bytes_per_token)))
    text = (_FILLER * (size // len(_FILLER) + 1))[:size]
    return text if salt is None else salted(text, salt)


def salted(text: str, salt: int) -> str:
    """`text` with its start replaced by `salt` spelled in English words, same length.

    Engines with a prefix cache (vLLM's is on by default) serve the blocks of a prompt they have
    seen from memory: a measurement or a load that repeats one prompt would see almost no prefill,
    where real users' prompts differ. Words, not digits, so the salt tokenizes at about the rate of
    the text it replaces and the prompt keeps its size in tokens."""
    head = " ".join(_SALT_WORDS[int(d)] for d in str(abs(int(salt)))) + ": "
    return (head + text)[: len(text)] if len(text) > len(head) else head[: len(text)]
