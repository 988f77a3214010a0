"""The sidecar policy's limits from the engine and from Triton (issue 15): a hand-written engine is
admitted against its own pool, a reserving engine that states no pool gets the plan's in tokens,
prompts are counted by the tokenizer the model's directory holds, and render refuses a policy
nothing could pass. The policy derived by hand and its schema: test_sidecar_policy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import EXAMPLES, run_cli
from tritongen.core.file_names import POLICY_FILE
from tritongen.core.plan import plan_deployment
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.core.spec import MIB
from tritongen.specio import load_spec


def model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["name"] == name)


def spec_variant(tmp_path: Path, edit: Any) -> Any:
    """The example spec, edited by `edit(doc)`, loaded from tmp_path (architectures linked)."""
    import yaml

    doc = yaml.safe_load((EXAMPLES / "deployment.yaml").read_text())
    edit(doc)
    (tmp_path / "architectures").symlink_to(EXAMPLES / "architectures")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _hand_written_llm(doc: dict[str, Any]) -> None:
    """tinyllm's entry as a user's own backend: reserves prompt + max_tokens from a 1920-token pool."""
    llm = next(m for m in doc["models"] if m["name"] == "tinyllm")
    llm.update(name="chat", bytes_per_token=3, typical_prompt_tokens=48, typical_output_tokens=48,
               engine={"kv_policy": "reserve_kill", "kv_pool_tokens": 1920, "max_num_seqs": 48},
               parameters={"default_max_tokens": "32"})
    doc["models"].append({"name": "echo", "backend": "python", "kind": "classic", "max_batch_size": 0,
                          "instances": 2, "inputs": [{"name": "IN", "data_type": "FP32", "dims": [4]}],
                          "outputs": [{"name": "OUT", "data_type": "FP32", "dims": [4]}]})


def test_a_hand_written_engine_is_admitted_against_its_own_pool(tmp_path: Path) -> None:
    loaded = load_spec(spec_variant(tmp_path, _hand_written_llm))
    plan = plan_deployment(loaded.spec, loaded.architectures)
    doc = build_sidecar_policy(loaded.spec, plan)
    parse_policy(doc)
    chat = model(doc, "chat")
    bpt = chat["kv"]["bytes_per_token"]
    assert chat["kv"]["kv_policy"] == "reserve_kill" and chat["kv"]["block_tokens"] == 1
    assert chat["kv"]["engine_pool_bytes"] == chat["memory_quota_bytes"] == 1920 * bpt  # the engine's pool
    assert chat["max_inflight"] == 48  # the engine's own limit, not pool / max_context
    assert chat["kv"]["prompt_bytes_per_token"] == 3 and chat["kv"]["default_max_tokens"] == 32
    note = next(n for n in doc["notes"] if n.startswith("chat:"))
    assert "20 sequences of the typical 96 tokens fit" in note and "reserved against the pool" in note
    # a non-batching classic model: Triton's default scheduler queues without bound, so does the sidecar
    echo = model(doc, "echo")
    assert echo["max_inflight"] is None and echo["engines"] == 2
    assert doc["concurrency"]["max"] == 48  # LLM requests only


def standins_variant(tmp_path: Path, edit: Any) -> Any:
    """The LLM stand-ins' spec (examples/llm_standins), edited by `edit(models by name)`, loaded
    from tmp_path."""
    import shutil

    import yaml

    standins = EXAMPLES / "llm_standins"
    doc = yaml.safe_load((standins / "deployment.yaml").read_text())
    edit({m["name"]: m for m in doc["models"]})
    shutil.copy(standins / "standin-arch.json", tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    return load_spec(tmp_path / "spec.yaml")


def test_a_reserving_engine_with_no_pool_or_block_gets_the_plans_pool_in_tokens(tmp_path: Path) -> None:
    """The stand-ins' reserve_llm with no kv_pool_tokens nor kv_block_tokens: the engine reserves
    token by token (block 1) from the plan's pool, 256 MiB / 2048 B = 131072 tokens, not the plan's
    8192 blocks of 16 tokens read as 8192 tokens. The simulator's engine (entry_engine) agrees."""
    from tritongen.engine_files import entry_engine
    from tritongen.core.engine_sources import MeasuredEngine
    from tritongen.core.engine import LLMCurve

    def unstated(models: dict[str, Any]) -> None:
        llm = models["reserve_llm"]
        del llm["engine"]["kv_pool_tokens"], llm["engine"]["kv_block_tokens"], llm["parameters"]["pool_tokens"]

    loaded = standins_variant(tmp_path, unstated)
    plan = plan_deployment(loaded.spec, loaded.architectures)
    kv = plan.entry("reserve_llm").kv
    assert (kv.budget_bytes, kv.kv_bytes_per_token, kv.block_tokens) == (256 * MIB, 2048, 16)

    policy = build_sidecar_policy(loaded.spec, plan)
    parse_policy(policy)
    llm_policy = model(policy, "reserve_llm")
    assert llm_policy["kv"]["block_tokens"] == 1
    assert llm_policy["kv"]["engine_pool_bytes"] == 131_072 * 2048 == 256 * MIB
    note = next(n for n in policy["notes"] if n.startswith("reserve_llm:"))
    assert "pool 131072 tokens in blocks of 1 (tritongen's KV plan" in note

    spec_model = next(m for m in loaded.spec.models if m.name == "reserve_llm")
    curve = LLMCurve(prefill_fixed_ms=1.0, prefill_ms_per_token=0.1, decode_fixed_ms=2.0, decode_ms_per_seq=1.0)
    simulated = entry_engine(plan.entry("reserve_llm"), spec_model, measured=MeasuredEngine(curve=curve))
    assert (simulated.kv_block_tokens, simulated.pool_tokens) == (1, 131_072)


