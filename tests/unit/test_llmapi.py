"""TensorRT-LLM's LLM-API model (issue 46): the key table, render's model.yaml, check's findings on
TensorRT-LLM's own model.yaml files (tests/unit/data/llmapi, each with its source in its header) and
on broken variants of them, and the engine model read from model.yaml."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.helpers import EXAMPLES, run_cli
from tritongen.core.engine_sources import EngineSourceError, resolve_engine_limits
from tritongen.core.trtllm_args import CAPACITY_POLICIES, RELEASE, default_of, key_at
from tritongen.core.trtllm_args_check import check_llm_args, check_model_yaml
from tritongen.errors import BadInput
from tritongen.llmapi_files import llmapi_args
from tritongen.render import render_repository, write_repository
from tritongen.repository import check_repository
from tritongen.specio import load_spec, parse_spec_text

DATA = Path(__file__).parent / "data" / "llmapi"
CORPUS = sorted(DATA.glob("*.yaml"))
UPSTREAM = DATA / "upstream_1.1_model.yaml"
STAND_IN = "# stands in for TensorRT-LLM's llmapi model.py (copied from the container in a real repository)\n"
SPEC_MODEL = "qwen3-8b-trtllm"


def llmapi_folder(root: Path, model_yaml: str, config: str | None = None, name: str = "tensorrt_llm") -> Path:
    """A model folder as a user copies TensorRT-LLM's: upstream's config.pbtxt, their model.yaml."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    text = config if config is not None else (DATA / "upstream_config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(text.replace('name: "tensorrt_llm"', f'name: "{name}"'))
    (folder / "1" / "model.yaml").write_text(model_yaml)
    (folder / "1" / "model.py").write_text(STAND_IN)
    return folder


def findings_of(root: Path, model: str = "tensorrt_llm"):
    report = check_repository(root, gpu_count=8, gpu_count_source="the test")
    return [f for f in report.findings if f.model == model]


# ---------------------------------------------------------------------------------------------
# The corpus: TensorRT-LLM's own files, 0 false alarms


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_tensorrt_llms_own_model_yaml_files_check_clean(path: Path, tmp_path: Path) -> None:
    assert "Source:" in path.read_text().splitlines()[0]
    llmapi_folder(tmp_path, path.read_text())
    assert findings_of(tmp_path) == []


def test_the_corpus_holds_the_upstream_files_and_the_docs_examples() -> None:
    assert len(CORPUS) >= 6
    assert check_model_yaml(yaml.safe_load(UPSTREAM.read_text())) == []


# ---------------------------------------------------------------------------------------------
# Broken variants of the upstream file: each caught, naming the key and the fix


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


BASE = UPSTREAM.read_text()
WITH_KV = _edit(BASE, "pipeline_parallel_size: 1\n", "pipeline_parallel_size: 1\nkv_cache_config:\n"
                "  free_gpu_memory_fraction: 0.8\n  enable_block_reuse: true\nscheduler_config:\n"
                "  capacity_scheduler_policy: GUARANTEED_NO_EVICT\n")
