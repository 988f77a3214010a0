"""One vocabulary across the commands (tritongen/cli/vocabulary.py), held to the registered commands.

Introspects the click commands Typer builds: no subprocess, no server, no port. Each shared flag is
taken by exactly the commands its row names (a new command that takes `--url` must be listed, so
the README's table stays true), each old spelling is still accepted but hidden from --help, and no
command shows an old spelling. The deprecation line and the clash of an old and a new spelling are
run once in process, on commands that stop before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from sidecar.config import SidecarConfig
from tests.helpers import REPO_ROOT
from tritongen.cli.main import app
from tritongen.cli.vocabulary import OLD_SPELLINGS, SHARED_FLAGS, SPEC, SharedFlag
from tritongen.core.fmt import fmt_ms
from tritongen.errors import BadInput
from tritongen.shared.fronts import DEFAULT_FRONT, FRONTS

EXAMPLES = REPO_ROOT / "examples"
COMMANDS: dict[str, click.Command] = get_command(app).commands  # type: ignore[attr-defined]
runner = CliRunner()


def options(command: click.Command, hidden: bool) -> set[str]:
    """Every spelling (long, short, --no- form) of the command's options that are (not) hidden."""
    return {opt for p in command.params if isinstance(p, click.Option) and p.hidden == hidden
            for opt in (*p.opts, *p.secondary_opts)}


def takes_spec_first(command: click.Command) -> bool:
    """The first positional argument is the spec: named `spec`, or shown as `SPEC`/`[SPEC] ...`."""
    argument = next((p for p in command.params if isinstance(p, click.Argument)), None)
    if argument is None:
        return False
    shown = (argument.metavar or "").split()
    return argument.name == "spec" or (bool(shown) and shown[0].strip("[]") == SPEC)


def takes(command: click.Command, flag: SharedFlag) -> bool:
    if flag.flag == SPEC:
        return takes_spec_first(command)
    visible = options(command, hidden=False)
    return flag.flag in visible and (flag.short is None or flag.short in visible)


def test_the_table_names_only_registered_commands() -> None:
    named = {c for f in SHARED_FLAGS for c in f.commands} | {o.command for o in OLD_SPELLINGS}
    assert named <= set(COMMANDS), named - set(COMMANDS)
    assert len({f.flag for f in SHARED_FLAGS}) == len(SHARED_FLAGS)


@pytest.mark.parametrize("flag", SHARED_FLAGS, ids=lambda f: f.flag)
def test_each_shared_flag_is_taken_by_exactly_the_commands_it_lists(flag: SharedFlag) -> None:
    taking = {name for name, command in COMMANDS.items() if takes(command, flag)}
    assert taking == set(flag.commands), f"{flag.flag}: listed {sorted(flag.commands)}, taken by {sorted(taking)}"


def test_a_shared_flags_short_form_is_that_flag_everywhere() -> None:
    for flag in (f for f in SHARED_FLAGS if f.short):
        for name, command in COMMANDS.items():
            for param in command.params:
                if isinstance(param, click.Option) and flag.short in param.opts:
                    assert flag.flag in param.opts, f"{name}: {flag.short} is not {flag.flag}"


@pytest.mark.parametrize("old", OLD_SPELLINGS, ids=lambda o: f"{o.command} {o.old}")
def test_each_old_spelling_is_still_accepted_and_hidden(old) -> None:
    command = COMMANDS[old.command]
    assert old.old in options(command, hidden=True), f"{old.command} no longer accepts {old.old}"
    if old.new == SPEC:
        assert takes_spec_first(command)
    else:
        assert old.new in options(command, hidden=False), f"{old.command}: {old.new} is missing"


def test_no_command_shows_an_old_spelling() -> None:
    old = {o.old for o in OLD_SPELLINGS}
    for name, command in COMMANDS.items():
        assert not options(command, hidden=False) & old, name


# ---------------------------------------------------------------------------------------------
# The deprecation line, and old and new spellings together (in process; nothing starts)


def test_an_old_spelling_says_so_once_on_stderr_and_behaves_identically() -> None:
    spec = str(EXAMPLES / "deployment.yaml")
    new = runner.invoke(app, ["dashboard", spec, "-o", "-"])
    old = runner.invoke(app, ["dashboard", "--spec", spec, "-o", "-"])
    assert new.exit_code == old.exit_code == 0, old.output
    assert old.stdout == new.stdout and json.loads(old.stdout)["title"] == "Triton fleet: cpu-demo"
    assert new.stderr == ""
    assert old.stderr == "tritongen: --spec is deprecated, use SPEC (it will be removed in the next release)\n"


