"""Imports every command module so each registers itself on `tritongen.cli.app.app`."""

from tritongen.cli import (  # noqa: F401
    check_cmd,
    dashboard_cmd,
    demo_cmd,
    deploy_cmd,
    doctor_cmd,
    kv_cmd,
    plan_cmd,
    profile_cmd,
    render_cmd,
    schema_cmd,
    serve_cmd,
    sidecar_cmd,
    simulate_cmd,
    tune_cmd,
)
