"""Prompts that begin alike: a class's shared prefixes (a system prompt, instructions, a document)
and conversations whose turns carry the whole history, as identities that the engine model's prefix
cache (`tritongen.core.prefix_cache`) and the load generator's prompt text
(`tritongen.core.prompts.arrival_prompt`) both read, so a prediction and a measurement see the
same sharing.

What a class states (`ClassMix.shared_prefix`, `ClassMix.conversation`), and what each request
carries (`SharedPrompts`, copied into `Arrivals`):
  prefix_id      which shared prefix the prompt starts with (-1: none), numbered over all classes
  prefix_tokens  that prefix's length in tokens (0: none), the same in every prompt with that id
  conversation   which conversation the request is a turn of (-1: none), numbered over all classes
  shared_tokens  the leading tokens the prompt has in common with earlier requests: its prefix, or
                 for a later turn the previous turn's whole prompt (the most a cache could serve)

`prompt_tokens` of a class is always the NEW part of a prompt: what follows the shared prefix, and
in a conversation the new text of each turn. The prompt the engine sees (`Arrivals.prompt`) is the
whole: prefix + new text; a conversation's turn k is turn k-1's prompt + its reply (turn k-1's
`output_tokens`) + turn k's new text. A class without either section is unchanged: its prompt is
`prompt_tokens`.

Conversations are made from the class's own arrivals (the arrival process is untouched, so its rate
and send times are the same with or without sharing): each arrival continues the conversation whose
next turn has been ready longest (`think_s` after its last turn was sent), else starts a new one.
So a turn follows the previous one by at least `think_s`. Arrivals are scheduled in advance (an open
loop), so the load generator cannot send the engine's real reply back: a later turn carries a
stand-in text of the reply's length. The engine has cached the previous turn's prompt, the text it
was sent, but not the stand-in, which is not what it generated; so `shared_tokens` of a later turn
is the previous turn's prompt, and the simulated cache keys only prompt blocks. (A real chat client
sends the engine's own reply back, which vLLM may serve from its cache as well: against such
traffic the model under-counts hits by about one reply per turn.)

Draws come from a stream of their own, spawned from the seed: the arrival times, classes and
lengths of a traffic are the same with or without its sharing sections.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pydantic import Field, model_validator

from tritongen.core.lengths import Length, least_length, length_array
from tritongen.core.strict import Strict


def _at_least_one(value: Length, name: str, why: str, otherwise: str = "") -> None:
    """A count that must never be drawn below 1; the error names the field, why and the fix."""
    least = least_length(value)
    if least < 1:
        raise ValueError(f"`{name}` can be {least}: {why}; set it (or its `min`) to 1 or more{otherwise}")


class SharedPrefix(Strict):
    """The prompts of a class begin with one of a few shared texts (a system prompt, instructions, a
    document); what follows (`prompt_tokens`) is each request's own."""

    tokens: Length = Field(
        description="Tokens of each shared prefix: a number, or a distribution drawn once per prefix (a prefix "
        "keeps its length in every prompt that starts with it)."
    )
    count: int = Field(default=1, ge=1, description="How many distinct prefixes the class's prompts start with.")
    zipf: float = Field(
        default=0.0, ge=0,
        description="How popular each prefix is: the k-th is chosen with weight 1/k^zipf. 0: all equally often; "
        "1 or more: the first few take most requests (the documents most users ask about).",
    )

    @model_validator(mode="after")
    def _at_least_one_token(self) -> "SharedPrefix":
        _at_least_one(self.tokens, "tokens", "a shared prefix has at least 1 token",
                      ", or remove shared_prefix for prompts that share nothing")
        return self


class Conversation(Strict):
    """Multi-turn chat: each turn's prompt carries the whole conversation so far (module docstring)."""

    turns: Length = Field(description="Turns per conversation: a number, or a distribution drawn per conversation.")
    think_s: float = Field(
        gt=0,
        description="Least time from one turn's send to the next turn's, s: the user reading the reply and typing. "
        "Set it above the reply's expected latency: a turn sent before the previous one was prefilled finds "
        "nothing of it in the cache.",
    )

    @model_validator(mode="after")
    def _at_least_one_turn(self) -> "Conversation":
        _at_least_one(self.turns, "turns", "a conversation has at least 1 turn")
        return self


class SharingClass(Protocol):
    """What `share_prompts` reads of a traffic class (`traffic.ClassMix`)."""

    @property
    def shared_prefix(self) -> SharedPrefix | None: ...

    @property
    def conversation(self) -> Conversation | None: ...


@dataclass(frozen=True)
class SharedPrompts:
    """Per request (send order): the whole prompt and what it shares (module docstring)."""

    prompt: np.ndarray
    prefix_id: np.ndarray
    prefix_tokens: np.ndarray
    conversation: np.ndarray
    shared_tokens: np.ndarray


