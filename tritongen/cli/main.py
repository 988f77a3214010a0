"""The console-script entry point: every command registered on the app, errors mapped to exit codes
only here. Importing this module registers every command, so `app` here is always complete."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

try:  # typer >= 0.20 vendors click as typer._click; older versions depend on click itself
    from typer import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]

from tritongen.cli.app import app
from tritongen.cli import commands  # noqa: F401,E402  (each command module registers itself on `app`)
from tritongen.errors import TritongenError

__all__ = ["app", "run"]

err_console = Console(stderr=True)


def run() -> None:
    """Console-script entry point: one message and an exit code, never a traceback."""
    try:
        code = app(prog_name="tritongen", standalone_mode=False)
        if isinstance(code, int) and code:  # click returns typer.Exit's code without standalone mode
            sys.exit(code)
    except TritongenError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except typer.Exit as ex:  # raised by commands to set an exit code
        sys.exit(ex.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as err:  # click usage errors and anything unexpected
        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(2)
        abort = getattr(click.exceptions, "Abort", None)  # the vendored click of typer >= 0.20 has none
        if abort is not None and isinstance(err, abort):
            sys.exit(130)
        err_console.print(f"[bold red]internal error:[/] {type(err).__name__}: {err}", highlight=False)
        sys.exit(1)
