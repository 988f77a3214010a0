"""The unit tests' in-process CLI runner (`run_cli`) against the console as users run it (`cli`, a
subprocess): the same exit code and the same text for each way a command ends, so a unit test that
asserts on one asserts on what users see. Here because the reference is a real process."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, cli, run_cli

pytestmark = pytest.mark.integration

# how a command ends -> (arguments, the exit code it ends with)
ENDINGS = {
    "success": (("schema",), 0),
    "help": (("plan", "--help"), 0),
    "usage error: unknown command": (("nosuch",), 2),
    "usage error: bad choice": (("kv", str(EXAMPLES / "architectures" / "tinyllm.json"), "--kv-dtype", "fp4"), 2),
    "tritongen error: no repository": (("check", "no/such/repository"), 2),
    "tritongen error: bad value": (("plan", "examples/deployment.yaml", "--profiles", "examples/profiles",
                                    "--peak-qps", "40", "--safety-factor", "0.95"), 2),
    "typer.Exit: drift": (("render", "examples/deployment.yaml", "-o", "examples/profiles", "--check"), 1),
}


@pytest.mark.parametrize(("args", "code"), ENDINGS.values(), ids=ENDINGS.keys())
def test_run_cli_ends_as_the_console_does(args: tuple[str, ...], code: int) -> None:
    real, mine = cli(*args), run_cli(*args)
    assert real.returncode == code, real.stderr
    assert (mine.returncode, mine.stdout, mine.stderr) == (real.returncode, real.stdout, real.stderr)
    assert "Traceback" not in mine.stderr


def test_run_cli_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (os.getcwd(), sys.argv, sys.stdin, dict(os.environ), list(root.handlers), root.level)
    bad = tmp_path / "policy.json"
    bad.write_text("{}")
    result = run_cli("sidecar", "--policy", str(bad), "--url", "127.0.0.1:1")  # configures logging, then fails
    assert result.returncode == 2, result.stderr
    assert (os.getcwd(), sys.argv, sys.stdin, dict(os.environ), list(root.handlers), root.level) == before
