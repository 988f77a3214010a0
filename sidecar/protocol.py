"""Reading and minimally rewriting Triton requests: KServe v2 HTTP (JSON with optional binary
tensor data), the HTTP `generate` extension, and gRPC `ModelInferRequest`. Pure functions.

The sidecar reads only what admission needs (the prompt lengths and max_tokens of LLM requests,
the traffic-class parameter, the tenant header) and writes only the `priority` parameter. Tensor
data, binary or not, is never decoded beyond the prompt's length prefix and is passed on byte for
byte.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sidecar.cost import LLMFacts, TokenCounter
from tritongen.core.llm_interface import int_or_none
from tritongen.core.sidecar_policy.base import DEFAULT_TENANT, NAME_MAX_LENGTH, NAME_PATTERN
from tritongen.core.sidecar_policy.kv_cost import KVCost

log = logging.getLogger("tritongen.sidecar.protocol")
Prompt = bytes | memoryview | None  # a prompt's UTF-8 bytes; None: unreadable here (shared memory)

HEADER_LENGTH = "Inference-Header-Content-Length"

_TENANT_NAME = re.compile(NAME_PATTERN)

_NUMERIC = {
    "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q",
    "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
}


class BadRequest(Exception):
    """A malformed request; str() is the reason sent back with the 400."""


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


def decode_ints(raw: bytes | memoryview, datatype: str) -> list[int]:
    code = _NUMERIC.get(datatype.upper())
    if code is None:
        raise BadRequest(f"max_tokens has datatype {datatype}; an integer type is expected")
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


def _int_list(values: Iterable[Any], what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise BadRequest(f"{what} must hold integers, got {v!r}")
        out.append(int(v))
    return out


def _sampling_max_tokens(text: Any) -> int | None:
    """vLLM-style `sampling_parameters` (a JSON string) may carry max_tokens."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        raise BadRequest("sampling_parameters is not valid JSON") from None
    return _count(doc.get("max_tokens") if isinstance(doc, dict) else None)


def _count(value: Any) -> int | None:
    """max_tokens as the backend casts it (`int_or_none`: an integer, or a numeric string as vLLM's
    own sample client sends); a negative count says nothing."""
    count = int_or_none(value)
    return count if count is not None and count >= 0 else None


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


def infer_llm_facts(body: InferBody, kv: KVCost, count: TokenCounter | None = None) -> LLMFacts:
    binary = _binary_slices(body)
    prompts: list[Prompt] = []
    max_tokens: list[int | None] = []
    for tensor in body.header["inputs"]:
        name = tensor.get("name")
        params = tensor.get("parameters") or {}
        if name == kv.prompt_input:
            if name in binary:
                prompts = list(decode_bytes_elements(binary[name]))
            elif "data" in tensor:
                prompts = [_utf8(v) for v in _flatten(tensor["data"])]
            elif "shared_memory_region" in params:
                prompts = [None]  # unreadable here: charged a full context
            else:
                raise BadRequest(f"input {name!r} has neither `data` nor binary data")
        elif name == kv.max_tokens_input:
            datatype = str(tensor.get("datatype", "INT32"))
            if name in binary:
                max_tokens = list(decode_ints(binary[name], datatype))
            elif "data" in tensor:
                max_tokens = list(_int_list(_flatten(tensor["data"]), f"input {name!r}"))
        elif name == "sampling_parameters" and "data" in tensor:
            values = _flatten(tensor["data"])
            found = _sampling_max_tokens(values[0]) if values else None
            if found is not None and not max_tokens:
                max_tokens = [found]
    if not max_tokens:
        found = _param_max_tokens(body.parameters)
        if found is not None:
            max_tokens = [found]
    if not prompts:
        prompts = [None]
    return _facts(prompts, max_tokens, count)


def _facts(prompts: list[Prompt], max_tokens: list[int | None], count: TokenCounter | None) -> LLMFacts:
    if len(max_tokens) not in (0, 1, len(prompts)):
        max_tokens = [max((m for m in max_tokens if m is not None), default=None)]
    lengths = [None if p is None else len(p) for p in prompts]
    if count is None:
        return LLMFacts(lengths, max_tokens)
    try:
        tokens = [None if p is None else count(bytes(p)) for p in prompts]
    except Exception as err:  # a prompt the tokenizer cannot read: the byte-ratio estimate stands
        log.debug("token count failed (%s: %s); using the bytes-per-token ratio", type(err).__name__, err)
        return LLMFacts(lengths, max_tokens)
    return LLMFacts(lengths, max_tokens, prompt_tokens=tokens)


def _param_max_tokens(parameters: Any) -> int | None:
    if isinstance(parameters, dict):
        return _count(parameters.get("max_tokens"))
    return None


