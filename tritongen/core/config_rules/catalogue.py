"""The catalogue of rules: every code with its severity, title and what tritonserver 2.51 did
with a config that breaks it (each observed on the real server; tests/integration/
test_check_vs_server.py proves them again), or, for a backend this machine cannot run (TensorRT-LLM
needs a GPU), what its own code does, read from it and marked `observed=False`, so the suite does
not claim to have seen it. A new rule starts here, with a code no other has."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tritongen.core.findings import Severity


@dataclass(frozen=True)
class Rule:
    code: str
    severity: Severity
    title: str
    server: str  # what tritonserver 2.51 did with it, as observed (or as the backend's code says)
    observed: bool = True  # False: read from the backend's code, not seen on a running server


def _r(code: str, severity: Severity, title: str, server: str) -> Rule:
    return Rule(code, severity, title, server)


def _read(code: str, severity: Severity, title: str, backend_does: str) -> Rule:
    """A rule whose consequence was read from a backend's code, not observed on a server."""
    return Rule(code, severity, title, backend_does, observed=False)


def rule_table(rules: Iterable[Rule]) -> dict[str, Rule]:
    """The rules by code. A code listed twice is refused: in a plain dict the second silently
    replaced the first, and the first rule's findings would then have carried the wrong title."""
    table: dict[str, Rule] = {}
    for rule in rules:
        if rule.code in table:
            raise ValueError(f"rule code {rule.code} is listed twice ({table[rule.code].title!r} and {rule.title!r})")
        table[rule.code] = rule
    return table


