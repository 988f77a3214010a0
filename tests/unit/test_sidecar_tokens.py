"""Exact prompt token counts from the model's tokenizer.json (sidecar/admission_prompts.py), end to end: the
spec names it, render writes it into the policy, the sidecar loads it and charges each request
the tokens its prompt really has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from sidecar.cost import llm_cost
from tritongen.core.sidecar_policy.kv_cost import KVCost
from tritongen.core.sidecar_policy.schema import PolicyError, parse_policy
from sidecar.admission_prompts import load_counters
from tests.helpers import EXAMPLES, run_cli
from tests.sidecar_rigs import generate_facts, policy_doc


def word_tokenizer(path: Path) -> Path:
    """One token per whitespace-separated word: "hello brave new world" is 4 tokens, 21 bytes."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def test_the_tokenizer_counts_where_the_ratio_would_guess(tmp_path: Path) -> None:
    word_tokenizer(tmp_path / "tokenizer.json")
    doc = policy_doc()
    doc["models"][0]["kv"]["tokenizer"] = "tokenizer.json"  # relative: the policy's directory
    counters = load_counters(parse_policy(doc), tmp_path)
    count = counters["llm"]
    assert count(b"hello brave new world") == 4
    kv = KVCost(bytes_per_token=10, bytes_per_token_source="analytic", max_context=100, prompt_bytes_per_token=1.0)
    body = {"text_input": "hello brave new world", "max_tokens": 6}
    exact = llm_cost(kv, generate_facts(body, kv, count))
    guessed = llm_cost(kv, generate_facts(body, kv))
    assert (exact.prompt_tokens, exact.tokens) == (4, 10)  # 4 prompt tokens + 6
    assert (guessed.prompt_tokens, guessed.tokens) == (21, 27)  # one byte per token, the safe bound


def test_a_named_tokenizer_that_cannot_be_read_is_a_policy_error(tmp_path: Path) -> None:
    doc = policy_doc()
    doc["models"][0]["kv"]["tokenizer"] = "missing/tokenizer.json"
    with pytest.raises(PolicyError, match=r"kv.tokenizer .*missing/tokenizer.json cannot be read"):
        load_counters(parse_policy(doc), tmp_path)


def test_render_writes_the_specs_tokenizer_into_the_policy(tmp_path: Path) -> None:
    import yaml

    word_tokenizer(tmp_path / "tok.json")
    doc = yaml.safe_load((EXAMPLES / "deployment.yaml").read_text())
    next(m for m in doc["models"] if m["name"] == "tinyllm")["tokenizer"] = "tok.json"
    (tmp_path / "architectures").symlink_to(EXAMPLES / "architectures")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    result = run_cli("render", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    policy = json.loads((tmp_path / "out" / "sidecar_policy.json").read_text())
    tiny = next(m for m in policy["models"] if m["name"] == "tinyllm")
    assert tiny["kv"]["tokenizer"] == str((tmp_path / "tok.json").resolve())
    assert load_counters(parse_policy(policy), tmp_path / "out")["tinyllm"](b"hello world") == 2
    # a tokenizer path that is not a file is the spec's error, with its line
    next(m for m in doc["models"] if m["name"] == "tinyllm")["tokenizer"] = "nope.json"
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    result = run_cli("render", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out2"))
    assert result.returncode == 2 and "models[1].tokenizer" in result.stdout + result.stderr
