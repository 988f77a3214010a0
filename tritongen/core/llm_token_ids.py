"""LLMs that speak token ids: how tritongen recognises them by role, and the ids it sends them.

Many LLMs on Triton take the prompt as token ids and answer with ids: TensorRT-LLM's raw
`tensorrt_llm` model (`input_ids`, `input_lengths`, `request_output_len` in; `output_ids`,
`sequence_length` out), Hugging Face-style Python backends that leave tokenizing to the client
(`input_ids`, `prompt_token_ids`, ...). tritongen has no tokenizer for them, and needs none: it sends
ids from a range every real vocabulary has (`TOKEN_ID_FIRST`, `TOKEN_ID_SPAN`), one id per token, so
the prompt's length in tokens is exact, and counts the tokens a response carries from its ids, so
the output is exact too (no bytes-per-token ratio on either side).

Prompts are made as text everywhere else (`core.prompts`: sized, salted against prefix caches,
sharing prefixes where the traffic says so) and turned into ids here one character per id
(`ids_of_text`): at one byte per token the text's length is the prompt's tokens, and two texts
share exactly the ids of the characters they share, so salting and sharing carry over unchanged.

Roles are taken by name, the names below (the one place they are listed), never from one example:
- the prompt: an integer input with variable length (dims [-1]) named in TOKEN_ID_PROMPT_INPUTS;
- its length: an integer input of one element named in TOKEN_ID_LENGTH_INPUTS, sent with the number
  of ids where the model has one;
- the budget: TOKEN_ID_MAX_TOKENS_INPUTS before the generic max_tokens names, else the request's
  parameters;
- the output: an integer output named in TOKEN_ID_OUTPUTS.

Pure: names and arithmetic on lists; `LLMInterface` (core.llm_interface) holds what was found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritongen.core.llm_tensors import TensorInfo
from tritongen.core.prompts import salted

TOKEN_ID_PROMPT_INPUTS = ("input_ids", "prompt_token_ids", "token_ids", "tokens", "prompt_ids")
TOKEN_ID_LENGTH_INPUTS = ("input_lengths", "input_length", "prompt_lengths", "prompt_length")
TOKEN_ID_MAX_TOKENS_INPUTS = ("request_output_len",)  # TensorRT-LLM's raw model; then the generic names
TOKEN_ID_OUTPUTS = ("output_ids", "token_ids", "generated_ids", "output_token_ids", "tokens", "output_tokens")

TOKEN_ID_FIRST = 100
"""The lowest id tritongen sends. Ids 0-2 (often more: a handful of special tokens) are pad, bos, eos
or unk in most vocabularies, and an eos inside a prompt may end it; every real vocabulary (byte-level
BPE, SentencePiece, WordPiece) has ordinary tokens from a few hundred on, far below its size, so ids
from here to `TOKEN_ID_FIRST + TOKEN_ID_SPAN` are tokens any model can embed. Which words they are
does not matter: a measurement needs the prompt's length, not its meaning."""

TOKEN_ID_SPAN = 128
"""How many ids tritongen uses, from TOKEN_ID_FIRST: one per ASCII character (`ids_of_text`), so the
largest id sent is 227, below any vocabulary's size."""

TOKEN_IDS_SOURCE = "token ids"
"""The profile's `bytes_per_token_source` for a model fed token ids: prompts were sent as ids, one
per token, so every prompt length in the profile is an exact token count (bytes_per_token is 1 by
construction, not a tokenizer's ratio)."""

_INTEGER_TYPES = frozenset({
    "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
})


@dataclass(frozen=True)
class TokenIdRoles:
    """The tensors a token-id model's request and response use (names from the model's config)."""

    prompt: TensorInfo  # the integer input taking the ids
    length: TensorInfo | None  # the integer input taking their number, where the model has one
    output: TensorInfo  # the integer output carrying the generated ids
    max_tokens_names: tuple[str, ...]  # the names the budget input is looked up by, in order


def ids_of_text(text: str) -> list[int]:
    """One id per character of `text`: TOKEN_ID_FIRST + its code, folded into TOKEN_ID_SPAN (the
    prompts tritongen makes are ASCII, so nothing folds). Equal characters give equal ids, so texts
    that share a prefix give ids that share it."""
    return [TOKEN_ID_FIRST + ord(ch) % TOKEN_ID_SPAN for ch in text]


