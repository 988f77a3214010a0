"""`tritongen doctor` on deliberately mis-configured live servers names the right problem.

Two real tritonservers, both serving copies of the example `ranker` (model_repository/ranker/1)
under three configs:
  slowq    max_queue_delay 400 ms, no preferred sizes, light load: every request waits for a batch
           that never fills -> DR101 (queueing over half the 250 ms budget; the window is too large)
  prio     priority_levels 2, 20 ms per execution, batch 4, 12 clients at level 1 keeping it busy and
           2 clients at level 2 that are never served -> DR106 (a priority level starves)
  healthy  short window, light load -> nothing
Server B is a replica of A whose `healthy` config differs (window and instance count) -> DR105.
Every server is stopped by the module fixture; the loads stop before the servers do.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import MODEL_REPOSITORY, cli
from tritongen.server import ServerOptions, TritonServer

pytestmark = pytest.mark.integration

RANKER_CODE = MODEL_REPOSITORY / "ranker" / "1"
WINDOW_S = "4"
BUDGET_MS = "250"

IO = """
input { name: "FEATURES" data_type: TYPE_FP32 dims: [ 32 ] }
output { name: "SCORES" data_type: TYPE_FP32 dims: [ 1 ] }
"""


def _params(overhead_ms: float, per_item_ms: float) -> str:
    return (
        f'parameters {{ key: "overhead_ms" value {{ string_value: "{overhead_ms}" }} }}\n'
        f'parameters {{ key: "per_item_ms" value {{ string_value: "{per_item_ms}" }} }}\n'
    )


CONFIGS = {
    "slowq": f"""name: "slowq"
backend: "python"
max_batch_size: 32
{IO}
instance_group {{ kind: KIND_CPU count: 1 }}
dynamic_batching {{ max_queue_delay_microseconds: 400000 }}
{_params(2.0, 0.1)}""",
    "prio": f"""name: "prio"
backend: "python"
max_batch_size: 4
{IO}
instance_group {{ kind: KIND_CPU count: 1 }}
dynamic_batching {{
  max_queue_delay_microseconds: 0
  priority_levels: 2
  default_priority_level: 2
}}
{_params(20.0, 0.0)}""",
    "healthy": f"""name: "healthy"
