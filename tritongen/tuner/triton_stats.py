"""Triton's own statistics of a model (GET /v2/models/<model>/stats), and what it counted between
two readings: executions, batch sizes, instance time and queue time."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from tritongen.errors import RunFailed


@dataclass(frozen=True)
class StatsSnapshot:
    model: str
    raw: dict

    @property
    def executions(self) -> int:
        return int(self.raw.get("execution_count", 0))

    @property
    def inferences(self) -> int:
        return int(self.raw.get("inference_count", 0))

    def stat(self, name: str) -> tuple[int, int]:
        entry = (self.raw.get("inference_stats") or {}).get(name) or {}
        return int(entry.get("count", 0)), int(entry.get("ns", 0))

    def batches(self) -> dict[int, tuple[int, int]]:
        """batch size -> (executions, ns of compute_input + compute_infer + compute_output)."""
        out = {}
        for item in self.raw.get("batch_stats") or []:
            count = int((item.get("compute_infer") or {}).get("count", 0))
            ns = sum(int((item.get(k) or {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
            out[int(item["batch_size"])] = (count, ns)
        return out


@dataclass(frozen=True)
class StatsDelta:
    """What Triton counted between two snapshots."""

    model: str
    executions: int
    inferences: int
    success: int
    success_mean_ms: float | None
    queue_mean_ms: float | None
    batches: dict[int, tuple[int, float]]  # rows -> (executions, mean instance ms per execution)
    busy_ms: float  # instance time summed over executions

    @property
    def mean_batch_rows(self) -> float | None:
        return self.inferences / self.executions if self.executions else None


def fetch_stats(http_url: str, model: str, client: httpx.Client | None = None) -> StatsSnapshot:
    url = f"http://{http_url}/v2/models/{model}/stats"
    try:
        response = (client or httpx).get(url, timeout=10.0)
    except httpx.HTTPError as err:
        raise RunFailed(f"cannot read statistics of {model!r} from {http_url}: {err}") from None
    if response.status_code != 200:
        raise RunFailed(f"statistics of {model!r}: HTTP {response.status_code}: {response.text[:200]}")
    stats = response.json().get("model_stats") or []
    if not stats:
        raise RunFailed(f"statistics of {model!r}: the server reported none")
    return StatsSnapshot(model=model, raw=stats[0])


def stats_delta(before: StatsSnapshot, after: StatsSnapshot) -> StatsDelta:
    def mean(name: str) -> tuple[int, float | None]:
        c0, n0 = before.stat(name)
        c1, n1 = after.stat(name)
        count = c1 - c0
        return count, ((n1 - n0) / count / 1e6 if count > 0 else None)

    success, success_ms = mean("success")
    _, queue_ms = mean("queue")
    b0 = before.batches()
    batches: dict[int, tuple[int, float]] = {}
    busy_ns = 0
    for rows, (count, ns) in after.batches().items():
        c0, n0 = b0.get(rows, (0, 0))
        if count - c0 > 0:
            batches[rows] = (count - c0, (ns - n0) / (count - c0) / 1e6)
            busy_ns += ns - n0
    return StatsDelta(
        model=after.model,
        executions=after.executions - before.executions,
        inferences=after.inferences - before.inferences,
        success=success,
        success_mean_ms=success_ms,
        queue_mean_ms=queue_ms,
        batches=dict(sorted(batches.items())),
        busy_ms=busy_ns / 1e6,
    )
