"""`tritongen demo`'s input checks, before any server starts."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli


def test_profiles_that_are_not_a_folder_are_one_clear_error(tmp_path: Path) -> None:
    result = run_cli("demo", "--only", "classic", "--profiles", str(tmp_path / "missing"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--profiles" in result.stderr and "not a directory" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_an_unknown_part_is_one_clear_error(tmp_path: Path) -> None:
    result = run_cli("demo", "--only", "gpu", "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and "--only 'gpu'" in result.stderr, result.stderr


def test_the_real_engine_spec_and_repository_load_from_a_relative_out(tmp_path: Path, monkeypatch) -> None:
    """`make demo` writes under demo-out, a relative folder: the spec it writes for the tiny Llama
    must load (its paths are read from the spec's own folder), and the engine files must name the
    model by an absolute path (the engine starts in Triton's working directory)."""
    import json

    from tests.helpers import EXAMPLES
    from tritongen.local_llm import write_example_repository, write_example_spec
    from tritongen.specio import load_spec

    monkeypatch.chdir(tmp_path)
    home = Path("demo-out") / "vllm"
    spec = write_example_spec(EXAMPLES / "vllm" / "deployment.yaml", home)
    loaded = load_spec(spec)
    assert [m.name for m in loaded.spec.models] == ["tiny_llama"]
    repo = write_example_repository(EXAMPLES / "vllm" / "naive_repository", Path("before"), home / "tiny-llama")
    (engine_file,) = repo.rglob("model.json")
    model = Path(json.loads(engine_file.read_text())["model"])
    assert model.is_absolute() and (model / "config.json").is_file()
