"""`tritongen doctor`'s adapter: scrape live servers, read their configs, hand a snapshot to the rules.

For each server: GET /metrics (and the sidecar's, when given) every `every_s` seconds through the
`window` (all servers scraped together, so their windows line up); POST /v2/repository/index and
GET /v2/models/M/config for every ready model. Counters are read at the window's two ends; the
LLM engines' gauges (running, waiting, KV usage) at every scrape, since a queue that comes and goes
between two instants would otherwise go unseen. The deltas and the rules are pure (tritongen.core.diagnosis); this module only
does the I/O. The HTTP client, the clock and the sleep are injectable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tritongen.core.diagnosis_inputs import (
    ClassTarget,
    ServerSnapshot,
    Targets,
    devices_from_samples,
    sidecar_headroom,
    window_from_samples,
)
from tritongen.core.engine_window import Samples, engine_windows, sidecar_windows
from tritongen.core.prometheus import parse_prometheus
from tritongen.core.spec import entry_names_of
from tritongen.errors import BadInput, RunFailed
from tritongen.shared.reach import HTTP, METRICS, derived
from tritongen.triton_admin import Endpoints, TritonAdmin, metrics_page


@dataclass(frozen=True)
class Endpoint:
    http: str  # host:port of Triton's HTTP API
    metrics: list[str]  # Triton's /metrics URL, then any extra (the sidecar's)
    # address -> (what it is, the option that set it), for the message when it does not answer
    how: dict[str, tuple[str, str]] = field(default_factory=dict)


def normalise_http(url: str) -> str:
    """'host:port' or 'http://host:port[/]' -> 'host:port'."""
    text = url.strip()
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise BadInput(f"--url {url!r}: give HOST:PORT of Triton's HTTP endpoint")
        text = parts.netloc
    text = text.rstrip("/")
    if ":" not in text:
        raise BadInput(f"--url {url!r}: give HOST:PORT of Triton's HTTP endpoint (e.g. 127.0.0.1:8000)")
    return text


def endpoints(urls: Sequence[str], metrics_urls: Sequence[str], sidecar_metrics: Sequence[str] = ()) -> list[Endpoint]:
    """Pair each --url with its --metrics-url (in order) or the default port 8002 on the same host."""
    if not urls:
        raise BadInput("give at least one --url HOST:PORT")
    if metrics_urls and len(metrics_urls) != len(urls):
        raise BadInput(f"{len(urls)} --url but {len(metrics_urls)} --metrics-url; give one per server or none")
    if sidecar_metrics and len(sidecar_metrics) != len(urls):
        raise BadInput(f"{len(urls)} --url but {len(sidecar_metrics)} --sidecar-metrics-url; give one per server or none")
    out = []
    for i, url in enumerate(urls):
        http = normalise_http(url)
        metrics = metrics_urls[i] if metrics_urls else f"http://{http.rsplit(':', 1)[0]}:8002/metrics"
        extra = [sidecar_metrics[i]] if sidecar_metrics else []
        how = {
            http: (HTTP, "--url"),
            metrics: (METRICS, "--metrics-url" if metrics_urls else derived("--metrics-url", "--url", "URL")),
            **{u: ("the sidecar's metrics endpoint", "--sidecar-metrics-url") for u in extra},
        }
        out.append(Endpoint(http=http, metrics=[metrics, *extra], how=how))
    return out


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {(sample name as written, sorted labels): value}, a repeated series summed.

    Parsed by tritongen.core.prometheus, which keeps every name as written: prometheus_client's
    parser renames counter samples to `<name>_total`, and Triton's counters
    (`nv_inference_request_success`) carry no such suffix.
    """
    try:
        samples = parse_prometheus(text, strict=True)
    except ValueError:
        raise RunFailed("the metrics endpoint did not return Prometheus text format") from None
    out: dict = {}
    for sample in samples:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        out[key] = out.get(key, 0.0) + sample.value
    return out


