"""Imports every command module so each registers itself on `tritongen.cli.main.app`."""

from tritongen.cli import (  # noqa: F401
    check_cmd,
    demo_cmd,
    kv_cmd,
    profile_cmd,
    render_cmd,
    schema_cmd,
    serve_cmd,
)
