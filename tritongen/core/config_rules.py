"""Semantic rules over a parsed Triton `ModelConfig`: pure, no filesystem, no network.

The error rules are the checks tritonserver (2.51, the binary in nvidia-pytriton) runs when it
loads a model: each was confirmed by loading a deliberately broken config on the real server
(see tests/integration/test_check_vs_server.py, which re-proves them). Warnings are settings the
server accepts but ignores or that cannot work, and settings that fail only under conditions the
checker cannot see (a host without GPUs, `--rate-limit=execution_count`).

Entry points:
- `check_model_config(config, model=..., gpu_available=...)`: one model on its own.
- `check_cross_model(configs)`: rules that need several models (ensemble steps, rate-limiter
  resources shared between models).
`RULES` lists every code with its severity and what the server does.
"""

from __future__ import annotations

import posixpath
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tritonclient.grpc.model_config_pb2 import (
    BatchInput,
    BatchOutput,
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

from tritongen.core.findings import Finding, Severity

WILDCARD = -1
ENSEMBLE_PLATFORM = "ensemble"
TENSORRT_PLATFORM = "tensorrt_plan"
# Platforms the server maps to a backend when `backend` is empty (model_config_utils.cc).
KNOWN_PLATFORMS = frozenset(
    {
        "tensorrt_plan",
        "tensorflow_graphdef",
        "tensorflow_savedmodel",
        "onnxruntime_onnx",
        "pytorch_libtorch",
        ENSEMBLE_PLATFORM,
    }
)
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
BATCH_INPUT_TYPES = ("TYPE_INT32", "TYPE_FP32")
_BOOL_CONTROLS = (
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
)


@dataclass(frozen=True)
class Rule:
    code: str
    severity: Severity
    title: str
    server: str  # what tritonserver 2.51 did with it, as observed


def _r(code: str, severity: Severity, title: str, server: str) -> Rule:
    return Rule(code, severity, title, server)


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
    ]
)


def _dtype(value: int) -> str:
    return DataType.Name(value) if value in DataType.values() else str(value)


def _dims(dims: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _full_shape(dims: Sequence[int], max_batch_size: int) -> list[int]:
    return ([WILDCARD] if max_batch_size > 0 else []) + list(dims)


def _shapes_compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD in (x, y) for x, y in zip(a, b))


def _element_chunks(shape: Sequence[int]) -> list[int]:
    """Element counts between variable-size dimensions, as the server compares dims and reshape."""
    chunks, current = [], 1
    for dim in shape:
        if dim == WILDCARD:
            chunks.append(current)
            current = 1
        else:
            current *= dim
    chunks.append(current)
    return chunks


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


def is_tensorrt(config: ModelConfig) -> bool:
    return config.platform == TENSORRT_PLATFORM or config.backend == "tensorrt"


class _Collector:
    def __init__(self, model: str) -> None:
        self.model = model
        self.findings: list[Finding] = []

    def error(self, code: str, field: str, message: str, fix: str) -> None:
        self._add("error", code, field, message, fix)

    def warning(self, code: str, field: str, message: str, fix: str) -> None:
        self._add("warning", code, field, message, fix)

    def _add(self, severity: Severity, code: str, field: str, message: str, fix: str) -> None:
        assert code in RULES, code
        self.findings.append(Finding(severity, code, self.model, field, f"model '{self.model}': {message}", fix))


def check_model_config(
    config: ModelConfig,
    *,
    model: str | None = None,
    gpu_available: bool | None = None,
    gpu_count: int | None = None,
    gpu_count_source: str = "the serving host",
    model_file: str | None = None,
    autofill_source: str | None = None,
) -> list[Finding]:
    """Every single-model rule. `model` is the directory name (the name the server loads it by);
    `gpu_available=False` turns on the KIND_GPU warning, `None` (unknown) and `True` leave it off.
    `gpu_count` is how many GPUs the serving host has (from NVML or the spec, named by
    `gpu_count_source`): instance-group ids at or beyond it are errors; unknown (None), ids are
    only checked for sign and a warning says they could not be checked further.
    `model_file` is the `model.<ext>` the server would infer the backend from (e.g. "1/model.plan");
    `autofill_source` says what the server's auto-complete would fill missing fields from (None:
    auto-complete is off or has nothing to read): what it fills is not decided here, and says so."""
    name = model or config.name or "<unnamed>"
    out = _Collector(name)
    _model_level(config, model, out)
    _batching(config, out)
    _sequence_batching(config, out)
    if is_ensemble(config) or config.HasField("ensemble_scheduling"):
        _ensemble(config, out)
    if not is_ensemble(config):
        _instance_groups(config, gpu_available, out, model_file)
        _gpu_ids(config, gpu_count, gpu_count_source, out)
    _io(config, out, autofill_source)
    _batch_io(config, out)
    _warmup(config, out)
    _version_policy(config, out)
    return out.findings


