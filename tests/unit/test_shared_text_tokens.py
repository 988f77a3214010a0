"""Shared texts hold their nominal tokens on real tokenizers (`core.prompts.arrival_prompt` with the
word counts a profile measures, `EngineProfiler.text_words`).

The load generator's shared texts were sized by bytes per token and held their nominal size only to
within ~12% on the tiny Llama's tokenizer: a 100-token prompt for all was 96 live, a cache block
fewer than the simulation's (2026-12-07). Here two tokenizers trained in the test (no download, no
server): the tiny Llama's byte-level BPE, and a SentencePiece-style unigram. Each word is counted
as the profile counts it (the growth from one number of repeats to the other), then every shared
text of a mixed traffic is counted whole."""

from __future__ import annotations

import numpy as np
import pytest

from tritongen.core.prompts import RUN_STRIDE, TEXT_WORDS, TextWords, arrival_prompt
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.local_llm import corpus
from tritongen.profiler.engine import WORD_REPEATS


def byte_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainer=trainers.BpeTrainer(
        vocab_size=430, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok


def sentencepiece_like():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(corpus(), trainer=trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>"], unk_token="<unk>", show_progress=False))
    return tok


def counted_words(count) -> TextWords:
    """As `EngineProfiler.text_words` counts them (this tokenizer adds no token to a prompt)."""
    low, high = WORD_REPEATS
    spaced = {w: (count(" ".join([w] * high)) - count(" ".join([w] * low))) / (high - low) for w in TEXT_WORDS}
    return TextWords(spaced=spaced, leading={w: count(" ".join([w] * low)) - low * spaced[w] for w in TEXT_WORDS})


def traffic():
    classes = [
        {"name": "one", "share": 0.3, "prompt_tokens": 108, "output_tokens": 8, "shared_prefix": {"tokens": 108}},
        {"name": "rag", "share": 0.3, "prompt_tokens": 108, "output_tokens": 8, "shared_prefix": {"tokens": 86, "count": 4}},
        {"name": "chat", "share": 0.4, "prompt_tokens": 40, "output_tokens": 16,
         "shared_prefix": {"tokens": 200}, "conversation": {"turns": 3, "think_s": 1.0}},
    ]
    return generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=10, duration_s=20, classes=classes), seed=3)


@pytest.mark.parametrize("make", [byte_bpe, sentencepiece_like])
def test_every_shared_text_holds_its_nominal_tokens(make) -> None:
    tok = make()
    count = lambda text: len(tok.encode(text).ids)  # noqa: E731
    words = counted_words(count)
    assert max(words.spaced.values()) > 1  # a small vocabulary: most words take several tokens (else this proves little)
    a = traffic()
    for salt0 in (7 * RUN_STRIDE, 420 * RUN_STRIDE):
        errors = [count(arrival_prompt(a, i, 4.0, salt0, words=words)) - int(a.prompt[i]) for i in range(len(a))]
        assert not any(errors), np.unique(errors, return_counts=True)
