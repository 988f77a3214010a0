"""Which LLM interface a Triton model speaks, and the request that asks it for N tokens.

tritongen sends LLM requests from its profiler, load generator, demo and sidecar. Real LLM models on
Triton do not share one set of inputs: the vLLM backend takes max_tokens inside a JSON string,
TensorRT-LLM's ensemble wants a batch dimension and a required max_tokens tensor, a user's Python
backend may have no stream switch at all. A request built for the wrong interface is refused, or
worse, accepted: a model that was never asked to stream answers with one whole response, and a
profiler counting responses then counts one token. So the interface is read from the model's
config (`detect_interface`; `llm_interface_config.interface_from_config` for a config as Triton serves
it) and requests are built from what was found (`LLMInterface.request`, `.generate_body`), never from
tritongen's own model's names. Reading a request back is `llm_max_tokens`; test prompts are `prompts`.

Four interfaces are recognised:

- "vllm": the vLLM backend (backend "vllm", or any model with a `sampling_parameters` input, e.g. a
  copy of its model.py under backend "python"). max_tokens travels in `sampling_parameters`, or,
  without that tensor, in the request parameters.
- "trtllm": TensorRT-LLM's text-in/text-out models: the `ensemble` and `tensorrt_llm_bls` models of
  all_models/inflight_batcher_llm (text_input, a required max_tokens, stream), and the LLM-API model
  of all_models/llmapi (text_input, sampling_param_max_tokens, streaming).
- "token_ids": models that take the prompt as token ids and answer with ids, TensorRT-LLM's raw
  `tensorrt_llm` model (input_ids, input_lengths, request_output_len -> output_ids) and users' own
  backends alike; their roles and the ids sent are `llm_token_ids`'. `text_input`/`text_output`
  then name the id tensors, a prompt given as text is sent one id per character, and each id of a
  response is one token.
- "generic": Triton's generate-extension convention, the shape of most users' own Python backends
  and of tritongen's tinyllm: a STRING text input, an optional integer max_tokens, an optional BOOL
  stream.

Pure: config data in, tensor descriptions out. No I/O, no numpy, no tritonclient; the adapters
(`tritongen.client.numpy_inputs`) turn `RequestTensor`s into arrays.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from tritongen.core.llm_tensors import StrictRead, TensorInfo, int_or_none, wire_datatype
from tritongen.core.llm_token_ids import prompt_ids, token_id_reason, token_id_roles

Kind = Literal["generic", "vllm", "trtllm", "token_ids"]
Value = str | bool | int | list[int]  # a tensor's one element, or a token-id prompt's ids
_Field = tuple[str, str, Value]  # (input name, wire datatype, value)
Prompt = str | Sequence[int]  # text, or a token-id model's ids

VLLM_DEFAULT_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default: what a vLLM model generates when no max_tokens is sent
(the backend builds its SamplingParams from the request's JSON alone, src/utils/vllm_backend_utils.py
`TritonSamplingParams.from_dict`)."""

# Names accepted for the generic interface's roles, in order of preference. "prompt"/"text" and
# "max_new_tokens"/"max_output_tokens" are what custom Python backends wrapping Hugging Face
# `generate()` or an OpenAI-style API commonly call them; "streaming" is the LLM-API model's name.
# Nothing looser is guessed (no "any STRING input"): a wrong guess sends the prompt into a tensor
# that means something else.
GENERIC_TEXT_INPUTS = ("text_input", "prompt", "text")
GENERIC_MAX_TOKENS_INPUTS = ("max_tokens", "max_new_tokens", "max_output_tokens")
GENERIC_STREAM_INPUTS = ("stream", "streaming")