def _model_level(config: ModelConfig, directory: str | None, out: _Collector) -> None:
    if directory and config.name and config.name != directory:
        out.error(
            "TG150", "name",
            f"name is '{config.name}' but the model directory is '{directory}'; the server loads a "
            "model only when they are equal",
            f"set name: \"{directory}\" (or remove the name line), or rename the directory to '{config.name}'",
        )
    if not config.backend and config.platform and config.platform not in KNOWN_PLATFORMS:
        out.error(
            "TG151", "platform",
            f"platform '{config.platform}' is not one the server knows and backend is empty",
            f"set backend (e.g. \"python\", \"onnxruntime\") or a platform among {sorted(KNOWN_PLATFORMS)}",
        )
    if is_ensemble(config) and config.backend:
        out.error(
            "TG152", "backend",
            f"platform is 'ensemble' but backend is '{config.backend}'; ensembles must have no backend",
            "remove the backend line from the ensemble",
        )
    if config.max_batch_size < 0:
        out.error(
            "TG104", "max_batch_size",
            f"max_batch_size is {config.max_batch_size}; it must be 0 (no batching) or positive",
            "set max_batch_size to 0 or a positive batch size",
        )
    if config.runtime and (config.runtime.startswith("/") or posixpath.normpath(config.runtime).startswith("..")):
        out.error(
            "TG147", "runtime",
            f"runtime is '{config.runtime}', a path that leaves the backend directory; the server only loads "
            "backend libraries from inside it",
            "give the library's name (e.g. \"libtriton_identity.so\", or \"model.py\" for a Python-based backend) "
            "and install it under the backend directory",
        )
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        out.error(
            "TG156", "response_cache.enable",
            "response_cache.enable is true and model_transaction_policy.decoupled is true; the "
            "response cache does not support decoupled models",
            "remove response_cache (or set enable: false), or make the model non-decoupled",
        )


def _check_preferred(
    sizes: Sequence[int], max_batch_size: int, field: str, out: _Collector
) -> None:
    for size in sizes:
        if size <= 0:
            out.error(
                "TG102", field,
                f"{field} contains {size}; every preferred batch size must be positive "
                f"(max_batch_size is {max_batch_size})",
                f"remove {size} from {field}",
            )
        elif size > max_batch_size:
            out.error(
                "TG101", field,
                f"{field} {size} is greater than max_batch_size {max_batch_size}",
                f"lower {field} to at most {max_batch_size}, or raise max_batch_size to at least {size}"
                if max_batch_size > 0
                else f"remove {field} (the model does not batch), or set max_batch_size to at least {size}",
            )


def _batching(config: ModelConfig, out: _Collector) -> None:
    if not config.HasField("dynamic_batching"):
        return
    db = config.dynamic_batching
    mbs = config.max_batch_size
    _check_preferred(list(db.preferred_batch_size), mbs, "dynamic_batching.preferred_batch_size", out)
    queues = db.priority_levels > 0 or db.HasField("default_queue_policy") or len(db.priority_queue_policy) > 0
    if mbs == 0 and not db.preferred_batch_size and not queues:  # queue policies still apply at 0
        out.warning(
            "TG103", "dynamic_batching",
            "dynamic_batching is set but max_batch_size is 0, so the server never batches requests "
            "(the batcher only queues them)",
            "set max_batch_size > 0 (and give inputs without the batch dimension), or remove dynamic_batching",
        )
    levels = db.priority_levels
    default = db.default_priority_level
    if levels > 0:
        if default == 0 or default > levels:
            out.error(
                "TG105", "dynamic_batching.default_priority_level",
                f"dynamic_batching.default_priority_level is {default} but priority_levels is {levels}; "
                f"it must lie in [1, {levels}]",
                f"set default_priority_level to a value in 1..{levels} (1 is the highest priority)",
            )
        for key in sorted(db.priority_queue_policy):
            if key == 0 or key > levels:
                out.error(
                    "TG107", "dynamic_batching.priority_queue_policy",
                    f"dynamic_batching.priority_queue_policy has key {key} but priority_levels is {levels}; "
                    f"keys must lie in [1, {levels}]",
                    f"change key {key} to a level in 1..{levels}, or raise priority_levels to {max(key, 1)}",
                )
    else:
        if default != 0:
            out.warning(
                "TG106", "dynamic_batching.default_priority_level",
                f"dynamic_batching.default_priority_level is {default} but priority_levels is 0, so the "
                "level is ignored",
                f"set priority_levels to at least {default}, or remove default_priority_level",
            )
        if db.priority_queue_policy:
            keys = sorted(db.priority_queue_policy)
            out.warning(
                "TG108", "dynamic_batching.priority_queue_policy",
                f"dynamic_batching.priority_queue_policy sets levels {keys} but priority_levels is 0, so "
                "these policies are ignored",
                f"set priority_levels to at least {max(keys)} with a default_priority_level, or move the "
                "policy to default_queue_policy",
            )
    if db.preserve_ordering:
        if levels > 1:
            out.error(
                "TG109", "dynamic_batching.preserve_ordering",
                f"dynamic_batching.preserve_ordering is true with priority_levels {levels}; only one "
                "priority level is allowed with preserve_ordering",
                "set priority_levels to 0 or 1, or set preserve_ordering: false",
            )
        policies = [("dynamic_batching.default_queue_policy", db.default_queue_policy)]
        policies += [
            (f"dynamic_batching.priority_queue_policy[{k}]", db.priority_queue_policy[k])
            for k in sorted(db.priority_queue_policy)
        ]
        for field, policy in policies:
            if policy.timeout_action == ModelQueuePolicy.DELAY and policy.default_timeout_microseconds != 0:
                out.error(
                    "TG110", f"{field}.timeout_action",
                    f"{field}.timeout_action is DELAY (default_timeout_microseconds "
                    f"{policy.default_timeout_microseconds}) while dynamic_batching.preserve_ordering is "
                    "true; a delayed request would break the ordering",
                    "use timeout_action: REJECT, or set preserve_ordering: false",
                )
    policies = []
    if db.HasField("default_queue_policy"):
        policies.append(("dynamic_batching.default_queue_policy", db.default_queue_policy))
    policies += [
        (f"dynamic_batching.priority_queue_policy[{k}]", db.priority_queue_policy[k])
        for k in sorted(db.priority_queue_policy)
    ]
    for field, policy in policies:
        if (
            policy.timeout_action == ModelQueuePolicy.DELAY
            and policy.default_timeout_microseconds == 0
            and not policy.allow_timeout_override
        ):
            out.warning(
                "TG111", f"{field}.timeout_action",
                f"{field}.timeout_action is DELAY but default_timeout_microseconds is 0 and "
                "allow_timeout_override is false, so no timeout can ever fire",
                "set default_timeout_microseconds (or allow_timeout_override: true), or drop timeout_action",
            )


def _sequence_batching(config: ModelConfig, out: _Collector) -> None:
    if not config.HasField("sequence_batching"):
        return
    sb = config.sequence_batching
    if sb.HasField("oldest"):
        _check_preferred(
            list(sb.oldest.preferred_batch_size), config.max_batch_size,
            "sequence_batching.oldest.preferred_batch_size", out,
        )
    kinds: Counter[int] = Counter()
    for i, ci in enumerate(sb.control_input):
        field = f"sequence_batching.control_input[{i}]"
        if not ci.name:
            out.error(
                "TG115", f"{field}.name",
                f"{field} has no name; every sequence control tensor needs one",
                f"add name: \"...\" to {field} (the tensor name the model reads)",
            )
        for j, control in enumerate(ci.control):
            kind_name = ModelSequenceBatching.Control.Kind.Name(control.kind)
            kinds[control.kind] += 1
            cfield = f"{field}.control[{j}]"
            if control.kind in _BOOL_CONTROLS:
                lists = [
                    (n, len(getattr(control, n)))
                    for n in ("int32_false_true", "fp32_false_true", "bool_false_true")
                    if len(getattr(control, n))
                ]
                if not lists:
                    out.error(
                        "TG117", cfield,
                        f"{cfield} ({kind_name}, tensor '{ci.name}') gives no int32_false_true, "
                        "fp32_false_true or bool_false_true",
                        "add exactly one of them with two entries, e.g. int32_false_true: [ 0, 1 ]",
                    )
                elif len(lists) > 1:
                    out.error(
                        "TG117", cfield,
                        f"{cfield} ({kind_name}, tensor '{ci.name}') gives {', '.join(n for n, _ in lists)}; "
                        "only one is allowed",
                        f"keep only one of {', '.join(n for n, _ in lists)}",
                    )
                elif lists[0][1] != 2:
                    n, count = lists[0]
                    out.error(
                        "TG117", f"{cfield}.{n}",
                        f"{cfield}.{n} ({kind_name}, tensor '{ci.name}') has {count} entries; it needs "
                        "exactly 2 (the false value, then the true value)",
                        f"write {n}: [ <false>, <true> ], e.g. [ 0, 1 ]",
                    )
            elif control.kind == ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                dtype = _dtype(control.data_type)
                if dtype not in CORRID_TYPES:
                    out.error(
                        "TG118", f"{cfield}.data_type",
                        f"{cfield}.data_type is {dtype} for CONTROL_SEQUENCE_CORRID (tensor '{ci.name}'); "
                        f"allowed: {', '.join(CORRID_TYPES)}",
                        "set data_type: TYPE_UINT64 (or TYPE_STRING for string correlation ids)",
                    )
    # The server walks control_input once per control kind and refuses a tensor name it has seen
    # in an earlier entry, whatever the kinds: one entry per tensor.
    entries_of: dict[str, list[int]] = defaultdict(list)
    for i, ci in enumerate(sb.control_input):
        if ci.name:
            entries_of[ci.name].append(i)
    for tensor, entries in sorted(entries_of.items()):
        if len(entries) > 1:
            kinds_named = sorted({ModelSequenceBatching.Control.Kind.Name(c.kind)
                                  for i in entries for c in sb.control_input[i].control})
            out.error(
                "TG112", "sequence_batching.control_input",
                f"sequence control tensor '{tensor}' is declared in {len(entries)} control_input entries "
                f"({', '.join(f'[{i}]' for i in entries)}, kinds {', '.join(kinds_named)}); a tensor may carry "
                "one control",
                f"give each control its own tensor name, e.g. keep '{tensor}' in control_input[{entries[0]}] "
                "and rename the others",
            )
    for kind, count in sorted(kinds.items()):
        if count > 1:
            kind_name = ModelSequenceBatching.Control.Kind.Name(kind)
            out.error(
                "TG116", "sequence_batching.control_input",
                f"sequence_batching.control_input declares {kind_name} {count} times; each control kind "
                "may appear once",
                f"keep one {kind_name} control and remove the others",
            )


def _gpu_ids(config: ModelConfig, gpu_count: int | None, source: str, out: _Collector) -> None:
    """The server resolves each listed id against the CUDA devices it sees at load: a negative id
    is refused everywhere, an id past the last device on that host."""
    unchecked: list[int] = []
    for i, group in enumerate(config.instance_group):
        if group.kind in (ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_MODEL):
            continue  # TG122/TG123 already refuse gpus on these kinds
        field = f"instance_group[{i}].gpus"
        label = f"instance_group[{i}]" + (f" ('{group.name}')" if group.name else "")
        ids = list(group.gpus)
        negative = [g for g in ids if g < 0]
        if negative:
            out.error(
                "TG119", field,
                f"{label}.gpus is {_dims(ids)}; GPU id {negative[0]} is negative (ids are 0 or more)",
                "use the device indices nvidia-smi lists (0 .. N-1), or leave gpus out to use every GPU",
            )
        valid = [g for g in ids if g >= 0]
        if gpu_count is not None:
            beyond = [g for g in valid if g >= gpu_count]
            if beyond:
                have = f"ids 0..{gpu_count - 1}" if gpu_count > 0 else "none"
                out.error(
                    "TG129", field,
                    f"{label}.gpus is {_dims(ids)} but {source} has {gpu_count} GPU(s) ({have}); "
                    f"GPU {beyond[0]} does not exist there",
                    f"list ids below {gpu_count}, or leave gpus out to use every GPU" if gpu_count > 0
                    else "use kind: KIND_CPU without gpus on a host without GPUs",
                )
        else:
            unchecked += valid
    if unchecked:
        out.warning(
            "TG114", "instance_group.gpus",
            f"instance groups list GPU ids {_dims(sorted(set(unchecked)))}, but the number of GPUs on the "
            "serving host is not known here (no NVML, no --gpus or --spec), so the ids were not checked "
            "against it",
            "pass --gpus N (the serving host's GPU count) or --spec, or run check on the serving host",
        )


