"""Triton's HTTP admin API as the profiler and doctor use it: where the server's HTTP, gRPC and
metrics endpoints are (`endpoints_from_url`), and the calls besides inference (metadata, the model
index, configs, statistics, loads and unloads, the metrics page), each failure one `RunFailed` that names the
address and the option that set it (`tritongen.shared.reach`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from tritongen.errors import BadInput, RunFailed
from tritongen.shared.reach import HTTP, METRICS, unreachable


@dataclass(frozen=True)
class Endpoints:
    http: str  # host:port
    grpc: str  # host:port
    metrics: str  # full URL of /metrics


def _host_port(url: str, option: str) -> tuple[str, int | None]:
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise BadInput(f"{option} {url!r} is not HOST:PORT: {err}") from None
    if not parts.hostname:
        raise BadInput(f"{option} {url!r} has no host; use HOST:PORT, e.g. 127.0.0.1:8000")
    return parts.hostname, port


def endpoints_from_url(url: str, grpc_url: str | None = None, metrics_url: str | None = None) -> Endpoints:
    """`--url HOST:PORT` (HTTP); gRPC and metrics default to ports 8001 and 8002 on the same host."""
    host, port = _host_port(url, "--url")
    http = f"{host}:{port or 8000}"
    if grpc_url:
        g_host, g_port = _host_port(grpc_url, "--grpc-url")
        grpc = f"{g_host}:{g_port or 8001}"
    else:
        grpc = f"{host}:8001"
    if metrics_url:
        m_host, m_port = _host_port(metrics_url, "--metrics-url")
        path = urlsplit(metrics_url if "://" in metrics_url else f"http://{metrics_url}").path or "/metrics"
        metrics = f"http://{m_host}:{m_port or 8002}{path}"
    else:
        metrics = f"http://{host}:8002/metrics"
    return Endpoints(http=http, grpc=grpc, metrics=metrics)


def _request(client: httpx.Client, what: str, address: str, how: str | None, method: str, url: str,
             **kwargs) -> httpx.Response:
    try:
        return client.request(method, url, **kwargs)
    except httpx.HTTPError as err:
        shown = address if "://" in address else f"http://{address}"
        raise unreachable(what, shown, how, f"{type(err).__name__}: {err}") from None


def metrics_page(client: httpx.Client, url: str, how: str | None = None) -> str:
    """A metrics page that must answer (doctor's); `how`: the option that set `url`."""
    response = _request(client, METRICS, url, how, "GET", url)
    if response.status_code != 200:
        raise RunFailed(f"metrics at {url}: HTTP {response.status_code}")
    return response.text


class TritonAdmin:
    """The HTTP calls besides inference: metadata, the index, configs, stats, loads, metrics.

    `client`: share one httpx client among several servers (doctor's replicas); the admin then
    leaves it open. `how`: the option that set each address (address -> option), for the error
    when one does not answer."""

    def __init__(self, endpoints: Endpoints, timeout_s: float = 30.0, client: httpx.Client | None = None,
                 how: dict[str, str] | None = None) -> None:
        self.endpoints = endpoints
        self.base = f"http://{endpoints.http}"
        self.owned = client is None
        self.client = client if client is not None else httpx.Client(timeout=timeout_s)
        self.how = {endpoints.http: "--url", **(how or {})}

    def close(self) -> None:
        if self.owned:
            self.client.close()

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        http = self.endpoints.http
        return _request(self.client, HTTP, http, self.how.get(http), method, self.base + path, **kwargs)

    def server_metadata(self) -> dict:
        response = self._call("GET", "/v2")
        if response.status_code != 200:
            raise RunFailed(f"http://{self.endpoints.http}/v2 answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def models(self) -> list[dict]:
        response = self._call("POST", "/v2/repository/index", json={})
        if response.status_code != 200:
            raise RunFailed(f"cannot list the server's models ({response.status_code}): {response.text[:200]}")
        return response.json()

    def config(self, model: str) -> dict:
        response = self._call("GET", f"/v2/models/{model}/config")
        if response.status_code != 200:
            raise RunFailed(f"cannot read the config of {model!r} ({response.status_code}): {response.text[:200]}")
        return response.json()

    def model_ready(self, model: str) -> bool:
        return self._call("GET", f"/v2/models/{model}/ready").status_code == 200

    def stats(self, model: str) -> dict:
        response = self._call("GET", f"/v2/models/{model}/stats")
        if response.status_code != 200:
            raise RunFailed(f"cannot read the statistics of {model!r} ({response.status_code}): {response.text[:200]}")
        stats = response.json().get("model_stats") or [{}]
        return stats[0]

    def load(self, model: str, config: dict | None = None) -> None:
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        response = self._call("POST", f"/v2/repository/models/{model}/load", json=body)
        if response.status_code != 200:
            raise RunFailed(f"reloading {model!r} failed ({response.status_code}): {response.text[:300]}")

    def unload(self, model: str, timeout_s: float = 60.0) -> None:
        """Unload `model` and wait until it is gone: Triton answers the call before the model's
        finalize() has run (a vLLM engine still stopping, holding its memory and cores) and lists it
        UNLOADING meanwhile (docs/server-behaviour.md)."""
        response = self._call("POST", f"/v2/repository/models/{model}/unload", json={})
        if response.status_code != 200:
            raise RunFailed(f"unloading {model!r} failed ({response.status_code}): {response.text[:300]}")
        deadline = time.monotonic() + timeout_s
        while True:
            states = [entry.get("state") for entry in self.models() if entry.get("name") == model]
            if not any(state in ("READY", "UNLOADING") for state in states):
                return
            if time.monotonic() > deadline:
                raise RunFailed(f"{model!r} still {states[0]} {timeout_s:.0f} s after its unload: {states}")
            time.sleep(0.2)

    def metrics(self) -> str | None:
        """The metrics page, or None when the server exports none (metrics are optional to a profile)."""
        try:
            response = self.client.get(self.endpoints.metrics, timeout=10.0)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None
