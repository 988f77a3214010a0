"""Traffic whose prompts share their beginning (`tritongen.core.traffic_sharing`): what a class
states, what each request carries, and that a traffic without sharing is the one it always was.
The engine's cache over these requests: test_prefix_cache.py; their live text: test_prompt_sharing.py."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from pydantic import ValidationError

from tests.helpers import EXAMPLES
from tritongen.core.traffic import TrafficSpec, generate_arrivals, parse_trace_csv, scale_rate
from tritongen.core.traffic_sharing import SharedPrefix, popularity
from tritongen.errors import BadInput
from tritongen.traffic_files import read_traffic


def spec(*classes: dict, rate: float = 20.0, duration: float = 60.0) -> TrafficSpec:
    return TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=duration, classes=list(classes))


def without_sharing(s: TrafficSpec) -> TrafficSpec:
    plain = [c.model_copy(update={"shared_prefix": None, "conversation": None}) for c in s.classes]
    return s.model_copy(update={"classes": plain})


# The arrivals of these specs and seeds before sharing existed (the traffic module of 81eb29c,
# numpy 1.26): a traffic that states no sharing must still be exactly these requests.
PINNED = [
    dict(shape="poisson", rate_per_s=40, duration_s=30, warmup_s=2, classes=[
        {"name": "i", "share": 0.3, "priority": 1, "prompt_tokens": 48, "output_tokens": 16},
        {"name": "n", "share": 0.5, "priority": 2, "prompt_tokens": {"dist": "uniform", "min": 16, "max": 96}, "output_tokens": 16},
        {"name": "b", "share": 0.2, "priority": 3, "prompt_tokens": {"dist": "lognormal", "mean": 96},
         "output_tokens": {"dist": "exponential", "mean": 20}}]),
    dict(shape="bursty", rate_per_s=30, duration_s=20, bursty={"on_s": 2, "off_s": 8, "burst_factor": 6},
         classes=[{"name": "a", "share": 1, "prompt_tokens": 32, "output_tokens": 8}]),
    dict(shape="daily", rate_per_s=25, duration_s=100, daily={"period_s": 50},
         classes=[{"name": "a", "share": 1, "prompt_tokens": {"dist": "uniform", "min": 1, "max": 9}}]),
]
PINNED_DIGEST = "4a53b307ea17fb4dcc986cfd1678b101d00bef9748a74f35efce7b8c997e71a6"


def test_a_traffic_that_shares_nothing_is_byte_for_byte_what_it_was() -> None:
    digest = hashlib.sha256()
    for d in PINNED:
        s = TrafficSpec.model_validate(d)
        for seed in (0, 1, 7):
            for requests in (None, 500):
                a = generate_arrivals(s, seed=seed, requests=requests)
                for name in ("t", "cls", "prompt", "output", "rows"):
                    digest.update(np.ascontiguousarray(getattr(a, name)).tobytes())
                digest.update(repr((a.class_names, a.class_priority, a.class_model, a.warmup_s)).encode())
                assert not a.shares_prompts
                assert (a.prefix_id == -1).all() and (a.conversation == -1).all() and not a.shared_tokens.any()
    assert digest.hexdigest() == PINNED_DIGEST


CHAT = {"name": "chat", "share": 0.5, "prompt_tokens": {"dist": "uniform", "min": 5, "max": 30}, "output_tokens": 40,
        "shared_prefix": {"tokens": 100}, "conversation": {"turns": 4, "think_s": 3.0}}
RAG = {"name": "rag", "share": 0.3, "prompt_tokens": 20, "output_tokens": {"dist": "uniform", "min": 4, "max": 9},
       "shared_prefix": {"tokens": {"dist": "uniform", "min": 200, "max": 400}, "count": 5, "zipf": 1.0}}
PLAIN = {"name": "plain", "share": 0.2, "prompt_tokens": 64, "output_tokens": 8}


def test_sharing_leaves_times_classes_and_outputs_and_adds_only_the_shared_tokens() -> None:
    s = spec(CHAT, RAG, PLAIN)
    shared, plain = generate_arrivals(s, seed=3), generate_arrivals(without_sharing(s), seed=3)
    assert np.array_equal(shared.t, plain.t) and np.array_equal(shared.cls, plain.cls)
    assert np.array_equal(shared.output, plain.output) and np.array_equal(shared.rows, plain.rows)
    rag, other = shared.cls == 1, shared.cls == 2
    # a prefix's requests: the prefix, then their own prompt_tokens
    assert np.array_equal(shared.prompt[rag], plain.prompt[rag] + shared.prefix_tokens[rag])
    assert np.array_equal(shared.shared_tokens[rag], shared.prefix_tokens[rag])
    assert (shared.conversation[rag] == -1).all()
    # a class that shares nothing is untouched
    assert np.array_equal(shared.prompt[other], plain.prompt[other])
    assert (shared.prefix_id[other] == -1).all() and not shared.shared_tokens[other].any()
    assert shared.shares_prompts


def test_each_prefix_keeps_one_length_and_ids_do_not_cross_classes() -> None:
    s = spec(CHAT, RAG, PLAIN)
    a = generate_arrivals(s, seed=5)
    for p in np.unique(a.prefix_id[a.prefix_id >= 0]):
        lengths = set(a.prefix_tokens[a.prefix_id == p].tolist())
        classes = set(a.cls[a.prefix_id == p].tolist())
        assert len(lengths) == 1 and len(classes) == 1
    assert set(a.prefix_id[a.cls == 0].tolist()) == {0}  # the chat's one system prompt
    assert set(a.prefix_id[a.cls == 1].tolist()) <= set(range(1, 6))  # the 5 documents come after it
    assert all(200 <= n <= 400 for n in a.prefix_tokens[a.cls == 1].tolist())


def test_popularity_is_zipf_and_zero_is_uniform() -> None:
    assert popularity(SharedPrefix(tokens=10, count=4)).tolist() == [0.25] * 4
    chance = popularity(SharedPrefix(tokens=10, count=3, zipf=1.0))
    assert chance.tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])  # 1, 1/2, 1/3 normalised
    rag = dict(RAG, share=1.0)
    a = generate_arrivals(spec(rag, rate=200.0), seed=1)
    seen = np.bincount(a.prefix_id, minlength=5) / len(a)
    assert seen.tolist() == pytest.approx(popularity(SharedPrefix.model_validate(RAG["shared_prefix"])).tolist(), abs=0.02)


def test_a_turn_carries_the_previous_turn_its_reply_and_new_text() -> None:
    s = spec(dict(CHAT, share=1.0), rate=10.0)
    a, plain = generate_arrivals(s, seed=2), generate_arrivals(without_sharing(s), seed=2)
    conversations = np.unique(a.conversation)
    assert (conversations >= 0).all() and len(conversations) > 10
    for c in conversations.tolist():
        turns = np.flatnonzero(a.conversation == c)
        assert 1 <= len(turns) <= 4
        first = turns[0]
        assert a.prompt[first] == 100 + plain.prompt[first] and a.shared_tokens[first] == 100
        for before, turn in zip(turns, turns[1:]):
            assert a.t[turn] - a.t[before] >= 3.0  # think_s
            assert a.prompt[turn] == a.prompt[before] + a.output[before] + plain.prompt[turn]
            assert a.shared_tokens[turn] == a.prompt[before]
        assert set(a.prefix_id[turns].tolist()) == {0} and set(a.prefix_tokens[turns].tolist()) == {100}


def test_a_conversation_without_a_prefix_shares_only_its_history() -> None:
    chat = {k: v for k, v in CHAT.items() if k != "shared_prefix"} | {"share": 1.0}
    a = generate_arrivals(spec(chat), seed=4)
    assert (a.prefix_id == -1).all() and not a.prefix_tokens.any()
    firsts = [np.flatnonzero(a.conversation == c)[0] for c in np.unique(a.conversation).tolist()]
    assert not a.shared_tokens[firsts].any()
    assert a.shared_tokens.any()


def test_selections_and_rescaling_keep_what_is_shared() -> None:
    a = generate_arrivals(spec(CHAT, RAG, PLAIN), seed=6)
    fast = scale_rate(a, 2.0)
    for name in ("prefix_id", "prefix_tokens", "conversation", "shared_tokens", "prompt"):
        assert np.array_equal(getattr(fast, name), getattr(a, name))
    some = a.take(a.cls == 1)
    assert np.array_equal(some.prefix_id, a.prefix_id[a.cls == 1])
    cut = generate_arrivals(spec(CHAT, RAG, PLAIN), seed=6, requests=50)
    assert len(cut.prefix_id) == 50 and len(cut.shared_tokens) == 50


def test_a_traces_prompt_tokens_are_the_new_part_too() -> None:
    text = "timestamp,class,prompt_tokens,output_tokens\n0,rag,10,5\n1,plain,30,2\n"
    s = TrafficSpec(shape="trace", trace={"path": "t.csv"},
                    classes=[{"name": "rag", "share": 0.5, "shared_prefix": {"tokens": 50}}, {"name": "plain", "share": 0.5}])
    a = generate_arrivals(s, trace_text=text)
    assert a.prompt.tolist() == [60, 30] and a.shared_tokens.tolist() == [50, 0]
    assert parse_trace_csv(text, s).prompt.tolist() == [10, 30]


@pytest.mark.parametrize("section, words", [
    ({"shared_prefix": {"tokens": 0}}, "a shared prefix has at least 1 token"),
    ({"shared_prefix": {"tokens": {"dist": "uniform", "min": 0, "max": 9}}}, "set it (or its `min`) to 1 or more"),
    ({"shared_prefix": {"tokens": 10, "count": 0}}, "greater than or equal to 1"),
    ({"shared_prefix": {"tokens": 10, "zipf": -1}}, "greater than or equal to 0"),
    ({"shared_prefix": {"tokens": 10, "popularity": "zipf"}}, "Extra inputs are not permitted"),
    ({"conversation": {"turns": 0, "think_s": 1}}, "a conversation has at least 1 turn"),
    ({"conversation": {"turns": 3}}, "think_s"),
    ({"conversation": {"turns": 3, "think_s": 0}}, "greater than 0"),
])
def test_the_schema_refuses_a_bad_field_with_one_message_naming_it(section: dict, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec({"name": "a", "share": 1.0, "prompt_tokens": 10, **section})
    assert len(err.value.errors()) == 1
    assert words in str(err.value)


def test_a_traffic_file_names_the_field_and_the_fix(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("shape: poisson\nrate_per_s: 1\nclasses:\n  - {name: a, share: 1, shared_prefix: {tokens: 0}}\n")
    with pytest.raises(BadInput, match=r"classes\[0\]\.shared_prefix: `tokens` can be 0: a shared prefix has at least 1 token"):
        read_traffic(path)


@pytest.mark.parametrize("name", ["chat.yaml", "rag.yaml"])
def test_the_examples_share_what_they_say(name: str) -> None:
    s, text = read_traffic(EXAMPLES / "traffic" / name)
    a = generate_arrivals(s, seed=0, trace_text=text)
    assert a.shares_prompts
    shared = a.shared_tokens.sum() / a.prompt.sum()
    assert 0.5 < shared < 1.0  # most of each prompt is shared, never all of it
    if name == "chat.yaml":
        assert (a.conversation >= 0).all() and len(set(a.prefix_id.tolist())) == 1
    else:
        docs = a.prefix_id[a.prefix_id >= 0]
        assert len(set(docs.tolist())) > 10 and np.bincount(docs).argmax() == 0  # the first document is the most asked
