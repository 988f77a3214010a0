"""Triton's admin APIs behind the sidecar (sidecar/admin_apis.py): every HTTP path and gRPC method
in its category, the refusals and the policy's allow-list. Both proxies in front of a fake Triton
are tested in tests/integration/test_sidecar_admin_loopback.py (they listen on loopback ports)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from sidecar import admin_apis
from tests.sidecar_rigs import ADMIN_TOKEN, TRITON_GRPC_METHODS, TRITON_GRPC_SERVICE, TRITON_HTTP_PATHS, policy_doc
from tritongen.core import admin_categories
from tritongen.core.sidecar_policy.schema import PolicyError, parse_policy
from tritongen.core.sidecar_policy.sections import AdminApisPolicy


# ------------------------------------------------------------------------------------------------
# classification


def test_categories_are_tritons() -> None:
    assert admin_categories.CATEGORIES == ("health", "metadata", "inference", "shared-memory", "model-config",
                                           "model-repository", "statistics", "trace", "logging")
    assert set(admin_apis.SHUT) == {"model-repository", "logging", "trace", "shared-memory"}
    assert set(admin_apis.WHAT) == set(admin_apis.SHUT)


@pytest.mark.parametrize(("path", "category"), TRITON_HTTP_PATHS)
def test_http_path_category(path: str, category: str) -> None:
    assert admin_apis.http_admin_category(path) == (category if category in admin_apis.SHUT else None)


@pytest.mark.parametrize("path", [
    "/v2/models/trace/infer",  # models named like admin endpoints are models
    "/v2/models/logging/generate_stream",
    "/v2/models/repository/config",
    "/v2/models/systemsharedmemory/versions/1/stats",
    "/v2/models/trace",
    "/v2/models/setting/ready",
    "/metrics",
    "/",
    "/v2/health",
    "/sidecar/status",
])
def test_http_paths_that_are_not_admin(path: str) -> None:
    assert admin_apis.http_admin_category(path) is None


@pytest.mark.parametrize(("path", "category"), [
    ("/v2/models/x/../../logging", "logging"),  # dot segments, as a URL library resolves them
    ("/v2/./repository/index", "model-repository"),
    ("/v2/models/x/%2e%2e/%2e%2e/trace/setting", "trace"),
    ("/v2/%72epository/index", "model-repository"),  # escapes, decoded
    ("/v2/models/a%2Fb/trace/setting", "trace"),  # a model name Triton reads as `a%2Fb`
    ("//v2//logging", "logging"),  # empty segments
    ("/v2/repository", "model-repository"),  # conservative: what Triton answers 404 under an admin root
    ("/v2/repository/whatever/else", "model-repository"),
    ("/v2/trace", "trace"),
    ("/v2/cudasharedmemory", "shared-memory"),
])
def test_http_admin_paths_in_any_spelling(path: str, category: str) -> None:
    assert admin_apis.http_admin_category(path) == category


def test_every_grpc_method_has_its_category() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {m.name for m in service.methods} == set(TRITON_GRPC_METHODS)  # the proto and this table agree
    for name, category in TRITON_GRPC_METHODS.items():
        method = TRITON_GRPC_SERVICE + name
        assert admin_apis.GRPC_CATEGORIES.get(method) == category, name
        assert admin_apis.grpc_admin_category(method) == (category if category in admin_apis.SHUT else None), name
    assert admin_apis.GRPC_CATEGORIES.get("/grpc.health.v1.Health/Check") == "health"
    assert admin_apis.GRPC_CATEGORIES.get(TRITON_GRPC_SERVICE + "NoSuchMethod") is None
    assert admin_apis.grpc_admin_category("/other.Service/LogSettings") is None


# ------------------------------------------------------------------------------------------------
# tokens and refusals


def test_token_matching() -> None:
    assert admin_apis.token_matches(ADMIN_TOKEN, ADMIN_TOKEN)
    assert not admin_apis.token_matches("wrong", ADMIN_TOKEN)
    assert not admin_apis.token_matches("", ADMIN_TOKEN) and not admin_apis.token_matches(None, ADMIN_TOKEN)
    assert not admin_apis.token_matches("", None) and not admin_apis.token_matches("x", None)
    assert not admin_apis.token_matches("", "")
    assert admin_apis.bearer(f"Bearer {ADMIN_TOKEN}") == admin_apis.bearer(f"bearer  {ADMIN_TOKEN} ") == ADMIN_TOKEN
    assert admin_apis.bearer(f"Basic {ADMIN_TOKEN}") is None and admin_apis.bearer(None) is None


@pytest.mark.parametrize("category", admin_apis.SHUT)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refusal_names_the_category_and_the_fix(category: str, protocol: str) -> None:
    status, body = admin_apis.refusal(category, protocol, token_configured=False)
    assert status == 403 and body["reason"] == "admin_api_restricted" and body["category"] == category
    assert "--token-file" in body["error"] and f'"admin_apis": {{"open": ["{category}"]}}' in body["error"]
    status, body = admin_apis.refusal(category, protocol, token_configured=True)
    assert status == 401 and body["category"] == category and "--token-file" not in body["error"]
    assert "admin token" in body["error"] and f'{{"open": ["{category}"]}}' in body["error"]
    assert ("authorization: Bearer" if protocol == "grpc" else "Authorization: Bearer") in body["error"]
    assert json.loads(json.dumps(body)) == body and "\n" not in json.dumps(body)  # one JSON line


# ------------------------------------------------------------------------------------------------
# the policy's allow-list


def refused(doc: Any) -> str:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc, "p.json")
    return str(err.value)


def test_policy_without_admin_apis_keeps_everything_shut() -> None:
    policy = parse_policy(policy_doc())
    assert policy.admin_apis == AdminApisPolicy() and policy.admin_apis.open == []


def test_the_policy_and_the_classifier_read_one_category_table() -> None:
    assert admin_apis.SHUT is admin_categories.SHUT
    for name in admin_categories.CATEGORIES:
        doc = policy_doc(admin_apis={"open": [name]})
        if name in admin_categories.SHUT:
            assert parse_policy(doc).admin_apis.open == [name]
        else:
            assert f"{name!r} is never shut by the sidecar" in refused(doc)


def test_policy_opens_categories() -> None:
    policy = parse_policy(policy_doc(admin_apis={"open": ["logging", "shared-memory"]}))
    assert policy.admin_apis.open == ["logging", "shared-memory"]
    assert policy.digest() != parse_policy(policy_doc()).digest()
    assert parse_policy(policy_doc(admin_apis={"open": list(admin_apis.SHUT)})).admin_apis.open == list(admin_apis.SHUT)


@pytest.mark.parametrize(("admin", "message"), [
    ({"open": ["models"]}, ("admin_apis.open: unknown admin API category 'models'; the valid ones are "
                            "['model-repository', 'logging', 'trace', 'shared-memory']")),
    ({"open": ["Logging"]}, "unknown admin API category 'Logging'"),
    ({"open": [3]}, "unknown admin API category 3"),
    ({"open": ["inference"]}, ("admin_apis.open: 'inference' is never shut by the sidecar; only "
                               "['model-repository', 'logging', 'trace', 'shared-memory'] can be opened")),
    ({"open": ["health"]}, "'health' is never shut by the sidecar"),
    ({"open": ["trace", "trace"]}, "admin_apis.open names ['trace'] more than once"),
    ({"open": "logging"}, "admin_apis.open: Input should be a valid list"),
    ({"opened": ["logging"]}, "admin_apis.opened: unknown key"),
])
def test_policy_refuses_bad_allow_lists(admin: Any, message: str) -> None:
    assert message in refused(policy_doc(admin_apis=admin))


# ------------------------------------------------------------------------------------------------
# one token check for both doors: Triton's admin APIs and the sidecar's own /sidecar/* endpoints


@pytest.mark.parametrize(("authorization", "sidecar_token", "carried"), [
    (f"Bearer {ADMIN_TOKEN}", None, "authorization"),
    (None, ADMIN_TOKEN, "x-sidecar-token"),
    (f"Bearer {ADMIN_TOKEN}", ADMIN_TOKEN, "authorization"),
    # a Bearer meant for Triton or a gateway beside a valid X-Sidecar-Token: the /sidecar/* copy of
    # the check refused it (it read X-Sidecar-Token only without a Bearer); the admin check did not
    ("Bearer for-the-gateway", ADMIN_TOKEN, "x-sidecar-token"),
    ("Basic for-triton", ADMIN_TOKEN, "x-sidecar-token"),
    ("Bearer ", ADMIN_TOKEN, "x-sidecar-token"),
    ("Bearer wrong", "wrong", None),
    (None, None, None),
    ("\udcff\udcfe", "\udcff", None),  # not UTF-8 (aiohttp's surrogates): refused, not a 500 as in both copies
])
def test_one_token_check(authorization: str | None, sidecar_token: str | None, carried: str | None) -> None:
    assert admin_apis.authorised(authorization, sidecar_token, ADMIN_TOKEN) == carried
    assert admin_apis.authorised(authorization, sidecar_token, None) is None  # no token configured: never


def test_the_sidecars_own_endpoints_take_the_same_check_and_answer_alike() -> None:
    """GET /sidecar/status and POST /sidecar/reload: the HTTP proxy's door, on the one check, refused
    with the admin APIs' status and body shape (reason, category), 401 with a Bearer challenge."""
    from types import SimpleNamespace

    from multidict import CIMultiDict

    from sidecar.http_proxy import Admin, HttpProxy
    from sidecar.upstream import UpstreamHealth

    def door(token: str | None, **headers: str) -> Any:
        proxy = HttpProxy("127.0.0.1:1", None, UpstreamHealth(None), None,  # type: ignore[arg-type]
                          lambda: parse_policy(policy_doc()), Admin(token=token, status=dict, reload=None))  # type: ignore[arg-type]
        return proxy._authorised(SimpleNamespace(headers=CIMultiDict(headers)))  # type: ignore[arg-type]

    assert door(ADMIN_TOKEN, Authorization=f"Bearer {ADMIN_TOKEN}") is None
    assert door(ADMIN_TOKEN, Authorization="Bearer for-the-gateway", **{"X-Sidecar-Token": ADMIN_TOKEN}) is None
    refused = door(ADMIN_TOKEN, Authorization="Bearer wrong")
    body = json.loads(refused.body)
    assert refused.status == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    assert body["reason"] == "admin_api_restricted" and body["category"] == "sidecar"
    assert "status and reload endpoints" in body["error"] and "X-Sidecar-Token" in body["error"]
    assert "admin_apis" not in body["error"]  # they cannot be opened to every client
    unset = door(None, Authorization=f"Bearer {ADMIN_TOKEN}")
    assert unset.status == 403 and "--token-file" in json.loads(unset.body)["error"]
