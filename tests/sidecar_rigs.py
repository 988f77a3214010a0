"""What the sidecar's tests share, unit and loopback alike: a clock the test moves, a small policy
document and the admission state on it, the admission parts and started HTTP proxy that the
loopback tests (tests/integration/*_loopback.py) put in front of their fake upstreams, and
Triton's APIs by category, and the sidecar image's Containerfile read as instructions.

Kept apart from tests/helpers.py (paths, CLI runners, fixture builders for every test) so that
what only the sidecar's tests read is found in one place. The repository a real tritonserver
serves behind the sidecar (`build_sidecar_repository`) stays in tests/helpers.py with the other
repository builders.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any

from sidecar.admission import AdmissionState
from sidecar.admission_types import Cost, Request
from tests.helpers import REPO_ROOT
from tritongen.core.sidecar_policy.schema import parse_policy

# ------------------------------------------------------------------------------------------------
# The sidecar's admission: a clock the test moves, a small policy document and the state on it


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def policy_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "deployment": "t",
        "default_class": "normal",
        "starvation_guard_ms": 200,
        "classes": [
            {"name": "interactive", "kind": "interactive", "priority": 1, "p99_ms": 250, "max_queue_wait_ms": 125,
             "queue_cap": 4, "budget_fraction": 1.0},
            {"name": "normal", "kind": "normal", "priority": 2, "p99_ms": 1000, "max_queue_wait_ms": 500,
             "queue_cap": 4, "budget_fraction": 0.9},
            {"name": "batch", "kind": "batch", "priority": 3, "p99_ms": 5000, "max_queue_wait_ms": 2500,
             "queue_cap": 4, "budget_fraction": 0.8},
        ],
        "devices": [{"id": "gpu0", "memory_bytes": 100_000, "utilization_cap": 1.0, "static_used_bytes": 0}],
        "models": [
            {"name": "llm", "kind": "llm", "devices": ["gpu0"], "memory_quota_bytes": 1000, "max_inflight": 10,
             "release_grace_ms": 300,
             "kv": {"bytes_per_token": 10, "bytes_per_token_source": "analytic", "block_tokens": 1, "max_context": 100}},
            {"name": "cls", "kind": "classic", "devices": ["gpu0"], "request_bytes": 100, "max_inflight": 5},
        ],
        "concurrency": {"min": 2, "max": 8, "queue_delay_high_ms": 50, "queue_delay_low_ms": 20,
                        "adjust_interval_ms": 1000, "increase_hold_ms": 3000},
        "headroom": {"sources": ["static"], "safety_pad_bytes": 0},
    }
    doc.update(over)
    return doc


def admission_state(**over: Any) -> tuple[AdmissionState, FakeClock]:
    """The pure admission state on `policy_doc(**over)`, and the fake clock it reads."""
    clock = FakeClock()
    return AdmissionState(parse_policy(policy_doc(**over)), clock), clock


# Strings: an AdmissionController numbers its own requests 1, 2, ... in the same state, and a test
# run first in its process would otherwise reuse them ("request id 1 is already known").
_request_ids = (f"request-{n}" for n in count(1))


def admission_request(model: str = "llm", klass: str = "normal", kv: int = 0, prefill: int = 0, request: int = 0,
                      tokens: int = 0, rid: Any = None, tenant: str = "default") -> Request:
    """A request with its cost stated in bytes and tokens; a fresh id unless `rid` names one."""
    return Request(rid if rid is not None else next(_request_ids), model, klass,
                   Cost(kv_bytes=kv, prefill_bytes=prefill, request_bytes=request, tokens=tokens), tenant)


def granted_ids(state: AdmissionState) -> list[Any]:
    """The ids granted from the queue since the last look (the events are taken)."""
    return [d.request_id for d in state.take_events().granted]


def tenant_usage(state: AdmissionState, tenant: str) -> tuple[int, int]:
    """(requests in flight, bytes reserved) of one tenant."""
    return state.inflight_of_tenant(tenant), state.reserved_of_tenant(tenant)


def generate_facts(doc: dict[str, Any], kv: Any, count: Any = None) -> Any:
    """What the one reader (sidecar/reading.py) reads of a generate body's prompts and budget for a
    model of KV cost `kv`: the `LLMFacts` its price is computed from."""
    from sidecar import protocol, reading

    stated = protocol.generate_stated(doc, kv, "traffic_class")
    return reading.sequences(stated.prompts, reading.budget(stated, kv.max_tokens_input), count)


# ------------------------------------------------------------------------------------------------
# The proxies before an upstream of the test's own (the loopback tests in tests/integration/)


async def admission_parts(policy: Any) -> tuple[Any, Any, Any, Any]:
    """What a proxy under test needs beside its upstream: (state, metrics, controller, health), on the
    running loop's clock, with a health probe that always answers up. The loopback tests of both
    proxies (HTTP and gRPC) share it."""
    import asyncio

    from sidecar.controller import AdmissionController
    from sidecar.metrics import SidecarMetrics
    from sidecar.upstream import UpstreamHealth

    async def up() -> bool:
        return True

    loop = asyncio.get_running_loop()
    state = AdmissionState(policy, loop.time)
    metrics = SidecarMetrics()
    controller = AdmissionController(state, metrics, loop.time)
    health = UpstreamHealth(up)
    await health.check()
    return state, metrics, controller, health


async def started_http_proxy(upstream_port: int, policy: Any, token: str | None = None) -> tuple[Any, Any, Any]:
    """An `HttpProxy` (started) before an in-process upstream on `upstream_port`, with its own
    admission state and metrics (`admission_parts`): (proxy, state, metrics). The loopback tests of
    the sidecar's HTTP side share it; the caller closes the proxy."""
    from sidecar.http_proxy import Admin, HttpProxy

    async def no_reload(why: str) -> tuple[bool, str]:
        return False, why

    state, metrics, controller, health = await admission_parts(policy)
    proxy = HttpProxy(f"127.0.0.1:{upstream_port}", controller, health, metrics, lambda: policy,
                      Admin(token=token, status=dict, reload=no_reload))
    await proxy.start()
    return proxy, state, metrics


