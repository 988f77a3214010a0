"""Config synthesis: every number the renderer writes, derived by hand here."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import EXAMPLES
from tritongen.core.plan import plan_deployment, preferred_batch_sizes
from tritongen.core.spec import MIB, DeploymentSpec
from tritongen.errors import Infeasible
from tritongen.specio import load_spec


def cpu_plan():
    loaded = load_spec(EXAMPLES / "deployment.yaml")
    return plan_deployment(loaded.spec, loaded.architectures)


def test_tinyllm_kv_budget_by_hand() -> None:
    kv = cpu_plan().entry("tinyllm").kv
    assert kv is not None
    # 2 (K and V) x 2 layers x 2 kv heads x 16 head_dim x 4 bytes (fp32)
    assert kv.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512
    # quota 8 MiB - weights 155968 x 4 B - reserve 0.5 MiB - pad 4 MiB (the spec's guess)
    budget = 8 * MIB - 155968 * 4 - MIB // 2 - 4 * MIB
    assert kv.budget_bytes == budget == 3046144
    assert kv.bytes_per_sequence == 256 * 512
    assert kv.max_sequences == budget // (256 * 512) == 23
    assert kv.pool_blocks == budget // (16 * 512) == 371


def test_tinyllm_entry() -> None:
    entry = cpu_plan().entry("tinyllm")
    assert entry.max_batch_size == 23
    assert entry.decoupled
    assert entry.parameters["kv_pool_blocks"] == "371" and entry.parameters["max_num_seqs"] == "23"
    assert entry.parameters["num_kv_heads"] == "2" and entry.parameters["seed"] == "11"
    assert [g.kind for g in entry.instance_groups] == ["KIND_CPU"]
    batching = entry.dynamic_batching
    assert batching is not None
    assert batching.max_queue_delay_us == 0  # the engine batches; a Triton window would only add TTFT
    assert batching.priority_levels == 3 and batching.default_priority_level == 2  # "normal"
    policies = {p.level: p for p in batching.priority_queue_policies}
    assert policies[1].timeout_us == 125_000 and policies[1].action == "REJECT"  # half of 250 ms
    assert policies[3].timeout_us == 2_500_000 and policies[3].action == "DELAY"  # batch waits
    assert policies[1].max_queue_size == 4 * 23 * 1


def test_ranker_entry() -> None:
    entry = cpu_plan().entry("ranker")
    assert entry.max_batch_size == 32
    assert entry.dynamic_batching is not None
    assert entry.dynamic_batching.preferred_batch_sizes == [8, 16, 32]
    assert entry.instance_groups[0].compute_units == 1
    assert entry.kv is None and not entry.decoupled


def test_server_flags_declare_rate_limit_resources() -> None:
    assert cpu_plan().server_flags == ["--rate-limit=execution_count", "--rate-limit-resource=compute:2"]


def test_preferred_sizes() -> None:
    assert preferred_batch_sizes(64, 1) == [16, 32, 64]
    assert preferred_batch_sizes(6, 1) == [3, 6]
    assert preferred_batch_sizes(1, 1) == []
    assert preferred_batch_sizes(32, 16) == [16, 32]


def gpu_spec(edit=None) -> tuple[DeploymentSpec, dict]:
    loaded = load_spec(EXAMPLES / "gpu-deployment.yaml")
    data = yaml.safe_load((EXAMPLES / "gpu-deployment.yaml").read_text())
    if edit:
        edit(data)
    return DeploymentSpec.model_validate(data), loaded.architectures


def test_gpu_lanes_and_vllm_engine_args() -> None:
    spec, archs = gpu_spec()
    plan = plan_deployment(spec, archs)
    short, long = plan.entry("llama3-8b_short"), plan.entry("llama3-8b_long")
    assert short.max_batch_size == 0 and short.decoupled  # vLLM batches inside its engine
    assert short.dynamic_batching is None
    # Llama-3-8B bf16: 2 x 32 layers x 8 kv heads x 128 x 2 bytes = 131072 B/token
    assert short.kv is not None and short.kv.kv_bytes_per_token == 131072
    lane_quota = 60000 * MIB // 2
    budget = lane_quota - 8030261248 * 2 - 1024 * MIB - 2048 * MIB
    assert short.kv.budget_bytes == budget
    # the short lane holds prompts up to 1024 plus a typical 300-token answer
    assert short.kv.context_tokens == 1324 and long.kv is not None and long.kv.context_tokens == 8192
    assert short.kv.max_sequences == min(64, budget // (1324 * 131072))
    assert long.kv.max_sequences == budget // (8192 * 131072)
    assert short.engine_args is not None
    assert short.engine_args["max_num_seqs"] == short.kv.max_sequences
    assert short.engine_args["gpu_memory_utilization"] == round(lane_quota / (81559 * MIB), 4)
    assert short.source_model == "llama3-8b_short" and long.source_model == "llama3-8b_short"
    assert [g.kind for g in short.instance_groups] == ["KIND_MODEL"]


def test_gpu_placement_and_replicas() -> None:
    spec, archs = gpu_spec()
    plan = plan_deployment(spec, archs)
    by_model = {p.model: p for p in plan.placements}
    assert by_model["llama3-8b"].gpus != by_model["qwen2.5-7b"].gpus  # 40 GiB each: one per GPU
    assert by_model["reranker"].gpus == [0, 1]
    reranker = plan.entry("reranker")
    assert reranker.instance_groups[0].kind == "KIND_GPU" and reranker.instance_groups[0].gpus == [0, 1]
    assert plan.server_flags == [
        "--rate-limit=execution_count",
        "--rate-limit-resource=compute:4:0",
        "--rate-limit-resource=compute:4:1",
    ]
    qwen = plan.entry("qwen2.5-7b")
    assert qwen.dynamic_batching is None and qwen.engine_args is not None
    assert qwen.engine_args["kv_cache_dtype"] == "fp8"


def test_placement_that_cannot_fit_says_where_memory_is() -> None:
    spec, archs = gpu_spec(lambda d: d["models"][1].update(memory_quota_mb=70000))
    with pytest.raises(Infeasible) as info:
        plan_deployment(spec, archs)
    message = str(info.value)
    assert "'qwen2.5-7b' needs 70000 MiB" in message
    assert "gpu0:" in message and "lower memory_quota_mb" in message


def test_budget_that_holds_no_sequence_says_by_how_much() -> None:
    spec, archs = gpu_spec(lambda d: d["models"][1].update(memory_quota_mb=16000))
    with pytest.raises(Infeasible) as info:
        plan_deployment(spec, archs)
    assert "qwen2.5-7b" in str(info.value)
    assert "MiB" in str(info.value)


def test_the_specs_prefix_caching_reaches_both_engines_files() -> None:
    """engine.prefix_caching is written where each engine reads it (vLLM enable_prefix_caching,
    TensorRT-LLM's LLM-API kv_cache_config.enable_block_reuse); unstated, vLLM's model.json leaves
    it to the engine's default."""
    spec, archs = gpu_spec()
    assert "enable_prefix_caching" not in plan_deployment(spec, archs).entry("qwen2.5-7b").engine_args

    def off(data: dict) -> None:
        for model in data["models"]:
            if model["name"] in ("qwen2.5-7b", "qwen3-8b-trtllm"):
                model["engine"] = {**(model.get("engine") or {}), "prefix_caching": False}

    spec, archs = gpu_spec(off)
    plan = plan_deployment(spec, archs)
    assert plan.entry("qwen2.5-7b").engine_args["enable_prefix_caching"] is False
    assert plan.entry("qwen3-8b-trtllm").llm_args["kv_cache_config"]["enable_block_reuse"] is False
