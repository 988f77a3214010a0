"""Triton's admin APIs behind the sidecar: which of Triton's restricted-API categories a request
belongs to, and what the sidecar answers when it keeps one shut. Pure: no I/O, no state.

The categories are Triton's own (tritongen/core/admin_categories.py); which endpoint is in which
follows Triton's src/http_server.cc and src/grpc/grpc_server.cc (`GRPC_CATEGORIES` lists every
gRPC method). A request in a shut category is served only with the sidecar's admin token (the one
`/sidecar/status` takes), unless the policy's `admin_apis.open` opens the category to every client.

HTTP paths are classified as Triton will match them: the path the proxy sends upstream, without the
query (yarl has resolved dot segments and decoded unreserved escapes by then). The test is a prefix
test on the segment after `/v2/` (plus a suffix test for per-model trace settings), so it is
conservative: a path under `/v2/repository` that Triton would answer 404 is shut too. A path with
`%`, `//` or a dot segment is also tested decoded and normalised; either form in a shut category
shuts it.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection
from typing import Any
from urllib.parse import unquote

from tritongen.core.admin_categories import (  # the one table of Triton's categories and the shut ones
    HEALTH,
    INFERENCE,
    LOGGING,
    METADATA,
    MODEL_CONFIG,
    MODEL_REPOSITORY,
    SHARED_MEMORY,
    SHUT,
    STATISTICS,
    TRACE,
    WHAT,
)

REASON = "admin_api_restricted"
TOKEN_HEADER = "x-sidecar-token"  # the sidecar's own token header (HTTP) and metadata key (gRPC)
AUTHORIZATION = "authorization"
SIDECAR = "sidecar"  # the refusals' category for the sidecar's own endpoints (/sidecar/status, /sidecar/reload)


# -- gRPC ------------------------------------------------------------------------------------------

SERVICE = "/inference.GRPCInferenceService/"
GRPC_CATEGORIES: dict[str, str] = {
    **{SERVICE + m: HEALTH for m in ("ServerLive", "ServerReady", "ModelReady")},
    "/grpc.health.v1.Health/Check": HEALTH,
    **{SERVICE + m: METADATA for m in ("ServerMetadata", "ModelMetadata")},
    **{SERVICE + m: INFERENCE for m in ("ModelInfer", "ModelStreamInfer")},
    SERVICE + "ModelConfig": MODEL_CONFIG,
    SERVICE + "ModelStatistics": STATISTICS,
    **{SERVICE + m: MODEL_REPOSITORY for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
    SERVICE + "TraceSetting": TRACE,
    SERVICE + "LogSettings": LOGGING,
    **{SERVICE + f"{kind}SharedMemory{op}": SHARED_MEMORY
       for kind in ("System", "Cuda") for op in ("Status", "Register", "Unregister")},
}
GRPC_ADMIN: dict[str, str] = {m: c for m, c in GRPC_CATEGORIES.items() if c in SHUT}


def grpc_admin_category(method: str) -> str | None:
    """The shut category of a gRPC method, or None (one dict lookup)."""
    return GRPC_ADMIN.get(method)


# -- HTTP ------------------------------------------------------------------------------------------

_HTTP_ADMIN_ROOTS = {
    "repository": MODEL_REPOSITORY,
    "logging": LOGGING,
    "trace": TRACE,
    "systemsharedmemory": SHARED_MEMORY,
    "cudasharedmemory": SHARED_MEMORY,
}


def _admin(path: str) -> str | None:
    if not path.startswith("/v2/"):
        return None
    root = path[4:].partition("/")[0]
    category = _HTTP_ADMIN_ROOTS.get(root)
    if category is None and root == "models" and path.endswith("/trace/setting"):
        return TRACE
    return category


def _normalised(path: str) -> str:
    """Decoded, with empty and dot segments resolved the way a URL library resolves them."""
    out: list[str] = []
    for segment in unquote(path).split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out)


def http_admin_category(path: str) -> str | None:
    """The shut category of a request path (no query), or None. A few string tests, no regex."""
    if "%" in path or "//" in path or "/." in path:
        return _admin(path) or _admin(_normalised(path))
    return _admin(path)


# -- the admin token and refusals ------------------------------------------------------------------


def token_matches(given: str | None, token: str | None) -> bool:
    """Whether `given` is the configured admin token (constant-time); never with no token configured.
    A header that is not UTF-8 (aiohttp hands its bytes on as surrogates) is compared byte for byte,
    not an error: it was a 500 before the check was one."""
    if not token or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass"))


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def authorised(authorization: str | None, sidecar_token: str | None, token: str | None) -> str | None:
    """The one token check, for Triton's admin APIs and the sidecar's own endpoints on both protocols:
    the header (gRPC: metadata key) that carried the admin token, `AUTHORIZATION` (as a Bearer) or
    `TOKEN_HEADER`, or None. Either may carry it: an `Authorization` meant for Triton or a gateway
    beside a valid `X-Sidecar-Token` is no refusal (the /sidecar/* check, a copy, refused it)."""
    if token_matches(bearer(authorization), token):
        return AUTHORIZATION
    if token_matches(sidecar_token, token):
        return TOKEN_HEADER
    return None


def kept_out(category: str, authorization: str | None, sidecar_token: str | None, token: str | None,
             open_categories: Collection[str]) -> tuple[str, ...] | None:
    """A request to a shut admin API passes with the admin token or when the policy opens its
    category: the headers (gRPC: metadata keys) that carried the token, kept out of what goes
    upstream, or None when it is refused."""
    carried = authorised(authorization, sidecar_token, token)
    if carried is None and category not in open_categories:
        return None
    return (AUTHORIZATION, TOKEN_HEADER) if carried == AUTHORIZATION else (TOKEN_HEADER,)


def refusal(category: str, protocol: str, token_configured: bool) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) refusing a request in a shut category, or to the sidecar's own
    endpoints (`SIDECAR`): 403 when the sidecar has no admin token (nothing the client sends can
    open it), 401 when the token is missing or wrong."""
    how = ("metadata `authorization: Bearer <token>` (or `x-sidecar-token: <token>`)" if protocol == "grpc"
           else "`Authorization: Bearer <token>` (or `X-Sidecar-Token: <token>`)")
    if category == SIDECAR:
        what, open_it = "the sidecar's status and reload endpoints are behind its admin token", ""
    else:
        what = f"Triton's {category} API ({WHAT.get(category, category)}) is shut behind the sidecar"
        open_it = f', or open it to every client with "admin_apis": {{"open": ["{category}"]}} in the sidecar policy'
    if token_configured:
        status, error = 401, f"{what}: send the sidecar's admin token, {how}{open_it}"
    else:
        status, error = 403, (f"{what} and the sidecar has no admin token: start it with --token-file and send "
                              f"the token, {how}{open_it}")
    return status, {"error": error, "reason": REASON, "category": category}