# Inputs only TensorRT-LLM's ensemble/BLS have (docs/model_config.md, "Unique Inputs for
# tensorrt_llm_bls model" and "Common Inputs"). Plain sampling names (top_k, top_p, temperature)
# are left out on purpose: a user's own model may have those too.
TRTLLM_MARKERS = frozenset({
    "bad_words", "stop_words", "end_id", "pad_id", "beam_width", "length_penalty", "decoder_text_input",
    "embedding_bias_words", "embedding_bias_weights", "prompt_embedding_table", "prompt_vocab_size",
    "lora_task_id", "num_draft_tokens", "use_draft_logits",
})
TRTLLM_MARKERS_NEEDED = 2

_INTEGER_TYPES = frozenset({
    "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
})
_STRING = frozenset({"TYPE_STRING"})
_BOOL = frozenset({"TYPE_BOOL"})

EXPECTED = (
    "tritongen speaks: generic (a STRING text_input, prompt or text; optional integer max_tokens, "
    "max_new_tokens or max_output_tokens; optional BOOL stream), the vLLM backend (backend \"vllm\" or a "
    "sampling_parameters input), TensorRT-LLM ensemble/BLS (text_input, max_tokens and inputs such as "
    "bad_words, stop_words, end_id, pad_id), its LLM-API model (text_input, sampling_param_max_tokens) or token ids "
    "(an integer input_ids, prompt_token_ids, token_ids or tokens [-1]; an integer output_ids, token_ids or "
    "generated_ids)"
)


class UnknownInterface(ValueError):
    """A model tritongen cannot send an LLM request to; the message says why, lists the model's inputs
    and what tritongen expects, in one line; `reason` is what the config lacks, alone."""
    reason: str = ""


class RequestTensor(StrictRead):
    """One input of a request: a single element, or a token-id prompt's ids, which the adapter turns
    into an array of `shape` (a list fills the last dimension)."""

    name: str = Field(description="Input name.")
    datatype: str = Field(description="Wire datatype as the inference protocol names it: BYTES, BOOL, INT32, ...")
    shape: list[int] = Field(description="Full request shape, batch dimension included where the model has one.")
    value: Value = Field(description="The one element: text for BYTES (UTF-8 on the wire), a flag, a count; or a "
                         "token-id prompt's ids, as many as `shape`'s last dimension.")