RULES: dict[str, Rule] = rule_table(
    [
        # batching
        _r("TG101", "error", "preferred_batch_size above max_batch_size",
           "refused: dynamic batching preferred size must be <= max batch size"),
        _r("TG102", "error", "preferred_batch_size not positive",
           "refused: dynamic batching preferred size must be positive"),
        _r("TG103", "warning", "dynamic_batching on a model with max_batch_size 0",
           "loaded; requests are never batched"),
        _r("TG104", "error", "negative max_batch_size",
           "refused: 'max_batch_size' must be non-negative value"),
        _r("TG105", "error", "default_priority_level outside [1, priority_levels]",
           "refused: default priority level must be in range [1, N]"),
        _r("TG106", "warning", "default_priority_level without priority_levels",
           "loaded; the level is ignored"),
        _r("TG107", "error", "priority_queue_policy key outside [1, priority_levels]",
           "refused: priority queue policy must have priority level in range [1, N]"),
        _r("TG108", "warning", "priority_queue_policy without priority_levels",
           "loaded; the policies are ignored"),
        _r("TG109", "error", "preserve_ordering with priority_levels > 1",
           "refused: Only one priority level is allowed when 'preserve_ordering' is true"),
        _r("TG110", "error", "preserve_ordering with a DELAY queue policy and a timeout",
           "refused: Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"),
        _r("TG111", "warning", "timeout_action DELAY with no timeout that can fire",
           "loaded; the action never applies"),
        # sequence batching
        _r("TG115", "error", "sequence control input without a name",
           "refused: sequence batching control tensor must have a name"),
        _r("TG116", "error", "the same sequence control kind twice",
           "refused: sequence batching specifies multiple CONTROL_SEQUENCE_* tensors"),
        _r("TG112", "error", "one sequence control tensor name in several control_input entries",
           "refused: sequence batching control tensor '...' is specified for multiple control kinds"),
        _r("TG117", "error", "START/END/READY control without exactly one 2-entry false/true list",
           "refused: must specify either 'int32_false_true', ... / must have exactly 2 entries / more than one"),
        _r("TG118", "error", "CORRID control with an unsupported data_type",
           "refused: unexpected data type for control CONTROL_SEQUENCE_CORRID"),
        # instance groups
        _r("TG120", "warning", "negative instance_group count",
           "loaded with count 1 (the server normalises it)"),
        _r("TG121", "warning", "KIND_GPU instance group on a host without GPUs",
           "refused on a CPU-only host: has kind KIND_GPU but no GPUs are available"),
        _r("TG122", "error", "KIND_CPU instance group lists gpus",
           "refused: has kind KIND_CPU but specifies one or more GPUs"),
        _r("TG119", "error", "instance group lists a negative GPU id",
           "refused: instance group specifies invalid or unsupported gpu id -1"),
        _r("TG129", "error", "instance group lists a GPU id beyond the serving host's GPUs",
           "refused: instance group specifies invalid or unsupported gpu id"),
        _r("TG114", "warning", "GPU ids that cannot be checked (no GPU count known)",
           "loads only where the ids exist"),
        _r("TG123", "error", "KIND_MODEL instance group lists gpus",
           "refused: has kind KIND_MODEL but specifies one or more GPUs"),
        _r("TG124", "error", "instance group profile on a non-TensorRT model",
           "refused: specifies profile field which is only supported for TensorRT models"),
        _r("TG125", "warning", "rate_limiter resource without a name",
           "loaded with rate limiting off; refused with --rate-limit=execution_count"),
        _r("TG126", "warning", "rate_limiter resource with count 0", "loaded; the resource never limits"),
        _r("TG127", "warning", "rate_limiter resource named twice in one group", "loaded"),
        _r("TG128", "warning", "rate_limiter resource both global and per-device",
           "loaded with rate limiting off; refused with --rate-limit=execution_count: Resource is "
           "present as both global and device-specific resource"),
        # inputs and outputs
        _r("TG130", "error", "input/output without a name", "refused: model input must specify 'name'"),
        _r("TG131", "error", "input/output without data_type",
           "refused: model input 'X' must specify 'data_type'"),
        _r("TG132", "error", "input/output without dims", "refused: model input 'X' must specify 'dims'"),
        _r("TG146", "warning", "input/output left for auto-complete to fill from the model file",
           "loads if the model file supplies it (auto-complete on); refused with --disable-auto-complete-config"),
        _r("TG133", "error", "dims value 0 or below -1",
           "refused: dimension must be integer >= 1, or -1 to indicate a variable-size dimension"),
        _r("TG134", "error", "reshape does not hold the same elements as dims",
           "refused: has different size for dims and reshape"),
        _r("TG135", "error", "empty reshape on a model with max_batch_size 0",
           "refused: cannot have empty reshape for non-batching model"),
        _r("TG136", "error", "FORMAT_NHWC/NCHW input without 3 dims", "refused: NHWC/NCHW require 3 dims"),
        _r("TG137", "error", "is_shape_tensor on a non-TensorRT model",
           "refused: shape tensors are only supported for TensorRT platform"),
        _r("TG138", "warning", "input or output name used twice", "loaded; the duplicate is ambiguous"),
        _r("TG139", "warning", "a name used for an input and an output", "loaded"),
        _r("TG140", "error", "batch_input/batch_output names an unknown source input",
           "refused: unknown source input name"),
        _r("TG141", "error", "batch_input data_type not TYPE_INT32/TYPE_FP32",
           "refused: batch input data type must be TYPE_INT32 or TYPE_FP32"),
        _r("TG142", "error", "batch_output names an unknown target output",
           "refused: unknown target output name"),
        _r("TG143", "error", "batch_input without exactly one source_input",
           "refused: batch input kind '...' expects 1 source input, got N"),
        _r("TG144", "error", "batch_output without exactly one source_input",
           "refused: batch output kind '...' expects 1 source input, got N"),
        _r("TG145", "error", "batch_output lists a target output twice",
           "refused: target output name '...' can only be specified once"),
        # model level
        _r("TG150", "error", "config name differs from the directory name",
           "refused: unexpected directory name, directory name must equal model name"),
        _r("TG151", "error", "unknown platform and no backend", "refused: unexpected platform type"),
        _r("TG152", "error", "ensemble platform with a backend",
           "refused: must have platform type 'ensemble' and empty backend type"),
        _r("TG153", "error", "ensemble platform without ensemble_scheduling",
           "refused: ensemble scheduling must be set for ensemble"),
        _r("TG154", "error", "ensemble_scheduling on a non-ensemble model",
           "refused: ensemble scheduling cannot be set for model whose platform is not ensemble"),
        _r("TG155", "error", "instance_group / optimization / model_warmup on an ensemble",
           "refused: ... should not be specified for ensemble"),
        _r("TG147", "error", "runtime library path that climbs out of the backend directory",
           "refused: backend library name '...' escapes backend directory"),
        _r("TG156", "error", "response_cache on a decoupled model",
           "refused: Response Cache does not currently support model with 'decoupled' transaction policy"),
        _r("TG157", "error", "model_warmup batch_size above what the model accepts",
           "max_batch_size > 0: refused (batch size N, max allowed is M); max_batch_size 0: the "
           "server crashes (SIGSEGV)"),
        _r("TG158", "error", "model_warmup misses a required input",
           "refused: expected N inputs but got M inputs"),
        _r("TG159", "error", "model_warmup input without data source, or with a wrong data_type/dims",
           "refused: warmup setting expects input to have input_data_type set / data-type is / unexpected shape"),
        _r("TG160", "warning", "model_warmup input the model does not have", "loaded; the input is ignored"),
        _r("TG162", "error", "version_policy that can select no version",
           "refused: at least one version must be available under the version policy"),
        # ensemble graph
        _r("TG180", "error", "ensemble without steps", "refused: must specify 'step' for ensemble"),
        _r("TG181", "error", "ensemble step without model_name",
           "refused: must specify 'model_name' in step N of ensemble"),
        _r("TG182", "error", "ensemble step without input_map or output_map",
           "refused: must specify 'input_map' / 'output_map' in step N of ensemble"),
        _r("TG183", "error", "ensemble tensor written by two steps",
           "refused: ensemble tensor can appear in an output map only once"),
        _r("TG184", "error", "ensemble input that no step reads", "refused: ensemble input 'X' is not used"),
        _r("TG185", "error", "ensemble output that no step writes",
           "refused: ensemble output 'X' is not used / is not written"),
        _r("TG186", "error", "ensemble step reads a tensor nothing produces (or a cycle)",
           "refused: is not written: at least one of its depending tensors is not connected / is unused"),
        _r("TG187", "error", "ensemble tensor written but never read", "refused: ensemble tensor 'X' is unused"),
        # ensembles across models (check_cross_model)
        _r("TG190", "error", "ensemble step names a model that is not in the repository",
           "refused: ensemble contains models that are not available or ambiguous"),
        _r("TG191", "error", "ensemble input_map key is not an input of the step's model",
           "refused: ensemble tensor is mapping to non-existing input"),
        _r("TG192", "error", "ensemble output_map key is not an output of the step's model",
           "refused: ensemble tensor is mapped from non-existing output"),
        _r("TG193", "error", "ensemble max_batch_size above a step model's max_batch_size",
           "refused: ensemble allows maximum batch size N, but it contains model which only allows M"),
        _r("TG195", "error", "a required input of an ensemble step's model is not mapped",
           "refused: input X in model M is not mapped to any ensemble tensors"),
        _r("TG196", "error", "ensembles that call each other in a cycle (or themselves)",
           "refused: circular dependency between ensembles"),
        _r("TG197", "error", "an ensemble step fed by two different decoupled models",
           "refused: step of model M receives inputs originated from different decoupled models"),
        _r("TG194", "error", "ensemble tensor with inconsistent data_type or shape across models",
           "refused: inconsistent data type / inconsistent shape"),
        # repository level (tritongen.repository)
        _r("TG201", "warning", "no config.pbtxt; the server auto-completes one",
           "loaded (python: from model.py, max_batch_size 0, inputs only if auto_complete_config sets them)"),
        _r("TG202", "error", "no backend/platform and no model.<backend> file to infer it from",
           "refused: Could not determine backend for model"),
        _r("TG203", "error", "config.pbtxt does not parse against Triton's schema",
           "refused: failed to read text proto"),
        _r("TG204", "error", "no numeric version directory", "refused: at least one version must be available"),
        _r("TG205", "warning", "non-numeric directory in a model directory",
           "ignored: ignore version directory which fails to convert to integral number"),
        _r("TG206", "error", "version_policy names only versions that are not on disk",
           "refused: version N is specified ... but the version directory is not present; at least one "
           "version must be available"),
        _r("TG213", "warning", "version_policy names some versions that are not on disk",
           "loaded (the versions present); logs: version directory is not present"),
        _r("TG207", "error", "python model without its model file in a version directory",
           "load hangs: Failed to preinitialize Python stub: Python model file not found"),
        _r("TG208", "error", "label_filename that does not exist", "refused: failed to open text file"),
        _r("TG209", "error", "python EXECUTION_ENV_PATH that does not exist",
           "refused: Failed to get the canonical path"),
        _r("TG210", "error", "model_warmup input_data_file missing under warmup/",
           "refused: failed to open text file"),
        _r("TG211", "error", "ensemble step asks for a model version that will not be loaded (unset = 0)",
           "refused: depends on 'M' whose required version N is not loaded"),
        _r("TG212", "error", "model directory cannot be read", "refused"),
        _r("TG200", "warning", "the repository holds no model directory", "serves nothing"),
        # the Triton release the repository targets (--triton-release; core.triton_releases): read
        # from the proto's history, not observed (the embedded server is 2.51 only)
        _read("TG214", "error", "ModelConfig field added in a later Triton release than the target",
              "refused: failed to read text proto (the release's ModelConfig has no such field)"),
        _read("TG215", "note", "ModelConfig field of the target release whose load rules tritongen does not model",
              "loaded or refused by rules tritongen has not read; parsed, not checked"),
        # TensorRT-LLM's LLM-API model.yaml (tritongen.core.llmapi_rules): what model.py and the
        # release's LLM() do with it, read from their code (no GPU server here to observe it)
        _read("TG401", "error", "LLM-API model.yaml unreadable, not YAML or not a mapping",
           "load fails: model.py's auto_complete_config cannot read triton_config"),
        _read("TG402", "error", "model.yaml key that is not an LLM() argument of the release",
           "load fails: LLM() refuses extra fields (StrictBaseModel, extra='forbid')"),
        _read("TG403", "error", "model.yaml value of the wrong type", "load fails: LLM()'s pydantic validation"),
        _read("TG404", "error", "model.yaml value out of range",
           "load fails: LLM()'s validation, or the engine (a size below 1)"),
        _read("TG405", "error", "model.yaml enum value that is not one of the release's (a misspelt policy)",
           "load fails: not a CapacitySchedulerPolicy (or other enum) value"),
        _read("TG406", "error", "model.yaml lacks a required key (model, triton_config.max_batch_size/decoupled)",
           "load fails: LLM() needs model; model.py reads triton_config[...] without a default"),
        _read("TG407", "error", "triton_config conflicts with config.pbtxt",
           "load fails: pb_utils refuses to change decoupled or lower max_batch_size in auto_complete_config"),
        _read("TG408", "warning", "config.pbtxt max_batch_size below triton_config's",
           "loaded; auto_complete_config replaces config.pbtxt's value"),
        _read("TG409", "warning", "triton_config key model.py does not read", "loaded; the key has no effect"),
        _read("TG412", "note", "the target release ships another TensorRT-LLM than model.yaml's key table",
              "keys are checked against the table's release, not the shipped one"),
    ]
)
