"""Prompts of a given size in tokens for measurements and loads, each with a unique start so an
engine's prefix cache does not serve it from memory, except where the traffic says prompts share
their beginning (`arrival_prompt`)."""

from __future__ import annotations

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


def _own_text(tokens: int, bytes_per_token: float, kind: str, ident: int, run: int) -> str:
    """Text of one identity (a prefix, a conversation, a request's own part), headed by its id
    spelled last digit first, then its kind and the run: texts of two identities part at their
    first word or two. What follows a shared prefix starts mid-block, and an engine caches the
    block the prefix ends in if the next few tokens of two prompts agree: a salt's long common
    leading digits would make them agree."""
    ident_words = " ".join(_SALT_WORDS[int(d)] for d in reversed(str(abs(int(ident)))))
    return _headed(_filler(tokens, bytes_per_token), f"{ident_words} {kind} {spelled(run)}: ")


def arrival_prompt(arrivals: Arrivals, i: int, bytes_per_token: float, salt0: int, salt_surplus: int = 0) -> str:
    """The text of request `i`, sized as `prompt_of` sizes prompts, that shares exactly what the
    arrivals say it shares (`tritongen.core.traffic_sharing`), so the live engine's prefix cache
    sees what the simulated one does:
    - its shared prefix, byte for byte the same in every request with that prefix (headed by the
      prefix's id, ending in a newline so its last token does not merge with what follows);
    - then, in a conversation, the conversation's own text up to the prompt's length, so a later
      turn begins with the whole text of every earlier one (the previous reply a stand-in of its
      length);
    - else its own text, headed by the request's index.
    A prompt that shares nothing is salted as it always was (`prompt_of`, salt `salt0 + i`, its filler
    short by `salt_surplus` tokens).
    `salt0` sets the run: another base makes every text new, so a second run meets no prompt of
    the first in a cache."""
    tokens = int(arrivals.prompt[i])
    prefix, conversation = int(arrivals.prefix_id[i]), int(arrivals.conversation[i])
    if prefix < 0 and conversation < 0:
        return prompt_of(tokens, bytes_per_token, salt=salt0 + i, salt_surplus=salt_surplus)
    head = ""
    if prefix >= 0:
        shared = int(arrivals.prefix_tokens[i])
        head = _own_text(shared, bytes_per_token, "prefix", prefix, salt0)[:-1] + "\n"
        tokens -= shared
    if tokens <= 0:
        return head
    if conversation >= 0:
        return head + _own_text(tokens, bytes_per_token, "conversation", conversation, salt0)
    return head + _own_text(tokens, bytes_per_token, "request", i, salt0)
