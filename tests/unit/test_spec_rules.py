"""`check --spec`: memory per device, KV capacity and drift, on rendered repositories."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import EXAMPLES, run_cli
from tritongen.render import render_repository, write_repository
from tritongen.repository import check_repository
from tritongen.spec_rules import rules_for_spec
from tritongen.specio import load_spec

GPU_SPEC = EXAMPLES / "gpu-deployment.yaml"


def render_to(tmp_path: Path, spec: Path) -> Path:
    out = tmp_path / "repo"
    write_repository(render_repository(load_spec(spec)), out)
    for model in out.iterdir():  # give every model a version folder so only spec rules speak
        if model.is_dir():
            (model / "1").mkdir(exist_ok=True)
            (model / "1" / "model.onnx").write_bytes(b"")
    return out


def codes(repo: Path, spec: Path) -> dict[str, list[str]]:
    report = check_repository(repo, gpu_available=True, extra_rules=rules_for_spec(spec))
    out: dict[str, list[str]] = {}
    for finding in report.findings:
        out.setdefault(finding.code, []).append(finding.message)
    return out


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_rendered_gpu_repository_is_clean(tmp_path: Path) -> None:
    repo = render_to(tmp_path, GPU_SPEC)
    found = codes(repo, GPU_SPEC)
    assert not [c for c in found if c.startswith("TG3")], found


def python_llm_spec(tmp_path: Path) -> Path:
    """The GPU example with both LLMs on the Python backend (KIND_GPU, so configs pin GPUs)."""
    text = GPU_SPEC.read_text().replace("backend: vllm", "backend: python")
    text = text.replace("    lanes: {split_prompt_tokens: 1024, short_share: 0.5}\n", "")
    spec = tmp_path / "python-llms.yaml"
    spec.write_text(text)
    (tmp_path / "architectures").symlink_to(EXAMPLES / "architectures")
    return spec


def test_two_big_models_on_one_gpu_do_not_fit(tmp_path: Path) -> None:
    spec = python_llm_spec(tmp_path)
    repo = render_to(tmp_path, spec)
    assert not [c for c in codes(repo, spec) if c.startswith("TG3")]
    llama, qwen = repo / "llama3-8b" / "config.pbtxt", repo / "qwen2.5-7b" / "config.pbtxt"
    gpu_of_llama = "gpus: [ 0 ]" if "gpus: [ 0 ]" in llama.read_text() else "gpus: [ 1 ]"
    other = "gpus: [ 1 ]" if gpu_of_llama == "gpus: [ 0 ]" else "gpus: [ 0 ]"
    edit(qwen, other, gpu_of_llama)  # a hand edit moves Qwen onto Llama's GPU
    found = codes(repo, spec)
    assert "TG306" in found  # drift from the spec
    (message,) = found["TG302"]
    assert "holds 103262 MiB of model quotas (" in message and "llama3-8b 60000 MiB" in message
    assert "qwen2.5-7b 40960 MiB" in message and "has 69325 MiB under the 85% cap" in message


def test_kv_capacity_and_pool(tmp_path: Path) -> None:
    spec = EXAMPLES / "deployment.yaml"
    repo = render_to(tmp_path, spec)
    config = repo / "tinyllm" / "config.pbtxt"
    edit(config, 'key: "max_num_seqs"\n  value { string_value: "23" }', 'key: "max_num_seqs"\n  value { string_value: "64" }')
    edit(config, 'string_value: "371"', 'string_value: "2000"')
    found = codes(repo, spec)
    assert any("parameters.max_num_seqs 64 x 0.12 MiB" in m and "exceeds the KV budget 2.9 MiB" in m for m in found["TG303"])
    assert any("kv_pool_blocks 2000 allocates 15.6 MiB" in m for m in found["TG304"])


def test_model_missing_and_unknown_model(tmp_path: Path) -> None:
    spec = EXAMPLES / "deployment.yaml"
    repo = render_to(tmp_path, spec)
    (repo / "tinyllm" / "config.pbtxt").rename(repo / "extra.pbtxt")
    (repo / "tinyllm").rename(repo / "other")
    (repo / "extra.pbtxt").rename(repo / "other" / "config.pbtxt")
    edit(repo / "other" / "config.pbtxt", 'name: "tinyllm"', 'name: "other"')
    found = codes(repo, spec)
    assert any("renders model 'tinyllm' but the repository has no config" in m for m in found["TG305"])
    assert any("'other' is in the repository but not in the spec" in m for m in found["TG301"])


def test_committed_example_repository_passes_check_with_spec() -> None:
    result = run_cli("check", "examples/deployment.yaml", "model_repository", "--profiles", "examples/profiles")
    assert result.returncode == 0, result.stdout + result.stderr