def _instance_groups(config: ModelConfig, gpu_available: bool | None, out: _Collector,
                     model_file: str | None = None) -> None:
    tensorrt = is_tensorrt(config) or (not config.platform and not config.backend and bool(model_file)
                                       and model_file.endswith(".plan"))
    for i, group in enumerate(config.instance_group):
        field = f"instance_group[{i}]"
        label = f"{field}" + (f" ('{group.name}')" if group.name else "")
        kind = ModelInstanceGroup.Kind.Name(group.kind)
        gpus = list(group.gpus)
        if group.count < 0:  # 0 is the same as leaving count out (proto3): one instance
            out.warning(
                "TG120", f"{field}.count",
                f"{label}.count is {group.count}; the server treats a count below 1 as 1",
                "set count: 1 (or the number of instances you want) explicitly",
            )
        wants_gpu = group.kind == ModelInstanceGroup.KIND_GPU or (
            group.kind == ModelInstanceGroup.KIND_AUTO and gpus
        )
        if wants_gpu and gpu_available is False:
            out.warning(
                "TG121", f"{field}.kind",
                f"{label}.kind is {kind}{' with gpus ' + _dims(gpus) if gpus else ''} but this host has "
                "no GPU; the server here refuses it (no GPUs are available)",
                "fine if the target host has GPUs; to load it here use kind: KIND_CPU without gpus",
            )
        if group.kind == ModelInstanceGroup.KIND_CPU and gpus:
            out.error(
                "TG122", f"{field}.gpus",
                f"{label}.kind is KIND_CPU but gpus is {_dims(gpus)}",
                "remove gpus, or set kind: KIND_GPU",
            )
        if group.kind == ModelInstanceGroup.KIND_MODEL and gpus:
            out.error(
                "TG123", f"{field}.gpus",
                f"{label}.kind is KIND_MODEL but gpus is {_dims(gpus)}; with KIND_MODEL the model "
                "places itself",
                "remove gpus, or set kind: KIND_GPU",
            )
        if group.profile and not tensorrt:
            out.error(
                "TG124", f"{field}.profile",
                f"{label}.profile is {list(group.profile)} but the model is not TensorRT "
                f"(platform '{config.platform}', backend '{config.backend}')",
                "remove profile (it only selects TensorRT optimization profiles)",
            )
        if group.HasField("rate_limiter"):
            names: Counter[str] = Counter()
            for j, res in enumerate(group.rate_limiter.resources):
                rfield = f"{field}.rate_limiter.resources[{j}]"
                names[res.name] += 1
                if not res.name:
                    out.warning(
                        "TG125", f"{rfield}.name",
                        f"{rfield} has no name (count {res.count}); with --rate-limit=execution_count "
                        "the server refuses it (resource \"\" limited to 0)",
                        "give the resource a name, e.g. name: \"R_GPU\"",
                    )
                if res.count == 0:
                    out.warning(
                        "TG126", f"{rfield}.count",
                        f"{rfield} ('{res.name}') has count 0, so it never limits anything",
                        "set count to the units one execution consumes (>= 1), or remove the resource",
                    )
            for rname, count in sorted(names.items()):
                if count > 1 and rname:
                    out.warning(
                        "TG127", f"{field}.rate_limiter.resources",
                        f"{field}.rate_limiter.resources names '{rname}' {count} times",
                        f"keep one entry for '{rname}' with the total count",
                    )


