"""Small, typed wrappers over tritonclient for the calls tritongen makes: one request, one stream.

Inputs are built from a model entry's tensor list, so the same code drives any rendered model
(the demo's smoke requests, and later the profiler's load).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tritongen.core.llm_interface import RequestTensor
from tritongen.core.llm_token_ids import ids_in
from tritongen.core.plan import ModelEntryPlan, TensorView
from tritongen.shared.reach import GRPC, HTTP, grpc_reason, grpc_unreached, stream_cause, unreachable

_NUMPY = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def tensors_from_config(items: list[dict]) -> list[TensorView]:
    """The `input` (or `output`) list of a config as the server serves it (its JSON) as TensorViews."""
    return [
        TensorView(
            name=t["name"],
            data_type=t.get("data_type", "TYPE_FP32"),
            dims=[int(d) for d in t.get("dims", [])],
            optional=bool(t.get("optional", False)),
        )
        for t in items
    ]


def sample_input(tensor: TensorView, batch: int | None, rng: np.random.Generator, prompt: str, max_tokens: int) -> np.ndarray:
    """A plausible value: random features, a text prompt, a small integer for counts like max_tokens."""
    dims = [4 if d == -1 else d for d in tensor.dims]
    shape = ([batch] if batch else []) + dims
    kind = tensor.data_type
    if kind == "TYPE_STRING":
        return np.full(shape, prompt.encode(), dtype=np.object_)
    if kind == "TYPE_BOOL":
        return np.zeros(shape, dtype=np.bool_)
    if kind.startswith("TYPE_INT") or kind.startswith("TYPE_UINT"):
        return np.full(shape, max_tokens, dtype=_NUMPY[kind])
    return rng.standard_normal(shape).astype(_NUMPY.get(kind, np.float32))


def sample_inputs(
    entry: ModelEntryPlan, batch: int = 1, seed: int = 0, prompt: str = "Hello, Triton!", max_tokens: int = 8
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = batch if entry.max_batch_size > 0 else None
    return {t.name: sample_input(t, rows, rng, prompt, max_tokens) for t in entry.inputs}


_WIRE_NUMPY = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
}


def numpy_inputs(tensors: Sequence[RequestTensor]) -> dict[str, np.ndarray]:
    """Arrays for `infer_inputs` from an LLM interface's request (`LLMInterface.request`): each
    tensor's one element filled into its shape, BYTES as UTF-8 bytes in an object array; a
    token-id prompt's ids laid along its last dimension ([n], or [1, n] with a batch dimension)."""
    out: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if isinstance(tensor.value, list):
            if tensor.datatype not in _WIRE_NUMPY or tensor.datatype == "BOOL":
                raise ValueError(f"input {tensor.name!r}: token ids need an integer datatype, got {tensor.datatype}")
            out[tensor.name] = np.asarray(tensor.value, dtype=_WIRE_NUMPY[tensor.datatype]).reshape(tensor.shape)
        elif tensor.datatype == "BYTES":
            value = tensor.value if isinstance(tensor.value, str) else str(tensor.value)
            out[tensor.name] = np.full(tensor.shape, value.encode("utf-8"), dtype=np.object_)
        elif tensor.datatype in _WIRE_NUMPY:
            out[tensor.name] = np.full(tensor.shape, tensor.value, dtype=_WIRE_NUMPY[tensor.datatype])
        else:
            raise ValueError(f"input {tensor.name!r}: datatype {tensor.datatype} is not one an LLM request uses")
    return out


def response_tokens(value: np.ndarray | None, token_ids: bool, counted: np.ndarray | None = None) -> int:
    """The tokens one response's output carries: none when it is absent or holds no element; else
    the model's own count where it sends one (`counted`, the vLLM backend's `num_output_tokens`:
    an engine that runs ahead of its backend merges several steps' tokens into one response, vLLM's
    output collector among them); else, for a model of token ids (`LLMInterface.speaks_token_ids`),
    every id it holds, exactly; else one (a response per token, the streaming convention of text
    models, an empty text included: a token that decodes to nothing yet is still a step)."""
    if value is None or not value.size:
        return 0
    total = int(np.asarray(counted, dtype=np.int64).sum()) if counted is not None and counted.size else None
    return _counted_or_ids_or_one(total, int(value.size) if token_ids else None)