# ------------------------------------------------------------------------------------------------
# The paths a request takes, without a listener (unit tests): the decision socket's protocol fed
# bytes as nginx sends them, and a gRPC stream relayed to a Triton of the test's own


class FakeTransport:
    """nginx's end of one decision-socket connection: what the sidecar writes to it is kept; closing
    it tells the protocol on the next loop turn, as asyncio's transports do."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.data += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            import asyncio

            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed


class NginxSide:
    """One connection nginx opens to the decision socket (sidecar/decisions.py), as the protocol object
    the socket would make for it: `send` what nginx sends, `answer` reads back what it was answered."""

    def __init__(self, server: Any) -> None:
        from sidecar.decisions import _Connection

        self.conn = _Connection(server)
        self.transport = FakeTransport(self.conn)
        self.conn.connection_made(self.transport)

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def admit(self, model: str, op: str, body: bytes, klass: str = "", tenant: str = "", header_length: str = "",
              start: str = "") -> None:
        self.send(f"admit\t{model}\t{op}\t{klass}\t{tenant}\t{header_length}\t{start}\t{len(body)}\n".encode() + body)

    def carried(self, model: str, op: str, body: bytes, **fields: str) -> int:
        """An admit granted at once and confirmed (`ok`) as nginx confirms a grant it read: its id."""
        self.admit(model, op, body, **fields)
        answer = self.answer()
        assert answer is not None and answer[0][0] == "admit", answer
        self.send(f"ok\t{answer[0][1]}\n".encode())
        return int(answer[0][1])

    def answer(self) -> tuple[list[str], bytes] | None:
        """The next whole answer (its fields, its body), taken; None when there is none yet."""
        data = self.transport.data
        at = data.find(b"\n")
        if at < 0:
            return None
        fields = data[:at].decode().split("\t")
        size = int(fields[-1])
        body = bytes(data[at + 1:at + 1 + size])
        del data[:at + 1 + size]
        return fields, body


async def decision_server(policy: Any) -> tuple[Any, Any, Any]:
    """A DecisionServer never started (no socket) on its own admission parts, with both proxies it
    prepares requests through: (server, state, metrics)."""
    from pathlib import Path

    from sidecar.decisions import DecisionServer
    from sidecar.grpc_proxy import GrpcProxy
    from sidecar.http_proxy import Admin, HttpProxy

    async def no_reload(why: str) -> tuple[bool, str]:
        return False, why

    state, metrics, controller, health = await admission_parts(policy)
    http = HttpProxy("127.0.0.1:1", controller, health, metrics, lambda: policy,
                     Admin(token=None, status=dict, reload=no_reload))
    grpc = GrpcProxy("127.0.0.1:1", controller, health, metrics, lambda: policy)
    return DecisionServer(Path("never-bound.sock"), http, grpc, controller, health), state, metrics


class TritonStream:
    """Triton's side of one ModelStreamInfer call: each request written is kept and answered by one
    final response; `on_write(request)` runs as it arrives (while its reservation is held)."""

    def __init__(self, on_write: Any = None) -> None:
        import asyncio

        self.sent: list[Any] = []
        self.on_write = on_write
        self.replies: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def initial_metadata(self) -> tuple[()]:
        return ()

    async def trailing_metadata(self) -> tuple[()]:
        return ()

    async def write(self, data: bytes) -> None:
        from tritonclient.grpc import service_pb2 as pb

        request = pb.ModelInferRequest.FromString(data)
        self.sent.append(request)
        if self.on_write is not None:
            self.on_write(request)
        reply = pb.ModelStreamInferResponse()
        reply.infer_response.id = request.id
        reply.infer_response.parameters["triton_final_response"].bool_param = True
        self.replies.put_nowait(reply.SerializeToString())

    async def done_writing(self) -> None:
        self.replies.put_nowait(None)

    def cancel(self) -> None:
        self.replies.put_nowait(None)

    def __aiter__(self) -> Any:
        return self._replies()

    async def _replies(self) -> Any:
        while (reply := await self.replies.get()) is not None:
            yield reply


class StreamClient:
    """The client's side of a ModelStreamInfer call, for the relay: what was written back to it."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    async def write(self, data: bytes) -> None:
        from tritonclient.grpc import service_pb2 as pb

        self.written.append(pb.ModelStreamInferResponse.FromString(data))

    async def send_initial_metadata(self, metadata: Any) -> None:
        pass

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


