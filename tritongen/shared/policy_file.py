"""Reading the sidecar's policy file: the one step of the policy that does I/O, kept out of the pure
schema (tritongen/core/sidecar_policy/schema.py) and shared by the sidecar, which serves by it, and
the CLI, which checks it before starting the sidecar."""

from __future__ import annotations

from pathlib import Path

from tritongen.core.sidecar_policy.schema import PolicyError, SidecarPolicy, parse_policy_text


def load_policy(path: Path) -> SidecarPolicy:
    """The policy at `path`; PolicyError names the file and every problem."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PolicyError(f"cannot read the sidecar policy {path}: {err.strerror or err}") from None
    return parse_policy_text(text, str(path))
