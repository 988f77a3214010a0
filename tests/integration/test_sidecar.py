"""The sidecar in front of a real tritonserver: out-of-memory kills versus friendly 429s, and the
HTTP and gRPC pass-through.
One unit (about 770 lines): every test runs against the one tritonserver (three Python models) and
sidecar process this module starts once (the `deployment` fixture); split, each file would start
its own pair, or share it through a conftest fixture that ties the files together anyway.

One server and one sidecar (started through `tritongen sidecar`, as a user would) for the module.
The repository is built by `build_sidecar_repository` (tests/helpers.py): `tinyllm` gets the KV
pool the plan computes for a small memory quota, but a `max_num_seqs` of 32 instead of the plan's
bound, as an operator chasing throughput might set it; so the engine admits more sequences than its pool can hold and direct traffic is killed with
"out of memory: KV cache pool exhausted". The sidecar's policy is built from the same spec and
plan with `build_sidecar_policy` and told about the raised `max_num_seqs` (max_inflight 32):
only memory admission stands between the burst and an out-of-memory error.

tinyllm runs without Triton's dynamic batcher here (max_batch_size 0): on this 2-core machine the
batcher in front of a decoupled Python model held streams for up to 0.5 s, which would measure
Triton's queue rather than the sidecar. `ranker` keeps its batcher and priority levels, so the
priority the sidecar forwards is exercised there.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import queue
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from sidecar.run import run_loop
from tests.helpers import SIDECAR_POOL_BLOCKS, build_sidecar_repository
from tests.live_sidecar_rigs import stream_run
from tritongen.server import ServerOptions, TritonServer
from tritongen.sidecar_process import SidecarProcess

pytestmark = pytest.mark.integration

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT_BYTES = 21  # "request NNN says hello"
# Chat-like interactive requests are short, batch requests long: 21 + 8 = 29 tokens (2 blocks of 16),
# 21 + 24 = 45 (3 blocks), 21 + 40 = 61 (4 blocks); the pool of 12 blocks holds 3 to 6 sequences.
MAX_TOKENS = {"interactive": 8, "normal": 24, "batch": 40}
# About 40 requests/s fit through the pool (~4 sequences, ~0.1 s each); the burst offers five times that.
BURST_REQUESTS = 100
BURST_SECONDS = 0.5
CLASSES = ("interactive", "normal", "batch")
# As deployed where nginx with Lua is installed (`--front auto`, which `make test` provides): nginx faces
# the clients, the lane carries plain classic requests, everything else reaches the Python listeners
# through it. tests/integration/test_sidecar_native.py checks the lane itself.
FRONT = "native"


@dataclass
class Deployment:
    server: TritonServer
    sidecar: subprocess.Popen[bytes]
    policy_path: Path
    policy: dict[str, Any]
    http: str  # sidecar base URL
    grpc: str  # sidecar gRPC host:port
    metrics: str  # sidecar metrics URL
    log_path: Path

    @property
    def direct(self) -> str:
        return f"http://{self.server.http_url}"

    def status(self) -> dict[str, Any]:
        resp = httpx.get(f"{self.http}/sidecar/status", headers=AUTH, timeout=5)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def wait_idle(self, timeout: float = 5.0) -> dict[str, Any]:
        """Until nothing is reserved, in flight or waiting (lingering reservations expire by then),
        but the native lane's idle slots (sidecar/lane.py: reservations nginx may fill)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            lane = [pair for classes in status["front"]["lane"].values() for pair in classes.values()]
            slots, slot_bytes = sum(x["slots"] for x in lane), sum(x["reserved_bytes"] for x in lane)
            if (status["reserved_bytes"] == slot_bytes and status["inflight"] == slots
                    and not any(x["inflight"] for x in lane) and not any(status["waiting"].values())):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"the sidecar did not return to idle: {status}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("sidecar")
    repo, policy, _ = build_sidecar_repository(tmp)
    policy_path = tmp / "sidecar_policy.json"
    policy_path.write_text(json.dumps(policy, indent=2))
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    with TritonServer(ServerOptions(repository=repo)) as server:
        log_path = tmp / "sidecar.log"
        sidecar = SidecarProcess(policy_path, server, log_path, grpc_upstream=server.grpc_url, token_file=token_file,
                                 front=FRONT, log_level=os.environ.get("SIDECAR_LOG", "info"))  # debug: one line a request
        with sidecar:
            assert sidecar.proc is not None
            yield Deployment(server, sidecar.proc, policy_path, policy, f"http://{sidecar.http_url}", sidecar.grpc_url,
                             sidecar.metrics_url, log_path)
    assert sidecar.proc.returncode == 0, log_path.read_text()  # SIGTERM is a clean stop


# ------------------------------------------------------------------------------------------------
# the burst: out-of-memory kills versus 429s


def metrics_text(deployment: Deployment) -> str:
    """The sidecar's Prometheus exposition."""
    return httpx.get(deployment.metrics, timeout=5).text