class LLMInterface(StrictRead):
    """How to ask one model for text: which tensors carry the prompt, max_tokens, the stream switch.

    Built by `detect_interface`; every role names a tensor that the model's config declares."""

    kind: Kind = Field(description="Which family of interface: generic, vllm, trtllm or token_ids.")
    label: str = Field(description="The family in words for reports: 'vLLM backend', 'TensorRT-LLM ensemble', ...")
    model: str = Field(description="The model's name, for messages.")
    text_input: str = Field(description="Input that takes the prompt: STRING, or integer ids (`prompt_datatype`).")
    text_output: str = Field(description="Output that carries what is generated: STRING text, or integer ids.")
    prompt_datatype: str = Field(default="BYTES", description="Wire datatype of the prompt: BYTES, or INT32/INT64 ids.")
    prompt_length_input: str | None = Field(default=None, description="Integer input taking the number of ids sent.")
    prompt_length_datatype: str | None = Field(default=None, description="Its wire datatype (INT32, ...).")
    max_tokens_input: str | None = Field(
        description="Integer input that takes max_tokens. None: it goes in `sampling_parameters_input`'s "
        "JSON, else in the request parameters (key 'max_tokens')."
    )
    max_tokens_datatype: str | None = Field(description="Wire datatype of `max_tokens_input` (INT32, INT64, ...).")
    sampling_parameters_input: str | None = Field(
        description="vLLM: the STRING input holding the sampling parameters as JSON; the backend then "
        "ignores the request parameters (src/utils/request.py, `_get_input_tensors`)."
    )
    stream_input: str | None = Field(
        description="BOOL input that switches streaming. None: the model has no switch (it streams, or not)."
    )
    exclude_input_input: str | None = Field(
        description="BOOL input that keeps the prompt out of text_output; always sent true, so the output "
        "holds the completion only (vLLM and TensorRT-LLM echo the prompt by default when not streaming)."
    )
    input_token_count_input: str | None = Field(
        description="BOOL input that asks for the prompt's token count (return_num_input_tokens)."
    )
    input_token_count_output: str | None = Field(
        description="Integer output with the prompt's token count (num_input_tokens), when the model has both."
    )
    output_token_count_input: str | None = Field(
        default=None, description="BOOL input that asks for each response's token count (return_num_output_tokens)."
    )
    output_token_count_output: str | None = Field(
        default=None, description="Integer output with the tokens each response carries (num_output_tokens), when "
        "the model has both: read instead of taking a response for one token, since an engine that runs ahead of "
        "its backend merges several tokens into one response.",
    )
    batched: bool = Field(description="max_batch_size > 0: every tensor carries a leading batch dimension of 1.")
    decoupled: bool = Field(description="Decoupled transaction policy: the model may send many responses per request.")
    default_max_tokens: int | None = Field(
        description="What the backend generates when max_tokens is not sent: 16 for vLLM, the model's "
        "`default_max_tokens` config parameter for generic models (tinyllm's convention); None: unknown "
        "or max_tokens is required."
    )

    @property
    def speaks_token_ids(self) -> bool:
        """The prompt goes as token ids, and each id of a response is one token (`llm_token_ids`)."""
        return self.prompt_datatype != "BYTES"

    def sizing_bytes_per_token(self, bytes_per_token: float) -> float:
        """The bytes per token a text prompt for this model is sized with: 1 for token ids (one id per
        character, so the text's length is the prompt's exact tokens), else `bytes_per_token`."""
        return 1.0 if self.speaks_token_ids else bytes_per_token

    def will_stream(self, stream: bool = True) -> bool:
        """Whether a request built with `stream` gets its tokens as separate responses.

        A model that is not decoupled sends exactly one response per request, so it never streams;
        a decoupled model without a stream switch is taken to stream (tinyllm always does), except
        vLLM, which does not stream unless told to (src/utils/request.py reads a missing stream as
        false)."""
        if not self.decoupled:
            return False
        if self.stream_input is None:
            return self.kind != "vllm"
        return stream

    def _fields(self, prompt: Prompt, max_tokens: int, stream: bool, count_input_tokens: bool) -> list[_Field]:
        """(name, wire datatype, value) of every tensor a request sends, in a stable order."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if not self.speaks_token_ids and not isinstance(prompt, str):
            raise ValueError(f"model {self.model!r} takes text in {self.text_input}: give the prompt as a string")
        fields: list[_Field] = [(self.text_input, self.prompt_datatype, prompt_ids(prompt))] if self.speaks_token_ids \
            else [(self.text_input, "BYTES", prompt)]
        if self.prompt_length_input is not None:
            fields.append((self.prompt_length_input, self.prompt_length_datatype or "INT32", len(fields[0][2])))
        if self.max_tokens_input is not None:
            fields.append((self.max_tokens_input, self.max_tokens_datatype or "INT32", max_tokens))
        if self.sampling_parameters_input is not None:
            # ignore_eos: tritongen's requests measure and load an engine at N output tokens; a model
            # that says end-of-sequence sooner (a real one on a short prompt, one with random weights at
            # random) would end the stream early and starve the measurement (seen on the real vLLM:
            # "no stream finished with 3 or more tokens").
            fields.append((self.sampling_parameters_input, "BYTES",
                           json.dumps({"max_tokens": max_tokens, "ignore_eos": True})))
        if self.stream_input is not None:
            # stream=true on a model that is not decoupled is refused or misbehaves: TensorRT-LLM's
            # decoupled_mode "Must be set to true for requests setting the stream tensor to true"
            # (docs/model_config.md), and the server's /generate wants exactly one response.
            fields.append((self.stream_input, "BOOL", bool(stream and self.decoupled)))
        if self.exclude_input_input is not None:
            # true whether streaming or not: vLLM refuses false when streaming, and prepends the
            # prompt to the one non-streamed response by default (src/utils/request.py)
            fields.append((self.exclude_input_input, "BOOL", True))
        if self.input_token_count_input is not None and count_input_tokens:
            fields.append((self.input_token_count_input, "BOOL", True))
        if self.output_token_count_input is not None and self.will_stream(stream):
            fields.append((self.output_token_count_input, "BOOL", True))  # a stream's tokens, counted by the model
        return fields

    def request(
        self, prompt: Prompt, max_tokens: int, stream: bool = True, count_input_tokens: bool = False
    ) -> list[RequestTensor]:
        """The input tensors of one request for `max_tokens` tokens of `prompt` (text; for a model of
        token ids, its ids, or a text sent one id per character: `llm_token_ids.prompt_ids`).

        `stream`: ask for token-by-token responses where the model has a switch (sent false on a
        model that is not decoupled; see `will_stream`). `count_input_tokens`: also ask for the
        prompt's token count in `input_token_count_output`, where the model offers it (ignored
        otherwise). Send `request_parameters(max_tokens)` with it."""
        lead = [1] if self.batched else []
        return [RequestTensor(name=name, datatype=dt, shape=lead + [len(value) if isinstance(value, list) else 1],
                              value=value) for name, dt, value in self._fields(prompt, max_tokens, stream, count_input_tokens)]

    def request_parameters(self, max_tokens: int) -> dict[str, int]:
        """Triton request parameters the request needs: {'max_tokens': N} where no tensor takes it
        (vLLM without a sampling_parameters input reads its sampling parameters from here; a generic
        model without a max_tokens input may); else empty."""
        if self.max_tokens_input is None and self.sampling_parameters_input is None:
            return {"max_tokens": max_tokens}
        return {}

    def generate_body(
        self, prompt: Prompt, max_tokens: int, stream: bool = True, count_input_tokens: bool = False
    ) -> dict[str, Any]:
        """JSON body for POST /v2/models/<model>/generate_stream (SSE) or /generate.

        The server maps each top-level key, and each key of "parameters", to the input of that name
        or else to a request parameter, and fills the shape (batch dimension included) from the
        model's metadata (server src/http_server.cc, `ConvertGenerateRequest`/`ExactMappingInput`),
        so the values are the same single elements as `request`'s (a token-id prompt: a JSON array)."""
        fields = self._fields(prompt, max_tokens, stream, count_input_tokens)
        body: dict[str, Any] = {name: value for name, _, value in fields}
        parameters = self.request_parameters(max_tokens)
        if parameters:
            body["parameters"] = parameters
        return body

    def describe(self) -> str:
        """One line for reports, e.g. 'vLLM backend (text_input, stream, sampling_parameters.max_tokens)'."""
        if self.max_tokens_input is not None:
            where = self.max_tokens_input
        elif self.sampling_parameters_input is not None:
            where = f"{self.sampling_parameters_input}.max_tokens"
        else:
            where = "parameters.max_tokens"
        parts = [self.text_input, self.stream_input or "no stream input", where]
        note = "" if self.decoupled else "; not decoupled: one response per request"
        return f"{self.label} ({', '.join(parts)}{note})"