def _utf8(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode("utf-8")


def infer_class(body: InferBody, key: str) -> str | None:
    return _class_value(body.parameters, key)


def infer_with_priority(body: InferBody, priority: int) -> tuple[bytes, str | None]:
    """The body with `parameters.priority` set; the new Inference-Header-Content-Length if binary."""
    header = dict(body.header)
    params = dict(header.get("parameters") or {})
    params["priority"] = priority
    header["parameters"] = params
    head = json.dumps(header, separators=(",", ":")).encode()
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


def generate_llm_facts(doc: dict[str, Any], kv: KVCost, count: TokenCounter | None = None) -> LLMFacts:
    text = doc.get(kv.prompt_input)
    if text is None:
        prompts: list[Prompt] = [None]
    else:
        prompts = [_utf8(v) for v in _flatten(text)]
    raw = doc.get(kv.max_tokens_input)
    max_tokens: list[int | None] = []
    if raw is not None:
        max_tokens = list(_int_list(_flatten(raw), kv.max_tokens_input))
    if not max_tokens:
        found = _param_max_tokens(doc.get("parameters"))
        if found is None and "sampling_parameters" in doc:
            sp = doc["sampling_parameters"]
            found = _sampling_max_tokens(sp if isinstance(sp, str) else json.dumps(sp))
        if found is not None:
            max_tokens = [found]
    return _facts(prompts, max_tokens, count)


def generate_class(doc: dict[str, Any], key: str) -> str | None:
    return _class_value(doc.get("parameters"), key)


def generate_with_priority(doc: dict[str, Any], priority: int) -> bytes:
    out = dict(doc)
    params = dict(out.get("parameters") or {})
    params["priority"] = priority
    out["parameters"] = params
    return json.dumps(out, separators=(",", ":")).encode()


# ------------------------------------------------------------------------------------------------
# gRPC ModelInferRequest


def grpc_llm_facts(request: Any, kv: KVCost, count: TokenCounter | None = None) -> LLMFacts:
    """Facts from a `service_pb2.ModelInferRequest` (contents or raw_input_contents)."""
    raw = list(request.raw_input_contents)
    prompts: list[Prompt] = []
    max_tokens: list[int | None] = []
    for index, tensor in enumerate(request.inputs):
        shm = "shared_memory_region" in tensor.parameters
        if tensor.name == kv.prompt_input:
            if raw:
                if index >= len(raw):
                    raise BadRequest(f"raw_input_contents has no entry for input {tensor.name!r}")
                prompts = list(decode_bytes_elements(raw[index]))
            elif len(tensor.contents.bytes_contents):
                prompts = list(tensor.contents.bytes_contents)
            elif shm:
                prompts = [None]
            else:
                raise BadRequest(f"input {tensor.name!r} carries no data")
        elif tensor.name == kv.max_tokens_input:
            if raw:
                if index < len(raw):
                    max_tokens = list(decode_ints(raw[index], tensor.datatype or "INT32"))
            else:
                c = tensor.contents
                values = list(c.int_contents) or list(c.int64_contents) or list(c.uint_contents) or list(c.uint64_contents)
                max_tokens = [int(v) for v in values]
        elif tensor.name == "sampling_parameters":
            data = None
            if raw and index < len(raw):
                blob = bytes(raw[index])
                data = blob[4:4 + struct.unpack_from("<I", blob, 0)[0]] if len(blob) >= 4 else None
            elif len(tensor.contents.bytes_contents):
                data = tensor.contents.bytes_contents[0]
            found = _sampling_max_tokens(data) if data is not None else None
            if found is not None and not max_tokens:
                max_tokens = [found]
    if not max_tokens and "max_tokens" in request.parameters:
        param = request.parameters["max_tokens"]
        kind = param.WhichOneof("parameter_choice")
        if kind in ("int64_param", "uint64_param"):
            max_tokens = [int(getattr(param, kind))]
    if not prompts:
        prompts = [None]
    return _facts(prompts, max_tokens, count)


def grpc_class(request: Any, key: str) -> str | None:
    if key not in request.parameters:
        return None
    param = request.parameters[key]
    if param.WhichOneof("parameter_choice") != "string_param":
        raise BadRequest(f"parameter {key!r} must be a string naming a traffic class")
    return param.string_param


def grpc_set_priority(request: Any, priority: int) -> None:
    request.parameters["priority"].uint64_param = priority


# ------------------------------------------------------------------------------------------------
# traffic class


def resolve_class(policy: Any, header_value: str | None, param_value: str | None) -> Any:
    """The request's class: the header, else the request parameter, else the policy's default.
    An unknown name is a 400 (a typo must not silently become the default class)."""
    name = header_value if header_value else param_value
    if not name:
        return policy.class_named(policy.default_class)
    found = policy.class_named(name.strip())
    if found is None:
        known = ", ".join(c.name for c in policy.classes)
        raise BadRequest(f"unknown traffic class {name!r}; known classes: {known}")
    return found


# ------------------------------------------------------------------------------------------------
# tenant


def resolve_tenant(header_value: str | None) -> str:
    """The request's tenant: the tenant header's value, or `default` when it is absent or empty.

    Any name is accepted (tenants the policy does not list get its `default_tenant` quota), but
    only in the policy's name syntax: the value becomes part of error bodies, logs and a
    dictionary key, so a value that could not be a tenant name is a 400 rather than carried along.
    """
    if header_value is None:
        return DEFAULT_TENANT
    name = header_value.strip()
    if not name:
        return DEFAULT_TENANT
    if len(name) > NAME_MAX_LENGTH or not _TENANT_NAME.fullmatch(name):
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise BadRequest(
            f"tenant {shown!r} is not a tenant name: use letters, digits, '_', '.' and '-' (starting with a "
            f"letter or digit), at most {NAME_MAX_LENGTH} characters"
        )
    return name