def metric_total(text: str, prefix: str) -> float:
    """The sum of the samples whose line starts with `prefix` (a family, or a family and labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def triton_oom_count(server: TritonServer) -> float:
    return metric_total(httpx.get(server.metrics_url, timeout=5).text, "llm_engine_oom_errors_total{")


async def _one(session: aiohttp.ClientSession, url: str, n: int, klass: str) -> dict[str, Any]:
    body = {"text_input": f"request {n:03d} says hello", "max_tokens": MAX_TOKENS[klass]}
    out: dict[str, Any] = {"class": klass, "status": None, "retry_after": None, "error": None, "ttft": None,
                           "tokens": 0, "body": None}
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body, headers={"x-traffic-class": klass}) as resp:
            out["status"], out["retry_after"] = resp.status, resp.headers.get("Retry-After")
            if resp.status != 200:
                out["body"] = await resp.text()
                try:
                    out["error"] = json.loads(out["body"]).get("error")
                except ValueError:
                    out["error"] = out["body"]
                return out
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    out["error"] = event["error"]
                    break
                if out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - t0
                out["tokens"] += 1
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        out["error"] = f"{type(err).__name__}: {err}"
    return out


def burst(base: str, requests: int = BURST_REQUESTS, seconds: float = BURST_SECONDS) -> list[dict[str, Any]]:
    """Open loop: `requests` arrivals spread evenly over `seconds`, whatever the answers; bounded
    (every request has a 20 s client timeout) and over in a few seconds."""

    async def main() -> list[dict[str, Any]]:
        timeout = aiohttp.ClientTimeout(total=20)
        url = f"{base}/v2/models/tinyllm/generate_stream"
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            start = time.perf_counter()

            async def arrival(n: int) -> dict[str, Any]:
                await asyncio.sleep(max(0.0, start + n * seconds / requests - time.perf_counter()))
                return await _one(session, url, n, CLASSES[n % 3])

            return await asyncio.gather(*(arrival(n) for n in range(requests)))

    return run_loop(main())  # uvloop, as the sidecar: the client shares the 2 cores too


def histogram(deployment: Deployment, name: str, klass: str) -> dict[str, float]:
    """Cumulative bucket counts of one of the sidecar's per-class histograms, summed over models."""
    text = metrics_text(deployment)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{") and f'class="{klass}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def histogram_within(deployment: Deployment, name: str, klass: str, bound_s: float,
                     before: dict[str, float]) -> tuple[int, int]:
    """(observations within bound_s, all observations) since `before`; bound_s must be a bucket bound."""
    after = histogram(deployment, name, klass)
    bound = next(le for le in after if le != "+Inf" and abs(float(le) - bound_s) < 1e-9)
    return (int(after[bound] - before.get(bound, 0.0)), int(after["+Inf"] - before.get("+Inf", 0.0)))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def test_burst_direct_is_killed_by_oom_sidecar_answers_429(deployment: Deployment) -> None:
    server = deployment.server
    # Directly against Triton: the engine admits up to 32 sequences into a pool that holds 3 to 6.
    before = triton_oom_count(server)
    direct = burst(deployment.direct)
    direct_oom = [r for r in direct if r["error"] and "out of memory" in r["error"]]
    assert direct_oom, f"expected out-of-memory failures directly against Triton, got {direct[:3]}"
    assert triton_oom_count(server) - before >= len(direct_oom)

    # The direct traffic is over; wait until the sidecar's live reading of the pool says so (it would
    # rightly count blocks still held by traffic that bypassed it as taken).
    deadline = time.monotonic() + 5
    while deployment.status()["scopes"]["pool:tinyllm"]["used_bytes"] != 0:
        assert time.monotonic() < deadline, "the KV pool did not drain after the direct burst"
        time.sleep(0.1)

    # Through the sidecar: served, or refused early with 429 and Retry-After; nothing killed.
    before = triton_oom_count(server)
    sidecar_before = histogram(deployment, "sidecar_time_to_first_token_seconds", "interactive")
    waits_before = histogram(deployment, "sidecar_queue_wait_seconds", "interactive")
    # Twice the direct burst: on a quiet host the sidecar's queue can absorb 100 requests without
    # refusing any (seen in CI), and this test is about what happens to the excess.
    through = burst(deployment.http, requests=2 * BURST_REQUESTS)
    ok = [r for r in through if r["status"] == 200 and r["error"] is None and r["tokens"] == MAX_TOKENS[r["class"]]]
    refused = [r for r in through if r["status"] == 429]
    others = [r for r in through if r not in ok and r not in refused]
    assert others == [], f"through the sidecar every request is served or gets a 429: {others[:3]}"
    assert triton_oom_count(server) == before, "no request may be killed by an out-of-memory error"
    assert refused, "five times the capacity must overflow into 429s"
    for r in refused:
        assert r["retry_after"] is not None and int(r["retry_after"]) >= 1
        body = json.loads(r["body"])
        assert body["reason"] in ("queue_full", "queue_wait_exceeds_target", "queue_timeout")
        assert body["limit"] and "headroom_bytes" in body and body["retry_after_s"] >= 1
        assert body["model"] == "tinyllm" and body["class"] == r["class"]
    interactive = [r["ttft"] for r in ok if r["class"] == "interactive"]
    assert len(interactive) >= 5, "interactive requests must be served under overload, not only refused"
    klass = next(c for c in deployment.policy["classes"] if c["name"] == "interactive")
    target_s, max_wait_s = klass["p99_ms"] / 1000, klass["max_queue_wait_ms"] / 1000
    # The verdicts are what the sidecar's admission decides, which a correct build can never miss:
    # no interactive request waited in the sidecar past its class's longest wait (a queued request
    # is refused at its deadline, never granted after it), and the sidecar's interactive time to
    # first token, from the request's arrival there, is within target for most requests (its
    # median). The tail is printed, not judged: it also holds the model's own compute on a host
    # where this burst's client, nginx, the sidecar and the model share 2 cores (a correct build
    # saw 38 of 40 within 250 ms in CI, 2026-12-04, and 66/66, 49/49 on other runs), and what the
    # client sees adds the 400 connections queued in nginx before the sidecar can stamp them
    # (279-505 ms medians on a slow hour). bench_llm_guard measures the tail on a real engine.
    median = sorted(interactive)[len(interactive) // 2]
    waited_within, waited = histogram_within(deployment, "sidecar_queue_wait_seconds", "interactive", max_wait_s,
                                             waits_before)
    assert waited_within == waited and waited >= len(interactive), (
        f"{waited - waited_within} of {waited} admitted interactive requests waited in the sidecar past the "
        f"class's {max_wait_s * 1000:.0f} ms"
    )
    within, total = histogram_within(deployment, "sidecar_time_to_first_token_seconds", "interactive", target_s,
                                     sidecar_before)
    assert total == len(interactive)
    assert within >= math.ceil(total / 2), (
        f"the sidecar's interactive median time to first token is over its {target_s * 1000:.0f} ms target: only "
        f"{within} of {total} within it"
    )
    print(
        f"\nclient-side interactive median {median * 1000:.0f} ms (target {target_s * 1000:.0f}); "
        f"burst of {len(direct)} requests in {BURST_SECONDS} s (KV pool of {SIDECAR_POOL_BLOCKS} blocks): direct "
        f"{len(direct_oom)} killed by OOM; through the sidecar {len(ok)} served, {len(refused)} x 429, 0 OOM; "
        f"interactive TTFT: {within}/{total} within {target_s * 1000:.0f} ms at the sidecar, client-side P99 "
        f"{p99(interactive) * 1000:.0f} ms ({sorted(round(x * 1000) for x in interactive)[-8:]})"
    )
    status = deployment.wait_idle()
    assert status["lingering"] == 0


def model_executions(deployment: Deployment, model: str) -> int:
    """Requests Triton itself has seen for `model` (successes and failures), from its statistics."""
    stats = httpx.get(f"{deployment.direct}/v2/models/{model}/stats", timeout=5).json()["model_stats"][0]
    inference = stats["inference_stats"]
    return int(inference["success"]["count"]) + int(inference["fail"]["count"])


def test_a_request_beyond_max_context_is_refused_by_the_sidecar_never_reaching_the_model(
    deployment: Deployment,
) -> None:
    before = model_executions(deployment, "tinyllm")
    resp = httpx.post(f"{deployment.http}/v2/models/tinyllm/generate_stream", timeout=10,
                      json={"text_input": "hello", "max_tokens": 100_000})
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["reason"] == "exceeds_context" and "max_tokens 100000" in body["error"]
    # gRPC: INVALID_ARGUMENT with the same reason
    client = grpcclient.InferenceServerClient(deployment.grpc)
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello"], dtype=object))
    tokens = grpcclient.InferInput("max_tokens", [1], "INT32")
    tokens.set_data_from_numpy(np.array([100_000], dtype=np.int32))
    errors: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: errors.put(error))
    client.async_stream_infer("tinyllm", [text, tokens])
    error = errors.get(timeout=10)
    client.stop_stream()
    client.close()
    assert error is not None and "exceeds_context" in str(error)
    assert model_executions(deployment, "tinyllm") == before, "the request must never reach the model"


def test_a_non_batching_model_at_concurrency_16_is_never_refused(deployment: Deployment) -> None:
    """`echo` has max_batch_size 0 and two instances: Triton queues without bound, so must the sidecar."""
    policy = next(m for m in deployment.policy["models"] if m["name"] == "echo")
    assert policy["max_inflight"] is None
    body = {"inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}

    async def main() -> list[int]:
        url = f"{deployment.http}/v2/models/echo/infer"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def client() -> list[int]:
                out = []
                for _ in range(25):
                    async with session.post(url, json=body) as resp:
                        await resp.read()
                        out.append(resp.status)
                return out

            return [status for statuses in await asyncio.gather(*(client() for _ in range(16))) for status in statuses]

    statuses = run_loop(main())
    assert statuses.count(200) == len(statuses) == 16 * 25, sorted(set(statuses))


# ------------------------------------------------------------------------------------------------
# pass-through: HTTP


def features(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).rand(rows, 32).astype(np.float32)


@pytest.mark.parametrize(("binary", "compression"), [(False, None), (True, None), (True, "gzip"), (False, "deflate")])
def test_http_infer_passes_tensors_through(deployment: Deployment, binary: bool, compression: str | None) -> None:
    x = features(3)
    results = []
    for url in (deployment.server.http_url, deployment.http.removeprefix("http://")):
        client = httpclient.InferenceServerClient(url)
        tensor = httpclient.InferInput("FEATURES", [3, 32], "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("SCORES", binary_data=binary)
        result = client.infer("ranker", [tensor], outputs=[out], request_id="req-42",
                              headers={"x-traffic-class": "batch"},  # batch: the priority is rewritten
                              request_compression_algorithm=compression, response_compression_algorithm=compression)
        results.append(result)
        client.close()
    direct, through = results
    np.testing.assert_array_equal(direct.as_numpy("SCORES"), through.as_numpy("SCORES"))
    assert through.get_response()["id"] == "req-42"


def test_http_infer_with_class_parameter_and_client_priority(deployment: Deployment) -> None:
    doc = {"id": "p1", "parameters": {"traffic_class": "interactive", "priority": 3},
           "inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32", "data": features(1).ravel().tolist()}]}
    resp = httpx.post(f"{deployment.http}/v2/models/ranker/infer", json=doc, timeout=10)
    assert resp.status_code == 200 and resp.json()["id"] == "p1"


def _raw_response(sock: socket.socket, buffer: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 response read off a raw socket (Content-Length or chunked): (status, body)."""
    def more() -> None:
        data = sock.recv(65536)
        assert data, "the connection closed before the response ended"
        buffer.extend(data)

    while b"\r\n\r\n" not in buffer:
        more()
    end = buffer.index(b"\r\n\r\n")
    head = bytes(buffer[:end]).decode("latin-1").lower()
    del buffer[: end + 4]
    status = int(head.split(" ", 2)[1])
    if 100 <= status < 200:  # an interim answer has no body
        return status, b""
    if "content-length:" in head:
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        while len(buffer) < length:
            more()
        body = bytes(buffer[:length])
        del buffer[:length]
        return status, body
    body = bytearray()
    while True:  # chunked
        while b"\r\n" not in buffer:
            more()
        line_end = buffer.index(b"\r\n")
        size = int(bytes(buffer[:line_end]).split(b";")[0], 16)
        while len(buffer) < line_end + 2 + size + 2:
            more()
        body += buffer[line_end + 2: line_end + 2 + size]
        del buffer[: line_end + 2 + size + 2]
        if size == 0:
            return status, bytes(body)


def test_one_keep_alive_connection_mixes_every_kind_of_request(deployment: Deployment) -> None:
    """What clients do on one connection: a health check, an infer, a stream, an infer with
    `Expect: 100-continue` (curl's habit for large bodies), an admin API, each answered in turn."""
    host, port = deployment.http.removeprefix("http://").split(":")
    doc = json.dumps({"inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32",
                                  "data": features(1).ravel().tolist()}]}).encode()

    def post(path: str, body: bytes, *extra: str) -> bytes:
        head = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", f"Content-Length: {len(body)}",
                *extra]
        return ("\r\n".join(head) + "\r\n\r\n").encode()

    buffer = bytearray()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _raw_response(sock, buffer)[0] == 200
        sock.sendall(post("/v2/models/ranker/infer", doc) + doc)
        status, body = _raw_response(sock, buffer)
        assert status == 200 and json.loads(body)["outputs"][0]["name"] == "SCORES"
        stream = json.dumps({"text_input": "one connection", "max_tokens": 4}).encode()
        sock.sendall(post("/v2/models/tinyllm/generate_stream", stream) + stream)
        status, body = _raw_response(sock, buffer)
        assert status == 200 and body.count(b"data:") >= 1 and b'"error"' not in body
        sock.sendall(post("/v2/models/ranker/infer", doc, "Expect: 100-continue"))
        status, _ = _raw_response(sock, buffer)
        assert status == 100
        sock.sendall(doc)
        status, body = _raw_response(sock, buffer)
        assert status == 200 and json.loads(body)["outputs"][0]["name"] == "SCORES"
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert _raw_response(sock, buffer)[0] == 401  # shut without the admin token (a token file is given)
        sock.sendall(post("/v2/models/ranker/infer", doc) + doc)
        assert _raw_response(sock, buffer)[0] == 200
    deployment.wait_idle()


