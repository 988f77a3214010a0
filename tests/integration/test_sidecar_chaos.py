"""Chaos: clients vanishing mid-stream, requests cancelled while queued or in flight, Triton killed
and restarted under load, the headroom source failing. After each, the sidecar's reserved bytes and
in-flight count return to zero and it serves again. All of it behind both fronts: the Python
listeners, and nginx (the native front), which carries the streams itself.

The sidecar runs in this process (`SidecarThread`) so its state can be read directly and its
Triton-metrics headroom source can be broken on purpose: the real `TritonMetricsSource`, given a
fetcher that fails or hangs when a test says so. Triton runs on fixed ports so it can be killed
and started again where the sidecar expects it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from sidecar.admission_types import Cost, Request
from sidecar.config import SidecarConfig
from sidecar.run import SidecarThread
from sidecar.headroom import StaticSource, TritonMetricsSource
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tests.helpers import build_sidecar_repository
from tritongen.server import ServerOptions, TritonServer
from tritongen.shared.processes import free_port

pytestmark = pytest.mark.integration

GRACE_MS = 300


@dataclass
class Breaker:
    """Makes the metrics fetch fail ("error") or hang ("hang") on demand."""

    mode: str | None = None
    calls: int = 0

    def wrap(self, fetch: Any) -> Any:
        async def fetch_or_fail() -> str:
            self.calls += 1
            if self.mode == "error":
                raise ConnectionRefusedError("metrics endpoint refused the connection (injected)")
            if self.mode == "hang":
                await asyncio.sleep(30)
            return await fetch()

        return fetch_or_fail


@dataclass
class Stack:
    repo: Path
    ports: tuple[int, int, int]
    server: TritonServer
    sidecar: SidecarThread
    breaker: Breaker
    started: list[TritonServer] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.sidecar.sidecar.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.sidecar.sidecar.grpc_port}"

    def state(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            st = self.sidecar.sidecar.state
            assert st is not None
            return {"reserved": st.reserved_bytes, "inflight": st.inflight, "waiting": st.waiting,
                    "lingering": st.lingering, "status": self.sidecar.sidecar.status()}

        return self.sidecar.call(read)

    def wait_idle(self, timeout: float = 5.0) -> dict[str, Any]:
        """Until nothing is reserved, in flight or waiting, but the native lane's idle slots
        (sidecar/lane.py: reservations nginx may fill) and with nothing nginx carries in flight."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            front = state["status"]["front"]
            lane = [pair for classes in front["lane"].values() for pair in classes.values()]
            slots, slot_bytes = sum(x["slots"] for x in lane), sum(x["reserved_bytes"] for x in lane)
            busy = any(x["inflight"] for x in lane) or front["carried"].get("in_flight", 0)
            if (state["reserved"] - slot_bytes, state["inflight"] - slots, state["waiting"], state["lingering"],
                    busy) == (0, 0, 0, 0, False):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"the sidecar did not return to zero: {state}")
            time.sleep(0.05)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.sidecar.sidecar.metrics_port}/metrics", timeout=5).text

    def start_server(self) -> TritonServer:
        http_port, grpc_port, metrics_port = self.ports
        server = TritonServer(ServerOptions(repository=self.repo, http_port=http_port, grpc_port=grpc_port,
                                            metrics_port=metrics_port))
        server.start()
        self.started.append(server)
        return server


