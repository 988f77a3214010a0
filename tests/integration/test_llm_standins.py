"""The LLM path on models tritongen did not write its own engine for (examples/llm_standins):
`vllm_standin` speaks the vLLM backend's interface (a Python-based backend named "vllm", its
model.json, vLLM-named metrics, preemption by recompute); `reserve_llm` is a hand-written Python
backend with the generic interface that reserves prompt + max_tokens, kills what does not fit and
exports no metrics; `tokenid_llm` the same engine speaking token ids (ids in, ids out, a budget
tensor, an input_lengths it checks), profiled without a spec, simulated and served through the
sidecar. Each is profiled on the embedded server and its measured step costs are held
against its configured ones (1/standin.json, which tritongen never reads) with wide margins: the
tight figures are bench/bench_llm_fidelity.py's.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import httpx

from tests.helpers import REPO_ROOT, cli
from tritongen.core.simulator import OK
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.llm_targets import llm_target
from tritongen.loadgen import run_load
from tritongen.core.profile_types import read_profile
from tritongen.profiler.run import Endpoints, Profiler, TritonAdmin, default_settings, resolve_targets
from tritongen.server import ServerOptions, TritonServer

STANDINS = REPO_ROOT / "examples" / "llm_standins"
REPOSITORY = STANDINS / "repository"

ODD_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return None
'''
ODD_CONFIG = '''name: "odd_llm"
backend: "python"
max_batch_size: 0
input { name: "tokens" data_type: TYPE_INT32 dims: [ -1 ] }
output { name: "logits" data_type: TYPE_FP32 dims: [ -1 ] }
model_transaction_policy { decoupled: true }
instance_group { kind: KIND_CPU count: 1 }
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """The stand-ins, plus a decoupled model whose interface no LLM client knows."""
    root = tmp_path_factory.mktemp("standins") / "repo"
    shutil.copytree(REPOSITORY, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "odd_llm" / "1").mkdir(parents=True)
    (root / "odd_llm" / "1" / "model.py").write_text(ODD_MODEL)
    (root / "odd_llm" / "config.pbtxt").write_text(ODD_CONFIG)
    return root


@pytest.fixture(scope="module")
def server(repository: Path):
    options = ServerOptions(repository=repository, python_backends={"vllm": STANDINS / "backends" / "vllm"})
    with TritonServer(options) as running:
        yield running


def urls(server: TritonServer) -> tuple[str, ...]:
    return ("--url", server.http_url, "--grpc-url", server.grpc_url, "--metrics-url", server.metrics_url)


def configured(model: str) -> dict:
    return json.loads((REPOSITORY / model / "1" / "standin.json").read_text())


def assert_costs_near(engine, truth: dict, prompt: int, margin: float) -> None:
    """The costs a simulation uses, where traffic puts them: a prefill of a typical prompt and a
    decode step at 1 and 8 sequences."""
    def prefill(c, n):
        return c["prefill_fixed_ms"] + c["prefill_ms_per_token"] * n

    def step(c, n):
        return c["decode_fixed_ms"] + c["decode_ms_per_seq"] * n

    got = engine.model_dump()
    for what, measured, want in (
        (f"prefill of {prompt} tokens", prefill(got, prompt), prefill(truth, prompt)),
        ("decode step at 1 sequence", step(got, 1), step(truth, 1)),
        ("decode step at 8 sequences", step(got, 8), step(truth, 8)),
    ):
        assert abs(measured - want) <= margin * want, f"{what}: measured {measured:.2f} ms, configured {want:.2f} ms"


def test_the_vllm_standin_is_profiled_through_the_vllm_interface(server: TritonServer, tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    result = cli("profile", *urls(server), "--model", "vllm_standin", "--quick", "-o", str(out))
    assert result.returncode == 0, result.stderr
    profile = read_profile((out / "vllm_standin.json").read_text())
    engine = profile.engine
    assert engine is not None and engine.interface_kind == "vllm"
    assert "sampling_parameters" in engine.interface
    # the backend's own token counts: 4 bytes per token
    assert engine.bytes_per_token_source == "backend token counts" and abs(engine.bytes_per_token - 4.0) < 0.3
    # the pool from vLLM's usage gauge against the streams' blocks: 168 blocks x 16 tokens
    assert engine.kv_capacity_source == "vllm metrics"
    assert abs(engine.kv_capacity_tokens - 168 * 16) <= 0.3 * 168 * 16
    assert {"vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"} <= set(engine.engine_metrics)
    assert_costs_near(engine, configured("vllm_standin"), 64, margin=0.5)
    # every request carried stream=true: tokens arrived one by one, a few ms apart
    assert all(d.mean_gap_ms > 1.0 for d in engine.decode)

    # simulate its own config: the engine comes from model.json and the profile
    sim = cli("simulate", "--profile", str(out / "vllm_standin.json"), "--config", str(REPOSITORY / "vllm_standin" / "config.pbtxt"),
              "--traffic", str(REPO_ROOT / "examples" / "traffic" / "poisson.yaml"), "--requests", "400", "--json")
    assert sim.returncode == 0, sim.stderr
    result_doc = json.loads(sim.stdout)["vllm_standin"]
    assert result_doc["throughput_per_s"] > 0


def test_the_hand_written_backend_is_profiled_with_the_capacity_probe(server: TritonServer, tmp_path: Path) -> None:
    endpoints = Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    admin = TritonAdmin(endpoints)
    try:
        # what the spec would say: its tokenizer takes 3 bytes per token
        targets = [replace(t, bytes_per_token=3.0, prompt_tokens=48, output_tokens=48)
                   for t in resolve_targets(admin, ["reserve_llm"], None)]
        profiler = Profiler(admin, endpoints, default_settings(quick=True), tmp_path, kv_capacity_probe=True)
        engine = profiler.run(targets)[0].engine
    finally:
        admin.close()
    assert engine is not None and engine.interface_kind == "generic" and "stream" in engine.interface
    assert engine.engine_metrics == []  # it exports none
    assert engine.kv_capacity_source == "capacity probe"
    # 1920 tokens hold 20 requests of 48 + 48: doubling stops between 16 and 32, bisection near 20
    assert 18 * 96 <= engine.kv_capacity_tokens <= 1920
    assert_costs_near(engine, configured("reserve_llm"), 48, margin=0.5)


@pytest.mark.parametrize("model", ["vllm_standin", "reserve_llm", "tokenid_llm"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_load_generator_streams_each_interface_over_grpc_and_sse(server: TritonServer, model: str, protocol: str) -> None:
    """Every request asks for 6 tokens in the model's own interface and gets them one response
    each, over gRPC streams and over HTTP generate_stream (server-sent events)."""
    config = httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10).json()
    target = llm_target(model, config, bytes_per_token=3.0, protocol=protocol)
    spec = TrafficSpec(shape="poisson", rate_per_s=20.0, duration_s=1.0, warmup_s=0.0,
                       classes=[{"name": "all", "share": 1.0, "priority": 1, "prompt_tokens": 24, "output_tokens": 6}])
    arrivals = generate_arrivals(spec, seed=3)
    result = run_load(arrivals, {"all": target}, http_url=server.http_url, grpc_url=server.grpc_url, request_timeout_s=20)
    assert (result.status == OK).all(), result.errors
    assert (result.tokens == 6).all()
    assert (result.first_t < result.done_t).all()


def test_a_token_id_llm_is_profiled_without_a_spec_simulated_and_served_through_the_sidecar(
        server: TritonServer, tmp_path: Path) -> None:
    """The way a user starts: `profile --model M --url ...` with no spec, then `render --profiles`
    (the policy alone), `simulate` on the profile, and a request of ids through the sidecar, its
    generated ids counted exactly."""
    from tritongen.sidecar_process import SidecarProcess

    out = tmp_path / "profiles"
    result = cli("profile", *urls(server), "--model", "tokenid_llm", "--quick", "--kv-capacity-probe", "-o", str(out),
                 timeout_s=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    profile = read_profile((out / "tokenid_llm.json").read_text())
    engine = profile.engine
    assert engine is not None and engine.interface_kind == "token_ids" and "token_ids" in engine.interface
    assert engine.bytes_per_token_source == "token ids" and engine.bytes_per_token == 1.0
    assert not any(g.measurement == "token counts" for g in profile.gaps)  # nothing assumed about tokens
    assert_costs_near(engine, configured("tokenid_llm"), 48, margin=0.5)
    # its pool of 2048 tokens, found by the probe from requests whose tokens were sent and counted as ids
    assert engine.kv_capacity_source == "capacity probe" and 1024 <= engine.kv_capacity_tokens <= 2048

    sim = cli("simulate", "--profile", str(out / "tokenid_llm.json"), "--config", str(REPOSITORY / "tokenid_llm" / "config.pbtxt"),
              "--traffic", str(REPO_ROOT / "examples" / "traffic" / "poisson.yaml"), "--requests", "400", "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["tokenid_llm"]["throughput_per_s"] > 0

    rendered = tmp_path / "policy"
    done = cli("render", "--profiles", str(out), "-o", str(rendered))
    assert done.returncode == 0, done.stdout + done.stderr
    kv = next(m for m in json.loads((rendered / "sidecar_policy.json").read_text())["models"] if m["name"] == "tokenid_llm")["kv"]
    assert (kv["prompt_input"], kv["max_tokens_input"], kv["prompt_token_ids"]) == ("token_ids", "request_output_len", True)

    body = {"token_ids": list(range(120, 160)), "input_lengths": 40, "request_output_len": 5, "streaming": True}
    with SidecarProcess(rendered / "sidecar_policy.json", server, tmp_path / "sidecar.log") as sidecar:
        response = httpx.post(f"http://{sidecar.http_url}/v2/models/tokenid_llm/generate_stream", json=body, timeout=30)
        metrics = httpx.get(sidecar.metrics_url, timeout=10).text
    assert response.status_code == 200, response.text
    events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    assert sum(len(e["output_ids"]) if isinstance(e["output_ids"], list) else 1 for e in events) == 5, events
    # the sidecar read the prompt as its 40 ids, exactly
    assert 'sidecar_prompt_tokens_sum{model="tokenid_llm"} 40.0' in metrics, metrics[-2000:]


def test_an_unknown_interface_is_one_clear_error(server: TritonServer, tmp_path: Path) -> None:
    result = cli("profile", *urls(server), "--model", "odd_llm", "--quick", "-o", str(tmp_path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "odd_llm" in result.stderr and "tokens" in result.stderr and "text_input" in result.stderr


def test_engine_values_that_contradict_model_json_are_refused(tmp_path: Path) -> None:
    profile = REPO_ROOT / "examples" / "profiles" / "vllm_standin.json"
    result = cli("simulate", "--profile", str(profile), "--config", str(REPOSITORY / "vllm_standin" / "config.pbtxt"),
                 "--traffic", str(REPO_ROOT / "examples" / "traffic" / "poisson.yaml"), "--engine", "max_num_seqs=64")
    assert result.returncode == 2
    assert "max_num_seqs is 32 in model.json but 64 in --engine" in result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------------
# the sidecar in front of a hand-written engine that reserves, and kills what does not fit


def _burst_at_once(url: str, requests: int, prompt: str, max_tokens: int, klass: str) -> list[dict]:
    """`requests` SSE streams sent at the same moment; each: status, error text, tokens, seconds."""
    import asyncio
    import time

    import aiohttp

    async def one(session: aiohttp.ClientSession) -> dict:
        out = {"status": None, "error": None, "tokens": 0, "seconds": None}
        body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True}
        t0 = time.perf_counter()
        async with session.post(url, json=body, headers={"x-traffic-class": klass}) as resp:
            out["status"] = resp.status
            if resp.status != 200:  # refused before streaming: Triton's or the sidecar's error body
                out["error"] = await resp.text()
                out["seconds"] = time.perf_counter() - t0
                return out
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if "error" in event:
                        out["error"] = event["error"]
                        break
                    out["tokens"] += 1
        out["seconds"] = time.perf_counter() - t0
        return out

    async def main() -> list[dict]:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            return await asyncio.gather(*(one(session) for _ in range(requests)))

    return asyncio.run(main())


def test_a_burst_of_100_at_once_is_served_through_the_sidecar_without_kills(server: TritonServer, tmp_path: Path) -> None:
    """reserve_llm's pool holds 20 sequences of 48 + 48 tokens; 100 at once directly: most are killed
    with an out-of-memory error. Through the sidecar, with the policy `render` writes from a spec
    that describes the model honestly: at least 95 served within the batch class's target, none
    killed (the rest may be refused with 429, never killed)."""
    from tritongen.sidecar_process import SidecarProcess

    out = tmp_path / "rendered"
    rendered = cli("render", str(STANDINS / "deployment.yaml"), "-o", str(out))
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    policy = json.loads((out / "sidecar_policy.json").read_text())
    batch_target_s = next(c["p99_ms"] for c in policy["classes"] if c["name"] == "batch") / 1000
    prompt = "x" * (48 * 3)  # 48 tokens at the stand-in's 3 bytes per token

    direct = _burst_at_once(f"http://{server.http_url}/v2/models/reserve_llm/generate_stream", 100, prompt, 48, "batch")
    direct_killed = [r for r in direct if r["error"] and "out of memory" in r["error"]]
    assert len(direct_killed) >= 50, f"the burst must overflow the pool directly: {len(direct_killed)} killed"

    with SidecarProcess(out / "sidecar_policy.json", server, tmp_path / "sidecar.log") as sidecar:
        through = _burst_at_once(f"http://{sidecar.http_url}/v2/models/reserve_llm/generate_stream", 100, prompt, 48,
                                 "batch")
    killed = [r for r in through if r["error"] and "out of memory" in r["error"]]
    served = [r for r in through if r["status"] == 200 and r["error"] is None and r["tokens"] == 48]
    in_time = [r for r in served if r["seconds"] <= batch_target_s]
    others = [r for r in through if r not in served and r["status"] != 429]
    assert killed == [] and others == [], (killed + others)[:3]
    assert len(in_time) >= 95, f"{len(in_time)} of 100 served within {batch_target_s:.0f} s ({len(served)} served)"