def stream_text(base: str, text_input: str, max_tokens: int) -> tuple[str, str]:
    """(the streamed text, the content type) of one tinyllm generate_stream request to `base`."""
    body = {"text_input": text_input, "max_tokens": max_tokens}
    with httpx.stream("POST", f"{base}/v2/models/tinyllm/generate_stream", json=body, timeout=20) as resp:
        assert resp.status_code == 200
        pieces = [json.loads(line[5:])["text_output"] for line in resp.iter_lines() if line.startswith("data:")]
        return "".join(pieces), resp.headers["content-type"]


def test_http_generate_stream_text_matches_direct(deployment: Deployment) -> None:
    prompt = "the sidecar passes tokens through"
    assert stream_text(deployment.direct, prompt, 20) == stream_text(deployment.http, prompt, 20)


def carried(deployment: Deployment) -> int:
    """Model requests nginx carried after a decision (sidecar/decisions.py), reported ended."""
    return int(deployment.status()["front"]["carried"]["carried"])


def test_http_streams_are_carried_by_nginx_with_the_python_paths_metrics(deployment: Deployment) -> None:
    """A generate_stream request crosses nginx only: Python decides once and hears of its first token
    and end; the same metrics count it as the Python path would."""
    deployment.wait_idle()
    text = metrics_text(deployment)
    durations = metric_total(text, 'sidecar_request_duration_seconds_count{class="interactive"')
    first_tokens = metric_total(text, 'sidecar_time_to_first_token_seconds_count{class="interactive"')
    finished = metric_total(text, 'sidecar_requests_finished_total{class="interactive",model="tinyllm",outcome="ok"')
    before = carried(deployment)
    for n in range(3):
        with httpx.stream("POST", f"{deployment.http}/v2/models/tinyllm/generate_stream", timeout=20,
                          json={"text_input": f"carried {n}", "max_tokens": 6},
                          headers={"x-traffic-class": "interactive"}) as resp:
            assert resp.status_code == 200
            assert sum(1 for line in resp.iter_lines() if line.startswith("data:")) == 6
    deadline = time.monotonic() + 5
    while carried(deployment) < before + 3:  # the ends come from nginx's log phase, a moment after the client's
        assert time.monotonic() < deadline, f"nginx reported {carried(deployment) - before} of 3 ends"
        time.sleep(0.05)
    text = metrics_text(deployment)
    assert metric_total(text, 'sidecar_request_duration_seconds_count{class="interactive"') - durations == 3
    assert metric_total(text, 'sidecar_time_to_first_token_seconds_count{class="interactive"') - first_tokens == 3
    assert metric_total(
        text, 'sidecar_requests_finished_total{class="interactive",model="tinyllm",outcome="ok"') - finished == 3
    deployment.wait_idle()


