"""Which module registers each command on `tritongen.cli.app.app`, and importing them.

The console script imports only the module of the command it runs (`register_for`): importing all
fourteen costs about 2 s (the simulator, protobuf, aiohttp, ...), paid by every `tritongen`
invocation, every sidecar process and every CLI test. Help, and anything that is not a known
command, imports them all, so what click lists and suggests is complete.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

COMMAND_MODULES = {
    "check": "check_cmd",
    "dashboard": "dashboard_cmd",
    "demo": "demo_cmd",
    "deploy": "deploy_cmd",
    "doctor": "doctor_cmd",
    "kv": "kv_cmd",
    "plan": "plan_cmd",
    "profile": "profile_cmd",
    "render": "render_cmd",
    "schema": "schema_cmd",
    "serve": "serve_cmd",
    "sidecar": "sidecar_cmd",
    "simulate": "simulate_cmd",
    "tune": "tune_cmd",
}


def register(names: Sequence[str] | None = None) -> None:
    """Import the modules of `names` (every command when None): each registers itself on import."""
    for name in COMMAND_MODULES if names is None else names:
        importlib.import_module(f"tritongen.cli.{COMMAND_MODULES[name]}")


def register_for(argv: Sequence[str]) -> None:
    """Register what a command line needs: its command's module, or every one."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    register([first] if first in COMMAND_MODULES else None)
