"""`tritongen profile`'s command line: where the server and the repository come from (no server runs)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tritongen.cli.main import app
from tritongen.errors import BadInput

runner = CliRunner()


def refused(*args: str) -> str:
    """The BadInput message the command stops with (`tritongen.cli.main.run` prints it, exit code 2)."""
    done = runner.invoke(app, ["profile", *args])
    assert isinstance(done.exception, BadInput), done.output
    return str(done.exception)


def test_a_profile_needs_a_server_or_a_repository(tmp_path: Path) -> None:
    said = refused("-m", "llm", "-o", str(tmp_path / "out"))
    assert "--url" in said and "--repo" in said
    assert not (tmp_path / "out").exists()


def test_a_repository_beside_a_url_must_exist_and_starts_nothing(tmp_path: Path) -> None:
    # --url with --repo names the repository the running server serves (its engine files are read):
    # a missing one is bad input before any server is reached.
    said = refused("-m", "llm", "--url", "127.0.0.1:9", "--repo", str(tmp_path / "absent"), "-o", str(tmp_path / "out"))
    assert "not a directory" in said


def test_the_embedded_servers_ports_are_not_given(tmp_path: Path) -> None:
    assert "--grpc-url" in refused("-m", "llm", "--repo", str(tmp_path), "--grpc-url", "127.0.0.1:9",
                                   "-o", str(tmp_path / "out"))
