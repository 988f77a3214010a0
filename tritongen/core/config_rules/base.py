"""What the rules of every concern share: the platform and type constants, shape helpers, and
the `Collector` that turns a rule code into a finding (refusing a code the catalogue lacks)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tritongen.core.config_rules.catalogue import RULES
from tritongen.core.findings import Finding, Severity
from tritongen.core.model_config_enums import ControlKind, DataType

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig

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
BOOL_CONTROLS = (
    ControlKind.CONTROL_SEQUENCE_START,
    ControlKind.CONTROL_SEQUENCE_END,
    ControlKind.CONTROL_SEQUENCE_READY,
)


def dtype_name(value: int) -> str:
    return DataType.Name(value) if value in DataType.values() else str(value)


def dims_text(dims: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def full_shape(dims: Sequence[int], max_batch_size: int) -> list[int]:
    return ([WILDCARD] if max_batch_size > 0 else []) + list(dims)


def shapes_compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD in (x, y) for x, y in zip(a, b))


def element_chunks(shape: Sequence[int]) -> list[int]:
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


class Collector:
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
