"""One small exception hierarchy; the CLI maps it to exit codes in one place (cli/main.py).

    TritongenError
    ├── BadInput        exit 2: the user's spec, config.json, repository or flags are unusable
    ├── Infeasible      exit 2: the input is well-formed but cannot be satisfied (memory, placement)
    └── RunFailed       exit 1: a live operation failed (server did not start, model failed to load)

Findings from `check` and drift from `render --check` are results, not exceptions: exit 1.
"""

from __future__ import annotations


class TritongenError(Exception):
    """Base class; `str(err)` is the one message the user sees."""

    exit_code: int = 1


class BadInput(TritongenError):
    """Malformed or contradictory input. The message names the file/field and the fix."""

    exit_code = 2


class Infeasible(BadInput):
    """Well-formed input that cannot be satisfied, e.g. a KV budget that holds no sequence."""


class RunFailed(TritongenError):
    """A live operation failed; the message carries the server's own reason where there is one."""

    exit_code = 1