def _io(config: ModelConfig, out: _Collector, autofill_source: str | None = None) -> None:
    mbs = config.max_batch_size
    seen: dict[str, Counter[str]] = {"input": Counter(), "output": Counter()}
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for i, io in enumerate(tensors):
            field = f"{kind}[{i}]"
            label = f"{kind} '{io.name}'" if io.name else field
            seen[kind][io.name] += 1
            if not io.name:
                out.error(
                    "TG130", f"{field}.name",
                    f"{field} has no name",
                    f"add name: \"...\" to {field}",
                )
            if io.data_type == DataType.TYPE_INVALID and autofill_source:
                out.warning(
                    "TG146", f"{field}.data_type",
                    f"{label} ({field}) has no data_type; the server's auto-complete fills it from "
                    f"{autofill_source}, which check does not read, so it is not checked here",
                    "set data_type explicitly to have it checked (and to load with --disable-auto-complete-config)",
                )
            elif io.data_type == DataType.TYPE_INVALID:
                out.error(
                    "TG131", f"{field}.data_type",
                    f"{label} ({field}) has data_type TYPE_INVALID (not set)",
                    "set data_type, e.g. data_type: TYPE_FP32",
                )
            dims = list(io.dims)
            if not dims and autofill_source and not io.HasField("reshape"):
                out.warning(
                    "TG146", f"{field}.dims",
                    f"{label} ({field}) has no dims; the server's auto-complete fills them from {autofill_source}, "
                    "which check does not read, so they are not checked here",
                    "write the dims explicitly to have them checked (and to load with --disable-auto-complete-config)",
                )
            elif not dims:
                out.error(
                    "TG132", f"{field}.dims",
                    f"{label} ({field}) has no dims (max_batch_size {mbs}); every input and output needs dims",
                    "add dims without the batch dimension, e.g. dims: [ -1 ]; for a scalar per batch "
                    "item use dims: [ 1 ] with reshape: { shape: [ ] }",
                )
            bad = [d for d in dims if d < 1 and d != WILDCARD]
            if bad:
                out.error(
                    "TG133", f"{field}.dims",
                    f"{label} ({field}) has dims {_dims(dims)}; {', '.join(map(str, bad))} is not allowed "
                    "(each dimension must be >= 1, or -1 for variable size)",
                    "use a positive size or -1 for a variable-size dimension",
                )
            if io.HasField("reshape"):
                shape = list(io.reshape.shape)
                if not shape and mbs == 0:
                    out.error(
                        "TG135", f"{field}.reshape",
                        f"{label} ({field}) has an empty reshape with max_batch_size 0; scalar tensors "
                        "are not supported",
                        "remove the reshape, or set max_batch_size > 0",
                    )
                bad_shape = [d for d in shape if d < 1 and d != WILDCARD]
                if bad_shape:
                    out.error(
                        "TG133", f"{field}.reshape.shape",
                        f"{label} ({field}) has reshape {_dims(shape)}; {', '.join(map(str, bad_shape))} "
                        "is not allowed",
                        "use positive sizes or -1",
                    )
                elif dims and not bad and _element_chunks(dims) != _element_chunks(shape):
                    out.error(
                        "TG134", f"{field}.reshape",
                        f"{label} ({field}) has dims {_dims(dims)} but reshape {_dims(shape)}; they do not "
                        "hold the same number of elements (compared between -1 dimensions)",
                        "make the reshape hold exactly the elements of dims, with -1 in the same groups",
                    )
            if kind == "input" and io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW):
                if len(dims) != 3:  # dims, not reshape: densenet_onnx reshapes [3,224,224] to 4 dims
                    out.error(
                        "TG136", f"{field}.format",
                        f"{label} ({field}) has format {ModelInput.Format.Name(io.format)} with dims "
                        f"{_dims(dims)}; NHWC/NCHW need exactly 3 dims",
                        "give 3 dims (without the batch dimension), or use format: FORMAT_NONE",
                    )
            if io.is_shape_tensor and not is_tensorrt(config):
                out.error(
                    "TG137", f"{field}.is_shape_tensor",
                    f"{label} ({field}) has is_shape_tensor: true but the model is not TensorRT "
                    f"(platform '{config.platform}', backend '{config.backend}')",
                    "remove is_shape_tensor",
                )
    for kind in ("input", "output"):
        for tname, count in sorted(seen[kind].items()):
            if tname and count > 1:
                out.warning(
                    "TG138", kind,
                    f"{kind} name '{tname}' is declared {count} times",
                    f"rename or remove the duplicate {kind} '{tname}'",
                )
    shared = sorted(n for n in set(seen["input"]) & set(seen["output"]) if n)
    for tname in shared:
        out.warning(
            "TG139", "output",
            f"'{tname}' is both an input and an output name",
            f"give the output a different name than input '{tname}'",
        )


def _batch_io(config: ModelConfig, out: _Collector) -> None:
    inputs = {i.name for i in config.input}
    outputs = {o.name for o in config.output}
    for i, bi in enumerate(config.batch_input):
        field = f"batch_input[{i}]"
        if len(bi.source_input) != 1:
            kind = BatchInput.Kind.Name(bi.kind)
            out.error(
                "TG143", f"{field}.source_input",
                f"{field} ({kind}, target '{bi.target_name[0] if bi.target_name else ''}') has "
                f"{len(bi.source_input)} source inputs {list(bi.source_input)}; every batch input kind takes exactly 1 "
                f"(the inputs are {sorted(inputs)})",
                f"give one source_input, the input whose shape the batch input is computed from "
                f"(one of {sorted(inputs)})",
            )
        for src in bi.source_input:
            if config.input and src not in inputs:
                out.error(
                    "TG140", f"{field}.source_input",
                    f"{field}.source_input is '{src}' but the inputs are {sorted(inputs)}",
                    f"set source_input to one of {sorted(inputs)}",
                )
        dtype = _dtype(bi.data_type)
        if dtype not in BATCH_INPUT_TYPES:
            out.error(
                "TG141", f"{field}.data_type",
                f"{field}.data_type is {dtype}; batch inputs must be TYPE_INT32 or TYPE_FP32",
                "set data_type: TYPE_INT32 or TYPE_FP32",
            )
    for i, bo in enumerate(config.batch_output):
        field = f"batch_output[{i}]"
        if len(bo.source_input) != 1:
            kind = BatchOutput.Kind.Name(bo.kind)
            out.error(
                "TG144", f"{field}.source_input",
                f"{field} ({kind}) has {len(bo.source_input)} source inputs {list(bo.source_input)}; it takes "
                f"exactly 1, the input whose shape the output is scattered by (the inputs are {sorted(inputs)})",
                f"give one source_input (one of {sorted(inputs)})",
            )
        repeated = sorted(t for t, n in Counter(bo.target_name).items() if n > 1)
        if repeated:
            out.error(
                "TG145", f"{field}.target_name",
                f"{field}.target_name lists '{repeated[0]}' {Counter(bo.target_name)[repeated[0]]} times; "
                "each target output may appear once",
                f"list '{repeated[0]}' once in target_name",
            )
        for target in bo.target_name:
            if config.output and target not in outputs:
                out.error(
                    "TG142", f"{field}.target_name",
                    f"{field}.target_name is '{target}' but the outputs are {sorted(outputs)}",
                    f"set target_name to one of {sorted(outputs)}",
                )
        for src in bo.source_input:
            if config.input and src not in inputs:
                out.error(
                    "TG140", f"{field}.source_input",
                    f"{field}.source_input is '{src}' but the inputs are {sorted(inputs)}",
                    f"set source_input to one of {sorted(inputs)}",
                )


