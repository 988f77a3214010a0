"""The wire side of reading Triton requests: KServe v2 HTTP (JSON with optional binary tensor data),
the HTTP `generate` extension, and gRPC `ModelInferRequest`; and the one change the sidecar makes to
a request, its `priority` parameter. Pure functions.

Each parser says what a request states (`reading.Stated`: the class parameter, a priority of its
own, the prompt's elements, max_tokens wherever it was put) and nothing more; the rules that turn
that into what admission reads, the same for every path, are sidecar/reading.py's. Tensor data,
binary or not, is never decoded beyond the prompt's length prefixes and the budget's elements, and
is passed on byte for byte.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from sidecar.reading import MAX_TOKENS, PRIORITY, SAMPLING, BadRequest, Prompt, Stated
from tritongen.core.sidecar_policy.kv_cost import KVCost

__all__ = ["BadRequest", "HEADER_LENGTH"]  # BadRequest: the name the proxies catch

HEADER_LENGTH = "Inference-Header-Content-Length"

_NUMERIC = {
    "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q",
    "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
    "FP16": "e", "FP32": "f", "FP64": "d",
}
# gRPC InferTensorContents: the fields a number's elements may travel in
_NUMBER_CONTENTS = ("int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
                    "fp64_contents")


# ------------------------------------------------------------------------------------------------
# shared helpers


def _flatten(values: Any) -> list[Any]:
    if isinstance(values, list):
        out: list[Any] = []
        for v in values:
            out.extend(_flatten(v))
        return out
    return [values]


def decode_bytes_elements(raw: bytes | memoryview) -> list[memoryview]:
    """The elements of a BYTES tensor in Triton's binary form (uint32 LE length + bytes), uncopied."""
    view = memoryview(raw)
    elements: list[memoryview] = []
    pos = 0
    while pos < len(view):
        if pos + 4 > len(view):
            raise BadRequest("BYTES tensor data ends inside an element's 4-byte length prefix")
        (n,) = struct.unpack_from("<I", view, pos)
        if pos + 4 + n > len(view):
            raise BadRequest(f"BYTES tensor element of {n} bytes runs past the end of its data")
        elements.append(view[pos + 4:pos + 4 + n])
        pos += 4 + n
    return elements


def decode_elements(raw: bytes | memoryview, datatype: str, name: str) -> list[Any]:
    """A numeric or BYTES tensor's elements from its binary form (the budget's: the rules judge them)."""
    kind = datatype.upper()
    if kind == "BYTES":
        return list(decode_bytes_elements(raw))
    code = _NUMERIC.get(kind)
    if code is None:
        raise BadRequest(f"input {name!r} has datatype {datatype}; a number is expected")
    size = struct.calcsize(code)
    if len(raw) % size:
        raise BadRequest(f"{datatype} tensor data of {len(raw)} bytes is not a whole number of elements")
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def _class_value(parameters: Any, key: str) -> str | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise BadRequest("`parameters` must be a JSON object")
    value = parameters.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"parameter {key!r} must be a string naming a traffic class, got {value!r}")
    return value


def _json_stated(parameters: dict[str, Any] | None, class_key: str, prompts: tuple[Prompt, ...] | None = None,
                 budget: tuple[Any, ...] = (), sampling: Any = None, ids: tuple[int, ...] = ()) -> Stated:
    """What a JSON request states (HTTP `infer`'s header, a `generate` body): its parameters and,
    for an LLM (`prompts` given), what its tensors said (`ids`: a token-id prompt's counts)."""
    if not parameters:
        return Stated(None, False, prompts or (), budget, sampling, None, ids)
    return Stated(_class_value(parameters, class_key), PRIORITY in parameters, prompts or (), budget, sampling,
                  parameters.get(MAX_TOKENS) if prompts is not None else None, ids)


