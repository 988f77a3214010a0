"""The Triton side both stand-ins share: reading one-value inputs, streaming an engine's tokens
as responses, starting the engine from the model's `1/standin.json`.

Imported by `backends/vllm/model.py` and `repository/reserve_llm/1/model.py` (each holds a link to
this file and to `standin_engine.py` beside it); it needs `triton_python_backend_utils`, so only
the server's stub imports it.
"""

from __future__ import annotations

import os

import numpy as np
import triton_python_backend_utils as pb_utils

from standin_engine import Costs, Engine, EngineConfig, EngineStats, GrowPreempt, ReserveKill, Sink

COSTS_FILE = "standin.json"

# engine error kind -> pb_utils.TritonError code name ("oom" is chosen per model: `oom_code`)
ERROR_CODES = {
    "invalid": "INVALID_ARG",
    "cancelled": "CANCELLED",
    "unavailable": "UNAVAILABLE",
    "internal": "INTERNAL",
}


class BadRequest(Exception):
    """A request refused before it reaches the engine (INVALID_ARG)."""


def triton_error(message: str, code_name: str):
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    return pb_utils.TritonError(message, code)


def send_error(sender, message: str, code_name: str) -> None:
    sender.send(
        pb_utils.InferenceResponse(error=triton_error(message, code_name)),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    )


def scalar(request, name: str, required: bool = False):
    """The one value of a [1]-shaped input as a Python value (bytes, bool, int), or None when an
    optional input is absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None and required:
        raise BadRequest(f"input {name} is missing")
    values = None if tensor is None else tensor.as_numpy()
    if values is not None and values.size != 1:
        raise BadRequest(f"input {name} must hold exactly one value, got shape {list(values.shape)}")
    return None if values is None else values.item()


def int_parameters(model_config: dict, defaults: dict[str, int], model: str) -> dict[str, int]:
    """The config's string `parameters` named in `defaults` as whole numbers of 1 or more (a missing
    or empty one: its default); a bad one stops the model loading, naming it."""
    params = model_config.get("parameters", {})
    values = {}
    for key, default in defaults.items():
        raw = params.get(key, {}).get("string_value", "")
        try:
            values[key] = int(raw) if raw.strip() else default
        except ValueError as err:
            raise pb_utils.TritonModelException(f"{model}: parameter {key} must be an integer, got {raw!r}") from err
        if values[key] < 1:
            raise pb_utils.TritonModelException(f"{model}: parameter {key} must be >= 1, got {values[key]}")
    return values


def as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def require_decoupled(model_config: dict, model: str) -> None:
    if not pb_utils.using_decoupled_model_transaction_policy(model_config):
        raise pb_utils.TritonModelException(
            f"{model} streams one response per token: its config needs model_transaction_policy {{ decoupled: true }}"
        )


def model_version_dir(args: dict) -> str:
    """The model's version directory (where model.json and standin.json live)."""
    get_model_dir = getattr(pb_utils, "get_model_dir", None)
    if get_model_dir is not None:
        return get_model_dir()
    return os.path.join(args["model_repository"], args["model_version"])


def start_engine(args: dict, policy: GrowPreempt | ReserveKill, max_running: int, on_step=None) -> Engine:
    """An engine thread with the costs of the model's standin.json, started."""
    path = os.path.join(model_version_dir(args), COSTS_FILE)
    try:
        costs = Costs.from_file(path)
        cfg = EngineConfig(costs=costs, policy=policy, max_running=max_running)
    except (OSError, ValueError) as err:
        raise pb_utils.TritonModelException(f"{args.get('model_name', 'stand-in')}: {err}") from err
    engine = Engine(cfg, on_step=on_step)
    if on_step is not None:
        on_step(engine.stats())
    engine.start()
    pb_utils.Logger.log_info(f"{args.get('model_name')}: stand-in engine {cfg}")
    return engine


class ResponseSink(Sink):
    """`stream`: one response per token, the last flagged final; else one final response holding
    the whole output. Subclasses add outputs through `tensors()`."""

    oom_code = "UNAVAILABLE"

    def __init__(self, sender, stream: bool) -> None:
        self.sender = sender
        self.stream = stream
        self.pieces: list[str] = []

    def tensors(self, text: str, tokens: int, first: bool) -> list:
        """The response's outputs: `text` of `tokens` new tokens (`first`: the request's first response)."""
        return [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]

    def token(self, text: str, index: int, final: bool) -> None:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if self.stream:
            response = pb_utils.InferenceResponse(output_tensors=self.tensors(text, 1, index == 0))
            self.sender.send(response, flags=flags)
            return
        self.pieces.append(text)
        if final:
            response = pb_utils.InferenceResponse(output_tensors=self.tensors("".join(self.pieces), len(self.pieces), True))
            self.sender.send(response, flags=flags)

    def error(self, message: str, kind: str) -> None:
        send_error(self.sender, message, self.oom_code if kind == "oom" else ERROR_CODES.get(kind, "INTERNAL"))

    def cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())


class MetricPublisher:
    """pb_utils metrics fed from EngineStats, pushing only changed values (each is an IPC).

    `spec`: name -> (kind "gauge" | "counter", stats attribute, description). Keeps every
    MetricFamily alive as long as its Metric (the Python backend requires it).
    """

    def __init__(self, spec: dict[str, tuple[str, str, str]], labels: dict[str, str]) -> None:
        self.spec = spec
        self.families = {}
        self.metrics = {}
        self.published: dict[str, float] = {}
        for name, (kind, _attr, description) in spec.items():
            family_kind = pb_utils.MetricFamily.GAUGE if kind == "gauge" else pb_utils.MetricFamily.COUNTER
            family = pb_utils.MetricFamily(name=name, description=description, kind=family_kind)
            self.families[name] = family
            self.metrics[name] = family.Metric(labels=labels)

    def publish(self, stats: EngineStats) -> None:
        for name, (kind, attr, _description) in self.spec.items():
            value = float(getattr(stats, attr))
            last = self.published.get(name)
            if value == last:
                continue
            if kind == "gauge":
                self.metrics[name].set(value)
            elif value != (last or 0.0):
                self.metrics[name].increment(value - (last or 0.0))
            self.published[name] = value

    def close(self) -> None:
        self.metrics.clear()  # metrics before their families
        self.families.clear()