def test_an_old_and_a_new_spelling_that_disagree_are_refused_naming_both() -> None:
    done = runner.invoke(app, ["dashboard", str(EXAMPLES / "deployment.yaml"), "--spec", "other.yaml", "-o", "-"])
    assert isinstance(done.exception, BadInput)
    assert "SPEC" in str(done.exception) and "--spec other.yaml" in str(done.exception)
    clash = runner.invoke(app, ["sidecar", "--policy", "p.json", "--url", "127.0.0.1:1", "--upstream", "127.0.0.1:2"])
    assert isinstance(clash.exception, BadInput)
    assert "--url 127.0.0.1:1" in str(clash.exception) and "--upstream 127.0.0.1:2" in str(clash.exception)
    same = runner.invoke(app, ["dashboard", str(EXAMPLES / "deployment.yaml"), "--spec", str(EXAMPLES / "deployment.yaml"),
                               "-o", "-"])
    assert same.exit_code == 0 and "--spec is deprecated" in same.stderr


def test_checks_old_format_maps_to_the_output_flags(tmp_path: Path) -> None:
    new = runner.invoke(app, ["check", str(tmp_path), "--json", "--no-gpu"])
    old = runner.invoke(app, ["check", str(tmp_path), "--format", "json", "--no-gpu"])
    assert old.stdout == new.stdout and json.loads(new.stdout)["summary"]["models"] == 0
    assert old.stderr.startswith("tritongen: --format json is deprecated, use --json")
    both = runner.invoke(app, ["check", str(tmp_path), "--json", "--github"])
    assert isinstance(both.exception, BadInput) and "--json and --github" in str(both.exception)
    clash = runner.invoke(app, ["check", str(tmp_path), "--json", "-f", "github"])
    assert isinstance(clash.exception, BadInput) and "--format github" in str(clash.exception)


def test_check_takes_the_spec_first_and_names_a_swapped_order(tmp_path: Path) -> None:
    spec = EXAMPLES / "deployment.yaml"
    swapped = runner.invoke(app, ["check", str(tmp_path), str(spec)])
    assert isinstance(swapped.exception, BadInput) and "the spec comes first" in str(swapped.exception)
    three = runner.invoke(app, ["check", str(spec), str(tmp_path), str(tmp_path)])
    assert isinstance(three.exception, BadInput) and "[SPEC] DIR" in str(three.exception)


def test_simulate_reads_a_profiles_directory_by_the_configs_model() -> None:
    config = str(REPO_ROOT / "model_repository" / "ranker" / "config.pbtxt")
    common = ["--config", config, "--traffic", str(EXAMPLES / "traffic" / "poisson.yaml"), "--requests", "400", "--json"]
    by_dir = runner.invoke(app, ["simulate", "--profiles", str(EXAMPLES / "profiles"), *common])
    by_file = runner.invoke(app, ["simulate", "--profile", str(EXAMPLES / "profiles" / "ranker.json"), *common])
    assert by_dir.exit_code == 0, by_dir.output
    assert json.loads(by_dir.stdout) == json.loads(by_file.stdout)
    neither = runner.invoke(app, ["simulate", *common])
    assert isinstance(neither.exception, BadInput) and "--profiles DIR" in str(neither.exception)


# ---------------------------------------------------------------------------------------------
# Facts stated once


def test_the_sidecars_front_has_one_default_and_one_check() -> None:
    front = next(p for p in COMMANDS["sidecar"].params if p.name == "front")
    assert front.default == DEFAULT_FRONT == SidecarConfig(policy_path=Path("p.json"), upstream="h:1").front
    assert DEFAULT_FRONT in FRONTS
    with pytest.raises(BadInput, match="--front 'nginx': use auto, native or python"):
        SidecarConfig(policy_path=Path("p.json"), upstream="h:1", front="nginx")


def test_milliseconds_read_the_same_everywhere() -> None:
    assert [fmt_ms(None), fmt_ms(0.04), fmt_ms(12.345), fmt_ms(99.94), fmt_ms(123.4)] == ["-", "0.0", "12.3", "99.9", "123"]
    assert fmt_ms(5, " ms") == "5.0 ms" and fmt_ms(None, " ms") == "-"