backend: "python"
max_batch_size: 8
{IO}
instance_group {{ kind: KIND_CPU count: 1 }}
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
{_params(2.0, 0.1)}""",
}
HEALTHY_ON_B = CONFIGS["healthy"].replace("max_queue_delay_microseconds: 1000", "max_queue_delay_microseconds: 3000").replace(
    "count: 1", "count: 2"
)


def _repository(root: Path, configs: dict[str, str]) -> Path:
    for name, text in configs.items():
        shutil.copytree(RANKER_CODE, root / name / "1", ignore=shutil.ignore_patterns("__pycache__"))
        (root / name / "config.pbtxt").write_text(text)
    return root


class Load:
    """Closed-loop clients: each sends its next request as soon as the previous one returns."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.done: dict[str, int] = {}
        self.lock = threading.Lock()

    def clients(self, url: str, model: str, count: int, priority: int = 0, pause_s: float = 0.0) -> None:
        body: dict = {"inputs": [{"name": "FEATURES", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]}
        if priority:
            body["parameters"] = {"priority": priority}
        key = f"{model}@{priority}"

        def run() -> None:
            with httpx.Client(timeout=60.0) as client:
                while not self.stop.is_set():
                    try:
                        client.post(f"http://{url}/v2/models/{model}/infer", json=body)
                    except httpx.HTTPError:
                        pass
                    with self.lock:
                        self.done[key] = self.done.get(key, 0) + 1
                    if pause_s:
                        self.stop.wait(pause_s)

        for _ in range(count):
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root_a = _repository(tmp_path_factory.mktemp("replica-a"), CONFIGS)
    root_b = _repository(tmp_path_factory.mktemp("replica-b"), {**CONFIGS, "healthy": HEALTHY_ON_B})
    extra = ["--metrics-config=summary_latencies=true"]
    a = TritonServer(ServerOptions(repository=root_a, extra_args=extra))
    b = TritonServer(ServerOptions(repository=root_b, extra_args=extra))
    load = Load()
    try:
        a.start()
        b.start()
        load.clients(a.http_url, "slowq", 3)
        load.clients(a.http_url, "prio", 12, priority=1)
        load.clients(a.http_url, "prio", 2, priority=2)
        load.clients(a.http_url, "healthy", 1, pause_s=0.05)
        time.sleep(2.0)  # the queues fill; the low-priority requests are stuck from here on
        yield {"a": a, "b": b, "load": load}
    finally:
        load.close()
        a.stop()
        b.stop()


def _doctor(*args: str):
    result = cli("doctor", *args, "--window", WINDOW_S, "--budget-ms", BUDGET_MS, "--json")
    assert result.stderr == "" or "error" not in result.stderr.lower(), result.stderr
    return result, json.loads(result.stdout)


def _codes(report: dict, model: str) -> set[str]:
    return {f["code"] for f in report["findings"] if f["model"] == model}


def test_doctor_names_each_problem_on_the_misconfigured_server(servers: dict) -> None:
    a = servers["a"]
    result, report = _doctor("--url", a.http_url, "--metrics-url", a.metrics_url)
    assert result.returncode == 1, result.stdout
    models = report["servers"][0]["models"]
    # The evidence is what the scenario built: a ~400 ms wait on slowq, a saturated prio.
    assert models["slowq"]["mean_queue_ms"] > 300, models["slowq"]
    assert models["prio"]["busy"] > 0.7 and models["prio"]["pending"] >= 2, models["prio"]
    assert _codes(report, "slowq") == {"DR101"}  # not overload (DR102), not starvation (DR106)
    slowq = next(f for f in report["findings"] if f["model"] == "slowq" and f["code"] == "DR101")
    assert slowq["field"] == "dynamic_batching.max_queue_delay_microseconds"  # the window, not overload
    assert "max_queue_delay_microseconds" in slowq["fix"]
    assert "DR106" in _codes(report, "prio")
    assert _codes(report, "healthy") == set(), [f for f in report["findings"] if f["model"] == "healthy"]
    # The low-priority clients really starved while level 1 was served.
    load = servers["load"]
    served_high = load.done.get("prio@1", 0) / 12  # per client
    served_low = load.done.get("prio@2", 0) / 2
    assert served_high > 10, load.done
    # A few low-priority requests slip into a batch with room while the queue first fills; after
    # that they wait. Starved means served at a small fraction of the rate level 1 gets.
    assert served_low < 0.1 * served_high, load.done


def test_doctor_text_output_names_problem_and_fix(servers: dict) -> None:
    a = servers["a"]
    result = cli("doctor", "--url", a.http_url, "--metrics-url", a.metrics_url, "--window", "2", "--budget-ms", BUDGET_MS)
    assert result.returncode == 1
    assert "DR101" in result.stdout and "slowq" in result.stdout
    assert "fix:" in result.stdout
    assert "Traceback" not in result.stderr


def test_doctor_finds_replicas_whose_configs_differ(servers: dict) -> None:
    a, b = servers["a"], servers["b"]
    result, report = _doctor("--url", a.http_url, "--metrics-url", a.metrics_url,
                             "--url", b.http_url, "--metrics-url", b.metrics_url)
    assert result.returncode == 1
    drift = [f for f in report["findings"] if f["code"] == "DR105"]
    assert [f["model"] for f in drift] == ["healthy"], drift
    assert "max_queue_delay_microseconds" in drift[0]["message"]
    assert "instance_group" in drift[0]["message"]
    assert "1000" in drift[0]["message"] and "3000" in drift[0]["message"]


def test_doctor_is_quiet_on_an_idle_consistent_replica(servers: dict) -> None:
    b = servers["b"]
    result = cli("doctor", "--url", b.http_url, "--metrics-url", b.metrics_url, "--window", "1")
    assert result.returncode == 0, result.stdout
    assert "no problems found" in result.stdout


def test_doctor_unreachable_server_is_a_clear_failure() -> None:
    result = cli("doctor", "--url", "127.0.0.1:1", "--window", "1")
    assert result.returncode == 1
    assert "cannot reach Triton's HTTP endpoint at http://127.0.0.1:1 (--url)" in result.stderr
    assert "Traceback" not in result.stderr
