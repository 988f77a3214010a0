"""The Typer app every command registers on.

It lives apart from `main.py` (which imports every command to register it) so that a command
module imports only this one and the library: no command imports `main`, none imports another.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tritongen",
    help="Profile models, render Triton configs, check repositories, guard a running server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Always a group of commands, even when the console script registered only the one it runs
    (tritongen/cli/commands.py): Typer runs a lone command as the whole program otherwise."""
