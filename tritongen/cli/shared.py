"""What more than one command prints or accepts the same way. Imports no command module: commands
import this, `app` and the library, never each other."""

from __future__ import annotations

from typing import TypeVar

import typer
from rich.console import Console

from tritongen.core.model_kind import KIND_FLAG, StatedKind, parse_kind_flags
from tritongen.core.simulator import ServiceCurve
from tritongen.core.triton_releases import EMBEDDED, Release, UnknownRelease, resolve
from tritongen.errors import BadInput

T = TypeVar("T")


def say_calibration(out: Console, overheads_used: str, device_curve: ServiceCurve | None, note: str | None, prefix: str = "") -> None:
    """Which overheads and which shared device the simulation uses, in one or two lines."""
    out.print(f"[dim]{prefix}overheads: {overheads_used}[/]")
    if device_curve is not None:
        out.print(f"[dim]{prefix}shared device: a part of {device_curve.fixed_ms:g} ms + {device_curve.per_item_ms:g} ms/row of "
                  "each execution is taken in turns by the instances of a device (the profile's instance scaling)[/]")
    if note:
        out.print(f"[yellow]note:[/] {prefix}{note}")


# ---------------------------------------------------------------------------------------------
# Old spellings (tritongen/cli/vocabulary.py lists them): accepted for one release, said once.


def say_deprecated(old: str, new: str) -> None:
    """The one stderr line an old spelling costs. On stderr so that `--json` output and scripts
    reading stdout are unchanged; one line so that a CI log shows it without burying anything."""
    typer.echo(f"tritongen: {old} is deprecated, use {new} (it will be removed in the next release)", err=True)


def renamed(new_value: T | None, old_value: T | None, new: str, old: str) -> T | None:
    """The value of something spelled `new` now and `old` before (an option, or an option that
    became a positional): the new spelling's, else the old one's with the deprecation line. Both
    given and different is BadInput naming both, rather than one silently winning."""
    if old_value is None:
        return new_value
    say_deprecated(old, new)
    if new_value is not None and new_value != old_value:
        raise BadInput(f"{new} {new_value} and {old} {old_value} disagree; give {new} only ({old} is its old spelling)")
    return old_value


def output_from_format(old_format: str | None, flags: dict[str, bool], default: str = "text") -> str:
    """The output chosen by a command's output flags (`flags`: format name -> whether `--NAME` was
    given, e.g. {"json": as_json}) or by its old `--format NAME`, which says it is deprecated. Two
    flags, or a `--format` that contradicts a flag, are BadInput: neither may silently win."""
    given = [name for name, on in flags.items() if on]
    if len(given) > 1:
        raise BadInput(f"{' and '.join('--' + name for name in given)} are different outputs; give one")
    if old_format is None:
        return given[0] if given else default
    say_deprecated(f"--format {old_format}", f"--{old_format}" if old_format in flags else
                   f"no output flag ({default} is the default)")
    if given and given[0] != old_format:
        raise BadInput(f"--{given[0]} and --format {old_format} disagree; give --{given[0]} only (--format is its old spelling)")
    return old_format


# ---------------------------------------------------------------------------------------------
# --triton-release (check, render): one flag, one meaning (tritongen/cli/vocabulary.py).

TRITON_RELEASE_HELP = (f"The Triton release the repository runs on: a container release (25.12) or a server "
                       f"version (2.64.0). Default: the embedded {EMBEDDED}.")


def triton_release(spelling: str | None) -> Release | None:
    """The named release (None when not named); an unknown one is BadInput listing the known."""
    if spelling is None:
        return None
    try:
        return resolve(spelling)
    except UnknownRelease as err:
        raise BadInput(f"--triton-release: {err}") from None


# ---------------------------------------------------------------------------------------------
# --kind (profile): a model's kind in the spec's own words, for models profiled without a spec.

KIND_HELP = ("What a model is, in the spec's words: MODEL=llm or MODEL=classic (repeatable). Without a SPEC only "
             "(a spec says it in each model's `kind:`). Where nothing says it, a model that is not decoupled with a text "
             "input and a text output is taken for an LLM, and the profile says so.")


def kind_flags(values: list[str], profiled: list[str], with_spec: bool) -> dict[str, StatedKind]:
    """The models' kinds `--kind` states; BadInput (one line, naming the flag and the fix) for a
    value that is not MODEL=llm|classic, a model given two kinds, a model not profiled, or any
    --kind beside a spec, whose `kind:` already states every model's (two sources would disagree)."""
    if not values:
        return {}
    if with_spec:
        raise BadInput(f"{KIND_FLAG} goes with --model (no SPEC): with a SPEC, each model's kind is its `kind:` there; "
                       f"drop {KIND_FLAG} or change the spec")
    try:
        stated = parse_kind_flags(values)
    except ValueError as err:
        raise BadInput(str(err)) from None
    for name, said in stated.items():
        if name not in profiled:
            listed = ", ".join(profiled) or "none"
            raise BadInput(f"{KIND_FLAG} {name}={said.kind}: {name!r} is not profiled (--model {listed}); add --model "
                           f"{name} or drop that {KIND_FLAG}")
    return stated
