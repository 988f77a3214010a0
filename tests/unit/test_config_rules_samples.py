"""Valid configs as real deployments write them (Triton's samples, the backends' own, an ensemble
with its members) give no finding, on a GPU host and on a CPU one; and tritongen.pbtxt locates
parse errors and round-trips these configs. Broken configs: test_config_rules.py.
"""

from __future__ import annotations

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from tritongen.core.config_rules import check_cross_model, check_model_config
from tritongen.core.findings import Finding
from tritongen.pbtxt import ConfigSyntaxError, config_to_json, config_to_text, field_line, field_lines, parse_model_config


def run_rules(text: str, *, model: str, gpu_available: bool | None = None, gpu_count: int | None = None) -> list[Finding]:
    return check_model_config(parse_model_config(text, f"{model}/config.pbtxt"), model=model, gpu_available=gpu_available,
                              gpu_count=gpu_count)


# ---------------------------------------------------------------- valid, real-world style configs

PYTHON_ADD_SUB = """
name: "add_sub"
backend: "python"

input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
input [
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]

instance_group [{ kind: KIND_CPU }]
"""

DENSENET_ONNX = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""

ONNX_DYNAMIC = """
name: "resnet50"
backend: "onnxruntime"
max_batch_size: 32
input [
  { name: "input" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] }
]
output [
  { name: "output" data_type: TYPE_FP32 dims: [ 1000 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16, 32 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 100000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy {
    key: 1
    value: { timeout_action: DELAY default_timeout_microseconds: 50000 max_queue_size: 16 }
  }
}
instance_group [
  { count: 2 kind: KIND_GPU gpus: [ 0 ] },
  { count: 1 kind: KIND_GPU gpus: [ 1 ] }
]
optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
model_warmup [
  {
    name: "warmup"
    batch_size: 8
    inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } }
  }
]
version_policy: { latest: { num_versions: 2 } }
"""

SEQUENCE = """
name: "accumulate"
backend: "onnxruntime"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 4, 8 ]
    max_queue_delay_microseconds: 100
  }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "initial state" }
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

VLLM = """
backend: "vllm"
max_batch_size: 0

# The usage of device is deferred to the vLLM engine
model_transaction_policy {
  decoupled: True
}
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [
  {
    count: 1
    kind: KIND_MODEL
  }
]
"""

TRTLLM = """
name: "tensorrt_llm"
backend: "tensorrtllm"
max_batch_size: 64

model_transaction_policy {
  decoupled: true
}

dynamic_batching {
    preferred_batch_size: [ 64 ]
    max_queue_delay_microseconds: 0
    default_queue_policy: { max_queue_size: 0 }
}

input [
  {
    name: "input_ids"
    data_type: TYPE_INT32
    dims: [ -1 ]
    allow_ragged_batch: true
  },
  {
    name: "input_lengths"
    data_type: TYPE_INT32
    dims: [ 1 ]
    reshape: { shape: [ ] }
  },
  {
    name: "request_output_len"
    data_type: TYPE_INT32
    dims: [ 1 ]
    reshape: { shape: [ ] }
  },
  {
    name: "end_id"
    data_type: TYPE_INT32
    dims: [ 1 ]
    reshape: { shape: [ ] }
    optional: true
  },
  {
    name: "streaming"
    data_type: TYPE_BOOL
    dims: [ 1 ]
    reshape: { shape: [ ] }
    optional: true
  },
  {
    name: "stop_words_list"
    data_type: TYPE_INT32
    dims: [ 2, -1 ]
    optional: true
    allow_ragged_batch: true
  }
]
output [
  {
    name: "output_ids"
    data_type: TYPE_INT32
    dims: [ -1, -1 ]
  },
  {
    name: "sequence_length"
    data_type: TYPE_INT32
    dims: [ -1 ]
  },
  {
    name: "cum_log_probs"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
instance_group [
  {
    count: 1
    kind : KIND_CPU
  }
]
parameters: {
  key: "max_beam_width"
  value: {
    string_value: "1"
  }
}
parameters: {
  key: "gpt_model_type"
  value: {
    string_value: "inflight_fused_batching"
  }
}
parameters: {
  key: "gpt_model_path"
  value: {
    string_value: "/tensorrtllm_backend/triton_model_repo/tensorrt_llm/1"
  }
}
parameters: {
  key: "batch_scheduler_policy"
  value: {
    string_value: "max_utilization"
  }
}
parameters: {
  key: "kv_cache_free_gpu_mem_fraction"
  value: {
    string_value: "0.9"
  }
}
"""

ENSEMBLE = """
name: "ensemble_model"
platform: "ensemble"
max_batch_size: 1
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "CLASSIFICATION" data_type: TYPE_FP32 dims: [ 1000 ] },
  { name: "SEGMENTATION" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "image_preprocess_model"
      model_version: -1
      input_map { key: "RAW_IMAGE" value: "IMAGE" }
      output_map { key: "PREPROCESSED_OUTPUT" value: "preprocessed_image" }
    },
    {
      model_name: "classification_model"
      model_version: -1
      input_map { key: "FORMATTED_IMAGE" value: "preprocessed_image" }
      output_map { key: "CLASSIFICATION_OUTPUT" value: "CLASSIFICATION" }
    },
    {
      model_name: "segmentation_model"
      model_version: -1
      input_map { key: "FORMATTED_IMAGE" value: "preprocessed_image" }
      output_map { key: "SEGMENTATION_OUTPUT" value: "SEGMENTATION" }
    }
  ]
}
"""

ENSEMBLE_MEMBERS = {
    "image_preprocess_model": """
