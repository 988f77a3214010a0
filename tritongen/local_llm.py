"""A small Llama-architecture model directory made on this machine, for a real vLLM engine with
nothing downloaded: a Hugging Face `config.json` and a byte-level BPE tokenizer trained here.

The engine loads it with `load_format: "dummy"` (random weights), so it computes real attention
over a real KV cache at the real cost of its shape; only the text it makes is noise. The shape is
a parameter, so the tests, benches and demo can try engines of other sizes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

WORDS = (
    "the model serves tokens from a cache of keys and values while requests wait in a queue for their "
    "turn on the device and each step decodes one token for every running sequence until the pool is full "
    "then the newest sequence is preempted and computed again later when blocks are free again"
).split()


@dataclass(frozen=True)
class LlamaShape:
    """The architecture fields vLLM reads; KV bytes per token = 2 x layers x kv_heads x head_dim x 2 (bf16)."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    vocab: int = 2048
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "tie_word_embeddings": False,
        }


def corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(lines)]


def write_tiny_llama(out: Path, shape: LlamaShape = LlamaShape()) -> Path:
    """Write config.json and a tokenizer into `out` (made atomically: a sibling directory renamed
    into place), unless `out` already holds the same shape. Needs the `tokenizers` package."""
    out = Path(out)
    marker = out / "tritongen-shape.json"
    if marker.is_file() and json.loads(marker.read_text()) == asdict(shape):
        return out
    # Trained in this process: its thread pool would warn at every later fork (the demo's subprocesses).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.save(str(work / "tokenizer.json"))
    (work / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": shape.max_positions, "add_bos_token": False, "add_eos_token": False,
    }, indent=2))
    (work / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}))
    config = shape.config()
    config["vocab_size"] = max(shape.vocab, tokenizer.get_vocab_size())
    (work / "config.json").write_text(json.dumps(config, indent=2))
    (work / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    (work / "tritongen-shape.json").write_text(json.dumps(asdict(shape)))
    if out.exists():
        backup = out.with_name(out.name + f".old-{os.getpid()}")
        out.rename(backup)
        work.rename(out)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        work.rename(out)
    return out


SPEC_PLACEHOLDER = "TINY_LLAMA"


def write_example_spec(template: Path, out: Path, shape: LlamaShape = LlamaShape()) -> Path:
    """A runnable copy of a spec that names the tiny Llama by `SPEC_PLACEHOLDER` (the project's
    examples/vllm/deployment.yaml): the model directory is written under `out` and its path put in
    place of the placeholder, absolute: the spec's paths are read from its own folder, and a relative
    `out` (the demo's default, demo-out) would be counted twice. Returns the spec's path, `out/deployment.yaml`."""
    llama = write_tiny_llama(Path(out) / "tiny-llama", shape).resolve()
    spec = Path(out) / "deployment.yaml"
    spec.write_text(Path(template).read_text().replace(SPEC_PLACEHOLDER, str(llama)))
    return spec


def write_example_repository(template: Path, out: Path, llama: Path) -> Path:
    """A runnable copy of a model repository whose engine files name the tiny Llama by
    `SPEC_PLACEHOLDER` (the demo's hand-written vLLM repository): every file copied, the
    placeholder in each `model.json` replaced by `llama`'s absolute path (the engine starts in
    Triton's working directory, not this one). Returns `out`."""
    shutil.copytree(template, out, ignore=shutil.ignore_patterns("__pycache__"))
    for engine_file in Path(out).rglob("model.json"):
        engine_file.write_text(engine_file.read_text().replace(SPEC_PLACEHOLDER, str(Path(llama).resolve())))
    return Path(out)


def split_cores() -> tuple[frozenset[int] | None, str | None]:
    """(CPUs for Triton, its stubs and clients; CPUs for a CPU engine's threads): the engine takes
    the last core of a host with two or more, as a GPU engine has its device to itself, so the
    engine's spinning OpenMP threads do not starve the server and the load; None, None on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return frozenset(cores[:-1]), str(cores[-1])


def vllm_cpu_environment(engine_cpus: str | None = None) -> dict[str, str]:
    """What vLLM needs on a CPU host beside Triton (measured, shared/docs/vllm-cpu.md): no sampler
    compile on the first request, loopback for torch.distributed, no usage stats, no hub. Empty on a
    host with an NVIDIA device, where the engine's defaults are the right ones."""
    if Path("/dev/nvidia0").exists():
        return {}
    bind = {"VLLM_CPU_OMP_THREADS_BIND": engine_cpus} if engine_cpus else {}
    return {
        **bind,
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }

