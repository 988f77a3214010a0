"""tritongen's vLLM backend for Triton: a Python-based backend named "vllm" that hosts a real vLLM
async engine and speaks the interface of Triton's own vLLM backend (triton-inference-server/
vllm_backend), so a model repository written for that backend serves unchanged.

Why our own: the upstream backend is not on PyPI, and the project's Triton comes from the
nvidia-pytriton wheel. This file was written from the upstream's documented interface; no code
of it is copied. Serve it with `ServerOptions(python_backends={"vllm": <this directory>})`.

Per model (as upstream):
  * `1/model.json` holds vLLM `AsyncEngineArgs` (unknown names are refused with the name);
  * inputs  text_input STRING [1]; optional stream BOOL, sampling_parameters STRING (JSON),
            exclude_input_in_output BOOL, return_finish_reason / return_cumulative_logprob /
            return_logprobs / return_num_input_tokens / return_num_output_tokens BOOL, image;
  * outputs text_output, finish_reason, cumulative_logprob, logprobs, num_input_tokens,
            num_output_tokens; `max_batch_size` 0 and decoupled, filled in by auto-complete.

Metrics: with the config parameter `REPORT_CUSTOM_METRICS` "true" and `disable_log_stats` false,
exactly the eight families the upstream backend reports (see `vllm_metrics.UPSTREAM`), and no KV or
queue gauge: a real deployment shows its queue only in TTFT, and tritongen must work from that.
The opt-in parameter `REPORT_ENGINE_GAUGES` "true" adds the engine's gauges as vLLM's own OpenAI
server exports them (running, waiting, KV usage, preemptions, cache_config_info).

Errors the engine raises (a prompt longer than max_model_len, bad sampling parameters) reach the
client verbatim as the response's error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from vllm_interface import OPTIONAL_BOOLS, auto_complete  # noqa: E402
from vllm_metrics import EngineMetrics, stat_logger_factory  # noqa: E402

ENGINE_ARGS_FILE = "model.json"

class BadRequest(Exception):
    """Refused before the engine sees it (INVALID_ARG)."""


def _true(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _parameter(config: dict, key: str) -> str:
    return str((config.get("parameters") or {}).get(key, {}).get("string_value", ""))


def _scalar(request, name: str, required: bool = False):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise BadRequest(f"input {name} is missing")
        return None
    values = tensor.as_numpy()
    if values.size != 1:
        raise BadRequest(f"input {name} must hold exactly one value, got shape {list(values.shape)}")
    return values.item()


def _send_error(sender, message: str, code=None) -> None:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def read_engine_args(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            args = json.load(handle)
    except (OSError, ValueError) as err:
        raise pb_utils.TritonModelException(f"'{ENGINE_ARGS_FILE}' holding the vLLM engine args could not be read: {err}") from err
    if not isinstance(args, dict):
        raise pb_utils.TritonModelException(f"{path}: expected a JSON object of vLLM engine args")
    return args


def engine_args_from(args: dict, path: str):
    """vLLM's AsyncEngineArgs; an unknown name is named in the error (vLLM's own TypeError is not)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise pb_utils.TritonModelException(f"{path}: {unknown} are not vLLM engine arguments (AsyncEngineArgs)")
    return AsyncEngineArgs(**args)


def sampling_params_from(raw, defaults_max_tokens: int | None = None):
    """vLLM SamplingParams from the request's JSON; values may be JSON strings ("16", "true"), as
    Triton clients often send them, and are converted by the field's default type."""
    from vllm import SamplingParams

    try:
        params = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else (raw or "{}"))
    except ValueError as err:
        raise BadRequest(f"sampling_parameters is not JSON: {err}") from err
    if not isinstance(params, dict):
        raise BadRequest("sampling_parameters must be a JSON object")
    template = SamplingParams()
    out = {}
    for key, value in params.items():
        default = getattr(template, key, None)
        if isinstance(value, str) and isinstance(default, bool):
            value = _true(value)
        elif isinstance(value, str) and isinstance(default, int):
            try:
                value = int(value)
            except ValueError as err:
                raise BadRequest(f"sampling_parameters: {key} must be an integer, got {value!r}") from err
        elif isinstance(value, str) and isinstance(default, float):
            try:
                value = float(value)
            except ValueError as err:
                raise BadRequest(f"sampling_parameters: {key} must be a number, got {value!r}") from err
        out[key] = value
    try:
        return SamplingParams(**out)
    except (TypeError, ValueError) as err:
        raise BadRequest(str(err)) from err


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        return auto_complete(auto_complete_model_config)

    def initialize(self, args):
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("the vllm backend streams: model_transaction_policy { decoupled: true }")
        version_dir = pb_utils.get_model_dir()
        path = os.path.join(version_dir, ENGINE_ARGS_FILE)
        raw_args = read_engine_args(path)
        engine_args = engine_args_from(raw_args, path)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        report = _true(_parameter(self.model_config, "REPORT_CUSTOM_METRICS")) and not engine_args.disable_log_stats
        gauges = _true(_parameter(self.model_config, "REPORT_ENGINE_GAUGES"))
        self.metrics = None
        loggers = None
        if report or gauges:
            if engine_args.disable_log_stats:
                raise pb_utils.TritonModelException(
                    f"{path}: REPORT_ENGINE_GAUGES needs the engine's stats: set disable_log_stats false"
                )
            self.metrics = EngineMetrics(labels, upstream=report, gauges=gauges)
            loggers = [stat_logger_factory(self.metrics)]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-engine-loop", daemon=True)
        self.thread.start()
        self.engine = AsyncLLM.from_engine_args(engine_args, stat_loggers=loggers)
        if self.metrics is not None:
            cache = self.engine.vllm_config.cache_config
            self.metrics.engine_started(cache.num_gpu_blocks or 0, cache.block_size, self.engine.model_config.max_model_len)
        self.active: set = set()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._parse(request)
            except BadRequest as err:
                _send_error(sender, str(err), pb_utils.TritonError.INVALID_ARG)
                continue
            future = asyncio.run_coroutine_threadsafe(self._generate(sender, *job), self.loop)
            self.active.add(future)
            future.add_done_callback(self.active.discard)
        return None

    def _parse(self, request):
        if pb_utils.get_input_tensor_by_name(request, "image") is not None:
            raise BadRequest("this backend serves text models: the image input is not supported")
        text = _scalar(request, "text_input", required=True)
        prompt = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        flags = {name: bool(value) for name in OPTIONAL_BOOLS if (value := _scalar(request, name)) is not None}
        stream = flags.get("stream", False)
        prepend = not flags.get("exclude_input_in_output", stream)
        if prepend and stream:
            raise BadRequest("when streaming, exclude_input_in_output = False is not allowed")
        raw = _scalar(request, "sampling_parameters")
        if raw is None:
            raw = request.parameters()  # as upstream: the request's own parameters
        params = sampling_params_from(raw)
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        return prompt, params, stream, prepend, flags

    async def _generate(self, sender, prompt, params, stream, prepend, flags):
        request_id = uuid.uuid4().hex
        try:
            async for output in self.engine.generate(prompt, params, request_id):
                if sender.is_cancelled():
                    await self.engine.abort(request_id)
                    _send_error(sender, "the request was cancelled", pb_utils.TritonError.CANCELLED)
                    return
                completion = output.outputs[0]
                text = completion.text
                if prepend and not stream:
                    text = prompt + text
                response = self._response(text, output, completion, len(completion.token_ids), flags)
                final = output.finished
                if stream or final:
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
                if final:
                    return
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except asyncio.CancelledError:
            await self.engine.abort(request_id)
            raise
        except Exception as err:  # the engine's own words reach the client
            _send_error(sender, f"{type(err).__name__}: {err}" if not str(err) else str(err))

    @staticmethod
    def _response(text, output, completion, tokens, flags):
        out = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        if flags.get("return_finish_reason"):
            out.append(pb_utils.Tensor("finish_reason", np.array([str(completion.finish_reason).encode()], dtype=np.object_)))
        if flags.get("return_cumulative_logprob"):
            value = completion.cumulative_logprob or 0.0
            out.append(pb_utils.Tensor("cumulative_logprob", np.array([value], dtype=np.float32)))
        if flags.get("return_logprobs"):
            logprobs = completion.logprobs
            encoded = json.dumps(
                [{str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in step.items()} for step in logprobs]
                if logprobs else None
            )
            out.append(pb_utils.Tensor("logprobs", np.array([encoded.encode()], dtype=np.object_)))
        if flags.get("return_num_input_tokens"):
            count = len(output.prompt_token_ids or [])
            out.append(pb_utils.Tensor("num_input_tokens", np.array([count], dtype=np.uint32)))
        if flags.get("return_num_output_tokens"):
            out.append(pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=out)

    def finalize(self):
        for future in list(self.active):
            future.cancel()
        try:
            self.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5.0)
            if self.metrics is not None:
                self.metrics.close()
