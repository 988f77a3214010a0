"""The README's tour runs as written (issue 43): the offline commands here, in the process, and each
live one in the integration module `tests/readme_tour.LIVE` names (see tests/readme_tour.py)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from rich.console import Console

from tests.helpers import REPO_ROOT, run_cli
from tests.readme_tour import (
    LIVE, OFFLINE, WIDE, TourCommand, live_module, missing_lines, sandbox, tour_command, tour_commands,
)

COMMANDS = tour_commands()
OFFLINE_COMMANDS = [c for c in COMMANDS if live_module(c) is None]


def test_the_tour_has_commands_and_each_is_run_by_a_test() -> None:
    assert len(COMMANDS) >= 8, [c.text for c in COMMANDS]
    for command in COMMANDS:
        module = live_module(command)
        if module is None:
            assert command.is_tritongen and command.argv[1] in OFFLINE, (
                f"{command.where()}: neither offline ({', '.join(OFFLINE)}) nor claimed by a live test in "
                "tests/readme_tour.LIVE; add it to one")
        else:
            key = next(start for start, m in LIVE.items() if m == module and command.text.startswith(start))
            assert f"tour_command(\"{key}\")" in (REPO_ROOT / module).read_text(), (
                f"{command.where()}: {module} does not run it (no tour_command({key!r}))")


@pytest.mark.parametrize("command", OFFLINE_COMMANDS, ids=lambda c: f"L{c.line_no}-{c.argv[1]}")
def test_an_offline_tour_command_prints_what_the_readme_shows(command: TourCommand, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in WIDE.items():
        monkeypatch.setenv(name, value)
    _widen_module_consoles(monkeypatch)
    where = sandbox(tmp_path / "tour")
    for earlier in COMMANDS[: COMMANDS.index(command)]:  # what the tour made before this step
        if earlier in OFFLINE_COMMANDS and earlier.argv[1] == "render":
            run_cli(*earlier.argv[1:], cwd=where)
    result = run_cli(*command.argv[1:], cwd=where)
    printed = result.stdout + result.stderr
    assert (result.returncode != 0) == command.fails, f"{command.where()} exited {result.returncode}:\n{printed}"
    missing = missing_lines(command, printed)
    assert not missing, f"{command.where()}: the README shows lines this run did not print:\n" + "\n".join(
        missing) + f"\n--- printed:\n{printed}"


def _widen_module_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console made at import took its width from COLUMNS then (a fresh process reads WIDE; an
    earlier test in this process may have imported the command first, or re-imported its module,
    so the registered command may hold a console sys.modules no longer names): widen every console
    this process holds. One the run makes itself reads WIDE from the environment."""
    for value in gc.get_objects():
        if isinstance(value, Console):
            monkeypatch.setattr(value, "_width", int(WIDE["COLUMNS"]))


def test_a_line_the_run_did_not_print_is_caught(tmp_path: Path) -> None:
    """The matcher itself: a changed figure is missing, borders and spacing are not."""
    readme = tmp_path / "README.md"
    readme.write_text("```\n$ tritongen kv x.json \\\n    --tp 2\n┃ a  ┃ b ┃\n│ 1 │ 2 │\n...\nlast\n```\n")
    command = tour_command("tritongen kv", readme)
    assert command.argv == ["tritongen", "kv", "x.json", "--tp", "2"] and not command.fails
    printed = "┏━━━┳━━━┓\n┃ a ┃ b ┃\n┡━━━╇━━━┩\n│ 1 │   2 │\n└───┴───┘\nskipped\nlast\n"
    assert missing_lines(command, printed) == []
    assert missing_lines(command, printed.replace("2 │", "3 │")) == ["│ 1 │ 2 │"]
    assert missing_lines(command, printed.replace("2 │", "3 │"), headers_only=True) == []
