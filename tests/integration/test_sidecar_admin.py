"""Triton's admin APIs behind the sidecar, against the session's real tritonserver: each one
(repository index, load, unload, log settings, trace settings, system and CUDA shared-memory status;
HTTP and gRPC, through tritonclient) is refused without the admin token, served with it exactly as
Triton serves it directly, and opened to every client by the policy's allow-list.

Three sidecars in this process (`SidecarThread`) in front of the one server: `guarded` (a token,
the default policy, behind the native front: nginx), `tokenless` (no `--token-file`) and `opened` (a token, and a policy opening all
four categories). Load and unload name a model that does not exist, so nothing any other test uses
is touched whatever the server's model-control mode; Triton's own error, the same as a direct
call's, is what "served" means there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sidecar import admin_apis
from sidecar.config import SidecarConfig
from sidecar.run import SidecarThread
from tests.readme_tour import tour_command
from tests.sidecar_rigs import policy_doc

pytestmark = pytest.mark.integration

TOKEN = "admin-it-token-0123456789"
NO_SUCH_MODEL = "admin_probe_no_such_model"  # load/unload touch no model another test uses

Call = Callable[[Any, dict[str, str]], Any]
# (name, category, call) for both clients; the gRPC ones answer JSON, like the HTTP ones
HTTP_CALLS: list[tuple[str, str, Call]] = [
    ("repository_index", "model-repository", lambda c, h: c.get_model_repository_index(headers=h)),
    ("load", "model-repository", lambda c, h: c.load_model(NO_SUCH_MODEL, headers=h)),
    ("unload", "model-repository", lambda c, h: c.unload_model(NO_SUCH_MODEL, headers=h)),
    ("logging", "logging", lambda c, h: c.get_log_settings(headers=h)),
    ("trace", "trace", lambda c, h: c.get_trace_settings(headers=h)),
    ("model_trace", "trace", lambda c, h: c.get_trace_settings(model_name="ranker", headers=h)),
    ("system_shm_status", "shared-memory", lambda c, h: c.get_system_shared_memory_status(headers=h)),
    ("cuda_shm_status", "shared-memory", lambda c, h: c.get_cuda_shared_memory_status(headers=h)),
]
GRPC_CALLS: list[tuple[str, str, Call]] = [
    ("repository_index", "model-repository", lambda c, h: c.get_model_repository_index(headers=h, as_json=True)),
    ("load", "model-repository", lambda c, h: c.load_model(NO_SUCH_MODEL, headers=h)),
    ("unload", "model-repository", lambda c, h: c.unload_model(NO_SUCH_MODEL, headers=h)),
    ("logging", "logging", lambda c, h: c.get_log_settings(headers=h, as_json=True)),
    ("trace", "trace", lambda c, h: c.get_trace_settings(headers=h, as_json=True)),
    ("model_trace", "trace", lambda c, h: c.get_trace_settings(model_name="ranker", headers=h, as_json=True)),
    ("system_shm_status", "shared-memory", lambda c, h: c.get_system_shared_memory_status(headers=h, as_json=True)),
    ("cuda_shm_status", "shared-memory", lambda c, h: c.get_cuda_shared_memory_status(headers=h, as_json=True)),
]
HTTP_TOKENS = [{"Authorization": f"Bearer {TOKEN}"}, {"X-Sidecar-Token": TOKEN}]
GRPC_TOKENS = [{"authorization": f"Bearer {TOKEN}"}, {"x-sidecar-token": TOKEN}]


def _start(tmp: Path, name: str, server: Any, token: str | None, front: str = "python", **policy: Any) -> SidecarThread:
    path = tmp / f"{name}_policy.json"
    path.write_text(json.dumps(policy_doc(**policy)))
    config = SidecarConfig(
        policy_path=path, upstream=server.http_url, grpc_upstream=server.grpc_url,
        triton_metrics_url=server.metrics_url, listen="127.0.0.1:0", grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0", token=token, front=front,
    )
    return SidecarThread(config).start()


@pytest.fixture(scope="module")
def sidecars(triton_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SidecarThread]]:
    tmp = tmp_path_factory.mktemp("sidecar_admin")
    started: dict[str, SidecarThread] = {}
    try:
        # the guarded one as deployed with nginx (the native front): its admin doors are the Python
        # path's, behind nginx; the other two on the sidecar's own listeners
        started["guarded"] = _start(tmp, "guarded", triton_server, TOKEN, front="native")
        started["tokenless"] = _start(tmp, "tokenless", triton_server, None)
        started["opened"] = _start(tmp, "opened", triton_server, TOKEN, admin_apis={"open": list(admin_apis.SHUT)})
        yield started
    finally:
        for sidecar in started.values():
            sidecar.stop()


def http_client(sidecar: SidecarThread) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{sidecar.sidecar.http_port}")


def grpc_client(sidecar: SidecarThread) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=f"127.0.0.1:{sidecar.sidecar.grpc_port}")


def outcome(call: Call, client: Any, headers: dict[str, str]) -> tuple[Any, ...]:
    """("ok", answer) or ("error", status, message): what the client saw."""
    try:
        return ("ok", call(client, headers))
    except InferenceServerException as err:
        return ("error", err.status(), err.message())


def triton_answer(name: str, call: Call, client: Any) -> tuple[Any, ...]:
    """What Triton answers the call directly: an answer for the reads; for load and unload of a
    model that is not there (and CUDA shared memory on a build or host without it) maybe an error."""
    direct = outcome(call, client, {})
    if name in ("repository_index", "logging", "trace", "model_trace", "system_shm_status"):
        assert direct[0] == "ok", direct
    else:
        assert direct[0] == "ok" or admin_apis.REASON not in direct[2], direct
    return direct


def refused_counts(sidecar: SidecarThread) -> dict[tuple[str, str], float]:
    text = httpx.get(f"http://127.0.0.1:{sidecar.sidecar.metrics_port}/metrics", timeout=5).text
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("sidecar_admin_refused_total{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            out[(labels["category"].strip('"'), labels["protocol"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out


# ------------------------------------------------------------------------------------------------
# HTTP


def test_the_readme_tours_curl_gets_what_the_readme_shows(sidecars: dict[str, SidecarThread]) -> None:
    """The README tour's `curl` as written, against the guarded sidecar (nginx in front) on its port:
    the status line and the refusal's reason and category it shows."""
    command = tour_command("curl ")
    method, url = command.argv[command.argv.index("-X") + 1], urlsplit(command.argv[-1])
    got = httpx.request(method, f"http://127.0.0.1:{sidecars['guarded'].sidecar.http_port}{url.path}", timeout=10)
    assert got.status_code == int(command.shown[0].split()[1]), (command.where(), got.text)
    shown = next(line for line in command.shown if line.startswith("{"))
    for key in ("reason", "category"):
        assert f'"{key}": "{got.json()[key]}"' in shown, (command.where(), got.text)