def _warmup(config: ModelConfig, out: _Collector) -> None:
    if is_ensemble(config):
        return
    inputs = {i.name: i for i in config.input}
    mbs = config.max_batch_size
    for i, warm in enumerate(config.model_warmup):
        field = f"model_warmup[{i}]"
        label = f"{field}" + (f" ('{warm.name}')" if warm.name else "")
        limit = max(mbs, 1)
        if warm.batch_size > limit:
            crash = " (with max_batch_size 0 the server crashes on it)" if mbs == 0 else ""
            out.error(
                "TG157", f"{field}.batch_size",
                f"{label}.batch_size is {warm.batch_size} but max_batch_size is {mbs}, so at most "
                f"{limit} is allowed{crash}",
                f"set batch_size to at most {limit}",
            )
        if not inputs:
            continue  # inputs come from auto-completion; nothing to compare against
        for name in sorted(warm.inputs):
            if name not in inputs:
                out.warning(
                    "TG160", f"{field}.inputs",
                    f"{label}.inputs has '{name}' but the model's inputs are {sorted(inputs)}",
                    f"rename '{name}' to one of {sorted(inputs)}, or remove it",
                )
                continue
            warm_in = warm.inputs[name]
            model_in = inputs[name]
            if warm_in.WhichOneof("input_data_type") is None:
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has no data source",
                    "add zero_data: true, random_data: true or input_data_file: \"...\"",
                )
            if warm_in.data_type != model_in.data_type:
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has data_type {_dtype(warm_in.data_type)} but the model "
                    f"input is {_dtype(model_in.data_type)}",
                    f"set data_type: {_dtype(model_in.data_type)}",
                )
            if list(model_in.dims) and not _shapes_compatible(list(warm_in.dims), list(model_in.dims)):
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has dims {_dims(warm_in.dims)} but the model input has dims "
                    f"{_dims(model_in.dims)} (without the batch dimension)",
                    f"give dims matching {_dims(model_in.dims)}, with a concrete size for each -1",
                )
        missing = sorted(n for n, inp in inputs.items() if not inp.optional and n not in warm.inputs)
        if missing:
            out.error(
                "TG158", f"{field}.inputs",
                f"{label} gives inputs {sorted(warm.inputs)} but the model requires {missing} as well",
                f"add warmup data for {missing}",
            )


def _version_policy(config: ModelConfig, out: _Collector) -> None:
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "latest" and config.version_policy.latest.num_versions == 0:
        out.error(
            "TG162", "version_policy.latest.num_versions",
            "version_policy.latest.num_versions is 0, so no version can be loaded",
            "set num_versions: 1 (or remove version_policy)",
        )
    if which == "specific" and not config.version_policy.specific.versions:
        out.error(
            "TG162", "version_policy.specific.versions",
            "version_policy.specific.versions is empty, so no version can be loaded",
            "list the versions to serve, e.g. versions: [ 1 ], or use latest",
        )


