"""Prompts of a given size in tokens for measurements and loads, each with a unique start so an
engine's prefix cache does not serve it from memory, except where the traffic says prompts share
their beginning (`arrival_prompt`)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from tritongen.core.traffic import Arrivals

_FILLER = "Triton serves models; tritongen measures them before it configures them. "


_SALT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Every salt is spelled with this many digits (leading zeros), whatever its value: a salt of fewer
# digits left more of the filler in a prompt, so two prompts of one size held different numbers of
# words, and a model that counts words saw the load generator's prompts (ten-digit salts) longer than
# the profile's static-batch probe (seven to nine): batches the probe had sized ran out of memory live
# (bench-zoo's oneshot, 2026-12-07). One width, so every prompt of a size has one make-up.
SALT_DIGITS = 10
_LONGEST_HEAD = SALT_DIGITS * (max(len(w) for w in _SALT_WORDS) + 1) + 1  # its words, their spaces, the colon


def prompt_of(tokens: int, bytes_per_token: float, salt: int | None = None, salt_surplus: int = 0) -> str:
    """An ASCII prompt of about `tokens` tokens for a tokenizer of `bytes_per_token` bytes per token;
    with `salt`, its start is unique (see `salted`), and `salt_surplus` (the tokens a salt adds
    beyond the filler it replaces, as the engine counts them: `EngineMeasurement.salt_surplus_tokens`)
    is taken off the filler, so the salted prompt holds `tokens` (`to_be_salted`)."""
    if salt is None:
        return _filler(tokens, bytes_per_token)
    return _headed(to_be_salted(tokens, bytes_per_token, salt_surplus), _salt_head(salt))


def to_be_salted(tokens: int, bytes_per_token: float, salt_surplus: int) -> str:
    """The unsalted prompt a load salts later (`salted`, which keeps a text's length) so that, salted,
    it holds `tokens`: `prompt_of`'s filler less `salt_surplus` tokens, unless that leaves no room for
    the longest salt head (then the whole size, as `prompt_of` does)."""
    if salt_surplus:
        shorter = _filler(max(1, tokens - salt_surplus), bytes_per_token)
        if len(shorter) > _LONGEST_HEAD:
            return shorter
    return _filler(tokens, bytes_per_token)


def _filler(tokens: int, bytes_per_token: float) -> str:
    size = max(1, int(round(tokens * bytes_per_token)))
    return (_FILLER * (size // len(_FILLER) + 1))[:size]


def spelled(number: int) -> str:
    """A number in English words, digit by digit."""
    return " ".join(_SALT_WORDS[int(d)] for d in str(abs(int(number))))


def _headed(text: str, head: str) -> str:
    return (head + text)[: len(text)] if len(text) > len(head) else head[: len(text)]


def salted(text: str, salt: int) -> str:
    """`text` with its start replaced by `salt` spelled in English words, same length.

    Engines with a prefix cache (vLLM's is on by default) serve the blocks of a prompt they have
    seen from memory: a measurement or a load that repeats one prompt would see almost no prefill,
    where real users' prompts differ. Words, not digits, so the salt tokenizes at about the rate of
    the text it replaces and the prompt keeps its size in tokens; SALT_DIGITS of them, last digit
    first, so consecutive salts part at the first word (a cache block shared by two salted prompts
    would be served from memory)."""
    return _headed(text, _salt_head(salt))


def _salt_head(salt: int) -> str:
    digits = str(abs(int(salt)) % 10**SALT_DIGITS).zfill(SALT_DIGITS)
    return " ".join(_SALT_WORDS[int(d)] for d in reversed(digits)) + ": "


# The load generator's run salts are multiples of this (`loadgen`): a salt is its run's base plus
# the request's index, and a shared text is headed by the run's number, `salt0 // RUN_STRIDE`.
RUN_STRIDE = 10**7

# Shared texts (a prefix, a conversation, a request's own part after a prefix) are words of this
# list only, each after a space. Nearly every tokenizer splits text at spaces before it merges (byte
# BPE, SentencePiece, word counters), so such a text holds the sum of its words' tokens: with each
# word's tokens as the engine counts them (`TextWords`), a text of N tokens is written exactly. The
# filler sentence of `prompt_of` held a shared text's size only to within ~12% on the tiny Llama's
# tokenizer (its heads of spelled digits and kinds tokenize at another rate than the filler, and a
# cut mid-word at another still): the bench's 100-token prompt for all was 96 tokens live, a cache
# block fewer than simulated (2026-12-07).
FILL_WORD = "the"
_KIND_WORDS = ("prefix", "conversation", "request")
TEXT_WORDS = (*_SALT_WORDS, *_KIND_WORDS, FILL_WORD)


class TextWords(BaseModel):
    """The engine's tokens for each of TEXT_WORDS (`EngineProfiler.text_words` counts them)."""

    spaced: dict[str, float] = Field(description="Tokens each word adds after a space.")
    leading: dict[str, float] = Field(
        default_factory=dict, description="Tokens a word adds at a prompt's start beyond `spaced` and the tokens the "
        "engine adds to every prompt (prompt_added_tokens): a byte-level BPE spells a first word without its space "
        "(-1 on the tiny Llama's: a 108-token prompt held 107), a SentencePiece one the same.")

    def covers_every_word(self) -> bool:
        """Whether every word of TEXT_WORDS has a count above 0 (a profile written by hand may lack one)."""
        return all(self.spaced.get(w, 0) > 0 for w in TEXT_WORDS)


def _worded(tokens: int, head: Sequence[str], words: TextWords, leads: bool) -> str:
    """`head`'s words, then FILL_WORD to the nearest of `tokens` (exact where it is one token), the
    first word's surplus counted where the text `leads` a prompt; a head longer than the text is cut
    after its last word that fits (its first words, which set the text apart, stay). No other word
    ends it, so a conversation's later turn, longer, begins with the earlier turn's whole text."""
    cost = words.spaced
    out: list[str] = []
    total = words.leading.get(head[0], 0.0) if leads else 0.0
    for word in head:
        if out and total + cost[word] > tokens + 0.5:
            break
        out.append(word)
        total += cost[word]
    out += [FILL_WORD] * max(0, round((tokens - total) / cost[FILL_WORD]))
    return " ".join(out)


def _own_text(tokens: int, bytes_per_token: float, kind: str, ident: int, run: int,
              words: TextWords | None, leads: bool) -> str:
    """Text of one identity (a prefix, a conversation, a request's own part), headed by its id
    spelled last digit first, then its kind and the run: texts of two identities part at their
    first word or two. What follows a shared prefix starts mid-block, and an engine caches the
    block the prefix ends in if the next few tokens of two prompts agree: a salt's long common
    leading digits would make them agree."""
    head = [_SALT_WORDS[int(d)] for d in reversed(str(abs(int(ident))))] + [kind] + spelled(run).split()
    if words is None or not words.covers_every_word():  # sized by bytes, as prompt_of's filler (bytes_per_token's text)
        return _headed(_filler(tokens, bytes_per_token), " ".join(head) + " ")
    return _worded(tokens, head, words, leads)


def arrival_prompt(arrivals: Arrivals, i: int, bytes_per_token: float, salt0: int, salt_surplus: int = 0,
                   words: TextWords | None = None) -> str:
    """The text of request `i`, sized as `prompt_of` sizes prompts, that shares exactly what the
    arrivals say it shares (`tritongen.core.traffic_sharing`), so the live engine's prefix cache
    sees what the simulated one does:
    - its shared prefix, word for word the same in every request with that prefix (headed by the
      prefix's id);
    - then, in a conversation, the conversation's own text up to the prompt's length, so a later
      turn begins with the whole text of every earlier one (the previous reply a stand-in of its
      length);
    - else its own text, headed by the request's index.
    Shared texts are of TEXT_WORDS, sized by `words` (the engine's count of each) where the profile
    measured them, else of `prompt_of`'s filler by bytes. A prompt that shares nothing is salted as
    it always was (`prompt_of`, salt `salt0 + i`, its filler short by `salt_surplus` tokens).
    `salt0` sets the run (a multiple of RUN_STRIDE): another base makes every text new, so a second
    run meets no prompt of the first in a cache."""
    tokens = int(arrivals.prompt[i])
    prefix, conversation = int(arrivals.prefix_id[i]), int(arrivals.conversation[i])
    if prefix < 0 and conversation < 0:
        return prompt_of(tokens, bytes_per_token, salt=salt0 + i, salt_surplus=salt_surplus)
    run = salt0 // RUN_STRIDE
    pieces = []
    if prefix >= 0:
        shared = int(arrivals.prefix_tokens[i])
        pieces.append(_own_text(shared, bytes_per_token, "prefix", prefix, run, words, leads=True))
        tokens -= shared
    if tokens > 0:
        kind, ident = ("conversation", conversation) if conversation >= 0 else ("request", i)
        pieces.append(_own_text(tokens, bytes_per_token, kind, ident, run, words, leads=not pieces))
    return " ".join(pieces)
