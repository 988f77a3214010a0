"""The console-script entry point: the command it runs registered on the app (tritongen/cli/commands.py
says why only that one), errors mapped to exit codes only here. `app` imported from here is
always complete: every command is registered the first time it is asked for."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

try:  # typer >= 0.20 vendors click as typer._click; older versions depend on click itself
    from typer import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]

from tritongen.cli import app as _app_module
from tritongen.cli import commands
from tritongen.errors import TritongenError

__all__ = ["app", "run"]

err_console = Console(stderr=True)


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        commands.register()
        return _app_module.app
    raise AttributeError(name)


def run() -> None:
    """Console-script entry point: one message and an exit code, never a traceback."""
    try:
        commands.register_for(sys.argv[1:])
        code = _app_module.app(prog_name="tritongen", standalone_mode=False)
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
