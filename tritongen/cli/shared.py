"""What more than one command prints the same way. Imports no command module: commands import
this, `app` and the library, never each other."""

from __future__ import annotations

from rich.console import Console

from tritongen.core.simulator import ServiceCurve


def say_calibration(out: Console, overheads_used: str, device_curve: ServiceCurve | None, note: str | None, prefix: str = "") -> None:
    """Which overheads and which shared device the simulation uses, in one or two lines."""
    out.print(f"[dim]{prefix}overheads: {overheads_used}[/]")
    if device_curve is not None:
        out.print(f"[dim]{prefix}shared device: a part of {device_curve.fixed_ms:g} ms + {device_curve.per_item_ms:g} ms/row of "
                  "each execution is taken in turns by the instances of a device (the profile's instance scaling)[/]")
    if note:
        out.print(f"[yellow]note:[/] {prefix}{note}")