VARIANTS = {
    # name: (model.yaml, config.pbtxt edit or None, code, key, a word the fix must hold)
    "unknown key": (_edit(BASE, "tensor_parallel_size: 1", "tensor_paralel_size: 1"), None,
                    "TG402", "tensor_paralel_size", "tensor_parallel_size"),
    "unknown nested key": (_edit(WITH_KV, "free_gpu_memory_fraction", "free_gpu_mem_fraction"), None,
                           "TG402", "kv_cache_config.free_gpu_mem_fraction", "free_gpu_memory_fraction"),
    "key in the wrong section": (_edit(BASE, "tensor_parallel_size: 1", "tensor_parallel_size: 1\nenable_block_reuse: false"),
                                 None, "TG402", "enable_block_reuse", "`kv_cache_config.enable_block_reuse`"),
    "wrong type": (_edit(BASE, "tensor_parallel_size: 1", "tensor_parallel_size: 1\nmax_batch_size: sixty-four"), None,
                   "TG403", "max_batch_size", "integer"),
    "wrong nested type": (_edit(WITH_KV, "enable_block_reuse: true", "enable_block_reuse: sometimes"), None,
                          "TG403", "kv_cache_config.enable_block_reuse", "true or false"),
    "fraction out of range": (_edit(WITH_KV, "free_gpu_memory_fraction: 0.8", "free_gpu_memory_fraction: 1.2"), None,
                              "TG404", "kv_cache_config.free_gpu_memory_fraction", "<= 1"),
    "no GPU": (_edit(BASE, "tensor_parallel_size: 1", "tensor_parallel_size: 0"), None,
               "TG404", "tensor_parallel_size", ">= 1"),
    "misspelt policy": (_edit(WITH_KV, "GUARANTEED_NO_EVICT", "GUARANTEED_NO_EVICTION"), None,
                        "TG405", "scheduler_config.capacity_scheduler_policy", "'GUARANTEED_NO_EVICT'"),
    "policy in lower case": (_edit(WITH_KV, "GUARANTEED_NO_EVICT", "max_utilization"), None,
                             "TG405", "scheduler_config.capacity_scheduler_policy", "'MAX_UTILIZATION'"),
    "missing model": (_edit(BASE, "model: TinyLlama/TinyLlama-1.1B-Chat-v1.0\n", ""), None,
                      "TG406", "model", "model id or local path"),
    "missing decoupled": (_edit(BASE, "  decoupled: False\n", ""), None, "TG406", "triton_config.decoupled", "add"),
    "triton_config decoupled against config.pbtxt": (
        _edit(BASE, "decoupled: False", "decoupled: True"), ("instance_group", 'model_transaction_policy { decoupled: false }\ninstance_group'),
        "TG407", "triton_config.decoupled", "model_transaction_policy"),
    "config.pbtxt batch above triton_config's": (
        BASE, ("instance_group", "max_batch_size: 8\ninstance_group"), "TG407", "triton_config.max_batch_size", "max_batch_size: 0"),
    "triton_config key model.py ignores": (_edit(BASE, "  decoupled: False", "  decoupled: False\n  max_queue_delay: 100"),
                                           None, "TG409", "triton_config.max_queue_delay", "remove"),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_broken_variant_is_caught_naming_the_key_and_the_fix(name: str, tmp_path: Path) -> None:
    text, config_edit, code, key, fix_word = VARIANTS[name]
    config = None
    if config_edit is not None:
        config = (DATA / "upstream_config.pbtxt").read_text().replace(*config_edit, 1)
    folder = llmapi_folder(tmp_path, text, config)
    found = [f for f in findings_of(tmp_path) if f.code == code]
    assert len(found) == 1, findings_of(tmp_path)
    finding = found[0]
    assert finding.field == key and f"`{key}`" in finding.message or key in finding.message
    assert fix_word in finding.fix, finding.fix
    assert finding.path == str(folder / "1" / "model.yaml")
    # the line is the key's own, or its section's when the key is missing (the whole file: none)
    if finding.line is None:
        assert code == "TG406" and "." not in key
    else:
        line = text.splitlines()[finding.line - 1]
        assert line.lstrip().startswith((key.split(".")[-1] + ":", key.split(".")[0] + ":")), (finding.line, line)


def test_a_model_yaml_that_is_not_a_mapping_is_one_finding(tmp_path: Path) -> None:
    llmapi_folder(tmp_path, "- model: x\n")
    (tmp_path / "tensorrt_llm" / "1" / "model.py").write_text("from tensorrt_llm import LLM\n")
    assert [f.code for f in findings_of(tmp_path)] == ["TG401"]


def test_another_python_models_yaml_is_left_alone(tmp_path: Path) -> None:
    folder = llmapi_folder(tmp_path, "threshold: 0.5\n")
    assert findings_of(tmp_path) == []
    assert llmapi_args(folder, "python") is None


# ---------------------------------------------------------------------------------------------
# The key table


def test_the_key_table_names_its_release_and_states_each_fact_once() -> None:
    assert RELEASE == "1.1.0"
    assert key_at(("scheduler_config", "capacity_scheduler_policy")).choices == CAPACITY_POLICIES
    assert default_of("scheduler_config", "capacity_scheduler_policy") == "GUARANTEED_NO_EVICT"
    assert default_of("kv_cache_config", "free_gpu_memory_fraction") == 0.9
    fraction = key_at(("kv_cache_config", "free_gpu_memory_fraction"))
    assert (fraction.ge, fraction.le, fraction.bound) == (0, 1, "upstream")
    assert check_llm_args({"model": "x"})[0].kind == "unknown"  # the spec names the model in hf_model


def test_lax_values_pass_as_they_do_upstream() -> None:
    data = yaml.safe_load(BASE)
    data.update(max_batch_size="64", kv_cache_config={"enable_block_reuse": "yes", "free_gpu_memory_fraction": 1})
    assert check_model_yaml(data) == []


# ---------------------------------------------------------------------------------------------
# render


@pytest.fixture(scope="module")
def gpu_render():
    loaded = load_spec(EXAMPLES / "gpu-deployment.yaml")
    return loaded, render_repository(loaded)


def test_render_writes_model_yaml_with_a_reason_for_each_value(gpu_render) -> None:
    _loaded, rendered = gpu_render
    text = rendered.files[f"{SPEC_MODEL}/1/model.yaml"]
    data = yaml.safe_load(text)
    assert check_model_yaml(data) == []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[a-z_]+: \S", line):  # a key with a value: the line above says why
            assert lines[i - 1].lstrip().startswith("# "), line
    entry = rendered.plan.entry(SPEC_MODEL)
    kv = entry.kv
    assert data["kv_cache_config"]["max_tokens"] == kv.pool_blocks * kv.block_tokens
    assert data["kv_cache_config"]["tokens_per_block"] == kv.block_tokens == default_of("kv_cache_config", "tokens_per_block")
    assert data["scheduler_config"]["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"
    assert data["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert data["max_seq_len"] == 16384 and data["max_num_tokens"] == 16384 + data["max_batch_size"]
    assert data["enable_chunked_prefill"] is True and data["cuda_graph_config"]["max_batch_size"] == 64
    # the fraction of what the engine finds free is the same KV budget: GPU 1 holds qwen2.5-7b and a reranker
    others = sum(p.quota_bytes for p in rendered.plan.placements
                 if p.model != SPEC_MODEL and set(p.gpus) & {1})
    free = rendered.plan.device_bytes[1] - kv.weights_bytes - kv.reserve_bytes - others
    assert abs(data["kv_cache_config"]["free_gpu_memory_fraction"] * free - kv.budget_bytes) < 0.0001 * free
    config = rendered.files[f"{SPEC_MODEL}/config.pbtxt"]
    assert 'backend: "python"' in config and "decoupled: true" in config and "max_batch_size: 0" in config


def test_render_is_deterministic_and_refuses_a_template_that_breaks_model_yaml(gpu_render, tmp_path: Path) -> None:
    loaded, rendered = gpu_render
    assert render_repository(loaded).files == rendered.files
    (tmp_path / "model.yaml.j2").write_text("model: x\nmax_batch_sise: 4\n")
    with pytest.raises(BadInput, match="does not say what the plan holds"):
        render_repository(loaded, tmp_path)


def test_render_then_check_is_clean(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert run_cli("render", str(EXAMPLES / "gpu-deployment.yaml"), "-o", str(repo)).returncode == 0
    # what a user adds: TensorRT-LLM's model code (render never writes model code) and the ONNX file
    (repo / SPEC_MODEL / "1" / "model.py").write_text(STAND_IN)
    (repo / "reranker" / "1").mkdir()
    (repo / "reranker" / "1" / "model.onnx").write_bytes(b"")
    result = run_cli("check", str(EXAMPLES / "gpu-deployment.yaml"), str(repo))
    assert result.returncode == 0, result.stdout
    assert "no findings" in result.stdout


def test_check_with_the_spec_catches_kv_over_the_gpu_and_drift(tmp_path: Path) -> None:
    loaded = load_spec(EXAMPLES / "gpu-deployment.yaml")
    repo = tmp_path / "repo"
    write_repository(render_repository(loaded), repo)
    path = repo / SPEC_MODEL / "1" / "model.yaml"
    (path.parent / "model.py").write_text(STAND_IN)
    data = yaml.safe_load(path.read_text())
    del data["kv_cache_config"]["max_tokens"], data["kv_cache_config"]["free_gpu_memory_fraction"]  # 0.9 of free
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_cli("check", "--json", str(EXAMPLES / "gpu-deployment.yaml"), str(repo))
    findings = {f["code"]: f for f in json.loads(result.stdout)["findings"] if f["model"] == SPEC_MODEL}
    assert result.returncode == 1
    kv = findings["TG410"]
    assert kv["field"] == "kv_cache_config.free_gpu_memory_fraction" and "0.9" in kv["message"]
    assert "max_tokens to at most" in kv["fix"]
    assert "kv_cache_config.free_gpu_memory_fraction" in findings["TG411"]["message"]


# ---------------------------------------------------------------------------------------------
# The spec


def _spec_with(tmp_path: Path, **changes: object) -> str:
    data = yaml.safe_load((EXAMPLES / "gpu-deployment.yaml").read_text())
    model = next(m for m in data["models"] if m["name"] == SPEC_MODEL)
    model.update(changes)
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("changes", "said"), [
    ({"llm_args": {"max_batch_size": 8}}, "derived by tritongen"),
    ({"llm_args": {"enable_chunked_prefil": True}}, "did you mean `enable_chunked_prefill`"),
    ({"llm_args": {"kv_cache_config": {"enable_block_reuse": "often"}}}, "kv_cache_config.enable_block_reuse"),
    ({"engine": {"kv_policy": "grow_kill"}}, "not a TensorRT-LLM capacity policy"),
    ({"kv_dtype": "int8"}, "kv_cache_config.dtype"),
    ({"hf_model": None}, "needs `hf_model`"),
])
def test_the_spec_refuses_what_would_not_render_with_the_fix(changes: dict, said: str, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=re.escape(said)):
        parse_spec_text(_spec_with(tmp_path, **changes))


# ---------------------------------------------------------------------------------------------
# The engine model reads model.yaml


def _limits(data: dict) -> object:
    return resolve_engine_limits(model="m", backend="python", parameters={}, llm_args=data)


def test_the_capacity_policy_is_the_engine_models_kv_policy() -> None:
    base = yaml.safe_load(BASE) | {"max_batch_size": 48, "max_seq_len": 4096,
                                    "kv_cache_config": {"max_tokens": 65536, "tokens_per_block": 64}}
    limits = _limits(base | {"scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}})
    assert (limits.kv_policy, limits.max_num_seqs, limits.pool_tokens, limits.kv_block_tokens) == ("grow_preempt", 48, 65536, 64)
    assert limits.max_context == 4096 and limits.prefix_caching is True
    reserve = _limits(base | {"kv_cache_config": {"max_tokens": 65536, "enable_block_reuse": False}})
    assert reserve.kv_policy == "reserve_wait" and "default" in reserve.sources["kv_policy"]
    assert reserve.prefix_caching is False and reserve.kv_block_tokens == 32
    assert reserve.max_batched_tokens == default_of("max_num_tokens")
    with pytest.raises(EngineSourceError, match="STATIC_BATCH.*not modelled"):
        _limits(base | {"scheduler_config": {"capacity_scheduler_policy": "STATIC_BATCH"}})


def test_a_fraction_alone_leaves_the_pool_to_the_plan_or_an_error() -> None:
    data = yaml.safe_load(BASE) | {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}}
    with pytest.raises(EngineSourceError, match="size of its KV pool is unknown"):
        _limits(data)
    planned = resolve_engine_limits(model="m", backend="python", parameters={}, llm_args=data, planned_pool_tokens=32000)
    assert planned.pool_tokens == 32000 and "KV plan" in planned.sources["kv_pool_blocks"]


def test_the_engine_files_read_model_yaml_from_a_model_folder(tmp_path: Path) -> None:
    folder = llmapi_folder(tmp_path, BASE)
    assert llmapi_args(folder, "python")["triton_config"] == {"max_batch_size": 0, "decoupled": False}
    shutil.rmtree(folder / "1")
    assert llmapi_args(folder, "python") is None
