"""`tritongen schema`: the deployment spec's JSON Schema, for editor completion and validation."""

from __future__ import annotations

from tritongen.cli.app import app
from tritongen.specio import schema_json


@app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the deployment spec (point your editor's YAML plugin at it)."""
    print(schema_json())