def _counted_or_ids_or_one(counted: int | None, ids: int | None) -> int:
    """The counting rule of a response whose output is there, for gRPC results and SSE events alike:
    the model's own count, else its ids, else one."""
    if counted is not None:
        return counted
    return ids if ids is not None else 1


@dataclass(frozen=True)
class TokenReader:
    """What a streaming client needs to count a model's tokens in each response: the output that
    carries them, whether it holds ids, and the output holding the model's own count, if any."""

    output: str
    token_ids: bool = False
    count_output: str | None = None

    @classmethod
    def of(cls, interface) -> TokenReader:
        """The reader for an `LLMInterface`."""
        return cls(interface.text_output, interface.speaks_token_ids, interface.output_token_count_output)

    def tokens(self, result) -> int:
        """Tokens in one tritonclient result (`response_tokens`)."""
        counted = result.as_numpy(self.count_output) if self.count_output else None
        return response_tokens(result.as_numpy(self.output), self.token_ids, counted)

    def event_tokens(self, event: Mapping) -> int:
        """Tokens in one generate_stream event (its JSON), counted as `tokens` counts a gRPC response:
        none when the event lacks the output (an empty final response), else the model's own count,
        else its ids, else one (an empty text included)."""
        value = event.get(self.output)
        if value is None:
            return 0
        counted = event.get(self.count_output) if self.count_output else None
        total = None
        if isinstance(counted, list):
            total = sum(counted)
        elif isinstance(counted, int) and not isinstance(counted, bool):
            total = counted
        return _counted_or_ids_or_one(total, ids_in(value) if self.token_ids else None)


class RequestInputs(dict):
    """A request's input arrays, with the Triton request parameters it must carry beside them.

    Some LLMs take their token budget in the request's parameters, not in a tensor (an interface
    whose `request_parameters` is not empty); a request sent without them runs at the model's own
    default budget, and a profile would measure the wrong thing. Keeping the parameters on the
    arrays' mapping lets every sender (stream workers, single probes) pass them on without a second
    argument threaded through each call."""

    def __init__(self, arrays: Mapping[str, np.ndarray], parameters: Mapping[str, object] | None = None) -> None:
        super().__init__(arrays)
        self.parameters: dict[str, object] = dict(parameters or {})


def request_parameters_of(inputs: Mapping[str, np.ndarray]) -> dict[str, object] | None:
    """The request parameters `inputs` carries (`RequestInputs`), or None."""
    parameters = getattr(inputs, "parameters", None)
    return dict(parameters) if parameters else None


EMPTY_FINAL = "triton_enable_empty_final_response"


def aio_stream_infer(client, requests, metadata: tuple[tuple[str, str], ...] = ()):
    """`client.stream_infer(requests)` of tritonclient's asyncio gRPC client, with every request
    asking for the empty final response: an async iterator of (InferResult | None, error | None).

    That client (2.73) builds each streamed request from a fixed list of keys, so it drops
    `enable_empty_final_response`, and it refuses `triton_*` request parameters. A model that flags
    its end on a response of its own with no outputs (the final flag alone, a common shape of users'
    Python backends) then never ends the stream for the client: the flag is not sent back without
    it, and every such request ran to the client's timeout. So the requests are built here with the
    library's own builder, the flag set on each message, and sent on the client's stub."""
    import grpc as grpc_module
    from tritonclient.grpc import InferResult
    from tritonclient.grpc._utils import _get_inference_request
    from tritonclient.utils import InferenceServerException

    async def messages():
        async for request in requests:
            message = _get_inference_request(
                model_name=request["model_name"], inputs=request["inputs"], model_version="",
                request_id=request.get("request_id", ""), outputs=None, sequence_id=0, sequence_start=False,
                sequence_end=False, priority=request.get("priority", 0), timeout=None,
                parameters=request.get("parameters"),
            )
            message.parameters[EMPTY_FINAL].bool_param = True
            yield message

    call = client._client_stub.ModelStreamInfer(messages(), metadata=metadata or None)

    class Responses:
        def __aiter__(self):
            return self

        async def __anext__(self):
            try:
                response = await call.__aiter__().__anext__()
            except grpc_module.RpcError as err:
                raise InferenceServerException(msg=str(err.details() if hasattr(err, "details") else err)) from None
            if response.error_message != "":
                return None, InferenceServerException(msg=response.error_message)
            return InferResult(response.infer_response), None

        def cancel(self):
            return call.cancel()

    return Responses()