name: "image_preprocess_model"
backend: "python"
max_batch_size: 256
input [ { name: "RAW_IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PREPROCESSED_OUTPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
""",
    "classification_model": """
name: "classification_model"
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "FORMATTED_IMAGE" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [ { name: "CLASSIFICATION_OUTPUT" data_type: TYPE_FP32 dims: [ 1000 ] } ]
instance_group [ { kind: KIND_GPU count: 1 profile: [ "0" ] } ]
""",
    "segmentation_model": """
name: "segmentation_model"
backend: "pytorch"
max_batch_size: 4
input [ { name: "FORMATTED_IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "SEGMENTATION_OUTPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
dynamic_batching { }
""",
}

DECOUPLED_PYTHON = """
name: "streamer"
backend: "python"
max_batch_size: 16
model_transaction_policy { decoupled: true }
dynamic_batching { max_queue_delay_microseconds: 2000 preserve_ordering: false }
input [ { name: "prompt" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "token" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R_CPU" count: 1 } ] priority: 1 } } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
"""

VALID = {
    "python_add_sub": ("add_sub", PYTHON_ADD_SUB),
    "densenet_onnx": ("densenet_onnx", DENSENET_ONNX),
    "onnx_dynamic_batching": ("resnet50", ONNX_DYNAMIC),
    "sequence_batching": ("accumulate", SEQUENCE),
    "vllm": ("vllm_model", VLLM),
    "tensorrt_llm": ("tensorrt_llm", TRTLLM),
    "ensemble": ("ensemble_model", ENSEMBLE),
    "decoupled_python": ("streamer", DECOUPLED_PYTHON),
    **{f"member_{name}": (name, text) for name, text in ENSEMBLE_MEMBERS.items()},
}


@pytest.mark.parametrize(("model", "text"), list(VALID.values()), ids=list(VALID))
def test_valid_real_world_config_gives_nothing(model: str, text: str) -> None:
    assert run_rules(text, model=model, gpu_available=True, gpu_count=8) == []


@pytest.mark.parametrize(("model", "text"), list(VALID.values()), ids=list(VALID))
def test_valid_config_on_cpu_host_gives_no_error(model: str, text: str) -> None:
    findings = run_rules(text, model=model, gpu_available=False)
    assert [f for f in findings if f.severity == "error"] == []
    assert {f.code for f in findings} <= {"TG121", "TG114"}


def _configs(**texts: str) -> dict[str, ModelConfig]:
    return {name: parse_model_config(text, f"{name}/config.pbtxt") for name, text in texts.items()}


def test_valid_ensemble_with_members_has_no_cross_model_finding() -> None:
    configs = _configs(ensemble_model=ENSEMBLE, **ENSEMBLE_MEMBERS)
    assert check_cross_model(configs) == []


# ---------------------------------------------------------------- pbtxt round trips and locations


def test_parse_error_is_located() -> None:
    text = 'name: "m"\nmax_batch_size: 8\ndynamic_batching { prefered_batch_size: 4 }\n'
    with pytest.raises(ConfigSyntaxError) as info:
        parse_model_config(text, "repo/m/config.pbtxt")
    err = info.value
    assert (err.path, err.line, err.column) == ("repo/m/config.pbtxt", 3, 20)
    assert "prefered_batch_size" in err.reason
    assert str(err).startswith("repo/m/config.pbtxt:3:20: ")
    assert err.exit_code == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('instance_group [ { kind: KIND_TPU } ]', "KIND_TPU"),
        ('dynamic_batching { }\nsequence_batching { }', "oneof"),
        ('name: "a"\nname: "b"', "multiple"),
        ('dynamic_batching {', "Expected"),
        ('max_batch_size: "eight"', "max_batch_size"),
    ],
)
def test_schema_violations_are_syntax_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigSyntaxError) as info:
        parse_model_config(text, "c.pbtxt")
    assert needle in str(info.value)
    assert info.value.line is not None


def test_text_and_json_round_trip() -> None:
    config = parse_model_config(ONNX_DYNAMIC, "c.pbtxt")
    assert parse_model_config(config_to_text(config), "c2.pbtxt") == config
    from google.protobuf import json_format

    again = json_format.Parse(config_to_json(config), ModelConfig())
    assert again == config
    assert '"max_batch_size": 32' in config_to_json(config)


def test_field_lines_index_repeated_messages() -> None:
    lines = field_lines(TRTLLM)
    text_lines = TRTLLM.splitlines()
    assert "max_batch_size" in text_lines[lines["max_batch_size"] - 1]
    assert text_lines[lines["input"] - 1].startswith("input [")
    assert 'name: "input_lengths"' in text_lines[lines["input[1].name"] - 1]
    assert "dims: [ 2, -1 ]" in text_lines[lines["input[5].dims"] - 1]
    assert "preferred_batch_size" in text_lines[lines["dynamic_batching.preferred_batch_size"] - 1]
    assert field_line(TRTLLM, "instance_group[0].kind") == lines["instance_group[0].kind"]
    # unknown leaf: falls back to the closest written parent
    assert field_line(TRTLLM, "input[1].reshape.shape.x") == lines["input[1].reshape"]
    assert field_line(TRTLLM, "sequence_batching") is None