def popularity(spec: SharedPrefix) -> np.ndarray:
    """The chance of each prefix: weights 1/k^zipf for k = 1..count, normalised."""
    weights = 1.0 / np.arange(1, spec.count + 1, dtype=float) ** spec.zipf
    return weights / weights.sum()


class _Builder:
    """The sharing of one traffic's requests, filled class by class; ids run on over classes."""

    def __init__(self, prompt: np.ndarray, seed: int) -> None:
        n = len(prompt)
        self.new = prompt
        self.rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        self.prompt = prompt.copy()
        self.prefix_id = np.full(n, -1, dtype=np.int64)
        self.prefix_tokens = np.zeros(n, dtype=np.int64)
        self.conversation = np.full(n, -1, dtype=np.int64)
        self.shared = np.zeros(n, dtype=np.int64)
        self.next_prefix = 0
        self.next_conversation = 0

    def prefixes(self, spec: SharedPrefix | None) -> tuple[int, np.ndarray, np.ndarray]:
        """(first global id, lengths, chances) of a class's prefixes; none: one empty prefix."""
        if spec is None:
            return -1, np.zeros(1, dtype=np.int64), np.ones(1)
        lengths = np.maximum(1, length_array(spec.tokens, self.rng, spec.count))
        first = self.next_prefix
        self.next_prefix += spec.count
        return first, lengths, popularity(spec)

    def single(self, idx: np.ndarray, spec: SharedPrefix) -> None:
        """Requests that each pick a prefix by popularity, then their own text."""
        first, lengths, chance = self.prefixes(spec)
        pick = self.rng.choice(len(lengths), size=len(idx), p=chance)
        self.prefix_id[idx] = first + pick
        self.prefix_tokens[idx] = lengths[pick]
        self.shared[idx] = lengths[pick]
        self.prompt[idx] = self.new[idx] + lengths[pick]

    def conversations(self, idx: np.ndarray, t: np.ndarray, output: np.ndarray, spec: Conversation,
                      prefix: SharedPrefix | None) -> None:
        """The class's arrivals, in send order, as turns of conversations (module docstring)."""
        first, lengths, chance = self.prefixes(prefix)
        ready: list[tuple[float, int]] = []  # (when its next turn may be sent, conversation)
        left: dict[int, int] = {}
        last: dict[int, tuple[int, int]] = {}  # conversation -> (its last prompt, that turn's reply)
        pick: dict[int, int] = {}
        for j in idx.tolist():
            if ready and ready[0][0] <= t[j]:
                _, c = heapq.heappop(ready)
                before, reply = last[c]
                self.shared[j] = before
                self.prompt[j] = before + reply + self.new[j]
            else:
                c = self.next_conversation
                self.next_conversation += 1
                left[c] = int(length_array(spec.turns, self.rng, 1)[0])
                pick[c] = int(self.rng.choice(len(lengths), p=chance)) if prefix is not None else 0
                self.shared[j] = lengths[pick[c]]
                self.prompt[j] = lengths[pick[c]] + self.new[j]
            if prefix is not None:
                self.prefix_id[j] = first + pick[c]
                self.prefix_tokens[j] = lengths[pick[c]]
            self.conversation[j] = c
            last[c] = (int(self.prompt[j]), int(output[j]))
            left[c] -= 1
            if left[c] > 0:
                heapq.heappush(ready, (float(t[j]) + spec.think_s, c))

    def result(self) -> SharedPrompts:
        return SharedPrompts(prompt=self.prompt, prefix_id=self.prefix_id, prefix_tokens=self.prefix_tokens,
                             conversation=self.conversation, shared_tokens=self.shared)


def any_shares(classes: Sequence[SharingClass]) -> bool:
    """Whether any class states a shared prefix or conversations."""
    return any(c.shared_prefix is not None or c.conversation is not None for c in classes)


def share_prompts(classes: Sequence[SharingClass], t: np.ndarray, cls: np.ndarray, prompt: np.ndarray,
                  output: np.ndarray, seed: int) -> SharedPrompts | None:
    """The sharing of requests (send times `t`, class indices `cls`, new prompt tokens `prompt`,
    max_tokens `output`) under their classes' sections; None when no class shares anything, so a
    traffic without sharing is left exactly as it was."""
    if not any_shares(classes):
        return None
    build = _Builder(prompt, seed)
    for i, klass in enumerate(classes):
        idx = np.flatnonzero(cls == i)
        if klass.conversation is not None:
            build.conversations(idx, t, output, klass.conversation, klass.shared_prefix)
        elif klass.shared_prefix is not None:
            build.single(idx, klass.shared_prefix)
    return build.result()