# ------------------------------------------------------------------------------------------------
# detection

# What the vLLM backend's auto_complete_config adds to a config that lists none (src/model.py,
# `_auto_complete_inputs_and_outputs`): its sample config.pbtxt lists no inputs at all.
VLLM_AUTOCOMPLETE_INPUTS = (
    TensorInfo(name="text_input", data_type="TYPE_STRING", dims=[1]),
    TensorInfo(name="image", data_type="TYPE_STRING", dims=[-1], optional=True),
    TensorInfo(name="stream", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="sampling_parameters", data_type="TYPE_STRING", dims=[1], optional=True),
    TensorInfo(name="exclude_input_in_output", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="return_finish_reason", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="return_cumulative_logprob", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="return_logprobs", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="return_num_input_tokens", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="return_num_output_tokens", data_type="TYPE_BOOL", dims=[1], optional=True),
    TensorInfo(name="embedding_request", data_type="TYPE_STRING", dims=[1], optional=True),
)
VLLM_AUTOCOMPLETE_OUTPUTS = (
    TensorInfo(name="text_output", data_type="TYPE_STRING", dims=[-1]),
    TensorInfo(name="finish_reason", data_type="TYPE_STRING", dims=[-1]),
    TensorInfo(name="cumulative_logprob", data_type="TYPE_FP32", dims=[-1]),
    TensorInfo(name="logprobs", data_type="TYPE_STRING", dims=[-1]),
    TensorInfo(name="num_input_tokens", data_type="TYPE_UINT32", dims=[1]),
    TensorInfo(name="num_output_tokens", data_type="TYPE_UINT32", dims=[-1]),
)


