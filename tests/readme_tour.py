"""The README's tour read as commands, so the tests run it as written and the README cannot drift.

Every fenced block of README.md holds commands (`$ ` lines, `\\` continuing one onto the next) and,
under each, the output a real run printed: table rows and headers (their border lines dropped) and
text lines, with `...` where lines were left out. A command is either

- **offline** (no server: kv, render, check, simulate, plan): tests/unit/test_readme_tour.py runs it
  in the process, in a sandbox holding `examples/`, and every line shown under it must appear in
  what it prints, in order;
- or **live** (it starts or needs a server): the integration test named in `LIVE` runs it as its own
  fixture, with only the server's addresses put in, and holds its exit status and the header rows
  of the tables shown (their figures are a run's, not a verdict).

A command in neither is an error of the unit test, so a new tour command cannot go untested.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import EXAMPLES, REPO_ROOT

README = REPO_ROOT / "README.md"
ELLIPSIS = "..."
# Commands that need a live server, by how their line starts, with the module that runs each.
LIVE: dict[str, str] = {
    "tritongen profile examples/deployment.yaml --repo": "tests/integration/test_profile.py",
    "tritongen profile -m scorer --repo": "tests/integration/test_classic_profile.py",
    "tritongen tune examples/classic_standins/deployment.yaml": "tests/integration/test_classic_profile.py",
    "tritongen profile --model oneshot --url": "tests/integration/test_zoo_conformance.py",
    "curl ": "tests/integration/test_sidecar_admin.py",
}
OFFLINE = ("kv", "render", "check", "simulate", "plan")
WIDE = {"COLUMNS": "200"}  # rich sizes its tables from COLUMNS when stdout is not a terminal
_BORDER = re.compile(r"^[\s┏┓┗┛┡┩┢┪├┤└┘┌┐━─┳┻╇╈┼┬┴╋]+$")


@dataclass(frozen=True)
class TourCommand:
    """One `$` line of the README (continuations joined) and the output shown under it."""

    line_no: int
    text: str
    shown: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def is_tritongen(self) -> bool:
        return self.argv[0] == "tritongen"

    @property
    def fails(self) -> bool:
        """A run that is shown failing: an `error:` line or check's `✗` summary."""
        return any(line.startswith(("error:", "✗")) for line in self.shown)

    def where(self) -> str:
        return f"README.md:{self.line_no}: $ {self.text}"


def tour_commands(readme: Path = README) -> list[TourCommand]:
    """Every `$` command in README.md's fenced blocks, in the order they appear."""
    commands: list[TourCommand] = []
    lines = readme.read_text().splitlines()
    inside, i = False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            inside = not inside
            i += 1
            continue
        if inside and line.startswith("$ "):
            start, text = i + 1, line[2:]
            while text.endswith("\\"):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            shown: list[str] = []
            while i + 1 < len(lines) and not lines[i + 1].startswith(("$ ", "```")):
                i += 1
                shown.append(lines[i])
            commands.append(TourCommand(line_no=start, text=text.split("  #")[0].strip(), shown=tuple(shown)))
        i += 1
    return commands


def tour_command(start: str, readme: Path = README) -> TourCommand:
    """The one README command whose line starts with `start` (a live test's fixture runs it)."""
    found = [c for c in tour_commands(readme) if c.text.startswith(start)]
    if len(found) != 1:
        raise LookupError(f"README.md has {len(found)} tour commands starting {start!r}; the tests expect one")
    return found[0]


def live_module(command: TourCommand) -> str | None:
    """The integration module that runs a live command, or None for an offline one."""
    for start, module in LIVE.items():
        if command.text.startswith(start):
            return module
    return None


def _normal(line: str) -> str:
    return " ".join(line.split())


def printed_lines(printed: str) -> list[str]:
    """What a run printed, as the README shows it: border lines dropped, spacing collapsed."""
    return [_normal(line) for line in printed.splitlines() if line.strip() and not _BORDER.match(line)]


def missing_lines(command: TourCommand, printed: str, *, headers_only: bool = False) -> list[str]:
    """The lines shown under `command` that its run did not print, in order (a table's header rows
    only, with `headers_only`: a live run's figures are its own)."""
    have = printed_lines(printed)
    missing, at = [], 0
    for raw in command.shown:
        want = _normal(raw)
        if not want or want == ELLIPSIS or (headers_only and not want.startswith("┃")):
            continue
        try:
            at = have.index(want, at) + 1
        except ValueError:
            missing.append(want)
    return missing


def sandbox(folder: Path, **links: Path) -> Path:
    """A working directory for the tour: `examples/` as in the repository (linked: the tour reads
    it), and each of `links` by its name (what an earlier step made: `model_repository`, `profiles`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    for name, target in links.items():
        (folder / name).symlink_to(target, target_is_directory=True)
    return folder


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """`argv` with `option`'s value replaced (a live server's address for the README's), or added."""
    out = list(argv)
    if option in out:
        out[out.index(option) + 1] = value
    else:
        out += [option, value]
    return out
