"""The Grafana dashboard: a dashboard JSON model with the panels the issue names, on Triton's and the
sidecar's metric names, filtered per model, laid out without overlaps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from sidecar import admission_types as admission
from sidecar.metrics import SidecarMetrics
from tests.helpers import EXAMPLES, run_cli
from tritongen.dashboard import (
    GRID_WIDTH,
    SIDECAR_METRICS,
    TRITON_METRICS,
    DashboardOptions,
    build_dashboard,
    dashboard_uid,
)

REQUIRED_PANELS = {
    "GPU utilisation": ["nv_gpu_utilization"],
    "Time to first token (avg, P99)": ["sidecar_time_to_first_token_seconds_sum",
                                       "sidecar_time_to_first_token_seconds_count",
                                       "sidecar_time_to_first_token_seconds_bucket"],
    "P99 latency": ["nv_inference_request_summary_us", "sidecar_request_duration_seconds_bucket"],
    "QPS": ["nv_inference_request_success"],
    "Rejections": ["sidecar_requests_rejected_total", "nv_inference_request_failure"],
    "Memory headroom": ["sidecar_headroom_bytes", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"],
    # the LLM engines' own metrics: what doctor's DR108-DR112 read (tritongen.core.engine_metrics)
    "LLM engine: running / waiting": ["vllm:num_requests_running", "vllm:num_requests_waiting",
                                      "nv_trt_llm_request_metrics", "llm_engine_waiting_sequences"],
    "LLM engine: KV-cache usage": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                                   "nv_trt_llm_kv_cache_block_metrics", "llm_engine_kv_blocks_used"],
    "Preemptions and out-of-memory kills": ["vllm:num_preemptions_total", "llm_engine_oom_errors_total",
                                            'sidecar_requests_finished_total{model=~"$model",outcome="oom"}'],
}
PER_MODEL = {"Time to first token (avg, P99)", "P99 latency", "QPS", "Rejections", "LLM engine: running / waiting",
             "LLM engine: KV-cache usage", "Preemptions and out-of-memory kills"}


@pytest.fixture()
def model() -> dict:
    return build_dashboard(DashboardOptions(p99_target_ms=250, memory_pad_bytes=2 << 30))


def _exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def test_top_level_is_a_grafana_dashboard_model(model: dict) -> None:
    for key, kind in {"title": str, "uid": str, "panels": list, "templating": dict, "time": dict,
                      "schemaVersion": int, "tags": list, "annotations": dict}.items():
        assert isinstance(model[key], kind), key
    assert model["schemaVersion"] >= 36  # the timeseries panel and datasource variables
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", model["uid"])
    assert "id" not in model or model["id"] is None  # Grafana assigns ids on import
    json.loads(json.dumps(model))  # plain JSON, nothing Python-only


def test_the_panels_the_issue_names_with_their_metrics(model: dict) -> None:
    panels = {p["title"]: p for p in model["panels"]}
    for title, metrics in REQUIRED_PANELS.items():
        assert title in panels, f"missing panel {title!r}"
        joined = " ".join(_exprs(panels[title]))
        for metric in metrics:
            assert metric in joined, f"{title}: no {metric} in {joined}"
    for title in PER_MODEL:
        assert all('model=~"$model"' in e for e in _exprs(panels[title]) if "nv_gpu" not in e), title
        assert "{{model}}" in panels[title]["targets"][0]["legendFormat"]
    assert "histogram_quantile(0.99" in " ".join(_exprs(panels["Time to first token (avg, P99)"]))
    assert 'quantile="0.99"' in " ".join(_exprs(panels["P99 latency"]))
    assert panels["QPS"]["fieldConfig"]["defaults"]["unit"] == "reqps"
    assert panels["Memory headroom"]["fieldConfig"]["defaults"]["unit"] == "bytes"
    # Headroom is per scope (a GPU, the CPU, or a model's KV pool `pool:<model>`): the model filter picks pools.
    assert 'pool:($model)' in _exprs(panels["Memory headroom"])[0]


def test_panels_are_well_formed(model: dict) -> None:
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        assert panel["type"] == "timeseries"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
            assert "$__rate_interval" in expr or "rate(" not in expr


def test_grid_positions_fit_and_do_not_overlap(model: dict) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in model["panels"]:
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0
        assert g["x"] + g["w"] <= GRID_WIDTH, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_model_and_datasource_variables(model: dict) -> None:
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    var = variables["model"]
    assert var["type"] == "query" and var["multi"] and var["includeAll"]
    assert var["query"]["query"] == "label_values(nv_inference_request_success, model)"


def test_targets_and_thresholds_come_from_the_spec(model: dict) -> None:
    panels = {p["title"]: p for p in model["panels"]}
    steps = panels["P99 latency"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 0.25}
    headroom = panels["Memory headroom"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert headroom[-1] == {"color": "green", "value": 2 << 30}


def test_uids_are_valid_for_any_deployment_name() -> None:
    assert dashboard_uid("h100.node_A") == "tritongen-h100-node_A"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard_uid("x" * 100 + ".y"))


def test_metric_name_tables_are_valid_prometheus_names() -> None:
    for name in [*TRITON_METRICS.values(), *SIDECAR_METRICS.values()]:
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), name


def test_cli_writes_the_dashboard_atomically(tmp_path: Path) -> None:
    out = tmp_path / "dash.json"
    result = run_cli("dashboard", str(EXAMPLES / "deployment.yaml"), "-o", str(out),
                 "--sidecar-metric", "rejected=my_rejections_total")
    assert result.returncode == 0, result.stderr
    model = json.loads(out.read_text())
    assert model["title"] == "Triton fleet: cpu-demo" and model["uid"] == "tritongen-cpu-demo"
    rejections = next(p for p in model["panels"] if p["title"] == "Rejections")
    assert "my_rejections_total" in rejections["targets"][0]["expr"]
    assert not list(tmp_path.glob(".*.tmp"))
    bad = run_cli("dashboard", "-o", str(out), "--sidecar-metric", "nope=x")
    assert bad.returncode == 2 and "--sidecar-metric" in bad.stderr


# ------------------------------------------------------------------------------------------------
# The sidecar's names in the dashboard's PromQL against what the sidecar really exposes

REFUSAL_REASONS = (admission.EXCEEDS_BUDGET, admission.CLASS_NOT_SERVED, admission.TENANT_CLASS_NOT_ALLOWED,
                   admission.QUEUE_FULL, admission.QUEUE_WAIT, admission.QUEUE_TIMEOUT)
LABEL_VALUES = {"class": "interactive", "model": "tinyllm", "scope": "pool:tinyllm", "source": "static",
                "tenant": "default", "outcome": "ok", "protocol": "http", "device": "gpu0", "result": "ok",
                "digest": "abc", "deployment": "t"}
# Labels the scrape adds (Kubernetes service discovery), not the sidecar.
SCRAPE_LABELS = {"pod", "instance", "job", "namespace"}
SIDECAR_NAME = re.compile(r"\b(sidecar_[a-zA-Z0-9_:]*)")
SELECTOR = re.compile(r"\b(sidecar_[a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _sidecar_exposition() -> dict[str, set[str]]:
    """Every sample name the real SidecarMetrics exposes (fresh registry, each family exercised
    once per reason it can refuse with), with the label names its samples carry."""
    metrics = SidecarMetrics(CollectorRegistry())
    families = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(families) > 20, "SidecarMetrics no longer holds its metrics as attributes"
    for family in families:
        names = family._labelnames  # prometheus_client keeps a family's label names here
        reasons = REFUSAL_REASONS if "reason" in names else (None,)
        for reason in reasons:
            values = [reason if n == "reason" else LABEL_VALUES.get(n, "x") for n in names]
            child = family.labels(*values) if names else family
            if hasattr(child, "observe"):
                child.observe(0.01)
            elif hasattr(child, "set"):
                child.set(1)
            else:
                child.inc()
    unexposed = [f.name for f in metrics.registry.collect() if not f.samples]
    assert not unexposed, f"sidecar metric families not exercised: {unexposed}"
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def _dashboard_queries(model: dict) -> list[str]:
    queries = [t["expr"] for p in model["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in model["templating"]["list"] if v.get("definition")]
    return [re.sub(r'"(?:[^"\\]|\\.)*"', '""', q) for q in queries]  # label values are not names


def test_every_sidecar_metric_the_dashboard_queries_is_exposed_by_the_sidecar(model: dict) -> None:
    exposed = _sidecar_exposition()
    queries = _dashboard_queries(model)
    referenced = {name for q in queries for name in SIDECAR_NAME.findall(q)}
    # The table is what the queries are built from: each entry shows up (maybe with a suffix).
    for key, name in SIDECAR_METRICS.items():
        assert any(r == name or r.startswith(name + "_") for r in referenced), f"{key}: {name} in no query"
    missing = sorted(referenced - exposed.keys())
    assert not missing, (f"the dashboard queries {missing}, which the sidecar does not expose; it exposes "
                         f"{sorted(n for n in exposed if not n.endswith('_created'))}")


def test_labels_the_dashboard_filters_and_groups_sidecar_metrics_by_exist(model: dict) -> None:
    exposed = _sidecar_exposition()
    wrong = []
    for query in _dashboard_queries(model):
        names = set(SIDECAR_NAME.findall(query))
        if not names:
            continue
        for name, matchers in SELECTOR.findall(query):
            for label in MATCHER.findall(matchers):
                if label not in exposed.get(name, set()):
                    wrong.append(f"{name}{{{label}}} in {query}")
        if "nv_" in query:  # grouping over a mix of Triton's and the sidecar's series: not judged here
            continue
        for group in BY.findall(query):
            for label in {g.strip() for g in group.split(",") if g.strip()} - SCRAPE_LABELS:
                for name in names:
                    if label not in exposed.get(name, set()):
                        wrong.append(f"by ({label}) over {name} in {query}")
    assert not wrong, "\n".join(wrong)
