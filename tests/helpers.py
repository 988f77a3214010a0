"""What several test modules share: paths, the CLI runners, fakes and fixture builders.

Test modules import shared things from here, from tests/sidecar_rigs.py (what only the sidecar's
tests read) or from the bench rig bench/rig/fidelity.py, never from one another or from
conftest.py; tests/unit/test_suite_hygiene.py holds the suite to that.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tritongen.core.simulator import Overheads, ServiceCurve
from tritongen.core.traffic import TrafficSpec, generate_arrivals
from tritongen.core.tune import TuneInputs

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
EXAMPLE_PROFILES = EXAMPLES / "profiles"
ARCHITECTURES = EXAMPLES / "architectures"  # Hugging Face config.json files of known models


HYBRID_SPEC = """\
version: 1
name: hybrid-node
hardware:
  gpus:
    - {{name: H100-SXM-80GB, memory_mb: 81559, count: 1}}
models:
  - name: nemotron-h-8b
    backend: vllm
    kind: llm
    streaming: true
    hf_model: nvidia/Nemotron-H-8B-Base-8K
    architecture_config: {config}
    weights: {{bytes: 16000000000}}
    max_context: 8192
    memory_quota_mb: 40000
    inputs:
      - {{name: text_input, data_type: STRING, dims: [1]}}
      - {{name: stream, data_type: BOOL, dims: [1], optional: true}}
      - {{name: sampling_parameters, data_type: STRING, dims: [1], optional: true}}
    outputs:
      - {{name: text_output, data_type: STRING, dims: [-1]}}
traffic_classes:
  - {{name: interactive, kind: interactive, priority: 1, p99_ms: 1500, share: 1.0}}
