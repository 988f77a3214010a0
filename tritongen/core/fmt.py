"""How a duration in milliseconds reads in a table or a message, the same everywhere.

One formatter for profile's, tune's and simulate's tables, doctor's findings and the benches: a
reader comparing two tables must not meet 123.4 in one and 123 in the other for the same figure.
Pure (no I/O, no third-party import), so core and the CLI both use it.
"""

from __future__ import annotations


def fmt_ms(value: float | None, unit: str = "") -> str:
    """Milliseconds: "-" for no value; whole milliseconds from 100 ms (a tenth is noise there), one
    decimal below. `unit` (e.g. " ms") follows a number, never the dash."""
    if value is None:
        return "-"
    return (f"{value:.0f}" if value >= 100 else f"{value:.1f}") + unit
