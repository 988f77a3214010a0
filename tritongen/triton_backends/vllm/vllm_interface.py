"""The interface of Triton's upstream vLLM backend (triton-inference-server/vllm_backend), in its
order: what tritongen's own vLLM backend and the vLLM stand-in (examples/llm_standins) both speak.
Plain data and one auto-complete step, so either backend's model.py imports it beside itself."""

OPTIONAL_BOOLS = (
    "stream",
    "exclude_input_in_output",
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)


def optional(name: str, data_type: str, dims: list[int]) -> dict:
    return {"name": name, "data_type": data_type, "dims": dims, "optional": True}


INPUTS = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
    optional("image", "TYPE_STRING", [-1]),
    optional("stream", "TYPE_BOOL", [1]),
    optional("sampling_parameters", "TYPE_STRING", [1]),
    *(optional(name, "TYPE_BOOL", [1]) for name in OPTIONAL_BOOLS[1:]),
]
OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
]


def auto_complete(auto_complete_model_config, inputs=INPUTS, outputs=OUTPUTS):
    """What the upstream backend's auto_complete_config fills in where the config is silent: its
    inputs and outputs, `max_batch_size` 0 and the decoupled policy."""
    config = auto_complete_model_config.as_dict()
    have_inputs = {tensor["name"] for tensor in config["input"]}
    have_outputs = {tensor["name"] for tensor in config["output"]}
    for tensor in inputs:
        if tensor["name"] not in have_inputs:
            auto_complete_model_config.add_input(tensor)
    for tensor in outputs:
        if tensor["name"] not in have_outputs:
            auto_complete_model_config.add_output(tensor)
    auto_complete_model_config.set_model_transaction_policy(dict(decoupled=True))
    auto_complete_model_config.set_max_batch_size(0)
    return auto_complete_model_config
