"""tritongen/core/llm_interface.py on the configs real LLM models have: which interface each speaks,
the request built for it (names, datatypes, shapes, values), generate bodies, reading max_tokens
back, and the refusals.
One unit (about 530 lines): nearly half of it is the served configs below, and detection, refusals
and max_tokens all read the same ones; split, those tables would move to a shared module that only
this topic reads.

The configs are written out as Triton serves them (GET /v2/models/M/config), copied from the
backends' own files: the vLLM backend's sample config.pbtxt (no inputs) and its auto-completed
form (src/model.py `_auto_complete_inputs_and_outputs`), TensorRT-LLM's inflight_batcher_llm
ensemble and tensorrt_llm_bls and its llmapi model, the raw tensorrt_llm model, and tinyllm's
model_repository/tinyllm/config.pbtxt.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import json_format

from tests.helpers import MODEL_REPOSITORY, config_tensors as tensors
from tritongen.client import numpy_inputs
from tritongen.core.llm_interface import (
    LLMInterface,
    RequestTensor,
    TensorInfo,
    UnknownInterface,
    detect_interface,
)
from tritongen.core.llm_interface_config import interface_from_config
from tritongen.core.llm_max_tokens import max_tokens_of
from tritongen.pbtxt import parse_model_config

# ------------------------------------------------------------------------------------------------
# configs


VLLM_SAMPLE = {  # samples/model_repository/vllm_model/config.pbtxt, read from disk: no inputs at all
    "backend": "vllm",
    "instance_group": [{"count": 1, "kind": "KIND_MODEL"}],
}

VLLM_SERVED = {  # the same model as the server reports it after the backend's auto_complete_config
    "name": "vllm_model",
    "platform": "",
    "backend": "vllm",
    "max_batch_size": 0,
    "input": tensors("""
        text_input STRING [1]
        image STRING [-1] optional
        stream BOOL [1] optional
        sampling_parameters STRING [1] optional
        exclude_input_in_output BOOL [1] optional
        return_finish_reason BOOL [1] optional
        return_cumulative_logprob BOOL [1] optional
        return_logprobs BOOL [1] optional
        return_num_input_tokens BOOL [1] optional
        return_num_output_tokens BOOL [1] optional
        embedding_request STRING [1] optional
    """),
    "output": tensors("""
        text_output STRING [-1]
        finish_reason STRING [-1]
        cumulative_logprob FP32 [-1]
        logprobs STRING [-1]
        num_input_tokens UINT32 [1]
        num_output_tokens UINT32 [-1]
    """),
    "model_transaction_policy": {"decoupled": True},
    "instance_group": [{"name": "vllm_model_0", "kind": "KIND_MODEL", "count": 1}],
}

VLLM_PARAMETERS_ONLY = {  # a vLLM config that lists its inputs, sampling_parameters not among them: the
    "name": "vllm_lean",  # backend then reads the sampling parameters from the request parameters
    "backend": "vllm",
    "max_batch_size": 0,
    "input": tensors("""
        text_input STRING [1]
        stream BOOL [1] optional
        exclude_input_in_output BOOL [1] optional
    """),
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
    "model_transaction_policy": {"decoupled": True},
}

ENSEMBLE = {  # all_models/inflight_batcher_llm/ensemble with triton_max_batch_size 64, as served
    "name": "ensemble",
    "platform": "ensemble",
    "backend": "",
    "max_batch_size": 64,
    "input": tensors("""
        text_input STRING [1]
        decoder_text_input STRING [1] optional
        max_tokens INT32 [1]
        num_return_sequences INT32 [1] optional
        bad_words STRING [-1] optional
        stop_words STRING [-1] optional
        exclude_input_in_output BOOL [1] optional
        end_id INT32 [1] optional
        pad_id INT32 [1] optional
        top_k INT32 [1] optional
        top_p FP32 [1] optional
        temperature FP32 [1] optional
        length_penalty FP32 [1] optional
        repetition_penalty FP32 [1] optional
        min_tokens INT32 [1] optional
        presence_penalty FP32 [1] optional
        frequency_penalty FP32 [1] optional
        seed UINT64 [1] optional
        return_log_probs BOOL [1] optional
        return_context_logits BOOL [1] optional
        return_generation_logits BOOL [1] optional
        return_perf_metrics BOOL [1] optional
        return_num_input_tokens BOOL [1] optional
        return_num_output_tokens BOOL [1] optional
        beam_width INT32 [1] optional
        stream BOOL [1] optional
        prompt_embedding_table FP16 [-1,-1] optional
        prompt_table_extra_id UINT64 [1] optional
        prompt_vocab_size INT32 [1] optional
        embedding_bias_words STRING [-1] optional
        embedding_bias_weights FP32 [-1] optional
        lora_task_id UINT64 [1] optional
        lora_weights FP16 [-1,-1] optional
        lora_config INT32 [-1,3] optional
        guided_decoding_guide_type STRING [1] optional
        guided_decoding_guide STRING [1] optional
    """),
    "output": tensors("""
        text_output STRING [-1]
        cum_log_probs FP32 [-1]
        output_log_probs FP32 [-1,-1]
        batch_index INT32 [1]
        num_input_tokens INT32 [1]
        num_output_tokens INT32 [1]
    """),
    # the ensemble's config.pbtxt has no policy; Triton sets it when a step (tensorrt_llm) is decoupled
    "model_transaction_policy": {"decoupled": True},
}

BLS = {  # all_models/inflight_batcher_llm/tensorrt_llm_bls with decoupled_mode false: the same inputs and more
    **ENSEMBLE,
    "name": "tensorrt_llm_bls",
    "platform": "",
    "backend": "python",
    "input": [
        *ENSEMBLE["input"],
        *tensors("""
            image_input FP16 [-1,3,-1,-1] optional
            image_url_input STRING [1] optional
            num_draft_tokens INT32 [1] optional
            use_draft_logits BOOL [1] optional
        """),
    ],
    "model_transaction_policy": {"decoupled": False},
}

LLMAPI = {  # all_models/llmapi/tensorrt_llm, max_batch_size and decoupled from its model.yaml
    "name": "tensorrt_llm",
    "backend": "python",
    "max_batch_size": 64,
    "input": tensors("""
        text_input STRING [-1]
        image_url STRING [-1] optional
        streaming BOOL [1] optional
        sampling_param_temperature FP32 [1] optional
        sampling_param_max_tokens INT32 [1] optional
        sampling_param_stop STRING [-1] optional
        sampling_param_exclude_input_from_output BOOL [1] optional
        return_finish_reason BOOL [1] optional
        stop BOOL [1] optional
    """),
    "output": tensors("""
        text_output STRING [-1]
        finish_reason STRING [-1]
    """),
    "model_transaction_policy": {"decoupled": True},
}

TINYLLM = {  # model_repository/tinyllm/config.pbtxt as served (checked against the file below)
    "name": "tinyllm",
    "backend": "python",
    "max_batch_size": 26,
    "input": tensors("""
        text_input STRING [1]
        max_tokens INT32 [1] optional
    """),
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
    "model_transaction_policy": {"decoupled": True},
    "parameters": {"default_max_tokens": {"string_value": "16"}, "max_context": {"string_value": "256"}},
}

GENERIC = {  # a user's own streaming Python backend, unbatched
    "name": "my_llm",
    "backend": "python",
    "max_batch_size": 0,
    "input": tensors("""
        text_input STRING [1]
        max_tokens INT32 [1] optional
        stream BOOL [1] optional
        temperature FP32 [1] optional
    """),
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
    "model_transaction_policy": {"decoupled": True},
}

GENERIC_BATCHED = {  # Hugging Face style names, batched, a 64-bit count, output under another name
    "name": "hf_llm",
    "backend": "python",
    "max_batch_size": 8,
    "input": tensors("""
        prompt STRING [-1]
        max_new_tokens INT64 [1]
        stream BOOL [1] optional
    """),
    "output": [{"name": "generated_text", "data_type": "TYPE_STRING", "dims": [-1]}],
    "model_transaction_policy": {"decoupled": True},
}

ALL = {
    "vllm_sample": VLLM_SAMPLE, "vllm_served": VLLM_SERVED, "vllm_parameters_only": VLLM_PARAMETERS_ONLY,
    "ensemble": ENSEMBLE, "bls": BLS, "llmapi": LLMAPI, "tinyllm": TINYLLM, "generic": GENERIC,
    "generic_batched": GENERIC_BATCHED,
}


def tensors_of(interface: LLMInterface, **kw) -> dict[str, RequestTensor]:
    return {t.name: t for t in interface.request("Hello", 32, **kw)}


# ------------------------------------------------------------------------------------------------
# detection


def test_vllm_sample_config_without_inputs_assumes_the_auto_completed_ones() -> None:
    iface = interface_from_config(VLLM_SAMPLE, model="vllm_model")
    assert iface.kind == "vllm" and iface.model == "vllm_model"
    assert (iface.text_input, iface.stream_input, iface.sampling_parameters_input) == (
        "text_input", "stream", "sampling_parameters")
    assert iface.max_tokens_input is None and iface.max_tokens_datatype is None
    assert iface.exclude_input_input == "exclude_input_in_output"
    assert (iface.input_token_count_input, iface.input_token_count_output) == ("return_num_input_tokens", "num_input_tokens")
    # the backend forces decoupled and max_batch_size 0, whatever the file says
    assert iface.decoupled and not iface.batched and iface.will_stream()
    assert iface.default_max_tokens == 16
    assert iface.describe() == "vLLM backend (text_input, stream, sampling_parameters.max_tokens)"


def test_vllm_served_config_is_the_same_interface_as_the_sample() -> None:
    served = interface_from_config(VLLM_SERVED)
    assert served == interface_from_config(VLLM_SAMPLE, model="vllm_model")


def test_vllm_request_puts_max_tokens_in_sampling_parameters_and_excludes_the_prompt() -> None:
    iface = interface_from_config(VLLM_SERVED)
    sent = tensors_of(iface)
    # a stream asks for each response's token count: vLLM merges several tokens into one response
    # when the backend falls behind the engine
    assert list(sent) == ["text_input", "sampling_parameters", "stream", "exclude_input_in_output", "return_num_output_tokens"]
    assert (iface.output_token_count_input, iface.output_token_count_output) == ("return_num_output_tokens", "num_output_tokens")
    assert "return_num_output_tokens" not in tensors_of(iface, stream=False)  # one response: nothing to count
    assert sent["text_input"] == RequestTensor(name="text_input", datatype="BYTES", shape=[1], value="Hello")
    assert sent["sampling_parameters"].datatype == "BYTES" and sent["sampling_parameters"].shape == [1]
    assert json.loads(sent["sampling_parameters"].value) == {"max_tokens": 32, "ignore_eos": True}
    assert sent["stream"].value is True and sent["stream"].datatype == "BOOL"
    assert sent["exclude_input_in_output"].value is True
    assert iface.request_parameters(32) == {}
    # not streaming: the prompt is still kept out of the one response (the backend echoes it by default)
    quiet = tensors_of(iface, stream=False)
    assert quiet["stream"].value is False and quiet["exclude_input_in_output"].value is True
    assert tensors_of(iface, count_input_tokens=True)["return_num_input_tokens"].value is True


def test_vllm_without_a_sampling_parameters_input_sends_max_tokens_as_a_request_parameter() -> None:
    iface = interface_from_config(VLLM_PARAMETERS_ONLY)
    assert iface.kind == "vllm" and iface.sampling_parameters_input is None
    assert iface.request_parameters(20) == {"max_tokens": 20}
    assert [t.name for t in iface.request("x", 20)] == ["text_input", "stream", "exclude_input_in_output"]
    assert iface.generate_body("x", 20) == {
        "text_input": "x", "stream": True, "exclude_input_in_output": True, "parameters": {"max_tokens": 20}}
    assert iface.input_token_count_input is None  # this config has no return_num_input_tokens
    assert "return_num_input_tokens" not in tensors_of(iface, count_input_tokens=True)
    assert iface.describe() == "vLLM backend (text_input, stream, parameters.max_tokens)"


def test_trtllm_ensemble_is_batched_and_fills_only_what_it_needs() -> None:
    iface = interface_from_config(ENSEMBLE)
    assert (iface.kind, iface.label) == ("trtllm", "TensorRT-LLM ensemble")
    assert iface.batched and iface.decoupled and iface.default_max_tokens is None
    sent = tensors_of(iface)
    assert list(sent) == ["text_input", "max_tokens", "stream", "exclude_input_in_output"]  # no sampling inputs
    assert iface.output_token_count_output is None  # its count's meaning in a stream is not known: not asked for
    assert sent["text_input"] == RequestTensor(name="text_input", datatype="BYTES", shape=[1, 1], value="Hello")
    assert sent["max_tokens"] == RequestTensor(name="max_tokens", datatype="INT32", shape=[1, 1], value=32)
    assert sent["stream"] == RequestTensor(name="stream", datatype="BOOL", shape=[1, 1], value=True)
    assert sent["exclude_input_in_output"].value is True
    assert iface.input_token_count_output == "num_input_tokens"
    assert tensors_of(iface, count_input_tokens=True)["return_num_input_tokens"].shape == [1, 1]
    assert iface.describe() == "TensorRT-LLM ensemble (text_input, stream, max_tokens)"


def test_trtllm_bls_not_decoupled_sends_stream_false() -> None:
    iface = interface_from_config(BLS)
    assert (iface.kind, iface.label) == ("trtllm", "TensorRT-LLM BLS")
    assert not iface.decoupled and not iface.will_stream(True)
    assert tensors_of(iface, stream=True)["stream"].value is False
    assert iface.generate_body("Hi", 5)["stream"] is False
    assert iface.describe() == (
        "TensorRT-LLM BLS (text_input, stream, max_tokens; not decoupled: one response per request)")


def test_trtllm_llmapi_model_uses_its_own_names() -> None:
    iface = interface_from_config(LLMAPI)
    assert (iface.kind, iface.label) == ("trtllm", "TensorRT-LLM LLM API")
    sent = tensors_of(iface)
    assert list(sent) == ["text_input", "sampling_param_max_tokens", "streaming",
                          "sampling_param_exclude_input_from_output"]
    assert sent["sampling_param_max_tokens"] == RequestTensor(
        name="sampling_param_max_tokens", datatype="INT32", shape=[1, 1], value=32)
    assert iface.input_token_count_output is None


def test_tinyllm_has_no_stream_input_and_always_streams() -> None:
    iface = interface_from_config(TINYLLM)
    assert (iface.kind, iface.text_input, iface.text_output) == ("generic", "text_input", "text_output")
    assert iface.stream_input is None and iface.will_stream(False)
    assert iface.max_tokens_input == "max_tokens" and iface.max_tokens_datatype == "INT32"
    assert iface.default_max_tokens == 16  # its default_max_tokens parameter
    assert iface.request("Hi", 8) == [
        RequestTensor(name="text_input", datatype="BYTES", shape=[1, 1], value="Hi"),
        RequestTensor(name="max_tokens", datatype="INT32", shape=[1, 1], value=8),
    ]
    assert iface.generate_body("Hi", 8) == {"text_input": "Hi", "max_tokens": 8}
    assert iface.describe() == "generic (text_input, no stream input, max_tokens)"


def test_tinyllm_literal_matches_the_repository_config_in_both_json_forms() -> None:
    config = parse_model_config((MODEL_REPOSITORY / "tinyllm" / "config.pbtxt").read_text())
    camel = json_format.MessageToDict(config)  # camelCase keys, int64 dims as strings
    snake = json_format.MessageToDict(config, preserving_proto_field_name=True)
    assert camel["input"][0]["dims"] == ["1"] and "dataType" in camel["input"][0]
    expected = interface_from_config(TINYLLM)
    assert interface_from_config(camel) == expected
    assert interface_from_config(snake) == expected
    assert interface_from_config({"config": camel}) == expected  # tritonclient.grpc get_model_config(as_json=True)


def test_generic_model_with_stream_switch() -> None:
    iface = interface_from_config(GENERIC)
    assert iface.kind == "generic" and not iface.batched and iface.default_max_tokens is None
    sent = tensors_of(iface)
    assert list(sent) == ["text_input", "max_tokens", "stream"]  # temperature is optional: left unset
    assert sent["stream"] == RequestTensor(name="stream", datatype="BOOL", shape=[1], value=True)
    assert iface.generate_body("Hi", 4, stream=False) == {"text_input": "Hi", "max_tokens": 4, "stream": False}
    assert iface.describe() == "generic (text_input, stream, max_tokens)"


def test_generic_batched_model_with_other_common_names() -> None:
    iface = interface_from_config(GENERIC_BATCHED)
    assert (iface.text_input, iface.max_tokens_input, iface.text_output) == ("prompt", "max_new_tokens", "generated_text")
    sent = tensors_of(iface)
    assert sent["prompt"].shape == [1, 1]
    assert sent["max_new_tokens"] == RequestTensor(name="max_new_tokens", datatype="INT64", shape=[1, 1], value=32)


def test_generic_model_without_max_tokens_input_gets_it_as_a_parameter() -> None:
    iface = detect_interface(
        model="echo", backend="python", platform=None,
        inputs=[TensorInfo(name="text", data_type="STRING", dims=[1])],
        outputs=[TensorInfo(name="out", data_type="BYTES", dims=[-1])],
        max_batch_size=0, decoupled=False,
    )
    assert (iface.text_input, iface.text_output, iface.max_tokens_input) == ("text", "out", None)
    assert not iface.will_stream()
    assert iface.request_parameters(9) == {"max_tokens": 9}
    assert iface.generate_body("a", 9) == {"text": "a", "parameters": {"max_tokens": 9}}


def test_sampling_markers_alone_do_not_make_a_model_trtllm() -> None:
    config = {**GENERIC, "input": [*GENERIC["input"],
                                   {"name": "top_k", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
                                   {"name": "top_p", "data_type": "TYPE_FP32", "dims": [1], "optional": True}]}
    assert interface_from_config(config).kind == "generic"


# ------------------------------------------------------------------------------------------------
# refusals


def test_unknown_interface_names_the_model_every_input_and_what_is_expected() -> None:
    ranker = {"name": "ranker", "backend": "python", "max_batch_size": 32,
              "input": [{"name": "FEATURES", "data_type": "TYPE_FP32", "dims": [32]},
                        {"name": "mask", "data_type": "TYPE_BOOL", "dims": [-1], "optional": True}],
              "output": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [1]}]}
    with pytest.raises(UnknownInterface) as err:
        interface_from_config(ranker)
    message = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in message
    assert "'ranker'" in message and "no STRING text input" in message
    assert "FEATURES FP32 [32]" in message and "mask BOOL [-1] optional" in message
    for expected in ("generic", "vLLM", "TensorRT-LLM", "text_input", "sampling_parameters", "max_tokens"):
        assert expected in message


def test_a_required_input_nobody_can_fill_is_named() -> None:
    config = {**GENERIC, "input": [*GENERIC["input"], {"name": "persona", "data_type": "TYPE_STRING", "dims": [1]}]}
    with pytest.raises(UnknownInterface, match=r"requires inputs tritongen cannot fill: persona STRING \[1\]") as err:
        interface_from_config(config)
    assert "text_input STRING [1]" in str(err.value)  # and the whole list


def test_trtllm_ensemble_with_an_unfillable_required_input_is_refused() -> None:
    config = {**ENSEMBLE, "input": [*ENSEMBLE["input"], {"name": "lora_config", "data_type": "TYPE_INT32", "dims": [-1, 3]}]}
    with pytest.raises(UnknownInterface, match="looks like TensorRT-LLM ensemble but requires inputs tritongen "
                                               r"cannot fill: lora_config INT32 \[-1,3\]"):
        interface_from_config(config)


def test_a_config_without_inputs_outside_vllm_says_to_read_the_servers() -> None:
    with pytest.raises(UnknownInterface, match=r"lists no inputs .*GET /v2/models/<model>/config"):
        interface_from_config({"name": "auto", "backend": "python"})


def test_several_string_outputs_without_text_output_are_refused() -> None:
    config = {**GENERIC, "output": [{"name": "a", "data_type": "TYPE_STRING", "dims": [-1]},
                                    {"name": "b", "data_type": "TYPE_STRING", "dims": [-1]}]}
    with pytest.raises(UnknownInterface, match=r"several STRING outputs \(a, b\)"):
        interface_from_config(config)


def test_a_text_input_that_holds_more_than_one_element_is_not_a_prompt() -> None:
    config = {**GENERIC, "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [2]}]}
    with pytest.raises(UnknownInterface, match="no STRING text input with one element"):
        interface_from_config(config)


@pytest.mark.parametrize("bad", [0, -3, True])
def test_max_tokens_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        interface_from_config(GENERIC).request("x", bad)


# ------------------------------------------------------------------------------------------------
# reading max_tokens back, and the arrays


@pytest.mark.parametrize("name", sorted(ALL))
def test_max_tokens_round_trips_through_numpy_inputs(name: str) -> None:
    iface = interface_from_config(ALL[name], model=name)
    arrays = numpy_inputs(iface.request("Hello there", 77))
    for tensor in iface.request("Hello there", 77):
        assert arrays[tensor.name].shape == tuple(tensor.shape)
    assert max_tokens_of(iface, arrays, iface.request_parameters(77)) == 77
    body = iface.generate_body("Hello there", 77)
    assert max_tokens_of(iface, body, body.get("parameters")) == 77


def test_numpy_inputs_dtypes() -> None:
    arrays = numpy_inputs(interface_from_config(ENSEMBLE).request("héllo", 5))
    assert arrays["text_input"].dtype == np.object_ and arrays["text_input"][0, 0] == "héllo".encode()
    assert arrays["max_tokens"].dtype == np.int32 and arrays["max_tokens"].shape == (1, 1)
    assert arrays["stream"].dtype == np.bool_ and bool(arrays["stream"][0, 0])
    assert numpy_inputs(interface_from_config(GENERIC_BATCHED).request("a", 3))["max_new_tokens"].dtype == np.int64
    counts = numpy_inputs([RequestTensor(name="n", datatype="UINT32", shape=[1], value=4)])
    assert counts["n"].dtype == np.uint32
    with pytest.raises(ValueError, match="FP32"):
        numpy_inputs([RequestTensor(name="t", datatype="FP32", shape=[1], value=1)])


def test_max_tokens_of_vllm() -> None:
    iface = interface_from_config(VLLM_SERVED)
    sampling = np.array([b'{"max_tokens": "100", "temperature": 0}'], dtype=np.object_)
    assert max_tokens_of(iface, {"sampling_parameters": sampling}, None) == 100  # vLLM casts strings with int()
    # with the tensor sent, vLLM ignores the request parameters; without max_tokens in it, its default
    assert max_tokens_of(iface, {"sampling_parameters": ['{"top_p": 0.9}']}, {"max_tokens": 5}) == 16
    assert max_tokens_of(iface, {"text_input": ["hi"]}, {"max_tokens": 5}) == 5
    assert max_tokens_of(iface, {"text_input": ["hi"]}, {"max_tokens": {"int64_param": 6}}) == 6
    assert max_tokens_of(iface, {"text_input": ["hi"]}, None) == 16
    with pytest.raises(ValueError, match="not a JSON object"):
        max_tokens_of(iface, {"sampling_parameters": [b"max_tokens=3"]}, None)
    with pytest.raises(ValueError, match="must be an integer"):
        max_tokens_of(iface, {"sampling_parameters": ['{"max_tokens": "lots"}']}, None)


def test_max_tokens_of_tensor_interfaces() -> None:
    ensemble = interface_from_config(ENSEMBLE)
    assert max_tokens_of(ensemble, {"max_tokens": [[12]]}, None) == 12
    assert max_tokens_of(ensemble, {"max_tokens": np.array([[3], [40]], dtype=np.int32)}, None) == 40  # largest row
    assert max_tokens_of(ensemble, {"max_tokens": 7}, {"max_tokens": 99}) == 7
    assert max_tokens_of(ensemble, {}, {"max_tokens": 99}) is None  # required tensor; parameters are not read
    with pytest.raises(ValueError, match="input 'max_tokens' must be an integer"):
        max_tokens_of(ensemble, {"max_tokens": [1.5]}, None)
    tinyllm = interface_from_config(TINYLLM)
    assert max_tokens_of(tinyllm, {"text_input": [[b"hi"]]}, None) == 16  # not sent: its default_max_tokens
    llmapi = interface_from_config(LLMAPI)
    assert max_tokens_of(llmapi, {"sampling_param_max_tokens": [[64]]}, None) == 64
    assert max_tokens_of(llmapi, {}, None) is None
