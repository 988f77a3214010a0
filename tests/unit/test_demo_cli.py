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
