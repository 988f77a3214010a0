"""`tritongen render SPEC -o DIR`: write the model repository the spec and arithmetic imply."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.cli.shared import TRITON_RELEASE_HELP, triton_release
from tritongen.core.spec import MIB
from tritongen.profiles import measured_pads_mb, read_profiles
from tritongen.errors import BadInput
from tritongen.render import drift, release_findings, render_repository, write_repository
from tritongen.specio import load_spec

console = Console()


@app.command("render")
def render(
    spec: Path = typer.Argument(..., help="Deployment spec (YAML)."),
    out: Path = typer.Option(..., "-o", "--out", help="Model repository to write (created if missing)."),
    templates: Optional[Path] = typer.Option(None, "--templates", help="Directory of templates overriding the built-in ones."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 with a diff if DIR differs from the render."),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", help="Profiles from `tritongen profile`: the KV safety pad comes from each LLM's measured prefill peak."
    ),
    release: Optional[str] = typer.Option(None, "--triton-release", help=TRITON_RELEASE_HELP),
) -> None:
    """Render config.pbtxt (and backend files) for every model; atomic, deterministic."""
    loaded = load_spec(spec)
    measured = read_profiles(profiles) if profiles else None
    pads = measured_pads_mb(measured) if measured else None
    rendered = render_repository(loaded, templates, pads, measured)
    target = triton_release(release)
    said = release_findings(rendered, target) if target is not None else []
    refused = [f for f in said if f.severity == "error"]
    if refused:  # nothing is written: the release would refuse these configs
        raise BadInput("; ".join(f"{f.path}: {f.message} (fix: {f.fix})" for f in refused))
    for finding in said:
        console.print(f"[yellow]note:[/] {finding.path}: {finding.message}", highlight=False, soft_wrap=True)
    if check:
        diff = drift(rendered, out)
        if diff:
            print(diff, end="")
            console.print(f"[red]drift:[/] {out} differs from what {spec} renders; run `tritongen render {spec} -o {out}`")
            raise typer.Exit(code=1)
        console.print(f"[green]no drift:[/] {out} matches {spec}")
        return
    changed = write_repository(rendered, out)
    assert rendered.plan is not None
    table = Table(title=f"{loaded.spec.name}: {len(rendered.plan.entries)} model entries -> {out}")
    for column in ("model", "max batch", "preferred", "delay", "levels", "instances", "KV budget", "seqs"):
        table.add_column(column)
    for entry in rendered.plan.entries:
        batching = entry.dynamic_batching
        groups = ", ".join(f"{g.count}x{g.kind[5:]}{g.gpus or ''}" for g in entry.instance_groups)
        table.add_row(
            entry.name,
            str(entry.max_batch_size),
            " ".join(map(str, batching.preferred_batch_sizes)) if batching else "-",
            f"{batching.max_queue_delay_us / 1000:g} ms" if batching else "-",
            str(batching.priority_levels) if batching and batching.priority_levels else "-",
            groups,
            f"{entry.kv.budget_bytes / MIB:.1f} MiB" if entry.kv else "-",
            str(entry.kv.max_sequences) if entry.kv else "-",
        )
    console.print(table)
    for placement in rendered.plan.placements:
        if placement.quota_default:  # say which default each model got: nothing in the spec states it
            console.print(f"memory quota of {placement.model}: {placement.quota_bytes / MIB:.1f} MiB, "
                          f"{placement.quota_source}", highlight=False)
    console.print(f"{len(changed)} file(s) written" + (": " + ", ".join(changed) if changed else " (already up to date)"))
    code = [e.name for e in rendered.plan.entries if e.llm_args is not None and not (out / e.name / "1" / "model.py").is_file()]
    if code:  # render writes model.yaml and config.pbtxt, never the model's code
        console.print(f"[yellow]note:[/] copy model.py and helpers.py from TensorRT-LLM's "
                      f"triton_backend/all_models/llmapi/tensorrt_llm/1/ into {out}/<model>/1/ for {', '.join(code)}")
    missing = [e.name for e in rendered.plan.entries if not any((out / e.name).glob("[0-9]*"))]
    if missing:
        console.print(f"[yellow]note:[/] no version folder yet for {', '.join(missing)}: put the model files in {out}/<model>/1/")