def _save_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models

    directory.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.BPE()).save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def _policy_of(loaded: Any) -> dict[str, Any]:
    """The policy render writes (render_repository: the adapter looks in the models' directories)."""
    from tritongen.render import render_repository

    return json.loads(render_repository(loaded).files[POLICY_FILE])


@pytest.mark.parametrize("where", ["absolute", "relative to the spec"])
def test_prompts_are_counted_by_the_model_directorys_tokenizer(tmp_path: Path, where: str) -> None:
    spec_dir, model_dir = tmp_path / "spec", tmp_path / "spec" / "models" / "tiny"
    spec_dir.mkdir()
    found = _save_tokenizer(model_dir)

    def local(models: dict[str, Any]) -> None:
        models["vllm_standin"]["hf_model"] = str(model_dir) if where == "absolute" else "models/tiny"

    doc = _policy_of(standins_variant(spec_dir, local))
    vllm = model(doc, "vllm_standin")
    assert vllm["kv"]["tokenizer"] == str(found.resolve())
    note = next(n for n in doc["notes"] if n.startswith("vllm_standin:"))
    assert f"counted by {found.resolve()} (the model directory's tokenizer.json), else at 4 bytes/token" in note
    assert model(doc, "reserve_llm")["kv"]["tokenizer"] is None  # its spec names no directory
    # the sidecar can count with it
    from sidecar.admission_prompts import load_counters

    counters = load_counters(parse_policy(doc), tmp_path)
    assert set(counters) == {"vllm_standin"}


def test_vllm_engine_args_name_the_tokenizer_directory(tmp_path: Path) -> None:
    """vLLM tokenizes with engine_args' `tokenizer` when it is set, not with the model's directory."""
    found = _save_tokenizer(tmp_path / "tok")

    def split(models: dict[str, Any]) -> None:
        models["vllm_standin"]["engine_args"] = {"tokenizer": str(tmp_path / "tok")}  # hf_model: a hub id

    doc = _policy_of(standins_variant(tmp_path, split))
    assert model(doc, "vllm_standin")["kv"]["tokenizer"] == str(found.resolve())


def test_a_spec_tokenizer_wins_over_the_model_directorys(tmp_path: Path) -> None:
    own = _save_tokenizer(tmp_path / "own")
    _save_tokenizer(tmp_path / "model")

    def both(models: dict[str, Any]) -> None:
        models["vllm_standin"].update(hf_model=str(tmp_path / "model"), tokenizer=str(own))

    doc = _policy_of(standins_variant(tmp_path, both))
    assert model(doc, "vllm_standin")["kv"]["tokenizer"] == str(own)
    note = next(n for n in doc["notes"] if n.startswith("vllm_standin:"))
    assert "counted by tokenizer.json, else" in note and "model directory" not in note


@pytest.mark.parametrize("hf_model", ["standin/no-weights", "bare"])
def test_no_tokenizer_without_a_local_directory_holding_one(tmp_path: Path, hf_model: str) -> None:
    """A hub id (no such directory), or a directory without tokenizer.json: the bound stays."""
    (tmp_path / "bare").mkdir()

    def named(models: dict[str, Any]) -> None:
        models["vllm_standin"]["hf_model"] = hf_model

    doc = _policy_of(standins_variant(tmp_path, named))
    assert model(doc, "vllm_standin")["kv"]["tokenizer"] is None
    note = next(n for n in doc["notes"] if n.startswith("vllm_standin:"))
    assert "counted by" not in note and "prompts at 4 bytes/token (the spec)" in note


def test_render_refuses_a_policy_nothing_could_pass(tmp_path: Path) -> None:
    def impossible(doc: dict[str, Any]) -> None:
        """Classic models only (the plan has no KV pool to check the pad against), 256 MiB of CPU
        memory and a stated 2048 MiB safety pad: the sidecar could never admit anything. (Unstated,
        a deployment without LLMs keeps no pad: tests/unit/test_default_quotas.py.)"""
        doc["hardware"]["cpu_memory_mb"] = 256
        doc["models"] = [m for m in doc["models"] if m["kind"] == "classic"]
        doc["policy"]["kv_safety_pad_mb"] = 2048

    out = tmp_path / "out"
    result = run_cli("render", str(spec_variant(tmp_path, impossible)), "-o", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stdout + result.stderr
    assert "safety_pad_bytes" in message and "kv_safety_pad_mb" in message and "Traceback" not in message
    assert not out.exists() or not any(out.iterdir()), "nothing may be written"
