"""One streaming request whose first integer output is wanted (the backend's own count of a prompt's
tokens), with the model's own error, or the unreached address, as the failure.

The profiler closes the stream itself once it has what it wants (or waited long enough). What the
client library then reports, "Locally cancelled by application!", is the profiler's own doing and is
never passed on as the model's error: only errors that arrive before the profiler stopped listening
are the model's (issue 43)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tritongen.client import infer_inputs
from tritongen.errors import RunFailed
from tritongen.profiler.load import ModelFailed
from tritongen.shared.reach import GRPC, grpc_reason, grpc_unreached, unreachable_message

PROFILE_GRPC = "--grpc-url; by default port 8001 on the --url host"  # how the profile's gRPC address is set


@dataclass(frozen=True)
class FirstOutput:
    """What one request showed: the integer found (None: none came), whether the model flagged its
    last response final, and how many responses arrived."""

    value: int | None
    finished: bool
    responses: int


def first_output(url: str, model: str, inputs: dict[str, np.ndarray], output: str, timeout_s: float = 30.0,
                 want_int: bool = True, parameters: dict | None = None) -> FirstOutput:
    """Send one streaming request; return the first integer value of `output` it carries (`want_int`)
    and whether it ended with a final flag within `timeout_s`. The model's own error is raised
    verbatim; the profiler's own cancel after it stopped waiting never is."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    found: list[int] = []
    errors: list[BaseException] = []
    responses = [0]
    listening = threading.Event()
    listening.set()
    done = threading.Event()

    def callback(result, error) -> None:
        if not listening.is_set():  # what comes after the profiler hung up is its own cancel
            return
        if error is not None:
            errors.append(error)
            done.set()
            return
        responses[0] += 1
        value = None
        if want_int:
            try:
                value = result.as_numpy(output)
            except Exception:  # noqa: BLE001 - an output the response lacks: no count, not an error
                value = None
        if value is not None and value.size and not found:
            try:
                found.append(int(value.reshape(-1)[0]))
            except (TypeError, ValueError):
                pass
            if want_int:
                done.set()
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        client.async_stream_infer(model, infer_inputs(grpcclient, inputs), enable_empty_final_response=True,
                                  parameters=parameters or None)
        finished = done.wait(timeout_s)
        listening.clear()
        # Nothing is in flight once the model said final: close without cancelling. Past the wait,
        # the request is cancelled, and that is the profiler's doing, not the model's.
        client.stop_stream(cancel_requests=not finished)
    except InferenceServerException as err:  # the stream broke: the callback holds the cause
        cause = errors[0] if errors else err
        raise RunFailed(f"model {model!r}: {unreachable_message(GRPC, url, PROFILE_GRPC, grpc_reason(cause))}") from None
    finally:
        client.close()
    if errors and not found:
        if grpc_unreached(errors[0]):
            raise RunFailed(f"model {model!r}: {unreachable_message(GRPC, url, PROFILE_GRPC, grpc_reason(errors[0]))}")
        said = errors[0].message() if hasattr(errors[0], "message") else str(errors[0])
        raise ModelFailed(f"model {model!r} answered with an error: {said}")
    return FirstOutput(value=found[0] if found else None, finished=finished and not errors, responses=responses[0])


def first_output_int(url: str, model: str, inputs: dict[str, np.ndarray], output: str, timeout_s: float = 30.0,
                     want_int: bool = True, parameters: dict | None = None) -> int | None:
    """The first integer value of `output` one request carries (None: none came)."""
    return first_output(url, model, inputs, output, timeout_s, want_int, parameters).value