@pytest.mark.parametrize(("name", "category", "call"), HTTP_CALLS, ids=[c[0] for c in HTTP_CALLS])
def test_http_admin_api_needs_the_token(
    sidecars: dict[str, SidecarThread], triton_server: Any, name: str, category: str, call: Call
) -> None:
    guarded = sidecars["guarded"]
    client = http_client(guarded)
    before = refused_counts(guarded).get((category, "http"), 0.0)
    refusal = admin_apis.refusal(category, "http", token_configured=True)[1]["error"]
    assert outcome(call, client, {}) == ("error", "401", refusal)
    assert outcome(call, client, {"Authorization": "Bearer not-the-token"}) == ("error", "401", refusal)
    assert outcome(call, client, {"X-Sidecar-Token": "not-the-token"}) == ("error", "401", refusal)
    assert refused_counts(guarded)[(category, "http")] == before + 3

    direct = triton_answer(name, call, httpclient.InferenceServerClient(url=triton_server.http_url))
    for headers in HTTP_TOKENS:
        assert outcome(call, client, headers) == direct  # served: Triton's own answer
    assert refused_counts(guarded)[(category, "http")] == before + 3


@pytest.mark.parametrize(("name", "category", "call"), HTTP_CALLS, ids=[c[0] for c in HTTP_CALLS])
def test_http_admin_api_without_a_configured_token_is_shut(
    sidecars: dict[str, SidecarThread], name: str, category: str, call: Call
) -> None:
    client = http_client(sidecars["tokenless"])
    refusal = admin_apis.refusal(category, "http", token_configured=False)[1]["error"]
    assert "--token-file" in refusal
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        assert outcome(call, client, headers) == ("error", "403", refusal)


