"""Live rigs of the sidecar's integration tests: a sidecar behind the native front in the test's
process, and tinyllm's requests on one gRPC stream (straight to Triton or through the sidecar)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any



class Stalled(Exception):
    """Triton answered "Request timeout expired": a model with queue timeouts, which tritonserver
    2.51 sometimes holds ~500 ms in its batcher (docs/server-behaviour.md)."""


def stream_run(url: str, requests: list[tuple[str, str, int]], empty_final: bool, batched: bool = False,
               metadata: tuple[tuple[str, str], ...] = (), priority: int = 0) -> dict[str, dict[str, Any]]:
    """tinyllm's (request id, prompt, max_tokens) requests on one gRPC stream: per request id, its
    text, responses and final flags. `batched`: the model has max_batch_size > 0 (shapes [1, 1]).
    Raises Stalled on Triton's stalled-batcher timeout; asserts there is no other error."""
    import queue
    import time

    import numpy as np
    import tritonclient.grpc as grpcclient

    from tritongen.client import STALL_TIMEOUT

    shape = [1, 1] if batched else [1]
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=dict(metadata))
    for rid, prompt, max_tokens in requests:
        text = grpcclient.InferInput("text_input", shape, "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_).reshape(shape))
        budget = grpcclient.InferInput("max_tokens", shape, "INT32")
        budget.set_data_from_numpy(np.array([max_tokens], dtype=np.int32).reshape(shape))
        client.async_stream_infer("tinyllm", [text, budget], request_id=rid, enable_empty_final_response=empty_final,
                                  priority=priority)
    expected = {rid for rid, _, max_tokens in requests if max_tokens > 0 or empty_final}
    got: dict[str, dict[str, Any]] = {}
    finished: set[str] = set()

    def take(timeout: float) -> None:
        result, error = responses.get(timeout=timeout)
        if error is not None and STALL_TIMEOUT in error.message():
            raise Stalled(error.message())
        assert error is None, (error.status(), error.message())
        response = result.get_response()
        entry = got.setdefault(response.id, {"text": "", "responses": 0, "finals": 0})
        entry["responses"] += 1
        output = result.as_numpy("text_output")
        if output is not None:
            entry["text"] += b"".join(output.ravel()).decode()
        if response.parameters["triton_final_response"].bool_param:
            entry["finals"] += 1
            finished.add(response.id)

    try:
        deadline = time.monotonic() + 20
        while not expected <= finished and time.monotonic() < deadline:
            take(10)
        time.sleep(0.3)  # anything more (there should be nothing) would show here
        while not responses.empty():
            take(1)
    finally:
        client.stop_stream()
        client.close()
    return got


@contextmanager
def native_sidecar(triton: Any, policy: dict[str, Any], folder: Path) -> Iterator[Any]:
    """A sidecar in a thread of the test process behind the native front (nginx with Lua, which
    `make test` installs), in front of `triton` (a TritonServer), on `policy` written to `folder`."""
    from sidecar.config import SidecarConfig
    from sidecar.nginx_front import find_nginx
    from sidecar.run import SidecarThread

    install, why = find_nginx()
    assert install is not None, f"the native front needs nginx with Lua: {why}"
    path = folder / "policy.json"
    path.write_text(json.dumps(policy))
    config = SidecarConfig(
        policy_path=path, upstream=triton.http_url, grpc_upstream=triton.grpc_url,
        triton_metrics_url=triton.metrics_url, listen="127.0.0.1:0", grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0", front="native", watch_interval_s=0.2,
    )
    with SidecarThread(config) as sidecar:
        yield sidecar
