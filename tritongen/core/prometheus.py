"""Prometheus text exposition, parsed: one parser for the sidecar's headroom, the profiler and
`doctor`, and tritongen's own KV-pool gauge convention read from its samples.

Pure text computation, so it lives in core. A small parser on purpose: prometheus_client's
renames counter samples to `<name>_total`, and Triton's counters (`nv_inference_request_success`)
carry no such suffix; here every sample keeps the name it was written with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# name, {labels}, value, optional timestamp (integer milliseconds, may be negative)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(match: re.Match[str]) -> str:
    return "\n" if match.group(1) == "n" else match.group(1)


def parse_prometheus(text: str, wanted: Callable[[str], bool] | None = None, strict: bool = False) -> list[Sample]:
    """The samples of a page, in page order; comments and malformed lines are skipped. With
    `wanted`, only lines whose metric name it accepts are parsed (Triton's page is long). With
    `strict`, a page with malformed lines and not one sample raises ValueError: it is not
    Prometheus text at all (an HTML error page, a JSON API)."""
    out: list[Sample] = []
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if wanted is not None and not wanted(line.split("{", 1)[0].split(" ", 1)[0]):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            bad += 1
            continue
        name, labels_text, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            bad += 1
            continue
        labels = {k: _ESCAPE.sub(_unescape, v) for k, v in _LABEL.findall(labels_text or "")}
        out.append(Sample(name, labels, number))
    if strict and bad and not out:
        raise ValueError("not Prometheus text format")
    return out


@dataclass(frozen=True)
class KVGauges:
    """A model's own KV-cache gauges (tritongen's convention: `<prefix>_kv_blocks_used` and friends,
    labelled with model=<name>), summed over instances for counts, max for per-token sizes."""

    blocks_used: int | None
    blocks_total: int | None
    bytes_per_token: float | None
    block_tokens: int | None
    generated_tokens: int | None = None

    @property
    def present(self) -> bool:
        return self.bytes_per_token is not None or self.blocks_used is not None


KV_GAUGE_SUFFIXES = ("_kv_blocks_used", "_kv_blocks_total", "_kv_bytes_per_token", "_kv_block_tokens")


def kv_gauges(samples: Sequence[Sample], model: str) -> KVGauges:
    """MODEL's KV gauges among SAMPLES (None where the model exports no such gauge)."""
    def pick(suffix: str, combine: Callable[[list[float]], float]) -> float | None:
        values = [s.value for s in samples if s.name.endswith(suffix) and s.labels.get("model") == model]
        return combine(values) if values else None

    used = pick("_kv_blocks_used", sum)
    total = pick("_kv_blocks_total", sum)
    bpt = pick("_kv_bytes_per_token", max)
    block = pick("_kv_block_tokens", max)
    generated = pick("_generated_tokens_total", sum)
    return KVGauges(
        blocks_used=None if used is None else int(used),
        blocks_total=None if total is None else int(total),
        bytes_per_token=bpt,
        block_tokens=None if block is None else int(block),
        generated_tokens=None if generated is None else int(generated),
    )
