"""The live side of prompts that share (`tritongen.core.prompts.arrival_prompt`, used by the load
generator): the text sent shares exactly what the arrivals say, so the live engine's prefix cache
meets what the simulated one does. No server: the load generator's runner is built, not run."""

from __future__ import annotations

import numpy as np

from tritongen.core.prompts import arrival_prompt, prompt_of
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.loadgen import LoadTarget, _Runner

BPT = 3.5  # bytes per token
SALT0 = 420_000_000


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
    texts = {i: arrival_prompt(a, i, BPT, SALT0) for i in range(len(a))}
    for i, text in texts.items():
        assert len(text) == len(prompt_of(int(a.prompt[i]) - int(a.prefix_tokens[i]), BPT)) + (
            round(int(a.prefix_tokens[i]) * BPT) if a.prefix_id[i] >= 0 else 0)  # about prompt x BPT bytes
    rag = np.flatnonzero(a.cls == 0).tolist()
    for i in rag:
        for j in rag:
            if i >= j:
                continue
            common = shared_bytes(texts[i], texts[j])
            if a.prefix_id[i] == a.prefix_id[j]:
                size = round(int(a.prefix_tokens[i]) * BPT)
                assert texts[i][size - 1] == "\n"
                assert size <= common < size + 20  # the whole prefix, then each its own within a few words
            else:
                assert common < 8  # different prefixes part at their first words
    assert len({texts[i] for i in rag}) == len(rag)


def test_a_later_turn_begins_with_the_whole_text_of_the_turn_before() -> None:
    a = arrivals()
    texts = [arrival_prompt(a, i, BPT, SALT0) for i in range(len(a))]
    conversations = np.unique(a.conversation[a.conversation >= 0]).tolist()
    later = 0
    for c in conversations:
        turns = np.flatnonzero(a.conversation == c).tolist()
        for before, turn in zip(turns, turns[1:]):
            assert texts[turn].startswith(texts[before])
            assert len(texts[before]) == round(50 * BPT) + len(prompt_of(int(a.shared_tokens[turn]) - 50, BPT))
            later += 1
    assert later > 5
    firsts = [np.flatnonzero(a.conversation == c)[0] for c in conversations]
    system = round(50 * BPT)
    assert len({texts[i][:system] for i in firsts}) == 1  # one system prompt for every conversation
    assert len({texts[i][system:system + 12] for i in firsts}) == len(firsts)  # each conversation its own text


def test_another_run_shares_nothing_with_the_first() -> None:
    a = arrivals()
    i = int(np.flatnonzero(a.cls == 0)[0])
    assert shared_bytes(arrival_prompt(a, i, BPT, SALT0), arrival_prompt(a, i, BPT, SALT0 + 10**7)) < 32  # a few words: inside any engine's first block


def test_the_load_generator_sends_these_texts() -> None:
    a = arrivals()
    runner = _Runner(None, None, a, lambda i: None, max_in_flight=4, request_timeout_s=1.0, drain_s=0.0, seed=0)
    target = LoadTarget(model="llm", streaming=True, bytes_per_token=BPT)
    for i in range(len(a)):
        assert runner._prompt(i, target) == arrival_prompt(a, i, BPT, runner.salt0)