def text_of_ids(ids: Sequence[int]) -> str:
    """The text `ids_of_text` made `ids` from (ids outside the range become '?')."""
    return "".join(chr(i - TOKEN_ID_FIRST) if TOKEN_ID_FIRST <= i < TOKEN_ID_FIRST + TOKEN_ID_SPAN else "?"
                   for i in ids)


def prompt_ids(prompt: str | Sequence[int]) -> list[int]:
    """The ids a prompt is sent as: a text through `ids_of_text`, a list of ints as it is. A
    ValueError names what was wrong with a list that is not whole numbers of 0 or more."""
    if isinstance(prompt, str):
        return ids_of_text(prompt)
    ids = list(prompt)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"a token-id prompt must be a list of whole numbers of 0 or more, got {ids[:8]!r}")
    if not ids:
        raise ValueError("a token-id prompt must hold at least one id")
    return ids


def _first(tensors: Mapping[str, TensorInfo], names: Sequence[str], variable: bool) -> TensorInfo | None:
    """The first of `names` that is an integer tensor: of variable length (`variable`) or of one element."""
    for name in names:
        tensor = tensors.get(name)
        if tensor is None or tensor.data_type not in _INTEGER_TYPES:
            continue
        if (variable and len(tensor.dims) == 1 and tensor.dims[0] == -1) or (not variable and tensor.one_element):
            return tensor
    return None


def token_id_roles(inputs: Mapping[str, TensorInfo], outputs: Sequence[TensorInfo],
                   max_tokens_names: Sequence[str]) -> TokenIdRoles | None:
    """The token-id roles of a model whose config has an integer prompt input by name
    (TOKEN_ID_PROMPT_INPUTS, dims [-1]) and an integer output of generated ids (TOKEN_ID_OUTPUTS);
    None where it lacks either (`token_id_reason` says which). `max_tokens_names`: the generic budget
    names, tried after TOKEN_ID_MAX_TOKENS_INPUTS."""
    prompt = _first(inputs, TOKEN_ID_PROMPT_INPUTS, variable=True)
    by_name = {t.name: t for t in outputs}
    output = _first(by_name, TOKEN_ID_OUTPUTS, variable=True) or next(
        (by_name[n] for n in TOKEN_ID_OUTPUTS if n in by_name and by_name[n].data_type in _INTEGER_TYPES), None)
    if prompt is None or output is None:
        return None
    length = _first({k: v for k, v in inputs.items() if k != prompt.name}, TOKEN_ID_LENGTH_INPUTS, variable=False)
    return TokenIdRoles(prompt, length, output, (*TOKEN_ID_MAX_TOKENS_INPUTS, *max_tokens_names))


def token_id_reason(inputs: Mapping[str, TensorInfo], outputs: Sequence[TensorInfo]) -> str | None:
    """Why a model with a token-id input by name is not a token-id LLM tritongen can drive (None:
    it has no such input, or it is one)."""
    named = [inputs[n] for n in TOKEN_ID_PROMPT_INPUTS if n in inputs]
    if not named:
        return None
    if _first(inputs, TOKEN_ID_PROMPT_INPUTS, variable=True) is None:
        return (f"input {named[0].name} is not an integer tensor of variable length (dims [-1]) to take the "
                "prompt's token ids")
    if token_id_roles(inputs, outputs, ()) is None:
        return (f"it takes token ids in {named[0].name} but has no integer output of generated ids "
                f"({', '.join(TOKEN_ID_OUTPUTS)})")
    return None


def salted_ids(ids: Sequence[int], salt: int) -> list[int]:
    """`ids` with their start made unique by `salt`, same length (core.prompts.salted on their text):
    each request of a load gets a prompt no prefix cache has seen."""
    return ids_of_text(salted(text_of_ids(ids), salt))


def ids_in(value: Any) -> int:
    """How many ids a response's output holds, as JSON gives it (a number, or lists of them, nested
    by batch and beam): every number counts."""
    if isinstance(value, (list, tuple)):
        return sum(ids_in(v) for v in value)
    return 0 if value is None or isinstance(value, (str, bytes)) else 1
