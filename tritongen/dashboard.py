"""A Grafana dashboard (JSON model) for a tritongen deployment: one screen, per model.

Built as a plain dict (no template): the JSON model is data, and building it in Python keeps the
panel grid, the PromQL and the metric names checkable by tests. Panels, top to bottom:

    QPS                     | P99 latency                  | time to first token (avg, P99)
    GPU utilisation         | rejections                   | memory headroom
    queue time / compute    | average queue time           | pending requests
    LLM engine: running /   | LLM engine: KV-cache usage   | preemptions and out-of-memory
    waiting                 |                              | kills

Sources: Triton's own metrics (`nv_*`, port 8002; P99 needs `--metrics-config
summary_latencies=true`, which `tritongen deploy` sets) and the sidecar's (`sidecar_*`):
the sidecar sees what Triton cannot (requests it rejected before Triton, time to first token of
streams, live memory headroom). The LLM engines' own metrics (vLLM's, TensorRT-LLM's, and a
Python backend's under tritongen's `llm_engine_*` convention; names in tritongen.core.engine_metrics)
show what a decoupled model's Triton counters cannot: the engine's queue, its KV cache and its
preemptions, the signals `tritongen doctor` diagnoses (DR108-DR112). The `model` variable filters
every per-model panel.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritongen.core import engine_metrics as engine
from tritongen.core.engine_window import SIDECAR_FINISHED, SIDECAR_OOM_OUTCOME
from tritongen.core.llm_diagnosis import KV_NEAR_FULL
from tritongen.errors import TritongenError

SCHEMA_VERSION = 39
GRID_WIDTH = 24

# Triton (server 2.51) metric families the dashboard reads.
TRITON_METRICS = {
    "success": "nv_inference_request_success",
    "failure": "nv_inference_request_failure",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_infer_us": "nv_inference_compute_infer_duration_us",
    "request_summary_us": "nv_inference_request_summary_us",
    "pending": "nv_inference_pending_request_count",
    "gpu_util": "nv_gpu_utilization",
    "gpu_used": "nv_gpu_memory_used_bytes",
    "gpu_total": "nv_gpu_memory_total_bytes",
    "cpu_util": "nv_cpu_utilization",
}

# The sidecar's metric names as exposed (sidecar/metrics.py; counters gain `_total` on exposition).
# Labels: rejected {class, model, reason}; ttft and latency histograms {class, model}; headroom
# {scope, source} with scope gpuN / cpu / pool:<model>; queue depth {class}.
SIDECAR_METRICS = {
    "rejected": "sidecar_requests_rejected_total",
    "ttft": "sidecar_time_to_first_token_seconds",
    "latency": "sidecar_request_duration_seconds",
    "headroom": "sidecar_headroom_bytes",
    "queue_depth": "sidecar_queue_depth",
}


@dataclass(frozen=True)
class DashboardOptions:
    title: str = "Triton fleet (tritongen)"
    uid: str = "tritongen-fleet"
    p99_target_ms: float | None = None  # threshold line on the latency panels
    memory_pad_bytes: float | None = None  # headroom under this is red
    sidecar: dict[str, str] | None = None  # overrides of SIDECAR_METRICS


_RATE = "$__rate_interval"
_SEL = 'model=~"$model"'


def _ds() -> dict[str, str]:
    return {"type": "prometheus", "uid": "${datasource}"}


def _target(ref: str, expr: str, legend: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": _ds(), "expr": expr, "legendFormat": legend, "range": True}


def _thresholds(red_above: float | None = None, red_below: float | None = None) -> dict[str, Any]:
    if red_above is not None:
        steps = [{"color": "green", "value": None}, {"color": "red", "value": red_above}]
    elif red_below is not None:
        steps = [{"color": "red", "value": None}, {"color": "green", "value": red_below}]
    else:
        steps = [{"color": "green", "value": None}]
    return {"mode": "absolute", "steps": steps}


def _panel(
    pid: int, title: str, description: str, unit: str, targets: list[dict[str, Any]], grid: tuple[int, int, int, int],
    thresholds: dict[str, Any] | None = None, minimum: float | None = 0,
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                   "thresholdsStyle": {"mode": "line" if thresholds else "off"}},
        "thresholds": thresholds or _thresholds(),
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": _ds(),
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": targets,
    }


def build_dashboard(options: DashboardOptions = DashboardOptions()) -> dict[str, Any]:
    """The dashboard JSON model (Grafana 10/11, schemaVersion 39)."""
    t = TRITON_METRICS
    s = {**SIDECAR_METRICS, **(options.sidecar or {})}
    target_s = options.p99_target_ms / 1000 if options.p99_target_ms else None
    w, h = 8, 8
    panels = [
        _panel(1, "QPS", "Successful inferences per second, per model (Triton).", "reqps", [
            _target("A", f"sum by (model) (rate({t['success']}{{{_SEL}}}[{_RATE}]))", "{{model}}"),
        ], (0, 0, w, h)),
        _panel(2, "P99 latency", "End-to-end P99 per model: at the sidecar (histogram) and inside Triton "
               "(summary quantile 0.99, needs --metrics-config summary_latencies=true).", "s", [
            _target("A", f"histogram_quantile(0.99, sum by (le, model) (rate({s['latency']}_bucket{{{_SEL}}}[{_RATE}])))",
                    "{{model}} sidecar"),
            _target("B", f'max by (model) ({t["request_summary_us"]}{{{_SEL},quantile="0.99"}}) / 1e6', "{{model}} triton"),
        ], (w, 0, w, h), _thresholds(red_above=target_s)),
        _panel(3, "Time to first token (avg, P99)", "Streaming models: average and P99 time to the first "
               "token, measured by the sidecar.", "s", [
            _target("A", f"sum by (model) (rate({s['ttft']}_sum{{{_SEL}}}[{_RATE}])) / "
                         f"sum by (model) (rate({s['ttft']}_count{{{_SEL}}}[{_RATE}]))", "{{model}} avg"),
            _target("B", f"histogram_quantile(0.99, sum by (le, model) (rate({s['ttft']}_bucket{{{_SEL}}}[{_RATE}])))",
                    "{{model}} P99"),
        ], (2 * w, 0, w, h), _thresholds(red_above=target_s)),
        _panel(4, "GPU utilisation", "Per GPU (Triton's nv_gpu_utilization is per device, not per model); "
               "CPU-only servers show nv_cpu_utilization.", "percentunit", [
            _target("A", f"avg by (pod, gpu_uuid) ({t['gpu_util']})", "{{pod}} {{gpu_uuid}}"),
            _target("B", f"avg by (pod) ({t['cpu_util']})", "{{pod}} cpu"),
        ], (0, h, w, h), _thresholds(red_above=0.95), minimum=0),
        _panel(5, "Rejections", "Requests refused per second: by the sidecar's admission (429, with reason) and "
               "by Triton (queue timeouts and other failures).", "reqps", [
            _target("A", f"sum by (model, reason) (rate({s['rejected']}{{{_SEL}}}[{_RATE}]))", "{{model}} sidecar {{reason}}"),
            _target("B", f"sum by (model, reason) (rate({t['failure']}{{{_SEL}}}[{_RATE}]))", "{{model}} triton {{reason}}"),
        ], (w, h, w, h), _thresholds(red_above=0.001)),
        _panel(6, "Memory headroom", "Memory left before the watermark: the sidecar's live headroom per scope "
               "(a GPU, the CPU pool, or pool:<model> for a model's KV pool; NVML, Triton's metrics or the plan) and "
               "total - used per GPU from Triton.", "bytes", [
            _target("A", f'min by (pod, scope) ({s["headroom"]}{{scope=~"gpu.*|cpu|pool:($model)"}})', "{{pod}} {{scope}} sidecar"),
            _target("B", f"min by (pod, gpu_uuid) ({t['gpu_total']} - {t['gpu_used']})", "{{pod}} {{gpu_uuid}} free"),
        ], (2 * w, h, w, h), _thresholds(red_below=options.memory_pad_bytes) if options.memory_pad_bytes else None),
        _panel(7, "Queue time / compute time", "The autoscaling signal: above 1, requests wait longer than "
               "they compute; the cold pool scales out.", "none", [
            _target("A", f"sum by (model) (rate({t['queue_us']}{{{_SEL}}}[{_RATE}])) / "
                         f"clamp_min(sum by (model) (rate({t['compute_infer_us']}{{{_SEL}}}[{_RATE}])), 1)", "{{model}}"),
        ], (0, 2 * h, w, h), _thresholds(red_above=1.0)),
        _panel(8, "Average queue time", "Mean time a request waited in Triton's scheduler queue.", "s", [
            _target("A", f"sum by (model) (rate({t['queue_us']}{{{_SEL}}}[{_RATE}])) / 1e6 / "
                         f"clamp_min(sum by (model) (rate({t['success']}{{{_SEL}}}[{_RATE}])), 1e-9)", "{{model}}"),
        ], (w, 2 * h, w, h), _thresholds(red_above=target_s / 2 if target_s else None)),
        _panel(9, "Pending requests", "Requests queued in Triton (per model) and in the sidecar (per class).", "short", [
            _target("A", f"sum by (model) ({t['pending']}{{{_SEL}}})", "{{model}} triton"),
            _target("B", f"sum by (class) ({s['queue_depth']})", "sidecar queue: class {{class}}"),
        ], (2 * w, 2 * h, w, h)),
        _panel(10, "LLM engine: running / waiting", "Sequences the engine runs and requests waiting inside it, "
               "from the engine's own metrics (a decoupled model's Triton queue is empty while its engine queues).",
               "short", [
            _target("A", f"sum by (model) ({engine.VLLM_RUNNING}{{{_SEL}}})", "{{model}} vLLM running"),
            _target("B", f"sum by (model) ({engine.VLLM_WAITING}{{{_SEL}}})", "{{model}} vLLM waiting"),
            _target("C", f'sum by (model, {engine.TRTLLM_REQUEST_TYPE}) ({engine.TRTLLM_REQUESTS}'
                         f'{{{_SEL},{engine.TRTLLM_REQUEST_TYPE}=~"active|waiting"}})',
                    f"{{{{model}}}} TensorRT-LLM {{{{{engine.TRTLLM_REQUEST_TYPE}}}}}"),
            _target("D", f"sum by (model) ({engine.PY_RUNNING}{{{_SEL}}})", "{{model}} running"),
            _target("E", f"sum by (model) ({engine.PY_WAITING}{{{_SEL}}})", "{{model}} waiting"),
        ], (0, 3 * h, w, h)),
        _panel(11, "LLM engine: KV-cache usage", "Fraction of the engine's KV cache in use; with requests waiting "
               f"above {KV_NEAR_FULL:.0%}, new sequences wait for blocks (doctor DR108).", "percentunit", [
            _target("A", f"max by (model) ({engine.VLLM_USAGE_GAUGES[0]}{{{_SEL}}} or {engine.VLLM_USAGE_GAUGES[1]}{{{_SEL}}})",
                    "{{model}} vLLM"),
            _target("B", f'sum by (model) ({engine.TRTLLM_KV_BLOCKS}{{{_SEL},{engine.TRTLLM_BLOCK_TYPE}="used"}}) / '
                         f'sum by (model) ({engine.TRTLLM_KV_BLOCKS}{{{_SEL},{engine.TRTLLM_BLOCK_TYPE}="max"}})',
                    "{{model}} TensorRT-LLM"),
            _target("C", f"sum by (model) ({engine.PY_KV_BLOCKS_USED}{{{_SEL}}}) / "
                         f"sum by (model) ({engine.PY_KV_BLOCKS_TOTAL}{{{_SEL}}})", "{{model}}"),
        ], (w, 3 * h, w, h), _thresholds(red_above=KV_NEAR_FULL)),
        _panel(12, "Preemptions and out-of-memory kills", "Per second: the engine's preemptions (vLLM recomputes "
               "them), the kills it counts itself, and the kills the sidecar saw in the engine's answers.", "ops", [
            _target("A", f"sum by (model) (rate({engine.VLLM_PREEMPTIONS[0]}{{{_SEL}}}[{_RATE}]))", "{{model}} preemptions"),
            _target("B", f"sum by (model) (rate({engine.PY_OOM_ERRORS}{{{_SEL}}}[{_RATE}]))",
                    "{{model}} killed (engine)"),
            _target("C", f'sum by (model) (rate({SIDECAR_FINISHED}{{{_SEL},outcome="{SIDECAR_OOM_OUTCOME}"}}[{_RATE}]))',
                    "{{model}} killed (sidecar)"),
        ], (2 * w, 3 * h, w, h), _thresholds(red_above=0.001)),
    ]
    templating = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "model", "label": "model", "type": "query", "datasource": _ds(),
         "query": {"query": f"label_values({t['success']}, model)", "refId": "model"},
         "definition": f"label_values({t['success']}, model)",
         "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
         "refresh": 2, "sort": 1, "hide": 0, "regex": "", "options": []},
    ]
    return {
        "uid": options.uid,
        "title": options.title,
        "description": "Generated by tritongen: GPU utilisation, TTFT, P99 latency, QPS, rejections and memory "
                       "headroom per model, from Triton's and the tritongen sidecar's metrics.",
        "tags": ["tritongen", "triton"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": templating},
        "panels": panels,
    }


def dashboard_uid(name: str) -> str:
    """A Grafana uid (1-40 of letters, digits, '-', '_') for a deployment name."""
    return ("tritongen-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name))[:40].rstrip("-")


def dashboard_json(options: DashboardOptions = DashboardOptions()) -> str:
    return json.dumps(build_dashboard(options), indent=2, sort_keys=True) + "\n"


def write_text_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename: a reader sees the old file or the new one, never half."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise TritongenError(f"cannot write {path}: {parent} is not a directory")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise TritongenError(f"cannot write {path}: {err}") from None
