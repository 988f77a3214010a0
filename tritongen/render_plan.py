"""Render an already-built `DeploymentPlan` (for example one `tune` changed) into repository files.

`render.render_repository` plans from a spec and renders; this renders a plan it is given, with
the same templates, the same parse-back through Triton's `ModelConfig` schema and the same
`RenderedRepository` result, so `render.write_repository` writes it atomically.
"""

from __future__ import annotations

from pathlib import Path

from tritongen.core.plan import DeploymentPlan
from tritongen.render import render_plan

__all__ = ["render_entry_config", "render_plan"]


def render_entry_config(plan: DeploymentPlan, entry_name: str, spec_name: str, templates: Path | None = None) -> str:
    """The config.pbtxt text of one entry (what `verify` loads on a live server)."""
    rendered = render_plan(plan, spec_name, templates)
    return rendered.files[f"{entry_name}/config.pbtxt"]