def test_classed_and_tenant_infers_are_carried_by_nginx_with_the_python_paths_metrics(deployment: Deployment) -> None:
    """An HTTP infer the lane does not take (a class whose priority must be written in, a tenant)
    crosses nginx only: Python decides it, writes the priority into its JSON part (the binary
    tensors after it keep their bytes) and counts it in the same metrics."""
    deployment.wait_idle()
    x = features(2, seed=5)
    expected = httpclient.InferenceServerClient(deployment.server.http_url).infer(
        "ranker", [_http_tensor(x)]).as_numpy("SCORES")
    text = metrics_text(deployment)
    durations = metric_total(text, 'sidecar_request_duration_seconds_count{class="batch",model="ranker"')
    before = carried(deployment)
    client = httpclient.InferenceServerClient(deployment.http.removeprefix("http://"))
    for headers in ({"x-traffic-class": "batch"}, {"x-traffic-class": "batch", "x-tenant": "team-a"}):
        for _ in range(2):
            result = client.infer("ranker", [_http_tensor(x)], headers=headers,
                                  outputs=[httpclient.InferRequestedOutput("SCORES", binary_data=True)])
            np.testing.assert_array_equal(result.as_numpy("SCORES"), expected)
    client.close()
    deadline = time.monotonic() + 5
    while carried(deployment) < before + 4:
        assert time.monotonic() < deadline, f"nginx reported {carried(deployment) - before} of 4 ends"
        time.sleep(0.05)
    text = metrics_text(deployment)
    assert metric_total(text, 'sidecar_request_duration_seconds_count{class="batch",model="ranker"') - durations == 4
    deployment.wait_idle()


