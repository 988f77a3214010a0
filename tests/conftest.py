"""Shared fixtures. Integration tests share ONE real tritonserver per session on the example repository."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
EXAMPLE_PROFILES = EXAMPLES / "profiles"


def example_render():
    """What `tritongen render examples/deployment.yaml --profiles examples/profiles` renders."""
    from tritongen.profiles import measured_pads_mb, read_profiles
    from tritongen.render import render_repository
    from tritongen.specio import load_spec

    profiles = read_profiles(EXAMPLE_PROFILES)
    return render_repository(
        load_spec(EXAMPLES / "deployment.yaml"), measured_pads_mb=measured_pads_mb(profiles), profiles=profiles
    )


def cli(*args: str, cwd: Path | None = None):
    """Run the real console entry point in a subprocess: exit codes and stderr as users see them."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", "from tritongen.cli.main import run; run()", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO_ROOT,
        timeout=120,
    )


@pytest.fixture(scope="session")
def triton_server() -> Iterator["object"]:
    """The embedded tritonserver serving the committed, rendered example repository."""
    from tritongen.cli.serve_cmd import server_flags_from
    from tritongen.server import ServerOptions, TritonServer

    options = ServerOptions(repository=MODEL_REPOSITORY, extra_args=server_flags_from(MODEL_REPOSITORY))
    with TritonServer(options) as server:
        yield server
