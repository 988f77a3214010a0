"""Rules on inputs and outputs: names, data types, dims and reshapes, formats, and the batch
inputs and outputs of ragged batching."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import BATCH_INPUT_TYPES, Collector, WILDCARD, dims_text, dtype_name, element_chunks, is_tensorrt
from tritongen.core.model_config_enums import BatchInputKind, BatchOutputKind, DataType, InputFormat

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_io(config: ModelConfig, out: Collector, autofill_source: str | None = None) -> None:
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
                    f"{label} ({field}) has dims {dims_text(dims)}; {', '.join(map(str, bad))} is not allowed "
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
                        f"{label} ({field}) has reshape {dims_text(shape)}; {', '.join(map(str, bad_shape))} "
                        "is not allowed",
                        "use positive sizes or -1",
                    )
                elif dims and not bad and element_chunks(dims) != element_chunks(shape):
                    out.error(
                        "TG134", f"{field}.reshape",
                        f"{label} ({field}) has dims {dims_text(dims)} but reshape {dims_text(shape)}; they do not "
                        "hold the same number of elements (compared between -1 dimensions)",
                        "make the reshape hold exactly the elements of dims, with -1 in the same groups",
                    )
            if kind == "input" and io.format in (InputFormat.FORMAT_NHWC, InputFormat.FORMAT_NCHW):
                if len(dims) != 3:  # dims, not reshape: densenet_onnx reshapes [3,224,224] to 4 dims
                    out.error(
                        "TG136", f"{field}.format",
                        f"{label} ({field}) has format {InputFormat.Name(io.format)} with dims "
                        f"{dims_text(dims)}; NHWC/NCHW need exactly 3 dims",
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


def check_batch_io(config: ModelConfig, out: Collector) -> None:
    inputs = {i.name for i in config.input}
    outputs = {o.name for o in config.output}
    for i, bi in enumerate(config.batch_input):
        field = f"batch_input[{i}]"
        if len(bi.source_input) != 1:
            kind = BatchInputKind.Name(bi.kind)
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
        dtype = dtype_name(bi.data_type)
        if dtype not in BATCH_INPUT_TYPES:
            out.error(
                "TG141", f"{field}.data_type",
                f"{field}.data_type is {dtype}; batch inputs must be TYPE_INT32 or TYPE_FP32",
                "set data_type: TYPE_INT32 or TYPE_FP32",
            )
    for i, bo in enumerate(config.batch_output):
        field = f"batch_output[{i}]"
        if len(bo.source_input) != 1:
            kind = BatchOutputKind.Name(bo.kind)
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
