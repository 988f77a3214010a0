"""The live side of prompts that share (`tritongen.core.prompts.arrival_prompt`, used by the load
generator): the text sent shares exactly what the arrivals say, so the live engine's prefix cache
meets what the simulated one does. No server: the load generator's runner is built, not run."""

from __future__ import annotations

import numpy as np

from tritongen.core.prompts import FILL_WORD, RUN_STRIDE, TEXT_WORDS, TextWords, arrival_prompt, prompt_of
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.loadgen import LoadTarget, _Runner

BPT = 3.5  # bytes per token
SALT0 = 42 * RUN_STRIDE
# Each shared-text word's tokens as a profile would have counted them (small-vocabulary-like: the
# digit words and kinds cost several tokens, the filler one).
WORDS = {w: 1 + len(w) % 4 for w in TEXT_WORDS} | {FILL_WORD: 1}
TEXT = TextWords(spaced=WORDS)


def tokens_in(text: str) -> float:
    return sum(WORDS[w] for w in text.split())


def shared_bytes(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def arrivals():
    classes = [
        {"name": "rag", "share": 0.4, "prompt_tokens": 30, "output_tokens": 8,
         "shared_prefix": {"tokens": {"dist": "uniform", "min": 100, "max": 300}, "count": 3}},
        {"name": "chat", "share": 0.4, "prompt_tokens": 20, "output_tokens": 16,
         "shared_prefix": {"tokens": 50}, "conversation": {"turns": 3, "think_s": 1.0}},
        {"name": "plain", "share": 0.2, "prompt_tokens": 40, "output_tokens": 8},
    ]
    return generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=10, duration_s=20, classes=classes), seed=1)


def test_a_prompt_that_shares_nothing_is_the_salted_prompt_it_always_was() -> None:
    a = arrivals()
    for i in np.flatnonzero(a.cls == 2).tolist():
        assert arrival_prompt(a, i, BPT, SALT0) == prompt_of(int(a.prompt[i]), BPT, salt=SALT0 + i)


def test_the_same_prefix_is_the_same_leading_text_and_the_rest_is_each_requests_own() -> None:
    a = arrivals()
    texts = {i: arrival_prompt(a, i, BPT, SALT0, words=TEXT) for i in range(len(a))}
    shared = [i for i in texts if a.prefix_id[i] >= 0 or a.conversation[i] >= 0]
    for i in shared:
        assert tokens_in(texts[i]) == int(a.prompt[i])  # exactly, with the engine's count of each word
    rag = np.flatnonzero(a.cls == 0).tolist()
    for i in rag:
        for j in rag:
            if i >= j:
                continue
            common = shared_bytes(texts[i], texts[j])
            if a.prefix_id[i] == a.prefix_id[j]:
                prefix = arrival_prompt(a, i, BPT, SALT0, words=TEXT)[:common].rsplit(" ", 1)[0]
                assert tokens_in(prefix) >= int(a.prefix_tokens[i])  # the whole prefix in common,
                assert common < len(prefix) + 24  # then each its own within a few words
            else:
                assert common < 8  # different prefixes part at their first words
    assert len({texts[i] for i in rag}) == len(rag)


def test_without_word_counts_a_shared_text_is_sized_by_bytes_per_token() -> None:
    a = arrivals()
    for i in np.flatnonzero(a.prefix_id >= 0).tolist():
        text = arrival_prompt(a, i, BPT, SALT0)
        prefix, own = int(a.prefix_tokens[i]), int(a.prompt[i]) - int(a.prefix_tokens[i])
        assert len(text) == round(prefix * BPT) + (1 + round(own * BPT) if own > 0 else 0)  # a space between
        assert text.startswith(arrival_prompt(a, int(np.flatnonzero(a.prefix_id == a.prefix_id[i])[0]), BPT, SALT0)[:round(prefix * BPT)])


def test_a_later_turn_begins_with_the_whole_text_of_the_turn_before() -> None:
    a = arrivals()
    texts = [arrival_prompt(a, i, BPT, SALT0, words=TEXT) for i in range(len(a))]
    conversations = np.unique(a.conversation[a.conversation >= 0]).tolist()
    later = 0
    for c in conversations:
        turns = np.flatnonzero(a.conversation == c).tolist()
        for before, turn in zip(turns, turns[1:]):
            assert texts[turn].startswith(texts[before] + " ")
            assert tokens_in(texts[before]) == int(a.shared_tokens[turn])
            later += 1
    assert later > 5
    firsts = [np.flatnonzero(a.conversation == c)[0] for c in conversations]
    heads = [system_prompt(texts[i].split(), 50) for i in firsts]
    assert len({tuple(words) for words, _ in heads}) == 1  # one system prompt of 50 tokens for every conversation
    assert len({tuple(rest[:3]) for _, rest in heads}) == len(firsts)  # then each conversation its own text


def system_prompt(words: list[str], tokens: int) -> tuple[list[str], list[str]]:
    """(the first words that hold `tokens`, the rest)."""
    held = 0.0
    for n, word in enumerate(words):
        if held == tokens:
            return words[:n], words[n:]
        held += WORDS[word]
    raise AssertionError(f"no leading words hold {tokens} tokens")


def test_another_run_shares_nothing_with_the_first() -> None:
    a = arrivals()
    i = int(np.flatnonzero(a.cls == 0)[0])
    assert shared_bytes(arrival_prompt(a, i, BPT, SALT0), arrival_prompt(a, i, BPT, SALT0 + RUN_STRIDE)) < 32  # a few words: inside any engine's first block


def test_the_load_generator_sends_these_texts() -> None:
    a = arrivals()
    runner = _Runner(None, None, a, lambda i: None, max_in_flight=4, request_timeout_s=1.0, drain_s=0.0, seed=0)
    target = LoadTarget(model="llm", streaming=True, bytes_per_token=BPT, text_words=TEXT)
    for i in range(len(a)):
        assert runner._prompt(i, target) == arrival_prompt(a, i, BPT, runner.salt0, words=TEXT)


def test_word_counts_that_miss_a_word_fall_back_to_bytes() -> None:
    a = arrivals()
    i = int(np.flatnonzero(a.prefix_id >= 0)[0])
    partial = TextWords(spaced={w: c for w, c in WORDS.items() if w != FILL_WORD})
    assert arrival_prompt(a, i, BPT, SALT0, words=partial) == arrival_prompt(a, i, BPT, SALT0)