@pytest.mark.parametrize(("name", "category", "call"), HTTP_CALLS, ids=[c[0] for c in HTTP_CALLS])
def test_http_allow_list_opens_the_admin_api(
    sidecars: dict[str, SidecarThread], triton_server: Any, name: str, category: str, call: Call
) -> None:
    direct = triton_answer(name, call, httpclient.InferenceServerClient(url=triton_server.http_url))
    assert outcome(call, http_client(sidecars["opened"]), {}) == direct


def test_http_refusal_is_one_json_line(sidecars: dict[str, SidecarThread], triton_server: Any) -> None:
    guarded = f"http://127.0.0.1:{sidecars['guarded'].sidecar.http_port}"
    resp = httpx.post(f"{guarded}/v2/repository/index", timeout=5)
    assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    assert resp.text.count("\n") == 0
    assert resp.json() == {"error": admin_apis.refusal("model-repository", "http", True)[1]["error"],
                           "reason": "admin_api_restricted", "category": "model-repository"}
    tokenless = f"http://127.0.0.1:{sidecars['tokenless'].sidecar.http_port}"
    resp = httpx.get(f"{tokenless}/v2/systemsharedmemory/region/any/status", timeout=5)
    assert resp.status_code == 403 and resp.json()["category"] == "shared-memory"
    # not admin APIs: served without a token, as before
    for path in ("/v2/health/ready", "/v2/models/ranker", "/v2/models/ranker/config", "/v2/models/ranker/stats"):
        through = httpx.get(f"{tokenless}{path}", timeout=5)
        direct = httpx.get(f"http://{triton_server.http_url}{path}", timeout=5)
        assert through.status_code == direct.status_code == 200, (path, through.text)


# ------------------------------------------------------------------------------------------------
# gRPC


@pytest.mark.parametrize(("name", "category", "call"), GRPC_CALLS, ids=[c[0] for c in GRPC_CALLS])
def test_grpc_admin_api_needs_the_token(
    sidecars: dict[str, SidecarThread], triton_server: Any, name: str, category: str, call: Call
) -> None:
    guarded = sidecars["guarded"]
    client = grpc_client(guarded)
    before = refused_counts(guarded).get((category, "grpc"), 0.0)
    refusal = json.dumps(admin_apis.refusal(category, "grpc", token_configured=True)[1])
    expected = ("error", "StatusCode.UNAUTHENTICATED", refusal)
    assert outcome(call, client, {}) == expected
    assert outcome(call, client, {"authorization": "Bearer not-the-token"}) == expected
    assert outcome(call, client, {"x-sidecar-token": "not-the-token"}) == expected
    assert refused_counts(guarded)[(category, "grpc")] == before + 3

    direct = triton_answer(name, call, grpcclient.InferenceServerClient(url=triton_server.grpc_url))
    for headers in GRPC_TOKENS:
        assert outcome(call, client, headers) == direct  # served: Triton's own answer
    assert refused_counts(guarded)[(category, "grpc")] == before + 3


@pytest.mark.parametrize(("name", "category", "call"), GRPC_CALLS, ids=[c[0] for c in GRPC_CALLS])
def test_grpc_admin_api_without_a_configured_token_is_shut(
    sidecars: dict[str, SidecarThread], name: str, category: str, call: Call
) -> None:
    client = grpc_client(sidecars["tokenless"])
    refusal = json.dumps(admin_apis.refusal(category, "grpc", token_configured=False)[1])
    for headers in ({}, {"authorization": f"Bearer {TOKEN}"}):
        assert outcome(call, client, headers) == ("error", "StatusCode.PERMISSION_DENIED", refusal)


@pytest.mark.parametrize(("name", "category", "call"), GRPC_CALLS, ids=[c[0] for c in GRPC_CALLS])
def test_grpc_allow_list_opens_the_admin_api(
    sidecars: dict[str, SidecarThread], triton_server: Any, name: str, category: str, call: Call
) -> None:
    direct = triton_answer(name, call, grpcclient.InferenceServerClient(url=triton_server.grpc_url))
    assert outcome(call, grpc_client(sidecars["opened"]), {}) == direct


def test_grpc_other_methods_need_no_token(sidecars: dict[str, SidecarThread], triton_server: Any) -> None:
    client = grpc_client(sidecars["tokenless"])
    direct = grpcclient.InferenceServerClient(url=triton_server.grpc_url)
    assert client.is_server_ready() and client.is_model_ready("ranker")
    assert client.get_model_config("ranker", as_json=True) == direct.get_model_config("ranker", as_json=True)
    assert client.get_server_metadata(as_json=True) == direct.get_server_metadata(as_json=True)