class TritonReader:
    """doctor's calls to each server, through one `TritonAdmin` per server on one shared client;
    `servers` name each address's option for the error when it does not answer."""

    def __init__(self, client: httpx.Client, servers: Sequence[Endpoint] = ()) -> None:
        self.client = client
        self.how = {address: how for server in servers for address, (_, how) in server.how.items()}
        self.admins: dict[str, TritonAdmin] = {}

    def _admin(self, http: str) -> TritonAdmin:
        if http not in self.admins:
            self.admins[http] = TritonAdmin(Endpoints(http=http, grpc="", metrics=""), client=self.client, how=self.how)
        return self.admins[http]

    def metrics(self, url: str) -> Samples:
        return parse_metrics(metrics_page(self.client, url, self.how.get(url)))

    def index(self, http: str) -> list[dict]:
        return list(self._admin(http).models())

    def config(self, http: str, model: str) -> dict:
        return dict(self._admin(http).config(model))


def snapshot(
    servers: Sequence[Endpoint],
    window_s: float,
    reader: TritonReader,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    every_s: float = 1.0,
) -> list[ServerSnapshot]:
    if window_s <= 0:
        raise BadInput(f"--window {window_s}: must be > 0 seconds")
    if every_s <= 0:
        raise BadInput(f"--sample-every {every_s}: must be > 0 seconds")
    indexes = [reader.index(s.http) for s in servers]
    t0 = clock()
    scrapes: list[list[dict]] = [[_merge(reader.metrics(u) for u in s.metrics) for s in servers]]
    steps = max(1, math.ceil(window_s / every_s - 1e-9))
    for step in range(steps):  # a fixed schedule: the window's length never depends on scrape times
        sleep(min(every_s, window_s - step * every_s))
        scrapes.append([_merge(reader.metrics(u) for u in s.metrics) for s in servers])
    elapsed = max(clock() - t0, 1e-6)
    snaps = []
    for i, (server, index) in enumerate(zip(servers, indexes)):
        mine = [scrape[i] for scrape in scrapes]
        b, a = mine[0], mine[-1]
        ready = sorted({e["name"] for e in index if e.get("state") == "READY"})
        configs = {name: reader.config(server.http, name) for name in ready}
        windows = {m: w for m, w in window_from_samples(b, a).items() if m in configs or not configs}
        snaps.append(ServerSnapshot(
            url=server.http, window_s=elapsed, models=windows, configs=configs, index=index,
            devices=devices_from_samples(a), headroom=sidecar_headroom(a),
            engines=engine_windows(mine, elapsed), sidecar=sidecar_windows(b, a),
        ))
    return snaps


def _merge(parts) -> dict:
    out: dict = {}
    for part in parts:
        out.update(part)
    return out


def targets_from_spec(path: Path | None, default_budget_ms: float) -> Targets:
    """Budgets per model entry from the spec's traffic classes (the tightest class P99 a model serves)."""
    if path is None:
        return Targets(default_budget_ms=default_budget_ms, source=f"--budget-ms {default_budget_ms:g}")
    from tritongen.specio import load_spec

    spec = load_spec(path).spec
    budgets: dict[str, float] = {}
    per_class: dict[str, dict[str, ClassTarget]] = {}
    seqs: dict[str, int] = {}
    for model in spec.models:
        classes = {c.name: ClassTarget(c.p99_ms, c.share) for c in spec.classes_of(model)}
        for name in entry_names_of(model):
            budgets[name] = min(c.p99_ms for c in classes.values())
            per_class[name] = classes
            if model.engine is not None and model.engine.max_num_seqs is not None:
                seqs[name] = model.engine.max_num_seqs
    return Targets(
        default_budget_ms=default_budget_ms, budget_ms=budgets, classes=per_class, max_num_seqs=seqs,
        memory_cap=spec.policy.memory_utilization_cap, source=str(path),
    )