def _count_pair(inputs: Mapping[str, TensorInfo], outputs: Sequence[TensorInfo], switch: str,
                counted: str) -> tuple[TensorInfo | None, TensorInfo | None]:
    """The BOOL input that asks for a count and the integer output that carries it (vLLM's
    return_num_input_tokens / num_input_tokens), or (None, None) unless the model has both."""
    asks = _pick(inputs, (switch,), _BOOL)
    carries = next((t for t in outputs if t.name == counted and t.data_type in _INTEGER_TYPES), None)
    return (asks, carries) if asks is not None and carries is not None else (None, None)


def _pick(tensors: Mapping[str, TensorInfo], names: Sequence[str], types: frozenset[str]) -> TensorInfo | None:
    """The first of `names` the model has with one of `types` and room for one element."""
    for name in names:
        tensor = tensors.get(name)
        if tensor is not None and tensor.data_type in types and tensor.one_element:
            return tensor
    return None


def _unknown(model: str, inputs: Sequence[TensorInfo], reason: str) -> UnknownInterface:
    found = ", ".join(t.label() for t in inputs) or "none listed"
    err = UnknownInterface(f"model {model!r}: {reason}; its inputs: {found}; {EXPECTED}")
    err.reason = reason
    return err


def _text_output(model: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> str:
    strings = [t.name for t in outputs if t.data_type == "TYPE_STRING"]
    if "text_output" in strings:
        return "text_output"
    if len(strings) == 1:
        return strings[0]
    if not strings:
        raise _unknown(model, inputs, "no STRING output to read the text from")
    raise _unknown(model, inputs, f"no text_output, and several STRING outputs ({', '.join(strings)}) to choose from")


def detect_interface(
    *,
    model: str,
    backend: str | None,
    platform: str | None,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    max_batch_size: int,
    decoupled: bool,
    parameters: Mapping[str, str] | None = None,
    text_inputs: Sequence[str] = GENERIC_TEXT_INPUTS,
) -> LLMInterface:
    """The interface of a model from its config's fields; `UnknownInterface` when it has none tritongen knows.

    Rules, first match wins:
    1. no STRING text input by name, an integer prompt input and an integer output of ids by name
       (`llm_token_ids.token_id_roles`): token ids, TensorRT-LLM's raw model or a user's own; the
       budget in request_output_len or a generic max_tokens name, else the request parameters.
    2. backend "vllm", or a `sampling_parameters` input: vLLM. With no inputs listed (a config.pbtxt
       read from disk: the backend's sample lists none) and backend "vllm", the backend's
       auto-completed inputs and outputs are assumed. A config that lists some is taken as it is:
       the server's (GET /v2/models/M/config) is already complete, and may come from a vLLM backend
       older than this list. vLLM is always decoupled: the backend sets the policy and refuses to
       load without it (src/model.py, `auto_complete_config` and `_init_engine_args`).
    3. text_input and a `sampling_param_*` input: TensorRT-LLM's LLM-API model.
    4. text_input, an integer max_tokens and at least two of TRTLLM_MARKERS (bad_words, stop_words,
       end_id, pad_id, ...): TensorRT-LLM ensemble (platform "ensemble") or BLS (backend "python").
       Read an ensemble's config from the server: Triton marks an ensemble decoupled there when a
       step is (core src/ensemble_scheduler/ensemble_utils.cc), its config.pbtxt says nothing.
    5. otherwise generic: a STRING text input (GENERIC_TEXT_INPUTS), optionally an integer max_tokens
       (GENERIC_MAX_TOKENS_INPUTS) and a BOOL stream (GENERIC_STREAM_INPUTS).

    Every tensor tritongen fills must take one element (dims [1] or [-1]). Only the prompt, max_tokens,
    the stream switch, exclude_input_in_output and (when asked) return_num_input_tokens are sent;
    optional sampling inputs are left unset, so the model's defaults apply, and a required input
    outside those is an `UnknownInterface` that names it.

    `parameters`: the config's string parameters; generic models may give `default_max_tokens`.
    `text_inputs`: the names rule 5 takes the prompt from; others only where the user said it is an LLM (model_kind).
    """
    inputs = list(inputs)
    outputs = list(outputs)
    is_vllm_backend = (backend or "").lower() == "vllm"
    if is_vllm_backend and not inputs:
        inputs = list(VLLM_AUTOCOMPLETE_INPUTS)
        outputs = outputs or list(VLLM_AUTOCOMPLETE_OUTPUTS)
    by_name = {t.name: t for t in inputs}
    ids = None if is_vllm_backend or _pick(by_name, text_inputs, _STRING) else token_id_roles(
        by_name, outputs, GENERIC_MAX_TOKENS_INPUTS)

    count_input, count_output = _count_pair(by_name, outputs, "return_num_input_tokens", "num_input_tokens")
    count_tokens, counted_tokens = _count_pair(by_name, outputs, "return_num_output_tokens", "num_output_tokens")
    common: dict[str, Any] = {
        "model": model,
        "batched": max_batch_size > 0,
        "input_token_count_input": count_input.name if count_input else None,
        "input_token_count_output": count_output.name if count_output else None,
    }

    if ids is not None:
        roles = dict(
            kind="token_ids", label="TensorRT-LLM raw model (token ids)" if (backend or "").lower() == "tensorrtllm"
            else "token ids", text=ids.prompt, max_tokens=_pick(by_name, ids.max_tokens_names, _INTEGER_TYPES),
            sampling=None, stream=_pick(by_name, GENERIC_STREAM_INPUTS, _BOOL),
            exclude=_pick(by_name, ("exclude_input_in_output",), _BOOL), decoupled=decoupled,
            default_max_tokens=int_or_none((parameters or {}).get("default_max_tokens")),
        )
    elif is_vllm_backend or "sampling_parameters" in by_name:
        text = _pick(by_name, ("text_input",), _STRING)
        sampling = _pick(by_name, ("sampling_parameters",), _STRING)
        roles = dict(
            kind="vllm", label="vLLM backend", text=text, max_tokens=None, sampling=sampling,
            stream=_pick(by_name, ("stream",), _BOOL), exclude=_pick(by_name, ("exclude_input_in_output",), _BOOL),
            decoupled=True, default_max_tokens=VLLM_DEFAULT_MAX_TOKENS,
        )
    elif "text_input" in by_name and any(name.startswith("sampling_param_") for name in by_name):
        roles = dict(
            kind="trtllm", label="TensorRT-LLM LLM API", text=_pick(by_name, ("text_input",), _STRING),
            max_tokens=_pick(by_name, ("sampling_param_max_tokens",), _INTEGER_TYPES), sampling=None,
            stream=_pick(by_name, ("streaming",), _BOOL),
            exclude=_pick(by_name, ("sampling_param_exclude_input_from_output",), _BOOL),
            decoupled=decoupled, default_max_tokens=None,
        )
    elif ("text_input" in by_name and "max_tokens" in by_name
          and len(TRTLLM_MARKERS & by_name.keys()) >= TRTLLM_MARKERS_NEEDED):
        if (platform or "").lower() == "ensemble":
            label = "TensorRT-LLM ensemble"
        elif (backend or "").lower() == "python":
            label = "TensorRT-LLM BLS"
        else:
            label = "TensorRT-LLM"
        roles = dict(
            kind="trtllm", label=label, text=_pick(by_name, ("text_input",), _STRING),
            max_tokens=_pick(by_name, ("max_tokens",), _INTEGER_TYPES), sampling=None,
            stream=_pick(by_name, ("stream",), _BOOL), exclude=_pick(by_name, ("exclude_input_in_output",), _BOOL),
            decoupled=decoupled, default_max_tokens=None,
        )
    else:
        roles = dict(
            kind="generic", label="generic", text=_pick(by_name, text_inputs, _STRING),
            max_tokens=_pick(by_name, GENERIC_MAX_TOKENS_INPUTS, _INTEGER_TYPES), sampling=None,
            stream=_pick(by_name, GENERIC_STREAM_INPUTS, _BOOL), exclude=None,
            decoupled=decoupled, default_max_tokens=int_or_none((parameters or {}).get("default_max_tokens")),
        )

    text = roles["text"]
    if text is None and not inputs:
        raise _unknown(model, inputs, "the config lists no inputs (read it from the server, GET "
                       "/v2/models/<model>/config, which holds the backend's auto-completed inputs)")
    if text is None:
        names = "text_input" if roles["kind"] != "generic" else ", ".join(text_inputs)
        raise _unknown(model, inputs, token_id_reason(by_name, outputs) or f"no STRING text input with one element ({names})")

    length = ids.length if ids is not None else None
    filled = {t.name for t in (text, length, roles["max_tokens"], roles["sampling"], roles["stream"], roles["exclude"]) if t}
    if roles["kind"] != "vllm":
        # Only vLLM's backend is known to count each streamed response's own tokens (src/utils/request.py,
        # `create_response`: the growth of the completion's token ids since the last response); another
        # family's count may be the running total, which summed would multiply the tokens.
        count_tokens = counted_tokens = None
    common["output_token_count_input"] = count_tokens.name if count_tokens else None
    common["output_token_count_output"] = counted_tokens.name if counted_tokens else None
    filled |= {t.name for t in (count_input, count_tokens) if t is not None}
    unfillable = [t for t in inputs if not t.optional and t.name not in filled]
    if unfillable:
        names = ", ".join(t.label() for t in unfillable)
        raise _unknown(model, inputs, f"looks like {roles['label']} but requires inputs tritongen cannot fill: {names}")

    max_tokens = roles["max_tokens"]
    return LLMInterface(
        kind=roles["kind"],
        label=roles["label"],
        text_input=text.name,
        text_output=ids.output.name if ids is not None else _text_output(model, inputs, outputs),
        prompt_datatype=wire_datatype(text.data_type),
        prompt_length_input=length.name if length else None,
        prompt_length_datatype=wire_datatype(length.data_type) if length else None,
        max_tokens_input=max_tokens.name if max_tokens else None,
        max_tokens_datatype=wire_datatype(max_tokens.data_type) if max_tokens else None,
        sampling_parameters_input=roles["sampling"].name if roles["sampling"] else None,
        stream_input=roles["stream"].name if roles["stream"] else None,
        exclude_input_input=roles["exclude"].name if roles["exclude"] else None,
        decoupled=roles["decoupled"],
        default_max_tokens=roles["default_max_tokens"],
        **common,
    )


# ------------------------------------------------------------------------------------------------
# a plan entry's interface


def plan_entry_interface(entry: Any) -> LLMInterface:
    """The interface of a plan entry (`ModelEntryPlan`): what its rendered config declares."""
    def info(t: Any) -> TensorInfo:
        return TensorInfo(name=t.name, data_type=t.data_type, dims=list(t.dims), optional=t.optional)

    return detect_interface(
        model=entry.name, backend=entry.backend, platform=None, inputs=[info(t) for t in entry.inputs],
        outputs=[info(t) for t in entry.outputs], max_batch_size=entry.max_batch_size, decoupled=entry.decoupled,
        parameters=entry.parameters,
    )