def id_counts(total: int, shape: Any, name: str) -> tuple[int, ...]:
    """Each sequence's number of ids in a token-id prompt of `total` ids and `shape`: [n] is one
    sequence, [b, n] (a batch dimension) b sequences of n."""
    dims = [int(d) for d in shape]
    rows = dims[0] if len(dims) >= 2 and dims[0] > 0 else 1
    if total % rows:
        raise BadRequest(f"input {name!r} holds {total} ids, not {rows} rows of one length (its shape {dims})")
    return (total // rows,) * rows


def count_ids(raw: bytes | memoryview, datatype: str, name: str) -> int:
    """How many integers a token-id tensor's binary data holds, read from its size alone: the ids
    themselves are never decoded (a long prompt's would cost the hot path microseconds)."""
    code = _NUMERIC.get(datatype.upper())
    if code is None or code in "efd":
        raise BadRequest(f"input {name!r} has datatype {datatype}; token ids are integers (INT32, INT64)")
    size = struct.calcsize(code)
    if len(raw) % size:
        raise BadRequest(f"{datatype} tensor data of {len(raw)} bytes is not a whole number of elements")
    return len(raw) // size


def _generate_ids(value: Any) -> tuple[int, ...]:
    """A generate body's token-id prompt: a list of ids (one sequence) or of lists (one per row)."""
    if isinstance(value, list) and value and all(isinstance(row, list) for row in value):
        return tuple(len(_flatten(row)) for row in value)
    return (len(_flatten(value)),)


def _utf8(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode("utf-8")


class Tensor(NamedTuple):
    """One input tensor as either protocol carries it, for `_tensors_stated`."""

    name: str
    datatype: str
    shape: Any
    raw: bytes | memoryview | None  # its binary data (HTTP binary extension, gRPC raw_input_contents)
    data: list[Any] | None  # its elements sent as values (HTTP JSON `data`, gRPC contents of its datatype)
    text: list[Any] | None  # its elements sent as values read as BYTES (a prompt's, sampling_parameters')
    shared: bool  # in a shared-memory region: unreadable here


def _elements(tensor: Tensor, datatype: str) -> list[Any] | None:
    """The tensor's elements as `datatype`, from its binary data or its values; None: it has neither."""
    if tensor.raw is not None:
        return decode_elements(tensor.raw, datatype, tensor.name)
    return tensor.text if datatype == "BYTES" else tensor.data


def _tensors_stated(tensors: list[Tensor], kv: KVCost) -> tuple[tuple[Prompt, ...], tuple[Any, ...], Any,
                                                                  tuple[int, ...]]:
    """(prompts, budget tensor, sampling_parameters, token-id counts) an LLM request's tensors state,
    by the same reading whichever protocol carried them; an unreadable prompt is charged a full context."""
    prompts: list[Prompt] = []
    budget: list[Any] = []
    sampling = None
    ids: tuple[int, ...] = ()
    for tensor in tensors:
        name = tensor.name
        if name == kv.prompt_input and kv.prompt_token_ids:
            if tensor.raw is not None:
                total = count_ids(tensor.raw, tensor.datatype, name)
            elif tensor.data is not None:
                total = len(tensor.data)
            else:
                prompts = [None]
                continue
            ids = id_counts(total, tensor.shape or [total], name)
        elif name == kv.prompt_input:
            elements = _elements(tensor, "BYTES")
            if elements is not None:
                prompts = [v if isinstance(v, memoryview) else _utf8(v) for v in elements]
            elif tensor.shared:
                prompts = [None]
            else:
                raise BadRequest(f"input {name!r} has neither `data` nor binary data")
        elif name == kv.max_tokens_input:
            budget = _elements(tensor, tensor.datatype) or []
        elif name == SAMPLING:
            elements = _elements(tensor, "BYTES")
            sampling = elements[0] if elements else None
    return tuple(prompts), tuple(budget), sampling, ids


# ------------------------------------------------------------------------------------------------
# HTTP /infer


@dataclass
class InferBody:
    header: dict[str, Any]
    header_length: int | None  # None: the whole body is JSON
    binary: bytes

    @property
    def parameters(self) -> Any:
        return self.header.get("parameters")


def parse_infer(body: bytes, header_length: str | None) -> InferBody:
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} {header_length!r} is not a number") from None
        if n < 0 or n > len(body):
            raise BadRequest(f"{HEADER_LENGTH} {n} is outside the body's {len(body)} bytes")
        head, binary = body[:n], body[n:]
    else:
        head, binary, n = body, b"", None
    try:
        header = json.loads(head)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request JSON is not valid: {err}") from None
    if not isinstance(header, dict):
        raise BadRequest("the request JSON must be an object with `inputs`")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
        raise BadRequest("the request JSON needs `inputs`, a list of tensor objects")
    sizes = 0
    for tensor in inputs:
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"input {tensor.get('name')!r}: `parameters` must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise BadRequest(f"input {tensor.get('name')!r}: binary_data_size must be a whole number")
            sizes += size
    if sizes > len(binary):
        raise BadRequest(
            f"inputs declare {sizes} bytes of binary data but the body carries {len(binary)} after the JSON header"
        )
    if header.get("parameters") is not None and not isinstance(header.get("parameters"), dict):
        raise BadRequest("`parameters` must be a JSON object")
    return InferBody(header, n, binary)


def _binary_slices(body: InferBody) -> dict[str, memoryview]:
    out: dict[str, memoryview] = {}
    view = memoryview(body.binary)
    pos = 0
    for tensor in body.header["inputs"]:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[str(tensor.get("name"))] = view[pos:pos + size]
            pos += size
    return out


def infer_stated(body: InferBody, kv: KVCost | None, class_key: str) -> Stated:
    """What an HTTP infer states; its tensors are read only for an LLM (`kv`)."""
    if kv is None:
        return _json_stated(body.parameters, class_key)
    binary = _binary_slices(body)
    tensors = []
    for t in body.header["inputs"]:
        values = _flatten(t["data"]) if "data" in t else None
        tensors.append(Tensor(str(t.get("name")), str(t.get("datatype") or "INT32"), t.get("shape"),
                              binary.get(str(t.get("name"))), values, values,
                              "shared_memory_region" in (t.get("parameters") or {})))
    return _json_stated(body.parameters, class_key, *_tensors_stated(tensors, kv))


def with_priority(doc: dict[str, Any], priority: int) -> bytes:
    """A JSON request (an infer's header, a generate body) with `parameters.priority` set, compact."""
    params = {**(doc.get("parameters") or {}), PRIORITY: priority}
    return json.dumps({**doc, "parameters": params}, separators=(",", ":")).encode()


def infer_with_priority(body: InferBody, priority: int) -> tuple[bytes, str | None]:
    """The body with its priority written in; the new Inference-Header-Content-Length if binary."""
    head = with_priority(body.header, priority)
    if body.header_length is None:
        return head, None
    return head + body.binary, str(len(head))


# ------------------------------------------------------------------------------------------------
# HTTP /generate and /generate_stream


def parse_generate(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request JSON is not valid: {err}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the generate request must be a JSON object")
    if doc.get("parameters") is not None and not isinstance(doc["parameters"], dict):
        raise BadRequest("`parameters` must be a JSON object")
    return doc


def generate_stated(doc: dict[str, Any], kv: KVCost | None, class_key: str) -> Stated:
    """What a generate body states: its fields are the model's inputs, `parameters` the request's."""
    if kv is None:
        return _json_stated(doc.get("parameters"), class_key)
    text = doc.get(kv.prompt_input)
    ids = _generate_ids(text) if kv.prompt_token_ids and text is not None else ()
    prompts = () if text is None or ids else tuple([_utf8(v) for v in _flatten(text)])
    raw = doc.get(kv.max_tokens_input)
    return _json_stated(doc.get("parameters"), class_key, prompts, () if raw is None else tuple(_flatten(raw)),
                        doc.get(SAMPLING), ids)


# ------------------------------------------------------------------------------------------------
# gRPC ModelInferRequest


def _grpc_parameter(request: Any, key: str) -> Any:
    """A request parameter's value, whatever its kind; None: not sent."""
    if key not in request.parameters:
        return None
    param = request.parameters[key]
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def grpc_stated(request: Any, kv: KVCost | None, class_key: str) -> Stated:
    """What a `service_pb2.ModelInferRequest` states; its tensors are read only for an LLM (`kv`)."""
    class_parameter = None
    if class_key in request.parameters:
        param = request.parameters[class_key]
        if param.WhichOneof("parameter_choice") != "string_param":
            raise BadRequest(f"parameter {class_key!r} must be a string naming a traffic class")
        class_parameter = param.string_param
    names_priority = PRIORITY in request.parameters
    if kv is None:
        return Stated(class_parameter=class_parameter, names_priority=names_priority)
    raw = request.raw_input_contents
    tensors = []
    for index, tensor in enumerate(request.inputs):
        if tensor.name not in (kv.prompt_input, kv.max_tokens_input, SAMPLING):
            continue
        if len(raw) and index >= len(raw):
            raise BadRequest(f"raw_input_contents has no entry for input {tensor.name!r}")
        text = numbers = None  # with raw_input_contents, the contents are not read
        if not len(raw):
            text = list(tensor.contents.bytes_contents) or None
            numbers = next((list(v) for v in (getattr(tensor.contents, f) for f in _NUMBER_CONTENTS) if len(v)), None)
        tensors.append(Tensor(tensor.name, tensor.datatype or "INT32", list(tensor.shape),
                              raw[index] if len(raw) else None, text if tensor.datatype == "BYTES" else numbers, text,
                              "shared_memory_region" in tensor.parameters))
    prompts, budget, sampling, ids = _tensors_stated(tensors, kv)
    return Stated(class_parameter, names_priority, prompts, budget, sampling, _grpc_parameter(request, MAX_TOKENS), ids)


def grpc_set_priority(request: Any, priority: int) -> None:
    request.parameters[PRIORITY].uint64_param = priority
