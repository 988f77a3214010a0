"""Triton's request trace (level TIMESTAMPS): turn it on for a server, read it back per model.

The trace is how the simulator's batcher hand-off model is calibrated (`tritongen.core.handoff`):
per request, when it entered the scheduler's queue and when the execution that served it started
and ended, on Triton's own clock. With `log-frequency=0` the server keeps the traces in memory and
appends them to the file when it shuts down, or when its trace settings are updated (re-posting
`log_frequency` does it; so does `stop_tracing`), so a running server's file can be read too
(tritonserver 2.51; the file stays an unterminated JSON array until shutdown).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np

from tritongen.errors import BadInput, RunFailed


def trace_flags(path: Path) -> list[str]:
    """tritonserver arguments that trace every request's timestamps into `path` (written at shutdown
    or when the trace settings are updated)."""
    return [
        f"--trace-config=triton,file={path}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        "--trace-config=count=-1",
        "--trace-config=log-frequency=0",
    ]


def set_trace_level(http_url: str, level: str = "TIMESTAMPS") -> None:
    """Turn a running server's tracing (back) on at `level`, into the file it was started with."""
    _post_setting(http_url, {"trace_level": [level]})


def stop_tracing(http_url: str) -> None:
    """Turn a running server's tracing off (what it holds is written out)."""
    set_trace_level(http_url, "OFF")


def _post_setting(http_url: str, setting: dict) -> None:
    url = http_url if "://" in http_url else f"http://{http_url}"
    try:
        reply = httpx.post(f"{url}/v2/trace/setting", json=setting, timeout=10.0)
    except httpx.HTTPError as exc:
        raise RunFailed(f"could not update Triton's trace setting at {url}: {exc}") from exc
    if reply.status_code != 200:
        raise RunFailed(f"could not update Triton's trace setting at {url}: {reply.status_code} {reply.text[:200]}")


class RequestTimes(NamedTuple):
    """Per traced request of one model, seconds on Triton's steady clock."""

    queue_s: np.ndarray  # QUEUE_START: entered the scheduler
    start_s: np.ndarray  # COMPUTE_START of the execution that served it
    end_s: np.ndarray  # COMPUTE_END of that execution

    def between(self, t0: float, t1: float) -> RequestTimes:
        """The requests that entered the queue in [t0, t1] (e.g. `LoadResult.clock_span()`)."""
        keep = (self.queue_s >= t0) & (self.queue_s <= t1)
        return RequestTimes(self.queue_s[keep], self.start_s[keep], self.end_s[keep])


def read_trace(path: Path, model: str) -> RequestTimes:
    """The requests of `model` in a trace file (entries of other models and unfinished requests are skipped)."""
    try:
        text = Path(path).read_text().strip() or "[]"
        if not text.endswith("]"):  # flushed from a running server: the array is closed at shutdown
            text += "]"
        raw = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not a Triton trace file ({exc}); was the server started with trace_flags()?") from exc
    by_id: dict[int, dict] = {}
    for rec in raw:
        tid = rec.get("id")
        if tid is None:
            continue
        entry = by_id.setdefault(tid, {"model": None, "ts": {}})
        if rec.get("model_name"):
            entry["model"] = rec["model_name"]
        for ts in rec.get("timestamps", ()):
            entry["ts"][ts["name"]] = int(ts["ns"])
    keys = ("QUEUE_START", "COMPUTE_START", "COMPUTE_END")
    rows = [[e["ts"][k] for k in keys] for e in by_id.values() if e["model"] == model and all(k in e["ts"] for k in keys)]
    times = np.asarray(rows, dtype=np.float64).reshape(-1, 3) / 1e9
    return RequestTimes(times[:, 0], times[:, 1], times[:, 2])
