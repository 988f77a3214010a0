"""One streaming request whose first integer output is wanted (the backend's own count of a prompt's
tokens), with the model's own error, or the unreached address, as the failure."""

from __future__ import annotations

import threading

import numpy as np

from tritongen.client import infer_inputs
from tritongen.errors import RunFailed
from tritongen.profiler.load import ModelFailed
from tritongen.shared.reach import GRPC, grpc_reason, grpc_unreached, unreachable_message

PROFILE_GRPC = "--grpc-url; by default port 8001 on the --url host"  # how the profile's gRPC address is set


def first_output_int(url: str, model: str, inputs: dict[str, np.ndarray], output: str, timeout_s: float = 30.0,
                     want_int: bool = True) -> int | None:
    """Send one streaming request and return the first integer value of `output` it carries
    (`want_int` False: wait for the request to finish and return None). The model's own error is
    raised verbatim."""
    import tritonclient.grpc as grpcclient

    found: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def callback(result, error) -> None:
        if error is not None:
            errors.append(error)
            done.set()
            return
        value = result.as_numpy(output) if want_int else None
        if value is not None and value.size and not found:
            found.append(int(value.reshape(-1)[0]))
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            done.set()

    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        client.async_stream_infer(model, infer_inputs(grpcclient, inputs), enable_empty_final_response=True)
        done.wait(timeout_s)
        client.stop_stream(cancel_requests=True)
    except InferenceServerException as err:  # the stream broke: the callback holds the cause
        cause = errors[0] if errors else err
        raise RunFailed(f"model {model!r}: {unreachable_message(GRPC, url, PROFILE_GRPC, grpc_reason(cause))}") from None
    finally:
        client.close()
    if not found and errors:
        if grpc_unreached(errors[0]):
            raise RunFailed(f"model {model!r}: {unreachable_message(GRPC, url, PROFILE_GRPC, grpc_reason(errors[0]))}")
        said = errors[0].message() if hasattr(errors[0], "message") else str(errors[0])
        raise ModelFailed(f"model {model!r} answered with an error: {said}")
    return found[0] if found else None
