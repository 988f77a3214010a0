"""The two example models (`ranker`, `tinyllm`) on a real tritonserver.

One server for the module, over a temp repository: the model code is copied from
model_repository/<m>/1/ and each config.pbtxt is written here with every parameter spelled out,
the way `tritongen render` writes them. The expected outputs come from the models' own pure
modules (ranker_net, tinyllm_engine) run in-process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RANKER_DIR = ROOT / "model_repository" / "ranker" / "1"
TINYLLM_DIR = ROOT / "model_repository" / "tinyllm" / "1"


def _load_beside_model(name: str, directory: Path):
    """Import a model's pure module by path (no sys.path entry: model.py must stay unimportable)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ranker_net = _load_beside_model("ranker_net", RANKER_DIR)
tinyllm_engine = _load_beside_model("tinyllm_engine", TINYLLM_DIR)

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from tritongen.server import ServerOptions, TritonServer  # noqa: E402

RANKER_PARAMS = {"seed": "7", "overhead_ms": "4.0", "per_item_ms": "0.25"}
TINYLLM_PARAMS = {
    "num_layers": "2",
    "hidden_size": "64",
    "num_heads": "4",
    "num_kv_heads": "2",
    "vocab_size": "256",
    "max_context": "256",
    "seed": "11",
    "kv_block_tokens": "16",
    "kv_pool_blocks": "64",
    "max_num_seqs": "8",
    "default_max_tokens": "16",
}
SMALL_POOL_PARAMS = {**TINYLLM_PARAMS, "kv_pool_blocks": "4", "kv_block_tokens": "16"}


def _parameters(params: dict[str, str]) -> str:
    return "\n".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )


def ranker_config(name: str, max_batch_size: int, params: dict[str, str]) -> str:
    if max_batch_size > 0:
        dims_in, dims_out = "[ 32 ]", "[ 1 ]"
        batching = "dynamic_batching { max_queue_delay_microseconds: 2000 }"
    else:
        dims_in, dims_out, batching = "[ -1, 32 ]", "[ -1, 1 ]", ""
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "FEATURES" data_type: TYPE_FP32 dims: {dims_in} }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: {dims_out} }} ]
{batching}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{_parameters(params)}
"""


def tinyllm_config(name: str, max_batch_size: int, instances: int, params: dict[str, str]) -> str:
    batching = "dynamic_batching { }" if max_batch_size > 0 else ""
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
{batching}
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
{_parameters(params)}
"""


MODELS = {
    # name: (source dir, config text)
    "ranker": (RANKER_DIR, ranker_config("ranker", 64, RANKER_PARAMS)),
    "ranker_nobatch": (RANKER_DIR, ranker_config("ranker_nobatch", 0, RANKER_PARAMS)),
    "tinyllm": (TINYLLM_DIR, tinyllm_config("tinyllm", 0, 1, TINYLLM_PARAMS)),
    # batched shapes ([1, 1] per request), two instances, a pool of 4 blocks x 16 tokens
    "tinyllm_small": (TINYLLM_DIR, tinyllm_config("tinyllm_small", 8, 2, SMALL_POOL_PARAMS)),
}


def build_repository(root: Path) -> Path:
    for name, (source, config) in MODELS.items():
        version = root / name / "1"
        version.mkdir(parents=True)
        for py in source.glob("*.py"):
            shutil.copy(py, version / py.name)
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("example_repo"))
    srv = TritonServer(ServerOptions(repository=repo))
    with srv:
        yield srv
    pgid = srv.process.pid if srv.process is not None else None
    if pgid is not None:  # the server and its Python stubs are gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