def _http_tensor(x: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("FEATURES", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def test_a_client_that_leaves_mid_stream_or_while_queued_holds_nothing(deployment: Deployment) -> None:
    """Streams cut after their first token, and a burst whose clients give up while queued: every
    reservation and queue place goes back."""
    deployment.wait_idle()

    async def main() -> list[str]:
        url = f"{deployment.http}/v2/models/tinyllm/generate_stream"

        async def cut(n: int) -> str:
            body = {"text_input": f"leaving {n:03d} early", "max_tokens": 40}
            timeout = aiohttp.ClientTimeout(total=0.3 if n % 2 else 20)  # half give up while queued
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.post(url, json=body, headers={"x-traffic-class": "batch"}) as resp:
                        if resp.status != 200:
                            return str(resp.status)
                        await resp.content.readline()  # the first event; then the client leaves
                        return "cut"
            except asyncio.TimeoutError:
                return "gave up"

        return await asyncio.gather(*(cut(n) for n in range(24)))

    outcomes = run_loop(main())
    assert "cut" in outcomes, outcomes
    status = deployment.wait_idle(timeout=10)
    assert status["lingering"] == 0 and not any(status["waiting"].values())
    assert deployment.status()["front"]["carried"]["in_flight"] == 0


@pytest.mark.parametrize(
    "path",
    ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/ranker", "/v2/models/ranker/config",
     "/v2/models/tinyllm/versions/1", "/v2/models/ranker/ready"],
)
def test_http_metadata_passes_through(deployment: Deployment, path: str) -> None:
    direct = httpx.get(deployment.direct + path, timeout=5)
    through = httpx.get(deployment.http + path, timeout=5)
    assert (through.status_code, through.content) == (direct.status_code, direct.content)


def test_http_stats_and_unknown_model(deployment: Deployment) -> None:
    stats = httpx.get(f"{deployment.http}/v2/models/ranker/stats", timeout=5)
    assert stats.status_code == 200 and stats.json()["model_stats"][0]["name"] == "ranker"
    missing = httpx.post(f"{deployment.http}/v2/models/nope/infer", json={"inputs": []}, timeout=5)
    direct = httpx.post(f"{deployment.direct}/v2/models/nope/infer", json={"inputs": []}, timeout=5)
    assert (missing.status_code, missing.json()) == (direct.status_code, direct.json())


# ------------------------------------------------------------------------------------------------
# pass-through: gRPC


def test_grpc_infer_passes_tensors_through(deployment: Deployment) -> None:
    x = features(4, seed=3)
    outs = []
    for url in (deployment.server.grpc_url, deployment.grpc):
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("FEATURES", [4, 32], "FP32")
        tensor.set_data_from_numpy(x)  # raw_input_contents: binary
        result = client.infer("ranker", [tensor], request_id="g-7", headers={"x-traffic-class": "interactive"})
        outs.append((result.as_numpy("SCORES"), result.get_response().id))
        assert client.is_server_ready() and client.is_model_ready("ranker")
        assert client.get_model_metadata("ranker").name == "ranker"
        assert client.get_model_config("tinyllm").config.model_transaction_policy.decoupled
        assert client.get_inference_statistics("ranker").model_stats[0].name == "ranker"
        client.close()
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    assert outs[1][1] == "g-7"


STREAM_REQUESTS = [("client-0", "first prompt", 12), ("client-1", "a second, longer prompt", 12),
                   ("client-2", "no tokens asked", 0)]  # max_tokens 0: the model sends a flags-only final


@pytest.mark.parametrize("empty_final", [False, True])
def test_grpc_stream_passes_through(deployment: Deployment, empty_final: bool) -> None:
    """tinyllm kills when its pool runs dry (kv_policy grow_kill): its streams take the Python relay,
    which reserves each request's KV (sidecar/stream_path.py); test_sidecar_streams.py runs nginx's way."""
    ways = deployment.status()["front"]["grpc_streams"]
    assert ways["path"] == "relay" and "grow_kill" in ways["why"], ways
    relayed = metric_total(metrics_text(deployment), 'sidecar_grpc_streams_total{path="relay"}')
    direct = stream_run(deployment.server.grpc_url, STREAM_REQUESTS, empty_final)
    through = stream_run(deployment.grpc, STREAM_REQUESTS, empty_final)
    assert metric_total(metrics_text(deployment), 'sidecar_grpc_streams_total{path="relay"}') == relayed + 1
    assert through == direct
    assert {"client-0", "client-1"} <= set(through) and all(v["finals"] == 1 for v in through.values())
    assert ("client-2" in through) == empty_final  # the flags-only final only when the client asked
    deployment.wait_idle()


# A request id in the metadata, a class, a tenant the policy does not list, and a binary value.
CLIENT_METADATA = (("x-request-id", "trace-0042"), ("x-traffic-class", "interactive"), ("x-tenant", "acme"),
                   ("x-trace-bin", b"\x00\x01\x02"))


def _pairs(metadata: Any) -> tuple[tuple[str, Any], ...]:
    """The metadata as (key, value) pairs, but `content-length: 0`: nginx (the native front) writes
    it on a trailers-only answer (an error with no message), as HTTP/2 allows; gRPC reads nothing of it."""
    return tuple((m[0], m[1]) for m in (metadata or ()) if (m[0], m[1]) != ("content-length", "0"))


def _stream_request(rid: str, prompt: bytes, max_tokens: int) -> Any:
    request = pb.ModelInferRequest(model_name="tinyllm", id=rid)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(prompt)) + prompt)
    request.raw_input_contents.append(np.array([max_tokens], dtype=np.int32).tobytes())
    return request