async def relay_stream(proxy: Any, requests: list[bytes], metadata: Any = (), on_write: Any = None) -> tuple[Any, Any]:
    """`requests` through sidecar/grpc_stream.py's relay of one stream, to a `TritonStream`:
    (Triton's side, the client's side) once the stream ended."""
    from sidecar.grpc_stream import StreamRelay

    async def client() -> Any:
        for raw in requests:
            yield raw

    upstream, context = TritonStream(on_write), StreamClient()
    await StreamRelay(proxy, upstream, tuple(metadata), context).run(client())  # type: ignore[arg-type]
    return upstream, context


# ------------------------------------------------------------------------------------------------
# Triton's APIs by category (sidecar/admin_apis.py): the classifier's unit tests and the proxies'
# loopback tests (tests/integration/test_sidecar_admin_loopback.py) read the same tables

ADMIN_TOKEN = "admin-token-0123456789"
TRITON_GRPC_SERVICE = "/inference.GRPCInferenceService/"

# every endpoint of Triton's HTTP server (src/http_server.cc) and its category
TRITON_HTTP_PATHS = [
    ("/v2", "metadata"),
    ("/v2/health/live", "health"),
    ("/v2/health/ready", "health"),
    ("/v2/models/ranker", "metadata"),
    ("/v2/models/ranker/versions/1", "metadata"),
    ("/v2/models/ranker/ready", "health"),
    ("/v2/models/ranker/versions/1/ready", "health"),
    ("/v2/models/ranker/infer", "inference"),
    ("/v2/models/ranker/versions/1/infer", "inference"),
    ("/v2/models/tinyllm/generate", "inference"),
    ("/v2/models/tinyllm/generate_stream", "inference"),
    ("/v2/models/tinyllm/versions/3/generate_stream", "inference"),
    ("/v2/models/ranker/config", "model-config"),
    ("/v2/models/ranker/versions/1/config", "model-config"),
    ("/v2/models/stats", "statistics"),
    ("/v2/models/ranker/stats", "statistics"),
    ("/v2/models/ranker/versions/1/stats", "statistics"),
    ("/v2/repository/index", "model-repository"),
    ("/v2/repository/models/ranker/load", "model-repository"),
    ("/v2/repository/models/ranker/unload", "model-repository"),
    ("/v2/repository/other-repo/index", "model-repository"),
    ("/v2/repository/other-repo/models/ranker/load", "model-repository"),
    ("/v2/logging", "logging"),
    ("/v2/trace/setting", "trace"),
    ("/v2/models/ranker/trace/setting", "trace"),
    ("/v2/models/ranker/versions/1/trace/setting", "trace"),
    ("/v2/systemsharedmemory/status", "shared-memory"),
    ("/v2/systemsharedmemory/register", "shared-memory"),
    ("/v2/systemsharedmemory/unregister", "shared-memory"),
    ("/v2/systemsharedmemory/region/r0/status", "shared-memory"),
    ("/v2/systemsharedmemory/region/r0/register", "shared-memory"),
    ("/v2/systemsharedmemory/region/r0/unregister", "shared-memory"),
    ("/v2/cudasharedmemory/status", "shared-memory"),
    ("/v2/cudasharedmemory/register", "shared-memory"),
    ("/v2/cudasharedmemory/unregister", "shared-memory"),
    ("/v2/cudasharedmemory/region/r0/status", "shared-memory"),
    ("/v2/cudasharedmemory/region/r0/register", "shared-memory"),
    ("/v2/cudasharedmemory/region/r0/unregister", "shared-memory"),
]

