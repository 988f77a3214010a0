"""What vLLM (V1) does with an engine argument that `1/model.json` leaves unset, stated once with
where it was read, so the engine model, render and the tuner agree on the engine the server runs.

Source: vLLM's `vllm/engine/arg_utils.py` (EngineArgs: `_set_default_args` / `get_batch_defaults`)
and `vllm/entrypoints/openai/api_server.py` (`build_async_engine_client_from_engine_args`, whose
usage context defaults to OPENAI_API_SERVER). Triton's vLLM backend builds its engine through a copy
of that function (`src/utils/vllm_backend_utils.py`), so its defaults are the OpenAI server's, not
the offline `LLM` class's.
"""

from __future__ import annotations

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM EngineArgs default
VLLM_DEFAULT_BLOCK_SIZE = 16

# V1 always splits a long prompt over steps (chunked prefill) unless model.json turns it off.
VLLM_CHUNKED_PREFILL = True

# max_num_batched_tokens unset: the OpenAI-server usage context's default, by the device vLLM runs on
# (get_batch_defaults: a GPU of 70 GiB or more that is not an A100 takes the larger budget).
VLLM_LARGE_DEVICE_BYTES = 70 * 1024**3
VLLM_SERVER_BATCHED_TOKENS = 2048
VLLM_SERVER_BATCHED_TOKENS_LARGE_DEVICE = 8192


def vllm_default_batched_tokens(device: tuple[int, str] | None) -> tuple[int, str]:
    """(vLLM V1's max_num_batched_tokens where model.json leaves it unset, why) for an engine on
    `device` (total bytes, name); None: a device nobody named, taken as the smaller kind."""
    if device is not None and device[0] >= VLLM_LARGE_DEVICE_BYTES and "a100" not in device[1].lower():
        return VLLM_SERVER_BATCHED_TOKENS_LARGE_DEVICE, (
            f"vLLM V1's default max_num_batched_tokens on a GPU of 70 GiB or more ({device[1]}; the OpenAI-server "
            "usage context Triton's vLLM backend starts its engine in)")
    where = f"on {device[1]}" if device is not None else "where the GPU is not known (taken as under 70 GiB)"
    return VLLM_SERVER_BATCHED_TOKENS, (
        f"vLLM V1's default max_num_batched_tokens {where} (the OpenAI-server usage context Triton's vLLM backend "
        "starts its engine in; 8192 on a GPU of 70 GiB or more that is not an A100)")