policy: {{max_batch: 1024}}
"""


def write_hybrid_spec(folder: Path) -> Path:
    """A one-GPU spec serving Nemotron-H 8B (4 attention, 24 Mamba2, 24 MLP layers) on vLLM at 8192
    tokens in a 40000 MiB quota: 22721814528 B of KV budget (see test_render's hybrid test)."""
    path = folder / "hybrid.yaml"
    path.write_text(HYBRID_SPEC.format(config=ARCHITECTURES / "nemotron-h-8b-base-8k.json"))
    return path


def example_render():
    """What `tritongen render examples/deployment.yaml --profiles examples/profiles` renders."""
    from tritongen.profiles import measured_pads_mb, read_profiles
    from tritongen.render import render_repository
    from tritongen.specio import load_spec

    profiles = read_profiles(EXAMPLE_PROFILES)
    return render_repository(
        load_spec(EXAMPLES / "deployment.yaml"), measured_pads_mb=measured_pads_mb(profiles), profiles=profiles
    )


def cli(*args: str, cwd: Path | None = None, timeout_s: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess: exit codes and stderr as users see them
    (`env` adds to this process's environment). For integration tests; unit tests start no process
    and use `run_cli` (test_suite_hygiene)."""
    return subprocess.run(
        [sys.executable, "-c", "from tritongen.cli.main import run; run()", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO_ROOT,
        timeout=timeout_s,
        env={**os.environ, **env} if env else None,
    )


@dataclass(frozen=True)
class CliResult:
    """What `run_cli` returns, named as `cli`'s CompletedProcess names it, so a test reads either."""

    returncode: int
    stdout: str
    stderr: str


def _exit_status(code: object, stderr: TextIO) -> int:
    """The status the interpreter makes of `sys.exit(code)`: None is 0, an int is taken modulo 256
    as the OS takes it, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=stderr)
    return 1


class _ProcessState:
    """What a command may change in the process that a subprocess would have taken away with it:
    cwd, argv, stdin, the environment, the root logger (`sidecar` calls logging.basicConfig) and
    the SIGINT/SIGTERM handlers (`serve` installs one)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        root = logging.getLogger()
        self.cwd, self.argv, self.stdin = os.getcwd(), sys.argv, sys.stdin
        self.environ = dict(os.environ)
        self.handlers, self.level = list(root.handlers), root.level
        self.signals = {sig: signal.getsignal(sig) for sig in self.SIGNALS}

    def restore(self) -> None:
        root = logging.getLogger()
        for handler in root.handlers:
            if handler not in self.handlers:
                handler.close()
        root.handlers[:], root.level = self.handlers, self.level
        for sig, handler in self.signals.items():
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.argv, sys.stdin = self.argv, self.stdin


def run_cli(*args: str, cwd: Path | None = None) -> CliResult:
    """The console entry point run in this process, as `cli` runs it in a subprocess: the same exit
    code (usage errors 2) and the same text on stdout and stderr, in a fraction of the time.

    Like a fresh process, the command starts with no log handlers (Python's last-resort handler
    prints warnings to stderr), an empty stdin and the given cwd (REPO_ROOT by default); what it
    changes there is put back afterwards. An exception `run` lets through (it catches every
    Exception) propagates here rather than becoming a traceback and exit 1: the test fails either
    way, and this way with its cause. Anything only a real process shows (signals, a process
    that outlives its parent) belongs to tests/integration with `cli`."""
    from tritongen.cli.main import run

    stdout, stderr = io.StringIO(), io.StringIO()
    state = _ProcessState()
    code = 0
    try:
        os.chdir(cwd or REPO_ROOT)
        sys.argv, sys.stdin = ["tritongen", *args], io.StringIO()
        logging.getLogger().handlers[:] = []
        logging.getLogger().setLevel(logging.WARNING)
        with redirect_stdout(stdout), redirect_stderr(stderr):
            try:
                run()
            except SystemExit as exit_:
                code = _exit_status(exit_.code, stderr)
    finally:
        state.restore()
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


# ------------------------------------------------------------------------------------------------
# Profiles (tritongen/core/profile_types.py `Profile`) of the example models, as `tritongen profile`
# writes them: `load_levels` for the classic ranker, `streaming.levels` for the streaming tinyllm.

PROFILE_SETTINGS = {
    "quick": True, "concurrency_levels": [1, 4, 16, 64, 128], "stream_concurrency_levels": [1, 4, 8],
    "warmup_s": 1.0, "window_s": 2.0, "min_windows": 2, "max_windows": 4, "agreement": 0.1,
    "pad_margin": 1.25, "kv_probe_mb": 0.0, "seed": 0,
}


def profile_header(model: str, kind: str, max_batch_size: int) -> dict:
    return {
        "schema_version": 1, "model": model, "kind": kind, "spec_model": model, "server_version": "2.51.0",
        "server_url": "127.0.0.1:8000", "created_at": "2025-01-01T00:00:00Z", "tritongen_version": "0.1.0",
        "complete": True, "duration_s": 60.0, "max_batch_size": max_batch_size, "settings": PROFILE_SETTINGS,
    }


def load_level(concurrency: int, throughput: float, p99: float, errors: int = 0) -> dict:
    return {
        "concurrency": concurrency, "requests": int(throughput * 10), "errors": errors, "duration_s": 10.0,
        "windows": 2, "converged": True, "window_throughputs": [throughput, throughput],
        "throughput_per_s": throughput, "p50_ms": p99 / 2, "p90_ms": p99 * 0.8, "p99_ms": p99,
    }


def stream_level(concurrency: int, requests: int, ttft_p99: float) -> dict:
    return {
        "concurrency": concurrency, "requests": requests, "errors": 0, "tokens": requests * 16, "duration_s": 10.0,
        "windows": 2, "converged": True, "window_tokens_per_s": [1.0, 1.0], "tokens_per_s": requests * 1.6,
        "stream_tokens_per_s_p50": 50.0, "ttft_p50_ms": ttft_p99 / 2, "ttft_p99_ms": ttft_p99,
        "itl_p50_ms": 5.0, "itl_p99_ms": 9.0,
    }


RANKER = {
    **profile_header("ranker", "classic", 32),
    "load_levels": [
        load_level(1, 180.0, 9.0), load_level(4, 520.0, 14.0), load_level(16, 900.0, 40.0),
        load_level(64, 1250.0, 180.0),  # the best level within 250 ms
        load_level(128, 1300.0, 420.0),  # more throughput, but over the target
        load_level(256, 1400.0, 240.0, errors=3),  # within the target only by failing requests: not capacity
    ],
}
TINYLLM = {
    **profile_header("tinyllm", "streaming", 19),
    "streaming": {"prompt_tokens": 48, "max_tokens": 16, "levels": [
        stream_level(1, 40, 30.0), stream_level(4, 120, 120.0), stream_level(8, 150, 300.0),
    ]},
}


# ------------------------------------------------------------------------------------------------
# The sidecar's integration repository: a ranker and a tinyllm whose KV pool the plan sizes

SIDECAR_ARCH = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
                "head_dim": 16, "dtype": "fp32", "attention": "gqa", "vocab_size": 256}
# tinyllm builds its network from these parameters (its own knobs, passed through the spec)
TINYLLM_NETWORK = {"num_layers": "2", "hidden_size": "64", "num_heads": "4", "num_kv_heads": "2", "head_dim": "16",
                   "vocab_size": "256"}
SIDECAR_POOL_BLOCKS = 12  # tinyllm's KV pool at the default 1.69 MiB quota


def sidecar_spec_doc(memory_quota_mb: float = 1.69) -> dict[str, Any]:
    tensors = {
        "inputs": [{"name": "text_input", "data_type": "STRING", "dims": [1]},
                   {"name": "max_tokens", "data_type": "INT32", "dims": [1], "optional": True}],
        "outputs": [{"name": "text_output", "data_type": "STRING", "dims": [1]}],
    }
    return {
        "version": 1, "name": "sidecar-it", "hardware": {"gpus": [], "cpu_memory_mb": 64},
        "models": [
            {"name": "ranker", "backend": "python", "kind": "classic", "max_batch_size": 32,
             "weights": {"parameters": 2177, "dtype": "fp32"},
             "inputs": [{"name": "FEATURES", "data_type": "FP32", "dims": [32]}],
             "outputs": [{"name": "SCORES", "data_type": "FP32", "dims": [1]}],
             "parameters": {"overhead_ms": "4.0", "per_item_ms": "0.25", "seed": "7"}},
            # quota 1.69 MiB - weights 0.595 - reserve 0.5 - pad 0.5 = 97.3 KiB: 12 blocks x 16 tokens x 512 B
            {"name": "tinyllm", "backend": "python", "kind": "llm", "streaming": True, "architecture": SIDECAR_ARCH,
             "weights": {"parameters": 155968, "dtype": "fp32"}, "kv_dtype": "fp32", "max_context": 128,
             "memory_quota_mb": memory_quota_mb, **tensors,
             "engine": {"kv_policy": "grow_kill", "render_parameters": True},
             "parameters": {"seed": "11", "default_max_tokens": "16", **TINYLLM_NETWORK}},
            # a non-batching classic model on two instances, the way many users start
            {"name": "echo", "backend": "python", "kind": "classic", "max_batch_size": 0, "instances": 2,
             "inputs": [{"name": "IN", "data_type": "FP32", "dims": [4]}],
             "outputs": [{"name": "OUT", "data_type": "FP32", "dims": [4]}]},
        ],
        "traffic_classes": [
            {"name": "interactive", "kind": "interactive", "priority": 1, "p99_ms": 250, "share": 0.35},
            {"name": "normal", "kind": "normal", "priority": 2, "p99_ms": 1000, "share": 0.35},
            {"name": "batch", "kind": "batch", "priority": 3, "p99_ms": 5000, "share": 0.3},
        ],
        "policy": {"kv_safety_pad_mb": 0.5, "framework_reserve_mb": 0.5},
    }


def _config_parameters(params: dict[str, str]) -> str:
    return "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in sorted(params.items()))


ECHO_MODEL = '''"""echo: OUT = IN, one request per execution (max_batch_size 0)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
'''


def write_sidecar_repository(root: Path, tinyllm_params: dict[str, str], ranker_params: dict[str, str]) -> Path:
    """The example models' code with hand-written configs: tinyllm without Triton's dynamic batcher
    (max_batch_size 0), ranker with its batcher and three priority levels, and `echo`, an identity
    without batching (max_batch_size 0) on two instances."""
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    (root / "echo" / "config.pbtxt").write_text("""name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
""")
    for name in ("ranker", "tinyllm"):
        version = root / name / "1"
        version.mkdir(parents=True)
        for py in (MODEL_REPOSITORY / name / "1").glob("*.py"):
            shutil.copy(py, version / py.name)
    (root / "tinyllm" / "config.pbtxt").write_text(f"""name: "tinyllm"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
        {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }} ]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{_config_parameters(tinyllm_params)}
""")
    (root / "ranker" / "config.pbtxt").write_text(f"""name: "ranker"
backend: "python"
max_batch_size: 32
input [ {{ name: "FEATURES" data_type: TYPE_FP32 dims: [ 32 ] }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 priority_levels: 3 default_priority_level: 2 }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{_config_parameters(ranker_params)}
""")
    return root


def build_sidecar_repository(
    tmp: Path, memory_quota_mb: float = 1.69, pool_blocks: int = SIDECAR_POOL_BLOCKS
) -> tuple[Path, dict[str, Any], int]:
    """`tmp/repo` and its sidecar policy, from the plan for `sidecar_spec_doc(memory_quota_mb)`.

    tinyllm gets the plan's KV pool (asserted to be `pool_blocks` blocks of 16 tokens) but a
    `max_num_seqs` of 32, an operator's override the policy is told about (max_inflight 32): only
    memory admission stands between a burst and an out-of-memory error. Returns (repository,
    policy document, pool blocks)."""
    from tritongen.core.sidecar_policy.schema import parse_policy
    from tritongen.core.architecture import Architecture
    from tritongen.core.plan import plan_deployment
    from tritongen.core.sidecar_policy.build import build_sidecar_policy
    from tritongen.core.spec import DeploymentSpec

    spec = DeploymentSpec.model_validate(sidecar_spec_doc(memory_quota_mb))
    plan = plan_deployment(spec, {"tinyllm": Architecture(**SIDECAR_ARCH)})
    entry = plan.entry("tinyllm")
    assert entry.kv is not None and entry.kv.pool_blocks == pool_blocks and entry.kv.block_tokens == 16
    tinyllm_params = {**entry.parameters, "max_num_seqs": "32"}  # the operator's override
    write_sidecar_repository(tmp / "repo", tinyllm_params, plan.entry("ranker").parameters)
    policy = build_sidecar_policy(spec, plan)
    for model in policy["models"]:
        if model["name"] == "tinyllm":
            model["max_inflight"] = 32  # told about the override: only memory admission is left
    policy["concurrency"].update(min=32, max=96)
    policy["limits"]["max_body_bytes"] = 1024 * 1024
    parse_policy(policy)
    return tmp / "repo", policy, entry.kv.pool_blocks


# ---------------------------------------------------------------------------------------------
# The tuner's unit tests: the example deployment's ranker, its classes, and traffic for it


def _tune_example():
    from tritongen.core.plan import plan_deployment
    from tritongen.specio import load_spec

    loaded = load_spec(EXAMPLES / "deployment.yaml")
    return loaded.spec, plan_deployment(loaded.spec, loaded.architectures)


TUNE_SPEC, TUNE_PLAN = _tune_example()
TUNE_CLASSES = TUNE_SPEC.traffic_classes


def tune_traffic(rate: float, n: int = 3000, seed: int = 1):
    spec = TrafficSpec(
        shape="poisson", rate_per_s=rate, duration_s=n / rate, warmup_s=0.5,
        classes=[{"name": c.name, "share": c.share, "priority": c.priority, "prompt_tokens": 48, "output_tokens": 16} for c in TUNE_CLASSES],
    )
    return generate_arrivals(spec, seed=seed)


def ranker_inputs(rate: float = 200.0, curve=None, **kw) -> TuneInputs:
    entry = TUNE_PLAN.entry("ranker")
    kw.setdefault("max_instances", 2)
    return TuneInputs(
        spec=TUNE_SPEC, entry=entry, arrivals=tune_traffic(rate, n=1200), classes=list(TUNE_CLASSES),
        curve=curve or ServiceCurve(fixed_ms=4.0, per_item_ms=0.25), overheads=Overheads(request_ms=1.0, batch_ms=0.5),
        **kw,
    )


class ServedIndex:
    """A server's model index and configs as TritonAdmin answers them, without a server."""

    def __init__(self, configs: dict[str, dict]) -> None:
        self.configs = configs

    def models(self) -> list[dict]:
        return [{"name": name, "state": "READY"} for name in self.configs]

    def model_ready(self, name: str) -> bool:
        return True

    def config(self, name: str) -> dict:
        return self.configs[name]


def config_tensors(table: str) -> list[dict]:
    """Config entries as Triton serves them, from rows 'name TYPE [dims]' with 'optional' for optional
    inputs (the layout of the backends' tables, one tensor a line)."""
    entries = []
    for row in table.strip().splitlines():
        name, kind, dims, *flags = row.split()
        entries.append({"name": name, "data_type": f"TYPE_{kind}", "dims": json.loads(dims),
                        "optional": flags == ["optional"]})
    return entries


RAW_TRTLLM = {  # all_models/inflight_batcher_llm/tensorrt_llm (docs/model_config.md): token ids in and out
    "name": "tensorrt_llm",
    "backend": "tensorrtllm",
    "max_batch_size": 64,
    "input": config_tensors("""
        input_ids INT32 [-1]
        input_lengths INT32 [1]
        request_output_len INT32 [1]
        end_id INT32 [1] optional
        streaming BOOL [1] optional
    """),
    "output": config_tensors("""
        output_ids INT32 [-1,-1]
        sequence_length INT32 [-1]
    """),
    "model_transaction_policy": {"decoupled": True},
}