# every method of Triton's gRPC service (grpc_service.proto) and its category
TRITON_GRPC_METHODS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory", "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}


async def started_grpc_server(handler: Any) -> tuple[Any, int]:
    """A grpc.aio server on a free loopback port serving one generic handler, started: the fake
    Triton behind a proxy, or the proxy's own listener, in the loopback tests."""
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


# ------------------------------------------------------------------------------------------------
# The sidecar image (Containerfile): its invariants' unit tests and the entrypoint's integration
# test read it the same way

CONTAINERFILE = REPO_ROOT / "Containerfile"
TINI = ["/usr/bin/tini", "--"]  # the image's PID 1, before our entrypoint


def containerfile_instructions(path: Path = CONTAINERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order: comment and blank lines dropped, a line ending in a
    backslash joined to the next, as the builder reads them."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or (not pending and not line.strip()):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        pending = ""
        out.append((keyword.upper(), rest.strip()))
    return out


def containerfile_values(keyword: str, path: Path = CONTAINERFILE) -> list[str]:
    """The arguments of every KEYWORD instruction, in order."""
    return [rest for key, rest in containerfile_instructions(path) if key == keyword]


def image_entrypoint(path: Path = CONTAINERFILE) -> list[str]:
    """The ENTRYPOINT, which must be in exec (JSON) form: a shell form would put sh at PID 1 and
    keep SIGTERM from the sidecar."""
    (text,) = containerfile_values("ENTRYPOINT", path)
    argv = json.loads(text)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), text
    return argv


def image_user(path: Path = CONTAINERFILE) -> tuple[int, int]:
    """(uid, gid) of the last USER instruction, the one the container runs as; numeric or an error."""
    uid, _, gid = containerfile_values("USER", path)[-1].partition(":")
    return int(uid), int(gid)

