"""`tritongen render SPEC -o DIR`: write the model repository the spec and arithmetic imply.

Without a SPEC, `tritongen render --profiles DIR -o OUT` writes only `OUT/sidecar_policy.json`,
from the profiles of a server the user already runs (issue 43): the same command that writes the
policy from a spec, with the same flags meaning the same things; the configs are the server's own,
so nothing else is written (docs/commands.md says why render and not a command of its own)."""

from __future__ import annotations

import json
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
from tritongen.render import (
    SIDECAR_POLICY_FILE,
    drift,
    release_findings,
    render_policy_only,
    render_repository,
    write_repository,
)
from tritongen.specio import load_spec

console = Console()


@app.command("render")
def render(
    spec: Optional[Path] = typer.Argument(
        None, help="Deployment spec (YAML). Without it, --profiles DIR: only the sidecar policy, from the profiles."
    ),
    out: Path = typer.Option(
        ..., "-o", "--out", help="Model repository to write (created if missing); without a SPEC, the folder "
        "sidecar_policy.json is written to (the server's model repository, or any)."
    ),
    templates: Optional[Path] = typer.Option(None, "--templates", help="Directory of templates overriding the built-in ones."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 with a diff if DIR differs from the render."),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", help="Profiles from `tritongen profile`: the KV safety pad comes from each LLM's measured "
        "prefill peak; without a SPEC, the whole sidecar policy comes from them."
    ),
    release: Optional[str] = typer.Option(None, "--triton-release", help=TRITON_RELEASE_HELP),
    p99_ms: Optional[float] = typer.Option(
        None, "--p99-ms", help="Without a SPEC: the P99 target of the policy's one class, ms (time to first token "
        "for streaming LLMs). Default: assumed from the profiles (5 x the slowest model's P99 at its lowest load), "
        "and said so."
    ),
) -> None:
    """Render config.pbtxt (and backend files) for every model; atomic, deterministic. Without a SPEC,
    only the sidecar policy, from --profiles."""
    if spec is None:
        _policy_only(out, profiles, templates, release, p99_ms, check)
        return
    if p99_ms is not None:
        raise BadInput("--p99-ms goes with --profiles and no SPEC: with a SPEC, its traffic_classes state each "
                       "class's p99_ms; drop --p99-ms or change the spec")
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


def _policy_only(out: Path, profiles: Optional[Path], templates: Optional[Path], release: Optional[str],
                 p99_ms: Optional[float], check: bool) -> None:
    """`render --profiles DIR -o OUT` without a SPEC: OUT/sidecar_policy.json and nothing else."""
    if profiles is None:
        raise BadInput("give a SPEC (the repository it implies), or --profiles DIR without one (only the sidecar "
                       "policy, from the profiles of a server you run)")
    for flag, given in (("--templates", templates), ("--triton-release", release)):
        if given is not None:
            raise BadInput(f"{flag} shapes config.pbtxt files, which render writes only from a SPEC; without one "
                           f"it writes only the sidecar policy: drop {flag} or give the SPEC")
    if p99_ms is not None and not p99_ms > 0:
        raise BadInput(f"--p99-ms {p99_ms:g}: a latency target is a positive number of milliseconds")
    rendered = render_policy_only(profiles, p99_ms)
    if check:
        diff = drift(rendered, out)
        if diff:
            print(diff, end="")
            console.print(f"[red]drift:[/] {out} differs from what {profiles} renders; run `tritongen render "
                          f"--profiles {profiles} -o {out}`", highlight=False)
            raise typer.Exit(code=1)
        console.print(f"[green]no drift:[/] {out}/{SIDECAR_POLICY_FILE} matches {profiles}", highlight=False)
        return
    policy = json.loads(rendered.files[SIDECAR_POLICY_FILE])
    changed = write_repository(rendered, out)
    table = Table(title=f"sidecar policy from {profiles} (no spec) -> {out}/{SIDECAR_POLICY_FILE}")
    for column in ("model", "kind", "KV pool (tokens)", "block", "kv_policy", "priced in", "max in flight"):
        table.add_column(column)
    for model in policy["models"]:
        kv = model.get("kv")
        table.add_row(
            model["name"], model["kind"] + (" (stream)" if model["streaming"] else ""),
            str(kv["max_context"]) if kv else "-", str(kv["block_tokens"]) if kv else "-",
            (kv["kv_policy"] or "not seen: reserve") if kv else "-",
            ("tokens" if kv["bytes_per_token_source"] == "tokens" else f"{kv['bytes_per_token']:g} B/token") if kv else "-",
            str(model["max_inflight"] or "-"),
        )
    console.print(table)
    klass = policy["classes"][0]
    console.print(f"class {klass['name']}: P99 target {klass['p99_ms']:g} ms", highlight=False)
    for note in policy["notes"]:  # what was assumed, not measured; every derivation is in the file's notes
        if "assumed" in note:
            console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    console.print(f"{len(changed)} file(s) written" + (": " + ", ".join(changed) if changed else " (already up to date)"))