def grpc_exchange(url: str) -> dict[str, Any]:
    """What a client sees of each kind of call (ids, codes, initial and trailing metadata)."""
    out: dict[str, Any] = {}
    infer = pb.ModelInferRequest(model_name="ranker", id="meta-1")
    infer.inputs.add(name="FEATURES", datatype="FP32", shape=[1, 32])
    infer.raw_input_contents.append(features(1).tobytes())
    with grpc.insecure_channel(url) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        response, call = stub.ModelInfer.with_call(infer, metadata=CLIENT_METADATA, timeout=10)
        out["infer"] = (response.id, _pairs(call.initial_metadata()), _pairs(call.trailing_metadata()))
        meta, call = stub.ServerMetadata.with_call(pb.ServerMetadataRequest(), metadata=CLIENT_METADATA, timeout=10)
        out["passthrough"] = (meta.name, _pairs(call.initial_metadata()), _pairs(call.trailing_metadata()))
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(pb.ModelInferRequest(model_name="nope", id="e-1"), metadata=CLIENT_METADATA, timeout=10)
        out["error"] = (err.value.code(), err.value.details(), _pairs(err.value.initial_metadata()),
                        _pairs(err.value.trailing_metadata()))
        requests = [_stream_request(f"s-{i}", f"prompt number {i}".encode(), 4) for i in range(3)]
        stream = stub.ModelStreamInfer(iter(requests), metadata=CLIENT_METADATA, timeout=20)
        replies = list(stream)
        assert all(not r.error_message for r in replies), [r.error_message for r in replies if r.error_message]
        out["stream"] = (sorted({r.infer_response.id for r in replies}), stream.code(),
                         _pairs(stream.initial_metadata()), _pairs(stream.trailing_metadata()))
    return out