class StreamSession:
    """One gRPC client with one open stream: send() a request, later collect() its responses."""

    def __init__(self, url: str) -> None:
        self.responses: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def send(self, model: str, prompt: str, max_tokens: int | None, batched: bool = False) -> None:
        shape = [1, 1] if batched else [1]
        text = grpcclient.InferInput("text_input", shape, "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_).reshape(shape))
        inputs = [text]
        if max_tokens is not None:
            mt = grpcclient.InferInput("max_tokens", shape, "INT32")
            mt.set_data_from_numpy(np.array([max_tokens], dtype=np.int32).reshape(shape))
            inputs.append(mt)
        self.client.async_stream_infer(model, inputs, request_id="r1", enable_empty_final_response=True)

    def collect(self, timeout_s: float = 30.0) -> tuple[list[str], str | None]:
        """(text pieces, error message or None) once the final response or an error arrived."""
        pieces: list[str] = []
        while True:
            result, error = self.responses.get(timeout=timeout_s)
            if error is not None:
                return pieces, str(error)
            out = result.as_numpy("text_output")
            if out is not None:
                pieces.append(out.reshape(-1)[0].decode("utf-8"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return pieces, None

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def stream_generate(url: str, model: str, prompt: str, max_tokens: int | None, batched: bool = False):
    """One request over its own gRPC stream: (pieces, error message or None)."""
    session = StreamSession(url)
    try:
        session.send(model, prompt, max_tokens, batched)
        return session.collect()
    finally:
        session.close()


def metric_samples(metrics_url: str, name: str, client: httpx.Client | None = None):
    """[(labels, value)] of one metric family on the server's Prometheus endpoint."""
    text = (client.get(metrics_url) if client is not None else httpx.get(metrics_url, timeout=5)).text
    samples = []
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})?\s+(\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            samples.append((labels, float(m.group(2))))
    return samples


def wait_for_metric(metrics_url: str, name: str, model: str, predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        values = [v for labels, v in metric_samples(metrics_url, name) if labels.get("model") == model]
        if values and predicate(values):
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} for {model}: {values} did not satisfy the condition")
        time.sleep(0.1)


def model_stats(http_url: str, model: str) -> dict:
    body = httpx.get(f"http://{http_url}/v2/models/{model}/stats", timeout=5).json()
    return body["model_stats"][0]


# --------------------------------------------------------------------------------------------
# ranker
# --------------------------------------------------------------------------------------------


def test_ranker_scores_match_numpy_net(server):
    x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    expected = ranker_net.RankerNet.from_seed(7).scores(x)
    with httpclient.InferenceServerClient(server.http_url) as client:
        inp = httpclient.InferInput("FEATURES", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("ranker", [inp]).as_numpy("SCORES")
        assert got.shape == (16, 1)
        assert np.allclose(got, expected, atol=1e-6)
        # max_batch_size 0 with dims [-1, 32]: same network, the leading dim is the model's own
        inp = httpclient.InferInput("FEATURES", [5, 32], "FP32")
        inp.set_data_from_numpy(x[:5])
        got = client.infer("ranker_nobatch", [inp]).as_numpy("SCORES")
        assert got.shape == (5, 1)
        assert np.allclose(got, expected[:5], atol=1e-6)


def _compute_by_batch(stats: dict) -> dict[int, tuple[int, int]]:
    return {
        int(b["batch_size"]): (int(b["compute_infer"]["count"]), int(b["compute_infer"]["ns"]))
        for b in stats["batch_stats"]
    }


def test_ranker_compute_time_grows_with_rows(server):
    rng = np.random.default_rng(1)

    def infer(client, rows: int) -> None:
        inp = httpclient.InferInput("FEATURES", [rows, 32], "FP32")
        inp.set_data_from_numpy(rng.standard_normal((rows, 32)).astype(np.float32))
        client.infer("ranker", [inp])

    with httpclient.InferenceServerClient(server.http_url) as client:
        infer(client, 3)  # warm-up: the first execute of an instance is slower
        before = _compute_by_batch(model_stats(server.http_url, "ranker"))
        for rows in (1, 64, 1, 64):
            infer(client, rows)
    after = _compute_by_batch(model_stats(server.http_url, "ranker"))
    mean_ns = {}
    for size in (1, 64):
        count0, ns0 = before.get(size, (0, 0))
        count1, ns1 = after[size]
        assert count1 - count0 == 2
        mean_ns[size] = (ns1 - ns0) / (count1 - count0)
    # by design 4.25 ms vs 20 ms; only a wide margin is asserted
    assert mean_ns[64] > 1.5 * mean_ns[1], mean_ns
    assert mean_ns[1] >= 4.0e6, mean_ns  # the fixed overhead is never skipped


def test_ranker_dynamic_batching_merges_concurrent_requests(server):
    before = model_stats(server.http_url, "ranker")
    x = np.random.default_rng(2).standard_normal((1, 32)).astype(np.float32)
    done: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("FEATURES", [1, 32], "FP32")
        inp.set_data_from_numpy(x)
        for _ in range(16):
            client.async_infer("ranker", [inp], callback=lambda result, error: done.put((result, error)))
        answers = [done.get(timeout=30) for _ in range(16)]
    finally:
        client.close()
    assert [error for _, error in answers] == [None] * 16
    expected = ranker_net.RankerNet.from_seed(7).scores(x)
    assert all(np.allclose(result.as_numpy("SCORES"), expected, atol=1e-6) for result, _ in answers)
    after = model_stats(server.http_url, "ranker")
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 16
    assert executions < 16


# --------------------------------------------------------------------------------------------
# tinyllm
# --------------------------------------------------------------------------------------------

CFG = tinyllm_engine.EngineConfig.from_parameters(TINYLLM_PARAMS)
SMALL_CFG = tinyllm_engine.EngineConfig.from_parameters(SMALL_POOL_PARAMS)
PROMPTS = [
    f"Request {i}: about {topic}"
    for i, topic in enumerate(["Triton", "paged KV", "batching", "numpy", "GPUs", "latency", "streams", "tokens"])
]


@pytest.fixture(scope="module")
def net():
    return tinyllm_engine.TinyLLM(CFG)


def test_tinyllm_grpc_stream_matches_in_process_engine(server, net):
    prompt = "Hello, Triton!"
    expected = tinyllm_engine.generate_text(CFG, prompt, 12, model=net)
    pieces, error = stream_generate(server.grpc_url, "tinyllm", prompt, 12)
    assert error is None
    assert len(pieces) == 12  # one response per token
    assert "".join(pieces) == expected
    # max_tokens omitted: the default_max_tokens parameter (16) applies
    pieces, error = stream_generate(server.grpc_url, "tinyllm", prompt, None)
    assert error is None
    assert "".join(pieces) == tinyllm_engine.generate_text(CFG, prompt, 16, model=net)


def test_tinyllm_batched_config_and_second_instance(server, net):
    """max_batch_size 8: tensors [1, 1] per request; two instances, each its own engine."""
    expected = tinyllm_engine.generate_text(SMALL_CFG, "abc", 10, model=net)
    for _ in range(3):
        pieces, error = stream_generate(server.grpc_url, "tinyllm_small", "abc", 10, batched=True)
        assert error is None
        assert "".join(pieces) == expected


def test_tinyllm_http_generate_stream(server, net):
    prompt = "Stream me"
    expected = tinyllm_engine.generate_text(CFG, prompt, 8, model=net)
    for model in ("tinyllm", "tinyllm_small"):
        events = []
        with httpx.Client(timeout=30) as client:
            with client.stream(
                "POST",
                f"http://{server.http_url}/v2/models/{model}/generate_stream",
                json={"text_input": prompt, "max_tokens": 8},
            ) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[len("data:"):]))
        assert all("error" not in e for e in events), events
        assert "".join(e.get("text_output", "") for e in events) == expected


def test_tinyllm_concurrent_streams_equal_sequential(server, net):
    """Eight streams at once share one engine's running batch and give the sequential texts."""
    tokens = 100  # prompts <= 28 bytes: 8 blocks of 16 each, the 8 sequences fill the 64-block pool
    assert all(len(p) <= 28 for p in PROMPTS)
    expected = [tinyllm_engine.generate_text(CFG, p, tokens, model=net) for p in PROMPTS]
    sequential = [stream_generate(server.grpc_url, "tinyllm", p, tokens) for p in PROMPTS[:2]]
    assert ["".join(s[0]) for s in sequential] == expected[:2]

    def counters() -> tuple[float, float]:
        return tuple(  # type: ignore[return-value]
            sum(v for labels, v in metric_samples(server.metrics_url, name) if labels.get("model") == "tinyllm")
            for name in ("llm_engine_generated_tokens_total", "llm_engine_decode_steps_total")
        )

    sessions = [StreamSession(server.grpc_url) for _ in PROMPTS]  # connect first, then send together
    tokens0, steps0 = counters()
    try:
        for session, prompt in zip(sessions, PROMPTS):
            session.send("tinyllm", prompt, tokens)
        results = [session.collect() for session in sessions]
    finally:
        for session in sessions:
            session.close()
    assert [r[1] for r in results] == [None] * len(PROMPTS)
    assert [len(r[0]) for r in results] == [tokens] * len(PROMPTS)
    assert ["".join(r[0]) for r in results] == expected
    deadline = time.monotonic() + 5
    while (counters()[0] - tokens0) < tokens * len(PROMPTS) and time.monotonic() < deadline:
        time.sleep(0.05)
    generated, steps = (now - before for now, before in zip(counters(), (tokens0, steps0)))
    assert generated == tokens * len(PROMPTS)
    # one after another the 8 streams need 8 x 99 decode steps; decoding together, about 99
    assert steps <= generated / 2, f"{steps} decode steps for {generated} tokens: no shared batch"


def test_tinyllm_rejects_request_over_max_context(server):
    pieces, error = stream_generate(server.grpc_url, "tinyllm", "x" * 250, 10)
    assert pieces == []
    assert error is not None and "exceeds max_context" in error
    assert "out of memory" not in error


def test_tinyllm_small_pool_out_of_memory_then_recovers(server, net):
    url = server.grpc_url
    # admission: 100 prompt tokens need 7 blocks of 16, the pool has 4
    pieces, error = stream_generate(url, "tinyllm_small", "p" * 100, 4, batched=True)
    assert pieces == []
    assert error is not None and "out of memory" in error, error
    assert "needed 7 blocks, 4 free of 4" in error
    # during decode: 40 + 60 tokens outgrow 4 blocks (64 tokens) after 25 streamed tokens
    pieces, error = stream_generate(url, "tinyllm_small", "q" * 40, 60, batched=True)
    assert error is not None and "out of memory" in error, error
    assert len(pieces) == 25  # 1 from prefill + decode at positions 40..63
    # the failed requests gave their blocks back: small requests still run (on either instance)
    expected = tinyllm_engine.generate_text(SMALL_CFG, "ok", 6, model=net)
    for _ in range(4):
        pieces, error = stream_generate(url, "tinyllm_small", "ok", 6, batched=True)
        assert error is None
        assert "".join(pieces) == expected
    wait_for_metric(server.metrics_url, "llm_engine_kv_blocks_used", "tinyllm_small", lambda v: sum(v) == 0)
    wait_for_metric(server.metrics_url, "llm_engine_oom_errors_total", "tinyllm_small", lambda v: sum(v) >= 2)


def test_tinyllm_custom_metrics_on_metrics_endpoint(server):
    stream_generate(server.grpc_url, "tinyllm", "count me", 5)
    url = server.metrics_url
    assert wait_for_metric(url, "llm_engine_kv_bytes_per_token", "tinyllm", lambda v: v == [512.0])
    assert wait_for_metric(url, "llm_engine_kv_block_tokens", "tinyllm", lambda v: v == [16.0])
    assert wait_for_metric(url, "llm_engine_kv_blocks_total", "tinyllm", lambda v: v == [64.0])
    assert wait_for_metric(url, "llm_engine_kv_blocks_total", "tinyllm_small", lambda v: v == [4.0, 4.0])
    wait_for_metric(url, "llm_engine_generated_tokens_total", "tinyllm", lambda v: v[0] >= 5)
    wait_for_metric(url, "llm_engine_decode_steps_total", "tinyllm", lambda v: v[0] >= 4)
    for name in ("llm_engine_kv_blocks_used", "llm_engine_running_sequences", "llm_engine_waiting_sequences"):
        wait_for_metric(url, name, "tinyllm", lambda v: v == [0.0])
    wait_for_metric(url, "llm_engine_oom_errors_total", "tinyllm", lambda v: len(v) == 1)