@pytest.fixture(scope="module", params=["python", "native"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The same chaos behind each front: the Python listeners relaying every byte, and nginx carrying
    the streams while Python only decides (sidecar/decisions.py)."""
    tmp = tmp_path_factory.mktemp("chaos")
    # quota 2.5 MiB - weights, reserve and pad = 0.9 MiB: 115 blocks of 16 tokens, room for ~25 streams
    repo, policy, _ = build_sidecar_repository(tmp, memory_quota_mb=2.5, pool_blocks=115)
    for model in policy["models"]:
        model["release_grace_ms"] = GRACE_MS if model["kind"] == "llm" else 0
    policy["headroom"]["poll_interval_ms"] = 200
    policy_path = tmp / "sidecar_policy.json"
    policy_path.write_text(json.dumps(policy, indent=2))
    ports = (free_port(), free_port(), free_port())
    breaker = Breaker()

    def sources(pol: SidecarPolicy, sidecar: Any) -> list[Any]:
        devices = [d.id for d in pol.devices]
        pools = [m.name for m in pol.models if m.kv is not None]
        return [TritonMetricsSource(breaker.wrap(sidecar.fetch_triton_metrics), devices, pools), StaticSource(pol)]

    placeholder = Stack(repo, ports, None, None, breaker)  # type: ignore[arg-type]
    server = placeholder.start_server()
    config = SidecarConfig(
        policy_path=policy_path, upstream=server.http_url, grpc_upstream=server.grpc_url,
        triton_metrics_url=server.metrics_url, listen="127.0.0.1:0", grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0", token="chaos-token-0123456789", health_interval_s=0.5, front=request.param,
    )
    sidecar = SidecarThread(config, sources=sources)
    sidecar.start()
    placeholder.server, placeholder.sidecar = server, sidecar
    try:
        yield placeholder
    finally:
        sidecar.stop()
        for srv in placeholder.started:
            srv.stop()


# ------------------------------------------------------------------------------------------------
# helpers


def generate_ok(stack: Stack, max_tokens: int = 8) -> None:
    with httpx.stream("POST", f"{stack.http}/v2/models/tinyllm/generate_stream",
                      json={"text_input": "are you still there?", "max_tokens": max_tokens}, timeout=20) as resp:
        assert resp.status_code == 200, resp.read()
        events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    assert len(events) == max_tokens and all("text_output" in e for e in events), events


def ranker_ok(stack: Stack) -> None:
    doc = {"inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]}
    resp = httpx.post(f"{stack.http}/v2/models/ranker/infer", json=doc, timeout=10)
    assert resp.status_code == 200, resp.text
    with grpc.insecure_channel(stack.grpc) as channel:
        request = pb.ModelInferRequest(model_name="ranker")
        request.inputs.add(name="FEATURES", datatype="FP32", shape=[1, 32])
        request.raw_input_contents.append(np.full((1, 32), 0.5, dtype=np.float32).tobytes())
        response = pbg.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
        assert response.model_name == "ranker"


def stream_request(rid: str, max_tokens: int, prompt: str = "tell me a long story") -> Any:
    request = pb.ModelInferRequest(model_name="tinyllm", id=rid)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(prompt.encode())
    request.inputs.add(name="max_tokens", datatype="INT32", shape=[1]).contents.int_contents.append(max_tokens)
    return request


def outcomes(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sidecar_requests_finished_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# ------------------------------------------------------------------------------------------------
# tests


# Long enough that no stream can end before its client walks away: with 40 tokens, a fast tinyllm
# (and nginx's buffering) finished all six streams before the cancels arrived once, every outcome ok
# (make test 14:43, 2026-12-07). The policy here gives tinyllm a 128-token context.
WALKS_AWAY_TOKENS = 100


def test_clients_disconnecting_mid_stream(stack: Stack) -> None:
    before = outcomes(stack.metrics())

    async def http_client(session: aiohttp.ClientSession, n: int) -> int:
        resp = await session.post(f"{stack.http}/v2/models/tinyllm/generate_stream",
                                  json={"text_input": f"client {n} walks away", "max_tokens": WALKS_AWAY_TOKENS})
        seen = 0
        async for line in resp.content:
            if line.startswith(b"data:"):
                seen += 1
                if seen == 2:
                    break
        resp.close()  # drop the connection mid-stream
        return seen

    async def grpc_client(stub: Any, n: int) -> int:
        async def requests() -> Any:
            yield stream_request(f"g{n}", WALKS_AWAY_TOKENS)
            await asyncio.sleep(30)  # keep the stream open: the client cancels it

        call = stub.ModelStreamInfer(requests())
        seen = 0
        async for response in call:
            assert not response.error_message, response.error_message
            seen += 1
            if seen == 2:
                break
        call.cancel()
        return seen

    async def main() -> list[int]:
        async with aiohttp.ClientSession() as session, grpc.aio.insecure_channel(stack.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            return await asyncio.gather(*(http_client(session, n) for n in range(3)),
                                        *(grpc_client(stub, n) for n in range(3)))

    seen = asyncio.run(main())
    assert all(s == 2 for s in seen), seen
    stack.wait_idle(timeout=GRACE_MS / 1000 + 5)
    after = outcomes(stack.metrics())
    gone = sum(after.get(k, 0) - before.get(k, 0) for k in ("client_disconnect", "cancelled"))
    assert gone >= 1, (before, after)
    generate_ok(stack)
    stack.wait_idle()


def test_cancelled_while_queued_and_in_flight(stack: Stack) -> None:
    # Hold all of tinyllm's memory with a reservation that never ends, so whatever comes next waits.
    def hold() -> None:
        st = stack.sidecar.sidecar.state
        room = int(min(st.model_policy("tinyllm").memory_quota_bytes, st.capacity("pool:tinyllm") or 1e18))
        assert st.submit(Request("holder", "tinyllm", "interactive", Cost(kv_bytes=room))).admitted

    stack.sidecar.call(hold)
    url = f"{stack.http}/v2/models/tinyllm/generate_stream"

    async def impatient_http(session: aiohttp.ClientSession, n: int) -> str:
        try:
            async with session.post(url, json={"text_input": f"impatient {n}", "max_tokens": 8},
                                    headers={"x-traffic-class": "batch"},
                                    timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
                await resp.read()
                return str(resp.status)
        except asyncio.TimeoutError:
            return "gave up"

    async def impatient_grpc(stub: Any, n: int) -> str:
        async def requests() -> Any:
            yield stream_request(f"q{n}", 8)
            await asyncio.sleep(30)

        call = stub.ModelStreamInfer(requests(), metadata=(("x-traffic-class", "batch"),))
        await asyncio.sleep(0.3)
        call.cancel()
        return "gave up"

    async def main() -> tuple[list[str], int]:
        async with aiohttp.ClientSession() as session, grpc.aio.insecure_channel(stack.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            tasks = [asyncio.ensure_future(impatient_http(session, n)) for n in range(6)]
            tasks += [asyncio.ensure_future(impatient_grpc(stub, n)) for n in range(4)]
            queued = 0
            for _ in range(20):
                await asyncio.sleep(0.01)
                queued = max(queued, stack.sidecar.call(lambda: stack.sidecar.sidecar.state.waiting))
            return await asyncio.gather(*tasks), queued

    results, queued = asyncio.run(main())
    assert results == ["gave up"] * 10 and queued == 10
    deadline = time.monotonic() + 2
    while stack.sidecar.call(lambda: stack.sidecar.sidecar.state.waiting):  # the ones who gave up left
        assert time.monotonic() < deadline, "cancelled requests stayed in the queue"
        time.sleep(0.02)
    state = stack.state()
    assert state["inflight"] == 1 and state["reserved"] == stack.sidecar.call(
        lambda: stack.sidecar.sidecar.state.reserved_of("tinyllm")
    ) > 0  # only the holder: nothing was reserved for the requests that gave up
    stack.sidecar.call(lambda: stack.sidecar.sidecar.state.release("holder"))

    # gRPC: a deadline that expires while the request is in flight
    with grpc.insecure_channel(stack.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="ranker")
        request.inputs.add(name="FEATURES", datatype="FP32", shape=[32, 32])
        request.raw_input_contents.append(np.zeros((32, 32), dtype=np.float32).tobytes())
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=0.002)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    stack.wait_idle(timeout=GRACE_MS / 1000 + 5)
    generate_ok(stack)
    ranker_ok(stack)
    stack.wait_idle()


def test_headroom_source_failing(stack: Stack) -> None:
    def pool_source() -> str | None:
        return stack.state()["status"]["scopes"]["pool:tinyllm"]["source"]

    deadline = time.monotonic() + 5
    while pool_source() != "triton_metrics":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        stack.breaker.mode = "error"
        deadline = time.monotonic() + 5
        while "triton_metrics" not in stack.state()["status"]["headroom_failures"]:
            assert time.monotonic() < deadline, "the failure was not noticed"
            time.sleep(0.05)
        status = stack.state()["status"]
        assert "injected" in status["headroom_failures"]["triton_metrics"]
        assert status["headroom_sources"]["triton_metrics"] is not None
        assert status["scopes"]["cpu"]["source"] == "static"
        text = stack.metrics()
        assert 'sidecar_headroom_source_up{source="triton_metrics"} 0.0' in text
        assert 'sidecar_headroom_source_failures_total{source="triton_metrics"}' in text
        generate_ok(stack)  # still serving, on the static quota
        ranker_ok(stack)

        stack.breaker.mode = "hang"  # a source that does not answer at all: timed out, not waited for
        calls = stack.breaker.calls
        deadline = time.monotonic() + 8
        while stack.breaker.calls <= calls + 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        generate_ok(stack)
    finally:
        stack.breaker.mode = None
    deadline = time.monotonic() + 8
    while pool_source() != "triton_metrics" or stack.state()["status"]["headroom_failures"]:
        assert time.monotonic() < deadline, "the source did not come back"
        time.sleep(0.05)
    assert 'sidecar_headroom_source_up{source="triton_metrics"} 1.0' in stack.metrics()
    stack.wait_idle()


def test_triton_killed_and_restarted_under_load(stack: Stack) -> None:
    results: list[tuple[str, float, Any]] = []  # (kind, seconds after the kill, status)
    killed_at: list[float] = []

    def more(kind: str, until: float) -> bool:
        """Until the window ends, and past it for a kind with no request sent after the kill yet
        (one in flight at the kill may take its time to fail on a busy host), within 10 s."""
        now = time.monotonic()
        if now < until:
            return True
        return bool(killed_at) and now < killed_at[0] + 10 and not any(r[0] == kind for r in results)

    stop = asyncio.Event

    async def load(kind: str, session: aiohttp.ClientSession, until: float) -> None:
        doc = {"inputs": [{"name": "FEATURES", "shape": [1, 32], "datatype": "FP32", "data": [0.1] * 32}]}
        while more(kind, until):
            t0 = time.monotonic()
            try:
                if kind == "stream":
                    async with session.post(f"{stack.http}/v2/models/tinyllm/generate_stream",
                                            json={"text_input": "under load", "max_tokens": 30}) as resp:
                        body = await resp.read()
                        status: Any = resp.status if b'"error"' not in body else "error-event"
                else:
                    async with session.post(f"{stack.http}/v2/models/ranker/infer", json=doc) as resp:
                        await resp.read()
                        status = resp.status
            except aiohttp.ClientError as err:
                status = type(err).__name__
            if killed_at and t0 >= killed_at[0]:
                results.append((kind, time.monotonic() - t0, status))
            await asyncio.sleep(0.01)

    async def grpc_load(until: float) -> None:
        async with grpc.aio.insecure_channel(stack.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            while more("grpc", until):
                t0 = time.monotonic()
                request = pb.ModelInferRequest(model_name="ranker")
                request.inputs.add(name="FEATURES", datatype="FP32", shape=[1, 32])
                request.raw_input_contents.append(np.zeros((1, 32), dtype=np.float32).tobytes())
                try:
                    await stub.ModelInfer(request, timeout=5)
                    status: Any = "OK"
                except grpc.aio.AioRpcError as err:
                    status = err.code().name
                if killed_at and t0 >= killed_at[0]:
                    results.append(("grpc", time.monotonic() - t0, status))
                await asyncio.sleep(0.01)

    async def grpc_stream_load(until: float) -> None:
        """One long-lived stream, one request at a time: after the kill its requests fail with
        UNAVAILABLE (in the stream, or the stream itself ends with it)."""
        async with grpc.aio.insecure_channel(stack.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            while more("grpc-stream", until):
                outbox: asyncio.Queue[Any] = asyncio.Queue()

                async def requests(outbox: asyncio.Queue[Any] = outbox) -> Any:
                    while True:
                        item = await outbox.get()
                        if item is None:
                            return
                        yield item

                call = stub.ModelStreamInfer(requests())
                try:
                    n = 0
                    while more("grpc-stream", until):
                        t0 = time.monotonic()
                        n += 1
                        await outbox.put(stream_request(f"s{n}", 20))
                        status: Any = "OK"
                        async for response in call:
                            if response.error_message:
                                status = response.error_message.split(":", 1)[0]
                                break
                            if response.infer_response.parameters["triton_final_response"].bool_param:
                                break
                        if killed_at and t0 >= killed_at[0]:
                            results.append(("grpc-stream", time.monotonic() - t0, status))
                        if status != "OK":
                            break
                except grpc.aio.AioRpcError as err:
                    if killed_at:
                        results.append(("grpc-stream", 0.0, err.code().name if err.code() != grpc.StatusCode.INTERNAL else err.details()))
                finally:
                    await outbox.put(None)
                    call.cancel()
                await asyncio.sleep(0.05)

    async def chaos() -> None:
        until = time.monotonic() + 2.0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            workers = [asyncio.ensure_future(load("stream", session, until)) for _ in range(3)]
            workers += [asyncio.ensure_future(load("infer", session, until)) for _ in range(3)]
            workers.append(asyncio.ensure_future(grpc_load(until)))
            workers.append(asyncio.ensure_future(grpc_stream_load(until)))
            await asyncio.sleep(0.6)
            assert stack.server.process is not None
            os.killpg(stack.server.process.pid, signal.SIGKILL)  # Triton and its model stubs
            killed_at.append(time.monotonic())
            await asyncio.gather(*workers)

    del stop
    asyncio.run(chaos())
    stack.server.stop()  # reap the killed process group
    late = [r for r in results if r[1] > 0]
    assert late, "the load kept running after the kill"
    http_after = [r for r in results if r[0] in ("stream", "infer") and r[2] != "error-event"]
    assert http_after and all(status == 503 for _, _, status in http_after), http_after[:5]
    assert all(seconds < 1.0 for _, seconds, _ in http_after), "503 must come at once"
    grpc_after = [r for r in results if r[0] == "grpc"]
    assert grpc_after and all(status == "UNAVAILABLE" for _, _, status in grpc_after), grpc_after[:5]
    streams_after = [r for r in results if r[0] == "grpc-stream"]
    assert streams_after and all(status == "UNAVAILABLE" for _, _, status in streams_after), streams_after[:5]
    state = stack.wait_idle(timeout=GRACE_MS / 1000 + 5)
    assert state["status"]["upstream"]["up"] is False
    assert httpx.get(f"{stack.http}/v2/health/ready", timeout=5).status_code == 503

    # Triton comes back on the same ports (sockets of the killed server linger in TIME_WAIT; the
    # launcher's pre-check binds with SO_REUSEADDR, as tritonserver does, so they do not count).
    stack.server = stack.start_server()
    deadline = time.monotonic() + 10
    while not stack.state()["status"]["upstream"]["up"]:
        assert time.monotonic() < deadline, "the sidecar did not see Triton come back"
        time.sleep(0.1)
    generate_ok(stack)
    ranker_ok(stack)
    stack.wait_idle()