def test_grpc_ids_and_metadata_come_back_as_triton_sends_them(deployment: Deployment) -> None:
    """The client's request ids come back on unary calls and streams (the sidecar maps its own stream
    ids back), and the response metadata through the sidecar is Triton's: nothing added, nothing
    removed, on ModelInfer, ModelStreamInfer, a pass-through method and an error."""
    direct = grpc_exchange(deployment.server.grpc_url)
    through = grpc_exchange(deployment.grpc)
    assert through == direct, f"direct: {direct}\nthrough the sidecar: {through}"
    assert through["infer"][0] == "meta-1"
    assert through["stream"][0] == ["s-0", "s-1", "s-2"] and through["stream"][1] == grpc.StatusCode.OK
    assert through["error"][0] != grpc.StatusCode.UNAVAILABLE and "nope" in through["error"][1]
    print(f"\nTriton's gRPC response metadata (direct == through the sidecar): {direct}")
    text = metrics_text(deployment)
    assert 'sidecar_tenant_requests_admitted_total{tenant="other"}' in text  # "acme" is not in this policy
    assert 'sidecar_prompt_tokens_bucket{le="16.0",model="tinyllm"}' in text  # the stream's prompts
    assert deployment.status()["upstream"]["up"] is True
    deployment.wait_idle()


# ------------------------------------------------------------------------------------------------
# bad requests, admin endpoints, reloads


def test_malformed_requests_get_400_with_a_reason(deployment: Deployment) -> None:
    base = deployment.http
    bad_json = httpx.post(f"{base}/v2/models/tinyllm/generate_stream", content=b"{nope", timeout=5)
    assert bad_json.status_code == 400 and bad_json.json()["reason"] == "malformed_request"
    assert "not valid" in bad_json.json()["error"]
    bad_length = httpx.post(f"{base}/v2/models/ranker/infer", content=b'{"inputs": []}',
                            headers={"Inference-Header-Content-Length": "999"}, timeout=5)
    assert bad_length.status_code == 400 and "outside the body" in bad_length.json()["error"]
    bad_class = httpx.post(f"{base}/v2/models/ranker/infer", json={"inputs": []},
                           headers={"x-traffic-class": "platinum"}, timeout=5)
    assert bad_class.status_code == 400 and "unknown traffic class 'platinum'" in bad_class.json()["error"]
    bad_tokens = httpx.post(f"{base}/v2/models/tinyllm/generate_stream",
                            json={"text_input": "x", "max_tokens": "lots"}, timeout=5)
    assert bad_tokens.status_code == 400 and "must hold integers" in bad_tokens.json()["error"]
    too_big = httpx.post(f"{base}/v2/models/ranker/infer", content=b" " * (2 * 1024 * 1024), timeout=10)
    assert too_big.status_code == 413
    huge_header = httpx.get(f"{base}/v2/health/ready", headers={"x-junk": "a" * 20000}, timeout=5)
    assert huge_header.status_code == 400
    with grpc.insecure_channel(deployment.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="ranker")
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, metadata=(("x-traffic-class", "platinum"),), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown traffic class" in err.value.details()
    text = metrics_text(deployment)
    assert 'sidecar_requests_malformed_total{protocol="http"}' in text