def infer_inputs(module, inputs: Mapping[str, np.ndarray]) -> list:
    """tritonclient InferInputs (of `module`: tritonclient.http or .grpc) holding `inputs`."""
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, value in inputs.items():
        dtype = "BYTES" if value.dtype == np.object_ else np_to_triton_dtype(value.dtype)
        tensor = module.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


@dataclass(frozen=True)
class UnaryResult:
    latency_s: float
    outputs: dict[str, np.ndarray]


STALL_TIMEOUT = "Request timeout expired"


def infer_http(
    url: str, model: str, inputs: Mapping[str, np.ndarray], output_names: list[str], priority: int = 0,
    retry_stall: bool = False,
) -> UnaryResult:
    """One request. `retry_stall`: send once more when Triton answers "Request timeout expired" to
    a lone request: tritonserver 2.51 sometimes holds a request ~500 ms in a batcher that has queue
    policies (README, "Known server behaviour"), and a shorter REJECT timeout turns that into an
    error. Smoke checks retry it; load measurements never do."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=60)
    try:
        for attempt in (1, 2):
            start = time.perf_counter()
            try:
                result = client.infer(model, infer_inputs(httpclient, inputs), priority=priority)
            except InferenceServerException as err:
                if retry_stall and attempt == 1 and STALL_TIMEOUT in str(err):
                    continue
                raise
            except OSError as err:  # refused, reset, unreachable: say where
                raise unreachable(HTTP, f"http://{url}", None, f"{type(err).__name__}: {err}") from None
            latency = time.perf_counter() - start
            return UnaryResult(latency_s=latency, outputs={n: result.as_numpy(n) for n in output_names})
        raise AssertionError("unreachable")
    finally:
        client.close()


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float | None
    total_s: float
    chunks: list[np.ndarray]
    error: str | None

    def text(self, output: str = "text_output") -> str:
        parts = []
        for chunk in self.chunks:
            for item in np.asarray(chunk).reshape(-1):
                parts.append(item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item))
        return "".join(parts)


def stream_grpc(
    url: str, model: str, inputs: Mapping[str, np.ndarray], output: str, timeout_s: float = 60.0, priority: int = 0,
    retry_stall: bool = False,
) -> StreamResult:
    """One decoupled request over gRPC streaming; TTFT is the first non-empty response.

    `retry_stall`: as for `infer_http`, one more try when the only answer was Triton's stalled-batcher
    "Request timeout expired" before any token."""
    result = _stream_once(url, model, inputs, output, timeout_s, priority)
    if retry_stall and not result.chunks and result.error and STALL_TIMEOUT in result.error:
        result = _stream_once(url, model, inputs, output, timeout_s, priority)
    return result


def _stream_once(
    url: str, model: str, inputs: Mapping[str, np.ndarray], output: str, timeout_s: float, priority: int
) -> StreamResult:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    chunks: list[np.ndarray] = []
    ttft: float | None = None
    error: str | None = None
    start = time.perf_counter()
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(
                model, infer_inputs(grpcclient, inputs), enable_empty_final_response=True, priority=priority
            )
        except InferenceServerException as err:  # the stream broke before the request went out
            responses.put((None, stream_cause(responses, err)))
        deadline = start + timeout_s
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                error = f"no final response after {timeout_s:.0f} s"
                break
            try:
                result, err = responses.get(timeout=remaining)
            except queue.Empty:
                continue
            if err is not None:
                if grpc_unreached(err):
                    raise unreachable(GRPC, url, None, grpc_reason(err))
                error = str(err)
                break
            value = result.as_numpy(output)
            if value is not None and value.size:
                if ttft is None:
                    ttft = time.perf_counter() - start
                chunks.append(value)
            response = result.get_response()
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream(cancel_requests=error is not None)
        client.close()
    return StreamResult(ttft_s=ttft, total_s=time.perf_counter() - start, chunks=chunks, error=error)