def _ensemble(config: ModelConfig, out: _Collector) -> None:
    has_sched = config.HasField("ensemble_scheduling")
    if not is_ensemble(config):
        out.error(
            "TG154", "ensemble_scheduling",
            f"ensemble_scheduling is set but platform is '{config.platform}' (backend '{config.backend}')",
            "set platform: \"ensemble\" and remove backend, or remove ensemble_scheduling",
        )
        return
    if not has_sched:
        out.error(
            "TG153", "platform",
            "platform is 'ensemble' but there is no ensemble_scheduling",
            "add ensemble_scheduling { step [ ... ] } describing the pipeline",
        )
        return
    for fname, present in (
        ("instance_group", len(config.instance_group) > 0),
        ("optimization", config.HasField("optimization")),
        ("model_warmup", len(config.model_warmup) > 0),
    ):
        if present:
            out.error(
                "TG155", fname,
                f"{fname} is set on an ensemble; ensembles run no instances of their own",
                f"remove {fname} from the ensemble (set it on the step models instead)",
            )
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        out.error(
            "TG180", "ensemble_scheduling.step",
            "ensemble_scheduling has no step",
            "add at least one step { model_name, input_map, output_map }",
        )
        return
    producers: dict[str, int] = {}
    broken = False
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        if not step.model_name:
            out.error("TG181", f"{field}.model_name", f"{field} has no model_name", f"add model_name to {field}")
            broken = True
        for mname in ("input_map", "output_map"):
            if not getattr(step, mname):
                out.error(
                    "TG182", f"{field}.{mname}",
                    f"{field} (model '{step.model_name}') has no {mname}",
                    f"add {mname} {{ key: \"<tensor of {step.model_name}>\" value: \"<ensemble tensor>\" }}",
                )
                broken = True
        for key in sorted(step.output_map):
            tensor = step.output_map[key]
            if tensor in producers:
                out.error(
                    "TG183", f"{field}.output_map",
                    f"ensemble tensor '{tensor}' is written by step {producers[tensor]} and again by step {i} "
                    f"(model '{step.model_name}', output '{key}')",
                    f"give one of them a different ensemble tensor name than '{tensor}'",
                )
                broken = True
            else:
                producers[tensor] = i
    if broken:
        return
    ens_inputs = [i.name for i in config.input]
    ens_outputs = [o.name for o in config.output]
    consumed = {t for s in steps for t in s.input_map.values()}
    for name in ens_inputs:
        if name not in consumed:
            out.error(
                "TG184", "input",
                f"ensemble input '{name}' is not read by any step (the steps read {sorted(consumed)})",
                f"map '{name}' into a step's input_map, or remove the input",
            )
    # Data flow: a step runs once every tensor it reads is available.
    available = set(ens_inputs)
    ran: set[int] = set()
    progress = True
    while progress:
        progress = False
        for i, step in enumerate(steps):
            if i not in ran and set(step.input_map.values()) <= available:
                ran.add(i)
                available |= set(step.output_map.values())
                progress = True
    for i, step in enumerate(steps):
        if i in ran:
            continue
        missing = sorted(t for t in step.input_map.values() if t not in available)
        out.error(
            "TG186", f"ensemble_scheduling.step[{i}].input_map",
            f"ensemble_scheduling.step[{i}] (model '{step.model_name}') reads {missing}, which neither an "
            f"ensemble input ({ens_inputs}) nor an earlier step produces (or the steps form a cycle)",
            f"produce {missing} in an earlier step's output_map, or read an ensemble input instead",
        )
    for name in ens_outputs:
        if name not in producers:
            out.error(
                "TG185", "output",
                f"ensemble output '{name}' is not written by any step (the steps write {sorted(producers)})",
                f"map a step output to '{name}' in its output_map, or remove the output",
            )
    outputs = set(ens_outputs)
    for tensor, i in sorted(producers.items()):
        if tensor not in consumed and tensor not in outputs and i in ran:
            out.error(
                "TG187", f"ensemble_scheduling.step[{i}].output_map",
                f"ensemble tensor '{tensor}' written by step {i} (model '{steps[i].model_name}') is never "
                "read by a step nor an ensemble output",
                f"read '{tensor}' in a later step, declare it as an ensemble output, or remove it from the output_map",
            )


