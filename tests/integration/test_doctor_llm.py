"""doctor on LLMs it did not write: the stand-ins of examples/llm_standins under live load.

- `vllm_standin` (the vLLM backend's interface, paged KV with preemption, vLLM-named gauges and
  the backend's TTFT histogram): overloaded, doctor names the preemptions and the missed TTFT
  target with model.json's fields; lightly loaded, nothing.
- `reserve_llm` (reserves prompt + max_tokens, kills what does not fit, exports no metrics):
  alone, doctor says what it could not see instead of "no problems"; behind a sidecar whose
  policy overstates its pool, it names the kills the sidecar saw, and the fix.

Loads are Poisson through the model's own interface; each doctor window starts after a few
seconds of load, and the load lasts until doctor returns. The capacities (vllm_standin about
24 req/s of 64 + 48 tokens, reserve_llm 20 sequences of 48 + 48) leave wide margins: 40 req/s is
far past both, 6 req/s far under.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import REPO_ROOT, cli
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.errors import TritongenError
from tritongen.llm_targets import llm_target
from tritongen.loadgen import run_load
from tritongen.server import ServerOptions, TritonServer
from tritongen.sidecar_process import SidecarProcess

STANDINS = REPO_ROOT / "examples" / "llm_standins"
SPEC = STANDINS / "deployment.yaml"
WARM_S = 3.0
LONGEST_S = 120.0  # a schedule no doctor run outlasts; the load stops when the block ends
WINDOW_S = "5"


@pytest.fixture(scope="module")
def server() -> Iterator[TritonServer]:
    options = ServerOptions(repository=STANDINS / "repository", python_backends={"vllm": STANDINS / "backends" / "vllm"})
    with TritonServer(options) as running:
        yield running


@contextmanager
def load(server: TritonServer, rates: dict[str, float], via: SidecarProcess | None = None) -> Iterator[None]:
    """Poisson load on each model at its rate for the whole block (interactive 30%, batch 70%),
    stopped when the block ends: doctor's window is under load however long its start takes."""
    errors: list[TritongenError] = []
    stop = threading.Event()
    grpc_url = via.grpc_url if via is not None else server.grpc_url

    def drive(model: str, rate: float) -> None:
        config = httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10).json()
        prompt = 64 if model == "vllm_standin" else 48
        target = llm_target(model, config, bytes_per_token=4.0 if model == "vllm_standin" else 3.0, protocol="grpc",
                            class_parameter="traffic_class")
        classes = [{"name": "interactive", "share": 0.3, "priority": 1, "prompt_tokens": prompt, "output_tokens": 48},
                   {"name": "batch", "share": 0.7, "priority": 3, "prompt_tokens": prompt, "output_tokens": 48}]
        arrivals = generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=LONGEST_S,
                                                 warmup_s=0.0, classes=classes), seed=5)
        try:
            run_load(arrivals, {"interactive": target, "batch": target}, http_url=server.http_url, grpc_url=grpc_url,
                     request_timeout_s=30, drain_s=5.0, stop=stop)
        except TritongenError as err:  # a load that could not run: reported by the test below
            errors.append(err)

    threads = [threading.Thread(target=drive, args=item, daemon=True) for item in rates.items()]
    for thread in threads:
        thread.start()
    time.sleep(WARM_S)
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "the load did not stop with its block"
    assert not errors, errors


def doctor(server: TritonServer, *extra: str, spec: Path = SPEC, as_json: bool = True):
    return cli("doctor", str(spec), "--url", server.http_url, "--metrics-url", server.metrics_url, "--window", WINDOW_S,
               *(["--json"] if as_json else []), *extra)


def findings_of(result, model: str) -> dict[str, dict]:
    report = json.loads(result.stdout)
    return {f["code"]: f for f in report["findings"] if f["model"] == model}


def test_an_overloaded_vllm_engine_is_diagnosed_with_model_json_fixes(server: TritonServer) -> None:
    with load(server, {"vllm_standin": 40.0}):
        result = doctor(server)
    assert result.returncode == 1, result.stdout + result.stderr
    found = findings_of(result, "vllm_standin")
    assert {"DR109", "DR110"} <= set(found), found
    assert "max_num_seqs in vllm_standin/1/model.json" in found["DR109"]["fix"]
    assert "past its capacity" in found["DR110"]["message"]
    assert all("vllm_standin/1/model.json" in f["fix"] for f in found.values())
    engine = json.loads(result.stdout)["servers"][0]["models"]["vllm_standin"]["engine"]
    assert engine["family"] == "vLLM" and engine["waiting"]["mean"] >= 1


def test_a_light_vllm_engine_gets_none_and_an_engine_without_metrics_is_never_healthy(server: TritonServer) -> None:
    """vllm_standin at a quarter of its capacity: no finding. reserve_llm at twice its: the engine
    kills, nothing on the endpoint shows it, so doctor names it as unseen instead of healthy."""
    with load(server, {"vllm_standin": 6.0, "reserve_llm": 40.0}):
        result = doctor(server, as_json=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " DR1" not in result.stdout  # no finding for either
    assert "LLM engines (their own metrics" in result.stdout  # vllm_standin's engine was seen
    assert "no problems found" not in result.stdout.replace("no problems in what doctor could see", "")
    assert "could not see inside reserve_llm" in result.stdout
    assert "--sidecar-metrics-url" in result.stdout and "Traceback" not in result.stderr


@pytest.fixture()
def overstated_policy(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-ins' spec with reserve_llm's pool stated twice too large, rendered."""
    doc = yaml.safe_load(SPEC.read_text())
    (entry,) = [m for m in doc["models"] if m["name"] == "reserve_llm"]
    entry["engine"]["kv_pool_tokens"] = 2 * entry["engine"]["kv_pool_tokens"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    shutil.copy(STANDINS / "standin-arch.json", tmp_path / "standin-arch.json")
    rendered = cli("render", str(spec), "-o", str(tmp_path / "out"))
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    return spec, tmp_path / "out" / "sidecar_policy.json"


def test_kills_behind_a_sidecar_with_an_overstated_pool(server: TritonServer, overstated_policy, tmp_path: Path) -> None:
    spec, policy = overstated_policy
    with SidecarProcess(policy, server, tmp_path / "sidecar.log", grpc_upstream=server.grpc_url) as sidecar:
        with load(server, {"reserve_llm": 40.0}, via=sidecar):
            result = doctor(server, "--sidecar-metrics-url", sidecar.metrics_url, spec=spec)
    assert result.returncode == 1, result.stdout + result.stderr
    found = findings_of(result, "reserve_llm")
    assert "DR112" in found, found
    assert "overstates the pool" in found["DR112"]["fix"] and "engine.kv_pool_tokens" in found["DR112"]["fix"]
    report = json.loads(result.stdout)
    assert report["unseen"] == [] or all(u["model"] != "reserve_llm" for u in report["unseen"])
    assert report["servers"][0]["models"]["reserve_llm"]["sidecar"]["oom_kills"] >= 1
