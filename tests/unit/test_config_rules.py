"""Semantic rules over Triton's ModelConfig: broken configs give the right finding, each alone.

Each broken case names the field and the values the message must quote. The error rules are
re-proved against the real server in tests/integration/test_check_vs_server.py. Valid real-world
configs (which give no finding) and pbtxt parsing are in test_config_rules_samples.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from tritongen.core.config_rules import RULES, Rule, check_cross_model, check_model_config, rule_table
from tritongen.core.findings import Finding
from tritongen.pbtxt import field_line, parse_model_config

IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
BASE = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\n' + IO
BASE0 = 'name: "m"\nbackend: "python"\nmax_batch_size: 0\n' + IO
ENS_IO = 'name: "m"\nplatform: "ensemble"\nmax_batch_size: 8\n' + IO
STEP = (
    '{ model_name: "echo" model_version: -1 input_map { key: "INPUT0" value: "%s" } '
    'output_map { key: "OUTPUT0" value: "%s" } }'
)


def ens(*steps: tuple[str, str], extra: str = "") -> str:
    return ENS_IO + extra + "\nensemble_scheduling { step [ " + ", ".join(STEP % s for s in steps) + " ] }"


def run_rules(text: str, *, model: str = "m", gpu_available: bool | None = None,
              gpu_count: int | None = None) -> list[Finding]:
    return check_model_config(parse_model_config(text, f"{model}/config.pbtxt"), model=model, gpu_available=gpu_available,
                              gpu_count=gpu_count)


# (id, config text, code, field, values the message must quote)
BROKEN = [
    ("pbs_above_mbs", BASE + "dynamic_batching { preferred_batch_size: [ 4, 16 ] }",
     "TG101", "dynamic_batching.preferred_batch_size", ["16", "8"]),
    ("pbs_with_mbs0", BASE0 + "dynamic_batching { preferred_batch_size: [ 2 ] }",
     "TG101", "dynamic_batching.preferred_batch_size", ["2", "0"]),
    ("pbs_zero", BASE + "dynamic_batching { preferred_batch_size: [ 0 ] }",
     "TG102", "dynamic_batching.preferred_batch_size", ["0", "8"]),
    ("pbs_negative", BASE + "dynamic_batching { preferred_batch_size: [ -3 ] }",
     "TG102", "dynamic_batching.preferred_batch_size", ["-3"]),
    ("dynamic_batching_mbs0", BASE0 + "dynamic_batching { }", "TG103", "dynamic_batching", ["max_batch_size is 0"]),
    ("mbs_negative", BASE.replace("max_batch_size: 8", "max_batch_size: -1"), "TG104", "max_batch_size", ["-1"]),
    ("priority_default_missing", BASE + "dynamic_batching { priority_levels: 2 }",
     "TG105", "dynamic_batching.default_priority_level", ["0", "2", "[1, 2]"]),
    ("priority_default_too_high", BASE + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "TG105", "dynamic_batching.default_priority_level", ["3", "2"]),
    ("priority_default_without_levels", BASE + "dynamic_batching { default_priority_level: 3 }",
     "TG106", "dynamic_batching.default_priority_level", ["3", "priority_levels is 0"]),
    ("priority_policy_key_high",
     BASE + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value { max_queue_size: 4 } } }",
     "TG107", "dynamic_batching.priority_queue_policy", ["key 3", "2"]),
    ("priority_policy_key_zero",
     BASE + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 0 value { max_queue_size: 4 } } }",
     "TG107", "dynamic_batching.priority_queue_policy", ["key 0", "2"]),
    ("priority_policy_without_levels",
     BASE + "dynamic_batching { priority_queue_policy { key: 1 value { max_queue_size: 4 } } }",
     "TG108", "dynamic_batching.priority_queue_policy", ["[1]", "priority_levels is 0"]),
    ("preserve_ordering_with_priorities",
     BASE + "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
     "TG109", "dynamic_batching.preserve_ordering", ["true", "2"]),
    ("preserve_ordering_delay",
     BASE + "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
     "default_timeout_microseconds: 1000 } }",
     "TG110", "dynamic_batching.default_queue_policy.timeout_action", ["DELAY", "1000", "preserve_ordering"]),
    ("preserve_ordering_delay_priority_policy",
     BASE + "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
     "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 500 } } }",
     "TG110", "dynamic_batching.priority_queue_policy[1].timeout_action", ["DELAY", "500"]),
    ("delay_that_never_fires",
     BASE + "dynamic_batching { default_queue_policy { timeout_action: DELAY } }",
     "TG111", "dynamic_batching.default_queue_policy.timeout_action", ["DELAY", "0"]),
    ("oldest_pbs_above_mbs",
     BASE + "sequence_batching { oldest { max_candidate_sequences: 4 preferred_batch_size: [ 16 ] } }",
     "TG101", "sequence_batching.oldest.preferred_batch_size", ["16", "8"]),
    ("oldest_pbs_zero",
     BASE + "sequence_batching { oldest { max_candidate_sequences: 4 preferred_batch_size: [ 0 ] } }",
     "TG102", "sequence_batching.oldest.preferred_batch_size", ["0"]),
    ("control_without_name",
     BASE + "sequence_batching { control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
     "int32_false_true: [ 0, 1 ] } ] } ] }",
     "TG115", "sequence_batching.control_input[0].name", ["control_input[0]"]),
    ("control_kind_twice",
     BASE + "sequence_batching { control_input [ "
     "{ name: \"S1\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: \"S2\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
     "TG116", "sequence_batching.control_input", ["CONTROL_SEQUENCE_START", "2 times"]),
    ("control_tensor_in_two_entries",
     BASE + "sequence_batching { control_input [ "
     "{ name: \"START\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: \"START\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] }",
     "TG112", "sequence_batching.control_input", ["'START'", "CONTROL_SEQUENCE_READY", "[0], [1]"]),
    ("control_no_values",
     BASE + "sequence_batching { control_input [ { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }",
     "TG117", "sequence_batching.control_input[0].control[0]", ["CONTROL_SEQUENCE_START", "START"]),
    ("control_one_value",
     BASE + "sequence_batching { control_input [ { name: \"READY\" control [ { kind: CONTROL_SEQUENCE_READY "
     "int32_false_true: [ 0 ] } ] } ] }",
     "TG117", "sequence_batching.control_input[0].control[0].int32_false_true", ["1 entries", "exactly 2"]),
    ("control_two_lists",
     BASE + "sequence_batching { control_input [ { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START "
     "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }",
     "TG117", "sequence_batching.control_input[0].control[0]", ["int32_false_true", "fp32_false_true"]),
    ("corrid_fp32",
     BASE + "sequence_batching { control_input [ { name: \"CORRID\" control [ { kind: CONTROL_SEQUENCE_CORRID "
     "data_type: TYPE_FP32 } ] } ] }",
     "TG118", "sequence_batching.control_input[0].control[0].data_type", ["TYPE_FP32", "TYPE_UINT64"]),
    ("corrid_no_type",
     BASE + "sequence_batching { control_input [ { name: \"CORRID\" control [ { kind: CONTROL_SEQUENCE_CORRID } ] } ] }",
     "TG118", "sequence_batching.control_input[0].control[0].data_type", ["TYPE_INVALID"]),
    ("instance_count_negative", BASE + "instance_group [ { count: -2 kind: KIND_CPU } ]",
     "TG120", "instance_group[0].count", ["-2", "1"]),
    ("cpu_group_with_gpus", BASE + "instance_group [ { count: 1 kind: KIND_CPU gpus: [ 0, 1 ] } ]",
     "TG122", "instance_group[0].gpus", ["KIND_CPU", "[0, 1]"]),
    ("model_group_with_gpus", BASE + "instance_group [ { count: 1 kind: KIND_MODEL gpus: [ 2 ] } ]",
     "TG123", "instance_group[0].gpus", ["KIND_MODEL", "[2]"]),
    ("profile_not_tensorrt", BASE + "instance_group [ { count: 1 kind: KIND_CPU profile: [ \"0\" ] } ]",
     "TG124", "instance_group[0].profile", ["['0']", "python"]),
    ("rate_limiter_unnamed",
     BASE + "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { count: 2 } ] } } ]",
     "TG125", "instance_group[0].rate_limiter.resources[0].name", ["count 2", "--rate-limit=execution_count"]),
    ("rate_limiter_count_zero",
     BASE + "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: \"R\" count: 0 } ] } } ]",
     "TG126", "instance_group[0].rate_limiter.resources[0].count", ["'R'", "count 0"]),
    ("rate_limiter_named_twice",
     BASE + "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: \"R\" count: 1 }, "
     "{ name: \"R\" count: 2 } ] } } ]",
     "TG127", "instance_group[0].rate_limiter.resources", ["'R'", "2 times"]),
    ("input_without_name",
     BASE + 'input [ { data_type: TYPE_FP32 dims: [ 4 ] } ]', "TG130", "input[1].name", ["input[1]"]),
    ("input_without_type",
     'name: "m"\nbackend: "python"\nmax_batch_size: 8\ninput [ { name: "X" dims: [ 4 ] } ]',
     "TG131", "input[0].data_type", ["'X'", "TYPE_INVALID"]),
    ("output_without_type",
     'name: "m"\nbackend: "python"\nmax_batch_size: 8\noutput [ { name: "Y" dims: [ 4 ] } ]',
     "TG131", "output[0].data_type", ["'Y'", "TYPE_INVALID"]),
    ("input_without_dims", BASE + 'input [ { name: "X" data_type: TYPE_FP32 } ]',
     "TG132", "input[1].dims", ["'X'", "max_batch_size 8"]),
    ("output_without_dims_mbs0", BASE0 + 'output [ { name: "Y" data_type: TYPE_FP32 } ]',
     "TG132", "output[1].dims", ["'Y'", "max_batch_size 0"]),
    ("dim_zero", BASE + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4, 0 ] } ]',
     "TG133", "input[1].dims", ["[4, 0]", "0"]),
    ("dim_below_minus_one", BASE + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -2 ] } ]',
     "TG133", "output[1].dims", ["[-2]", "-2"]),
    ("reshape_count", BASE + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 3 ] } } ]',
     "TG134", "input[1].reshape", ["[4]", "[2, 3]"]),
    ("reshape_variable_groups",
     BASE + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, -1 ] } } ]',
     "TG134", "input[1].reshape", ["[-1, 4]", "[2, -1]"]),
    ("reshape_empty_mbs0", BASE0 + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
     "TG135", "input[1].reshape", ["'X'", "max_batch_size 0"]),
    ("nhwc_two_dims", BASE + 'input [ { name: "X" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 4, 4 ] } ]',
     "TG136", "input[1].format", ["FORMAT_NHWC", "[4, 4]"]),
    ("shape_tensor_python", BASE + 'input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]',
     "TG137", "input[1].is_shape_tensor", ["'X'", "python"]),
    ("input_twice", BASE + 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "TG138", "input", ["'INPUT0'", "2 times"]),
    ("input_is_output", BASE + 'output [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "TG139", "output", ["'INPUT0'"]),
    ("batch_input_unknown_source",
     BASE + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 source_input: "NOPE" } ]',
     "TG140", "batch_input[0].source_input", ["'NOPE'", "INPUT0"]),
    ("batch_input_fp16",
     BASE + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP16 source_input: "INPUT0" } ]',
     "TG141", "batch_input[0].data_type", ["TYPE_FP16", "TYPE_INT32"]),
    ("batch_input_no_source",
     BASE + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 } ]',
     "TG143", "batch_input[0].source_input", ["BATCH_ELEMENT_COUNT", "0 source inputs", "INPUT0"]),
    ("batch_input_two_sources",
     BASE + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 '
     'source_input: [ "INPUT0", "INPUT0" ] } ]',
     "TG143", "batch_input[0].source_input", ["BATCH_ITEM_SHAPE", "2 source inputs"]),
    ("batch_output_no_source",
     BASE + 'batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE } ]',
     "TG144", "batch_output[0].source_input", ["BATCH_SCATTER_WITH_INPUT_SHAPE", "0 source inputs"]),
    ("batch_output_target_twice",
     BASE + 'batch_output [ { target_name: [ "OUTPUT0", "OUTPUT0" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
     'source_input: "INPUT0" } ]',
     "TG145", "batch_output[0].target_name", ["'OUTPUT0'", "2 times"]),
    ("batch_output_unknown_target",
     BASE + 'batch_output [ { target_name: "NOPE" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]',
     "TG142", "batch_output[0].target_name", ["'NOPE'", "OUTPUT0"]),
    ("name_differs_from_directory", BASE.replace('name: "m"', 'name: "other"'), "TG150", "name", ["'other'", "'m'"]),
    ("unknown_platform", 'name: "m"\nplatform: "bogus_platform"\nmax_batch_size: 8\n' + IO,
     "TG151", "platform", ["bogus_platform"]),
    ("ensemble_with_backend", ens(("INPUT0", "OUTPUT0")).replace('platform: "ensemble"', 'platform: "ensemble"\nbackend: "python"'),
     "TG152", "backend", ["python"]),
    ("ensemble_without_scheduling", ENS_IO, "TG153", "platform", ["ensemble"]),
    ("scheduling_on_python", BASE + "ensemble_scheduling { step [ " + STEP % ("INPUT0", "OUTPUT0") + " ] }",
     "TG154", "ensemble_scheduling", ["python"]),
    ("ensemble_instance_group", ens(("INPUT0", "OUTPUT0"), extra="instance_group [ { count: 1 kind: KIND_CPU } ]"),
     "TG155", "instance_group", ["instance_group"]),
    ("ensemble_optimization", ens(("INPUT0", "OUTPUT0"), extra="optimization { priority: PRIORITY_MAX }"),
     "TG155", "optimization", ["optimization"]),
    ("cache_and_decoupled", BASE + "response_cache { enable: true }\nmodel_transaction_policy { decoupled: true }",
     "TG156", "response_cache.enable", ["response_cache.enable is true", "decoupled is true"]),
    ("warmup_batch_above_mbs",
     BASE + 'model_warmup [ { name: "w" batch_size: 16 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
     "TG157", "model_warmup[0].batch_size", ["16", "8"]),
    ("warmup_batch_on_mbs0",
     BASE0 + 'model_warmup [ { name: "w" batch_size: 2 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
     "TG157", "model_warmup[0].batch_size", ["2", "max_batch_size is 0", "crashes"]),
    ("warmup_missing_input",
     BASE + 'model_warmup [ { name: "w" batch_size: 1 } ]', "TG158", "model_warmup[0].inputs", ["INPUT0"]),
    ("warmup_no_data",
     BASE + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] } } } ]',
     "TG159", "model_warmup[0].inputs", ["'INPUT0'", "no data source"]),
    ("warmup_wrong_type",
     BASE + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } } ]',
     "TG159", "model_warmup[0].inputs", ["TYPE_INT32", "TYPE_FP32"]),
    ("warmup_wrong_dims",
     BASE + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } } ]',
     "TG159", "model_warmup[0].inputs", ["[5]", "[4]"]),
    ("warmup_unknown_input",
     BASE + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } '
     'inputs { key: "NOPE" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
     "TG160", "model_warmup[0].inputs", ["'NOPE'", "INPUT0"]),
    ("latest_zero_versions", BASE + "version_policy { latest { num_versions: 0 } }",
     "TG162", "version_policy.latest.num_versions", ["0"]),
    ("specific_empty", BASE + "version_policy { specific { } }", "TG162", "version_policy.specific.versions", ["empty"]),
    ("ensemble_no_steps", ENS_IO + "ensemble_scheduling { }", "TG180", "ensemble_scheduling.step", ["no step"]),
    ("ensemble_step_without_model", ens(("INPUT0", "OUTPUT0")).replace('model_name: "echo" ', ""),
     "TG181", "ensemble_scheduling.step[0].model_name", ["step[0]"]),
    ("ensemble_step_without_input_map",
     ENS_IO + 'ensemble_scheduling { step [ { model_name: "echo" output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }',
     "TG182", "ensemble_scheduling.step[0].input_map", ["'echo'", "input_map"]),
    ("ensemble_tensor_written_twice", ens(("INPUT0", "OUTPUT0"), ("INPUT0", "OUTPUT0")),
     "TG183", "ensemble_scheduling.step[1].output_map", ["'OUTPUT0'", "step 0", "step 1"]),
    ("ensemble_input_unused", ens(("INPUT0", "OUTPUT0"), extra='input [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] } ]'),
     "TG184", "input", ["'EXTRA'", "INPUT0"]),
    ("ensemble_output_unwritten", ens(("INPUT0", "mid"), ("mid", "OTHER")),
     "TG185", "output", ["'OUTPUT0'", "OTHER"]),
    ("ensemble_reads_ghost", ens(("INPUT0", "OUTPUT0"), ("ghost", "x"), ("x", "y")).replace(
        'output [ { name: "OUTPUT0"', 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT0"'),
     "TG186", "ensemble_scheduling.step[1].input_map", ["'ghost'"]),
    ("ensemble_cycle", ens(("INPUT0", "OUTPUT0"), ("a", "b"), ("b", "a")),
     "TG186", "ensemble_scheduling.step[1].input_map", ["'a'", "cycle"]),
    ("ensemble_dead_end", ens(("INPUT0", "OUTPUT0"), ("INPUT0", "unused_tensor")),
     "TG187", "ensemble_scheduling.step[1].output_map", ["'unused_tensor'", "'echo'"]),
]


@pytest.mark.parametrize(("text", "code", "field", "values"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_broken_config_gives_the_finding(text: str, code: str, field: str, values: list[str]) -> None:
    findings = run_rules(text)
    matching = [f for f in findings if f.code == code]
    assert matching, f"expected {code}, got {[(f.code, f.message) for f in findings]}"
    finding = next((f for f in matching if f.field == field), None)
    assert finding is not None, f"{code} on {field}? got fields {[f.field for f in matching]}"
    assert finding.severity == RULES[code].severity
    assert finding.model == "m"
    assert "model 'm'" in finding.message
    for value in values:
        assert value in finding.message, f"{value!r} missing from: {finding.message}"
    assert finding.fix.strip()
    # the field path points at a line of the file it came from
    assert field_line(text, finding.field) is not None


def test_each_error_case_has_no_unrelated_errors() -> None:
    """A broken config reports its own problem, not a cascade of others."""
    allowed = {"ensemble_output_unwritten": {"TG187"}}  # 'OTHER' is written but unread: also true
    for case_id, text, code, _field, _values in BROKEN:
        others = {f.code for f in run_rules(text) if f.severity == "error" and f.code != code}
        others -= allowed.get(case_id, set())
        assert not others, f"{case_id}: unexpected extra errors {others}"


def test_kind_gpu_warns_only_without_gpu() -> None:
    text = BASE + "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]"
    without = run_rules(text, gpu_available=False)
    # TG114: how many GPUs the serving host has is not known either, so the id 0 went unchecked
    assert [(f.code, f.severity) for f in without] == [("TG121", "warning"), ("TG114", "warning")]
    assert "KIND_GPU" in without[0].message and "[0]" in without[0].message
    assert run_rules(text, gpu_available=True, gpu_count=1) == []
    assert [f.code for f in run_rules(text, gpu_available=None)] == ["TG114"]
    auto_with_gpus = BASE + "instance_group [ { count: 1 gpus: [ 1 ] } ]"
    assert [f.code for f in run_rules(auto_with_gpus, gpu_available=False)] == ["TG121", "TG114"]
    assert run_rules(BASE + "instance_group [ { count: 1 kind: KIND_CPU } ]", gpu_available=False) == []


def test_dynamic_batching_without_batching_is_fine_for_queue_policies() -> None:
    """max_batch_size 0 with priorities or a queue policy: the batcher still queues by them."""
    assert run_rules(BASE0 + "dynamic_batching { priority_levels: 2 default_priority_level: 1 }") == []
    assert run_rules(BASE0 + "dynamic_batching { default_queue_policy { max_queue_size: 4 } }") == []
    assert [f.code for f in run_rules(BASE0 + "dynamic_batching { max_queue_delay_microseconds: 100 }")] == ["TG103"]


def test_every_rule_code_is_documented_and_unique() -> None:
    codes = [c[2] for c in BROKEN]
    assert set(codes) <= set(RULES)
    for code, rule in RULES.items():
        assert rule.code == code and rule.severity in ("error", "warning", "note") and rule.title and rule.server


def test_the_rule_table_refuses_a_code_listed_twice() -> None:
    """A duplicated code must fail at import, not silently replace the first rule."""
    first, second = Rule("TG999", "error", "first", "refused"), Rule("TG999", "warning", "second", "loaded")
    with pytest.raises(ValueError, match="TG999 is listed twice"):
        rule_table([first, second])
    assert rule_table([first]) == {"TG999": first}


def test_every_code_in_the_rules_source_is_in_the_table() -> None:
    """The table holds as many rules as the source lists: none was dropped on the way."""
    import re

    import tritongen.core.config_rules.catalogue as module

    listed = re.findall(r'_(?:r|read)\("(TG\d+)"', Path(module.__file__).read_text())
    assert len(listed) == len(RULES) and set(listed) == set(RULES)


# ---------------------------------------------------------------- the runtime path and the model file


def test_a_runtime_path_may_not_leave_the_backend_directory() -> None:
    for runtime in ("../dummy_runtime/libtriton_identity.so", "/opt/libtriton_x.so", "a/../../b.so"):
        assert [f.code for f in run_rules(BASE + f'runtime: "{runtime}"')] == ["TG147"], runtime
    for runtime in ("libtriton_identity.so", "model.py", "sub/../libtriton_x.so"):
        assert run_rules(BASE + f'runtime: "{runtime}"') == [], runtime


def test_fields_auto_complete_fills_are_a_warning_that_says_so() -> None:
    """With auto-complete on and a model file it reads, missing data_type and dims are filled at
    load: check says it could not check them instead of refusing (or passing) them."""
    text = 'name: "m"\nmax_batch_size: 8\ninput [ { name: "X" } ]\noutput [ { name: "Y" data_type: TYPE_FP32 } ]'
    config = parse_model_config(text, "m/config.pbtxt")
    strict = check_model_config(config, model="m")
    assert {f.code for f in strict} == {"TG131", "TG132"} and all(f.severity == "error" for f in strict)
    filled = check_model_config(config, model="m", model_file="1/model.onnx", autofill_source="1/model.onnx (ONNX Runtime)")
    assert {(f.code, f.severity) for f in filled} == {("TG146", "warning")} and len(filled) == 3
    assert all("1/model.onnx (ONNX Runtime)" in f.message and "not checked" in f.message for f in filled)


def test_a_profile_is_fine_on_a_model_whose_plan_file_makes_it_tensorrt() -> None:
    text = 'name: "m"\nmax_batch_size: 8\n' + IO + "instance_group [ { count: 1 kind: KIND_GPU profile: [ \"0\" ] } ]"
    config = parse_model_config(text, "m/config.pbtxt")
    assert "TG124" in {f.code for f in check_model_config(config, model="m", model_file="1/model.onnx")}
    assert "TG124" not in {f.code for f in check_model_config(config, model="m", model_file="1/model.plan")}


# ---------------------------------------------------------------- rules across models


def _configs(**texts: str) -> dict[str, ModelConfig]:
    return {name: parse_model_config(text, f"{name}/config.pbtxt") for name, text in texts.items()}


ECHO = 'name: "echo"\nbackend: "python"\nmax_batch_size: 8\n' + IO
ECHO4 = ECHO.replace("max_batch_size: 8", "max_batch_size: 4")
ECHO0 = ECHO.replace("max_batch_size: 8", "max_batch_size: 0")


@pytest.mark.parametrize(
    ("ensemble", "echo", "code", "values"),
    [
        (ens(("INPUT0", "OUTPUT0")).replace('"echo"', '"missing_model"'), ECHO, "TG190", ["'missing_model'"]),
        (ens(("INPUT0", "OUTPUT0")).replace('key: "INPUT0"', 'key: "WRONG"'), ECHO, "TG191", ["'WRONG'", "'echo'", "INPUT0"]),
        (ens(("INPUT0", "OUTPUT0")).replace('key: "OUTPUT0"', 'key: "WRONG"'), ECHO, "TG192", ["'WRONG'", "OUTPUT0"]),
        (ens(("INPUT0", "OUTPUT0")), ECHO4, "TG193", ["8", "4", "'echo'"]),
        (ens(("INPUT0", "OUTPUT0")).replace("dims: [ 4 ] } ]\noutput", "dims: [ 5 ] } ]\noutput", 1), ECHO, "TG194",
         ["'INPUT0'", "[-1, 5]", "[-1, 4]"]),
        (ens(("INPUT0", "OUTPUT0")).replace("TYPE_FP32", "TYPE_INT32", 1), ECHO, "TG194", ["TYPE_INT32", "TYPE_FP32"]),
    ],
    ids=["unknown_model", "bad_input_key", "bad_output_key", "mbs_above_step", "shape", "dtype"],
)
def test_ensemble_cross_model_rules(ensemble: str, echo: str, code: str, values: list[str]) -> None:
    findings = check_cross_model(_configs(m=ensemble, echo=echo))
    assert [f.code for f in findings] == [code], [f.message for f in findings]
    finding = findings[0]
    assert finding.severity == "error" and finding.model == "m"
    for value in values:
        assert value in finding.message, f"{value!r} missing from: {finding.message}"


def test_ensemble_may_batch_over_a_non_batching_step() -> None:
    """The server loads an ensemble with max_batch_size 8 over a step with max_batch_size 0."""
    assert check_cross_model(_configs(m=ens(("INPUT0", "OUTPUT0")), echo=ECHO0)) == []


def test_rate_limiter_resource_global_and_per_device() -> None:
    group = 'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" %s count: 1 } ] } } ]'
    configs = _configs(a=BASE.replace('"m"', '"a"') + group % "global: true", b=BASE.replace('"m"', '"b"') + group % "")
    findings = check_cross_model(configs)
    assert [(f.code, f.model, f.severity) for f in findings] == [("TG128", "a", "warning")]
    assert "'R'" in findings[0].message and "['b']" in findings[0].message
    both_global = _configs(a=BASE.replace('"m"', '"a"') + group % "global: true", b=BASE.replace('"m"', '"b"') + group % "global: true")
    assert check_cross_model(both_global) == []


# ---------------------------------------------------------------- ensemble data flow and cycles

ECHO2 = ECHO.replace('name: "echo"', 'name: "echo2"') + 'input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]'
DEC = ECHO.replace('name: "echo"', 'name: "dec"') + "model_transaction_policy { decoupled: true }"


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps} }}'


def _ensemble(*steps: str, name: str = "m", io: str = IO) -> str:
    return f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n{io}\nensemble_scheduling {{ step [ {", ".join(steps)} ] }}'


def test_a_required_input_of_a_step_model_must_be_mapped() -> None:
    configs = _configs(m=ens(("INPUT0", "OUTPUT0")).replace('"echo"', '"echo2"'), echo2=ECHO2)
    findings = check_cross_model(configs)
    assert [f.code for f in findings] == ["TG195"]
    assert "['INPUT1']" in findings[0].message and "'echo2'" in findings[0].message
    optional = ECHO2.replace('name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ]', 'name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] optional: true')
    assert check_cross_model(_configs(m=ens(("INPUT0", "OUTPUT0")).replace('"echo"', '"echo2"'), echo2=optional)) == []


def test_ensembles_that_call_themselves_are_a_cycle() -> None:
    self_call = ens(("INPUT0", "OUTPUT0")).replace('"echo"', '"m"')
    findings = [f for f in check_cross_model(_configs(m=self_call)) if f.code == "TG196"]
    assert len(findings) == 1 and "m -> m" in findings[0].message
    a = _ensemble(_step("b", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}), name="a")
    b = _ensemble(_step("a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}), name="b")
    cycle = [f for f in check_cross_model(_configs(a=a, b=b)) if f.code == "TG196"]
    assert sorted(f.model for f in cycle) == ["a", "b"] and "a -> b -> a" in cycle[0].message
    chain = _ensemble(_step("m", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}), name="outer")
    assert [f for f in check_cross_model(_configs(outer=chain, m=ens(("INPUT0", "OUTPUT0")), echo=ECHO))
            if f.code == "TG196"] == []  # an ensemble calling another ensemble is fine


def test_a_step_fed_by_two_decoupled_models_is_refused() -> None:
    two = _ensemble(
        _step("dec", {"INPUT0": "INPUT0"}, {"OUTPUT0": "A"}), _step("dec", {"INPUT0": "INPUT0"}, {"OUTPUT0": "B"}),
        _step("echo2", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "OUTPUT0"}),
    )
    findings = check_cross_model(_configs(m=two, dec=DEC, echo2=ECHO2))
    assert [f.code for f in findings] == ["TG197"] and "step[2]" in findings[0].message
    # one decoupled branch feeding a step, the other input straight from the ensemble: fine
    one = _ensemble(
        _step("dec", {"INPUT0": "INPUT0"}, {"OUTPUT0": "A"}),
        _step("echo2", {"INPUT0": "A", "INPUT1": "A"}, {"OUTPUT0": "OUTPUT0"}),
    )
    assert check_cross_model(_configs(m=one, dec=DEC, echo2=ECHO2)) == []
    # the same two branches, non-decoupled: fine
    assert check_cross_model(_configs(m=two, dec=ECHO.replace('name: "echo"', 'name: "dec"'), echo2=ECHO2)) == []
    # two decoupled branches ending in the ensemble's own outputs (Triton's invalid_decoupled_branching_2)
    outs = IO + 'output [ { name: "OUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    split = _ensemble(_step("dec", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
                      _step("dec", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUT1"}), io=outs)
    findings = check_cross_model(_configs(m=split, dec=DEC))
    assert [(f.code, f.field) for f in findings] == [("TG197", "output")]