def check_cross_model(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    """Rules across models: ensemble steps against the models they call, rate-limiter resources."""
    findings: list[Finding] = []
    for name in sorted(configs):
        config = configs[name]
        if is_ensemble(config) and config.HasField("ensemble_scheduling"):
            findings.extend(_ensemble_references(name, config, configs))
    findings.extend(_ensemble_cycles(configs))
    findings.extend(_rate_limiter_scopes(configs))
    return findings


def _ensemble_references(name: str, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> list[Finding]:
    out = _Collector(name)
    # tensor -> list of (source description, data_type, full shape, batching)
    seen: dict[str, list[tuple[str, int, list[int], bool]]] = defaultdict(list)
    ens_batching = config.max_batch_size > 0
    for io in list(config.input) + list(config.output):
        seen[io.name].append((f"ensemble '{name}'", io.data_type, _full_shape(io.dims, config.max_batch_size), ens_batching))
    for i, step in enumerate(config.ensemble_scheduling.step):
        field = f"ensemble_scheduling.step[{i}]"
        target = configs.get(step.model_name)
        if not step.model_name:
            continue
        if target is None:
            out.error(
                "TG190", f"{field}.model_name",
                f"{field} calls model '{step.model_name}', which is not in the repository "
                f"(models: {sorted(configs)})",
                f"add model '{step.model_name}' to the repository or fix the step's model_name",
            )
            continue
        if not target.input and not target.output:
            continue  # auto-completed model: its tensors are unknown here
        t_inputs = {i.name: i for i in target.input}
        t_outputs = {o.name: o for o in target.output}
        unmapped = [inp.name for inp in target.input if not inp.optional and inp.name not in step.input_map]
        # no input_map at all is TG182; a key that is not an input is TG191 (the likely typo)
        if unmapped and step.input_map and all(key in t_inputs for key in step.input_map):
            out.error(
                "TG195", f"{field}.input_map",
                f"{field} calls model '{step.model_name}' but maps none of the ensemble's tensors to its "
                f"required input{'s' * (len(unmapped) > 1)} {unmapped} (the step maps {sorted(step.input_map)})",
                f"add input_map {{ key: \"{unmapped[0]}\" value: \"<ensemble tensor>\" }} to the step, or mark "
                f"'{unmapped[0]}' optional in '{step.model_name}'",
            )
        for key in sorted(step.input_map):
            if key not in t_inputs:
                out.error(
                    "TG191", f"{field}.input_map",
                    f"{field} maps ensemble tensor '{step.input_map[key]}' to '{key}', which is not an input "
                    f"of model '{step.model_name}' (its inputs: {sorted(t_inputs)})",
                    f"use one of {sorted(t_inputs)} as the input_map key",
                )
            else:
                io = t_inputs[key]
                seen[step.input_map[key]].append(
                    (f"model '{step.model_name}' input '{key}'", io.data_type,
                     _full_shape(io.dims, target.max_batch_size), target.max_batch_size > 0)
                )
        for key in sorted(step.output_map):
            if key not in t_outputs:
                out.error(
                    "TG192", f"{field}.output_map",
                    f"{field} maps '{key}' to ensemble tensor '{step.output_map[key]}', but '{key}' is not "
                    f"an output of model '{step.model_name}' (its outputs: {sorted(t_outputs)})",
                    f"use one of {sorted(t_outputs)} as the output_map key",
                )
            else:
                io = t_outputs[key]
                seen[step.output_map[key]].append(
                    (f"model '{step.model_name}' output '{key}'", io.data_type,
                     _full_shape(io.dims, target.max_batch_size), target.max_batch_size > 0)
                )
        if target.max_batch_size > 0 and config.max_batch_size > target.max_batch_size:
            out.error(
                "TG193", "max_batch_size",
                f"max_batch_size is {config.max_batch_size} but step {i} calls model '{step.model_name}' "
                f"whose max_batch_size is {target.max_batch_size}",
                f"lower the ensemble's max_batch_size to {target.max_batch_size}, or raise "
                f"'{step.model_name}' max_batch_size to {config.max_batch_size}",
            )
    _decoupled_branches(config, configs, out)
    for tensor in sorted(seen):
        entries = seen[tensor]
        first = entries[0]
        for other in entries[1:]:
            if first[1] != DataType.TYPE_INVALID and other[1] != DataType.TYPE_INVALID and first[1] != other[1]:
                out.error(
                    "TG194", "ensemble_scheduling.step",
                    f"ensemble tensor '{tensor}' is {_dtype(first[1])} for {first[0]} but "
                    f"{_dtype(other[1])} for {other[0]}",
                    "make the data types equal on both sides of the mapping",
                )
                break
            if first[3] == other[3] and first[2] and other[2] and not _shapes_compatible(first[2], other[2]):
                out.error(
                    "TG194", "ensemble_scheduling.step",
                    f"ensemble tensor '{tensor}' has shape {_dims(first[2])} for {first[0]} but "
                    f"{_dims(other[2])} for {other[0]} (batch dimension included)",
                    "make the dims agree on both sides of the mapping (-1 matches any size)",
                )
                break
    return out.findings


def _decoupled_branches(config: ModelConfig, configs: Mapping[str, ModelConfig], out: _Collector) -> None:
    """The server labels every ensemble tensor with the decoupled step it descends from (the
    ensemble's inputs: none; a decoupled step's outputs: a label of their own; any other step's:
    its inputs' label) and refuses a step whose inputs carry two labels: the responses of two
    decoupled models cannot be paired up."""
    label = {inp.name: 0 for inp in config.input}
    steps = list(enumerate(config.ensemble_scheduling.step))
    fresh = 0
    while steps:
        ready = [(i, st) for i, st in steps if all(t in label for t in st.input_map.values())]
        if not ready:
            return  # a tensor nothing produces, or a cycle: TG186 says so
        for i, step in ready:
            steps.remove((i, step))
            origins = sorted({label[t] for t in step.input_map.values()})
            if len(origins) > 1:
                out.error(
                    "TG197", f"ensemble_scheduling.step[{i}].input_map",
                    f"ensemble_scheduling.step[{i}] (model '{step.model_name}') reads tensors "
                    f"{sorted(step.input_map.values())} that descend from different decoupled models; the server "
                    "cannot pair their responses",
                    "feed the step from one decoupled branch only (or make one of the upstream models non-decoupled)",
                )
            target = configs.get(step.model_name)
            if target is not None and target.model_transaction_policy.decoupled:
                fresh += 1
                outgoing = fresh
            else:
                outgoing = origins[0] if origins else 0
            for tensor in step.output_map.values():
                label.setdefault(tensor, outgoing)
    outputs = [o.name for o in config.output if o.name in label]
    if len({label[o] for o in outputs}) > 1:
        out.error(
            "TG197", "output",
            f"the ensemble's outputs {outputs} descend from different decoupled models; the server cannot "
            "pair their responses into one",
            "produce every ensemble output from one decoupled branch (or make the upstream models non-decoupled)",
        )


def _ensemble_cycles(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    """An ensemble that reaches itself through its steps' ensembles never finishes loading."""
    calls = {name: [st.model_name for st in c.ensemble_scheduling.step if is_ensemble(configs.get(st.model_name, ModelConfig()))]
             for name, c in configs.items() if is_ensemble(c)}
    findings: list[Finding] = []
    for start in sorted(calls):
        path, stack = [start], [(start, iter(calls[start]))]
        found = None
        while stack and found is None:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
            elif child == start:
                found = path + [start]
            elif child not in path and child in calls:
                path.append(child)
                stack.append((child, iter(calls[child])))
        if found is not None:
            out = _Collector(start)
            out.error(
                "TG196", "ensemble_scheduling.step",
                f"ensemble '{start}' calls itself: {' -> '.join(found)}; the server refuses the whole cycle",
                "break the cycle: no ensemble may call itself directly or through other ensembles",
            )
            findings += out.findings
    return findings


def _rate_limiter_scopes(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    scopes: dict[str, dict[bool, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for name in sorted(configs):
        for i, group in enumerate(configs[name].instance_group):
            for j, res in enumerate(group.rate_limiter.resources):
                if res.name:
                    scopes[res.name][bool(getattr(res, "global"))].append(
                        (name, f"instance_group[{i}].rate_limiter.resources[{j}]")
                    )
    findings = []
    for rname in sorted(scopes):
        by_scope = scopes[rname]
        if by_scope.get(True) and by_scope.get(False):
            global_users = sorted({m for m, _ in by_scope[True]})
            device_users = sorted({m for m, _ in by_scope[False]})
            for model, field in by_scope[True]:
                findings.append(
                    Finding(
                        "warning", "TG128", model, f"{field}.global",
                        f"model '{model}': rate_limiter resource '{rname}' is global here but per-device in "
                        f"{device_users}; with --rate-limit=execution_count the server refuses the model "
                        "loaded second",
                        f"use one scope for '{rname}' everywhere (global: true in {device_users} too, or "
                        f"drop global in {global_users}), or rename one of them",
                    )
                )
    return findings
