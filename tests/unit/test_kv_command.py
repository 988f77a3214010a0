"""Around the KV arithmetic, what a user meets: a Hugging Face config.json that cannot be read
(tritongen/hfconfig.py) is refused with a located message, and `tritongen kv` prints the numbers
(test_kv.py checks them by hand) as JSON or a table, with exit code 2 for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.helpers import ARCHITECTURES, run_cli
from tritongen.errors import BadInput
from tritongen.hfconfig import load_architecture


# ---- config.json errors ------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as err:
        load_architecture(tmp_path / "nope.json")
    assert "nope.json" in str(err.value) and "no such file" in str(err.value)


def test_invalid_json_quotes_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{\n  "num_hidden_layers": 32,\n}\n')
    with pytest.raises(BadInput) as err:
        load_architecture(p)
    assert f"{p}:3:1: not valid JSON" in str(err.value)


def test_json_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(BadInput, match="got a JSON array"):
        load_architecture(p)


def test_missing_key_names_key_and_source(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(BadInput) as err:
        load_architecture(p)
    assert str(err.value) == (
        f"{p}: missing `num_hidden_layers` (or `n_layer`, `num_layers`); is this a Hugging Face model config?"
    )


def test_wrong_type_names_key(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_hidden_layers": "32", "hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(BadInput, match=r"`num_hidden_layers` must be a whole number, got '32' \(str\)"):
        load_architecture(p)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="is a directory"):
        load_architecture(tmp_path)


# ---- CLI ---------------------------------------------------------------------------------------

runner = CliRunner()
WIDE = {"COLUMNS": "200"}  # rich sizes its tables from COLUMNS when stdout is not a terminal


def _app() -> typer.Typer:
    """The commands registered on the real app, as a group even while `kv` is the only one.

    Typer collapses an app with one command into that command (no `kv` word); until the other
    command modules exist that would change the argv, so tests wrap the registrations in a group.
    """
    import tritongen.cli.kv_cmd  # noqa: F401  registers `kv`
    from tritongen.cli.main import app

    assert any(c.name == "kv" for c in app.registered_commands)
    group = typer.Typer(add_completion=False)
    group.registered_commands = list(app.registered_commands)
    group.callback()(lambda: None)
    return group


def test_cli_json() -> None:
    result = runner.invoke(
        _app(), ["kv", str(ARCHITECTURES / "llama-3.1-70b.json"), "--tp", "2", "--context", "1000", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["kv_bytes_per_token"] == 2 * 80 * 4 * 128 * 2
    assert out["num_layers"] == 80 and out["num_kv_heads"] == 4 and out["head_dim"] == 128
    assert out["kv_dtype"] == "bf16" and out["kv_dtype_bytes"] == 2
    assert out["tensor_parallel"] == 2 and out["attention"] == "gqa" and out["family"] == "llama"
    assert out["kv_bytes_per_sequence"] == 1000 * 2 * 80 * 4 * 128 * 2


def test_cli_json_fp8_without_context() -> None:
    result = runner.invoke(_app(), ["kv", str(ARCHITECTURES / "deepseek-v3.json"), "--kv-dtype", "fp8", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["kv_bytes_per_token"] == 61 * 576 and out["latent_dim"] == 576
    assert "kv_bytes_per_sequence" not in out


def test_cli_text() -> None:
    result = runner.invoke(_app(), ["kv", str(ARCHITECTURES / "llama-3-8b.json"), "--context", "8192"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "131,072 (128.0 KiB)" in result.stdout
    assert "1,073,741,824 (1,024.0 MiB)" in result.stdout  # 8192 x 131072


def test_cli_json_hybrid() -> None:
    result = runner.invoke(
        _app(), ["kv", str(ARCHITECTURES / "qwen3-next-80b-a3b-instruct.json"), "--context", "32768", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    # 12 full layers x 2048 B/token x 32768 + 36 Gated DeltaNet states of 1097728 B (see HYBRID in test_kv.py).
    assert out["kv_bytes_per_sequence"] == 32768 * 24576 + 39_518_208 == 844_824_576
    assert out["growing_bytes_per_token"] == 24576 and out["capped"] == []
    assert out["state_bytes_per_sequence"] == 39_518_208 and out["state"]["kind"] == "gated_delta_net"
    assert out["layers"] == {"linear_attention": 36, "full_attention": 12}


def test_cli_text_explains_the_split() -> None:
    result = runner.invoke(
        _app(), ["kv", str(ARCHITECTURES / "gemma-3-27b-it.json"), "--context", "8192"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    assert "sliding window" in result.stdout and "the last 1,024 tokens" in result.stdout
    assert "436,207,616 (416.0 MiB)" in result.stdout  # 52 x 8192 B x 1024 tokens
    assert "1,107,296,256 (1,056.0 MiB)" in result.stdout


def test_cli_rejects_unknown_kv_dtype() -> None:
    result = runner.invoke(_app(), ["kv", str(ARCHITECTURES / "llama-3-8b.json"), "--kv-dtype", "fp4"])
    assert result.exit_code == 2


def test_console_bad_file_exits_2_without_traceback(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("{ not json")
    proc = run_cli("kv", str(p), "--json")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{p}:1:3: not valid JSON" in proc.stderr and proc.stdout == ""


def test_console_unreadable_layer_pattern_exits_2(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    config = json.loads((ARCHITECTURES / "gpt-oss-20b.json").read_text())
    config["layer_types"] = config["layer_types"][:-1]  # 23 kinds for 24 layers
    p.write_text(json.dumps(config))
    proc = run_cli("kv", str(p), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "`layer_types` lists 23 layers but `num_hidden_layers` is 24" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # one readable message


def test_console_bad_kv_dtype_is_usage_error() -> None:
    proc = run_cli("kv", str(ARCHITECTURES / "tinyllm.json"), "--kv-dtype", "fp4")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "fp4" in proc.stderr
