"""Reaching a running Triton: one message for an endpoint that does not answer.

Every command that talks to a live server (profile, doctor, the sidecar, the load generator) says,
when a connection fails, which address it tried and how that address was chosen, in one line:

    cannot reach Triton's gRPC endpoint at 127.0.0.1:8001 (derived from --url; pass --grpc-url
    HOST:PORT): failed to connect to all addresses; ... Connection refused

`how` is the option that set the address, or the option it was derived from and the one that sets
it (`derived`); None where no option sets it. The probes import tritonclient only when called.
"""

from __future__ import annotations

import queue

from tritongen.errors import RunFailed

GRPC = "Triton's gRPC endpoint"
HTTP = "Triton's HTTP endpoint"
METRICS = "Triton's metrics endpoint"


def derived(option: str, origin: str, form: str = "HOST:PORT") -> str:
    """How an address the user did not give was chosen, and how to give it."""
    return f"derived from {origin}; pass {option} {form}"


def one_line(reason: object, limit: int = 300) -> str:
    text = " ".join(str(reason).split()) or type(reason).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unreachable_message(what: str, address: str, how: str | None, reason: object) -> str:
    where = f"{address} ({how})" if how else address
    return f"cannot reach {what} at {where}: {one_line(reason)}"


def unreachable(what: str, address: str, how: str | None, reason: object) -> RunFailed:
    """The error for an endpoint that did not answer (`what`: GRPC, HTTP, METRICS or another noun)."""
    return RunFailed(unreachable_message(what, address, how, reason))


def grpc_reason(err: BaseException) -> str:
    """tritonclient's message without its class name (InferenceServerException.message())."""
    message = getattr(err, "message", None)
    text = message() if callable(message) else None
    return text or str(err) or type(err).__name__


def grpc_unreached(err: object) -> bool:
    """A gRPC error that says no server answered (UNAVAILABLE, or no answer in time), not that one refused."""
    status = getattr(err, "status", None)
    code = str((status() if callable(status) else status) or "")
    return "UNAVAILABLE" in code or "DEADLINE_EXCEEDED" in code


def stream_cause(responses: queue.Queue, err: BaseException, last_error: str | None = None) -> object:
    """Why a gRPC stream broke. tritonclient hands the cause (a refused connection, say) to the
    stream's callback and raises only "The stream is no longer in valid state" from the next send:
    the callback's error still queued (items end with it) is the one to report, else the last
    request's (the callback's error, already collected), else what the send raised."""
    cause: object = last_error
    while True:
        try:
            item = responses.get_nowait()
        except queue.Empty:
            break
        if item[-1] is not None:
            cause = item[-1]
    return cause if cause is not None else err


def check_grpc(address: str, how: str | None, timeout_s: float = 5.0) -> None:
    """Raise `unreachable` unless a Triton answers gRPC at `address` (ServerLive, one round trip)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(address)
    except (InferenceServerException, ValueError) as err:  # an address gRPC cannot parse
        raise unreachable(GRPC, address, how, grpc_reason(err)) from None
    try:
        client.is_server_live(client_timeout=timeout_s)
    except InferenceServerException as err:
        if grpc_unreached(err):  # any other error is an answer: something serves gRPC there
            raise unreachable(GRPC, address, how, grpc_reason(err)) from None
    finally:
        client.close()


def metrics_problem(url: str, how: str | None, timeout_s: float = 5.0) -> str | None:
    """None when `url` serves metrics, else the one-line reason naming it."""
    import httpx

    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as err:
        return unreachable_message(METRICS, url, how, f"{type(err).__name__}: {err}")
    if response.status_code != 200:
        return unreachable_message(METRICS, url, how, f"HTTP {response.status_code}")
    return None