def test_status_and_reload_need_the_token(deployment: Deployment) -> None:
    base = deployment.http
    assert httpx.get(f"{base}/sidecar/status", timeout=5).status_code == 401
    assert httpx.get(f"{base}/sidecar/status", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
    assert httpx.post(f"{base}/sidecar/reload", timeout=5).status_code == 401
    status = deployment.status()
    assert {"inflight", "reserved_bytes", "concurrency_limit", "scopes", "policy", "upstream"} <= set(status)
    assert status["upstream"]["up"] is True
    assert status["scopes"]["pool:tinyllm"]["source"] == "triton_metrics"  # tinyllm's own KV gauges
    assert status["scopes"]["pool:tinyllm"]["total_bytes"] == SIDECAR_POOL_BLOCKS * 16 * 512
    reload = httpx.post(f"{base}/sidecar/reload", headers=AUTH, timeout=5)
    assert reload.status_code == 200 and reload.json()["reloaded"] is True


def test_metrics_endpoint(deployment: Deployment) -> None:
    # A streamed request of its own first: the histograms have a sample whichever tests ran before.
    stream_text(deployment.http, "metrics", 4)
    text = metrics_text(deployment)
    for family in ("sidecar_requests_admitted_total", "sidecar_inflight_requests", "sidecar_reserved_bytes",
                   "sidecar_oom_risk_ratio", "sidecar_headroom_bytes", "sidecar_concurrency_limit",
                   "sidecar_queue_wait_seconds_bucket", "sidecar_request_duration_seconds_bucket",
                   "sidecar_time_to_first_token_seconds_bucket", "sidecar_headroom_source_up",
                   "sidecar_upstream_up 1.0"):
        assert family in text, family
    assert 'sidecar_headroom_source_up{source="triton_metrics"} 1.0' in text
    # The loop-lag timer samples every 100 ms from start (sidecar.app.LOOP_LAG_PERIOD_S): 10 within a few seconds.
    deadline = time.monotonic() + 5.0
    while (lag_count := metric_total(text, "sidecar_event_loop_lag_seconds_count")) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
        text = metrics_text(deployment)
    assert lag_count >= 10


def _edit_keeping_stat(path: Path, text: str) -> None:
    """Replace the file with `text` (same length) carrying the old mtime: only SIGHUP can notice."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    os.utime(staged, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(staged, path)


def wait_reload(deployment: Deployment, after: float, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = deployment.status()["last_reload"]
        if last and last["at"] > after:
            return last
        time.sleep(0.05)
    raise AssertionError("no reload happened")


def test_sighup_reload_refuses_an_invalid_policy_and_applies_a_valid_one(deployment: Deployment) -> None:
    path = deployment.policy_path
    good = path.read_text()
    digest = deployment.status()["policy"]["digest"]
    # 1. invalid (not JSON), same size and mtime: only SIGHUP triggers the reload
    t0 = time.time()
    _edit_keeping_stat(path, "{" + good[1:-1].replace('"version": 1', '"version": X') + "}")
    deployment.sidecar.send_signal(signal.SIGHUP)
    last = wait_reload(deployment, t0)
    assert last["ok"] is False and last["why"] == "SIGHUP" and "not valid JSON" in last["message"]
    assert deployment.status()["policy"]["digest"] == digest  # the old policy stays
    assert httpx.get(f"{deployment.http}/v2/health/ready", timeout=5).status_code == 200  # still serving
    assert "policy reload (SIGHUP) refused" in deployment.log_path.read_text()

    # 2. valid and stricter: ranker at one request in flight, batch may not queue
    policy = json.loads(good)
    for model in policy["models"]:
        if model["name"] == "ranker":
            model["max_inflight"] = 1
    for klass in policy["classes"]:
        if klass["name"] == "batch":
            klass["queue_cap"] = 0
    t0 = time.time()
    path.write_text(json.dumps(policy, indent=2))
    deployment.sidecar.send_signal(signal.SIGHUP)
    last = wait_reload(deployment, t0)
    assert last["ok"] is True, last
    assert deployment.status()["policy"]["digest"] != digest
    try:
        # 8 concurrent batch requests against 1 slot: the rest are refused at once, on both protocols
        async def http_burst() -> list[httpx.Response]:
            doc = {"inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32",
                               "data": features(1).ravel().tolist()}]}
            async with httpx.AsyncClient(timeout=10) as client:
                return await asyncio.gather(*(client.post(f"{deployment.http}/v2/models/ranker/infer", json=doc,
                                                          headers={"x-traffic-class": "batch"}) for _ in range(8)))

        statuses = [r.status_code for r in asyncio.run(http_burst())]
        assert 200 in statuses and 429 in statuses and set(statuses) <= {200, 429}

        async def grpc_burst() -> list[Any]:
            async with grpc.aio.insecure_channel(deployment.grpc) as channel:
                stub = pbg.GRPCInferenceServiceStub(channel)
                request = pb.ModelInferRequest(model_name="ranker")
                tensor = request.inputs.add(name="FEATURES", datatype="FP32", shape=[1, 32])
                request.raw_input_contents.append(features(1).tobytes())
                del tensor

                async def one() -> Any:
                    call = stub.ModelInfer(request, metadata=(("x-traffic-class", "batch"),), timeout=10)
                    try:
                        await call
                        return "ok"
                    except grpc.aio.AioRpcError as err:
                        return err

                return await asyncio.gather(*(one() for _ in range(8)))

        answers = asyncio.run(grpc_burst())
        errors = [a for a in answers if a != "ok"]
        assert "ok" in answers and errors
        for err in errors:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            body = json.loads(err.details())
            assert body["reason"] == "queue_full" and body["limit"] == "model_concurrency_quota:ranker"
            assert int(dict(err.trailing_metadata())["retry-after"]) >= 1
    finally:
        # 3. the file watcher also reloads: restore the original policy by writing it
        t0 = time.time()
        path.write_text(good + "\n")
        last = wait_reload(deployment, t0)
        assert last["ok"] is True and last["why"] == "file changed"
        assert deployment.status()["policy"]["digest"] == digest
    deployment.wait_idle()
