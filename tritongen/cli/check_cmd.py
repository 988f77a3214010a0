"""`tritongen check [SPEC] DIR`: lint a Triton model repository for CI.

Exit codes: 0 no error finding (warnings allowed), 1 at least one error finding, 2 DIR unusable
or bad flags. Outputs: text (one line per finding and a summary), `--json` (`findings` and
`summary`), `--github` (workflow-command annotations). The spec is the first positional, as on
every command that reads one; `--spec` and `--format` are the old spellings (tritongen/cli/vocabulary.py).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from tritongen.cli.app import app
from tritongen.cli.shared import TRITON_RELEASE_HELP, output_from_format, renamed, triton_release
from tritongen.core.findings import Finding
from tritongen.errors import BadInput
from tritongen.repository import CheckReport, ExtraRule, check_repository


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    github = "github"


def _spec_rules(spec: Optional[Path], profiles: Optional[Path], directory: Path) -> list[ExtraRule]:
    if spec is None:
        if profiles is not None:
            raise BadInput("--profiles needs the spec (`check SPEC DIR --profiles P`: the profiles refine the spec's render)")
        return []
    from tritongen.spec_rules import rules_for_spec

    return list(rules_for_spec(spec, profiles, directory))


def spec_and_directory(paths: list[Path], spec_option: Optional[Path]) -> tuple[Optional[Path], Path]:
    """`[SPEC] DIR` (and the old `--spec`) as (spec or None, repository). The spec comes first as on
    every command; a spec and a repository given the other way round are named, not misread."""
    if not 1 <= len(paths) <= 2:
        raise BadInput(f"check takes [SPEC] DIR: the deployment spec (optional), then the model repository; got {len(paths)} paths")
    spec, directory = (paths[0], paths[1]) if len(paths) == 2 else (None, paths[0])
    if spec is not None and spec.is_dir() and directory.is_file():
        raise BadInput(f"the spec comes first: tritongen check {directory} {spec}")
    return renamed(spec, spec_option, "SPEC", "--spec"), directory


def _gpu_count(gpus: Optional[int], spec: Optional[Path]) -> tuple[Optional[int], Optional[str]]:
    """How many GPUs the serving host has, and who says so: --gpus, else the spec's hardware,
    else nobody here (check_repository then asks NVML)."""
    if gpus is not None:
        return gpus, "the serving host (--gpus)"
    if spec is not None:
        from tritongen.specio import load_spec

        hardware = load_spec(spec).spec.hardware  # a CPU-only spec's one device is its memory pool, not a GPU
        return sum(gpu.count for gpu in hardware.gpus), f"the spec's hardware ({spec.name})"
    return None, None


def format_text_line(finding: Finding) -> str:
    where = finding.path or finding.model or "."
    if finding.line is not None:
        where += f":{finding.line}"
    subject = " ".join(part for part in (finding.model, finding.field) if part)
    return f"{where}: {finding.severity} {finding.code} {subject}: {finding.message} (fix: {finding.fix})"


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def format_github_line(finding: Finding) -> str:
    props = []
    if finding.path:
        props.append(f"file={_escape_property(finding.path)}")
    if finding.line is not None:
        props.append(f"line={finding.line}")
    props.append(f"title={_escape_property(finding.code + (' ' + finding.field if finding.field else ''))}")
    message = f"{finding.message} (fix: {finding.fix})"
    level = "notice" if finding.severity == "note" else finding.severity  # GitHub's word for a note
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


def report_to_json(report: CheckReport) -> str:
    return json.dumps(
        {"findings": [f.to_dict() for f in report.findings], "summary": report.summary()},
        indent=2,
    )


def _print_summary(report: CheckReport, console: Console) -> None:
    models = len(report.models)
    errors, warnings = report.error_count, report.warning_count
    notes = sum(1 for f in report.findings if f.severity == "note")
    counts = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    counts += f", {notes} note{'s' * (notes != 1)}" if notes else ""
    where = f"{models} model{'s' * (models != 1)} in {report.root}"
    gpu = "GPU host" if report.gpu_available else "no GPU on this host"
    if errors:
        line = f"[bold red]✗ {counts}[/]"
    elif warnings or notes:
        line = f"[bold yellow]✓ {counts}[/]"
    else:
        line = "[bold green]✓ no findings[/]"
    console.print(f"{line} ({escape(where)}; {gpu})", highlight=False, soft_wrap=True)


@app.command("check")
def check(
    paths: list[Path] = typer.Argument(
        ..., metavar="[SPEC] DIR", show_default=False,
        help="The deployment spec (optional: also check memory feasibility, the KV budget and drift), then the model "
        "repository: one sub-directory per model.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the findings and a summary as one JSON object."),
    github: bool = typer.Option(False, "--github", help="Print GitHub workflow annotations (::error file=...,line=...::)."),
    gpu: Optional[bool] = typer.Option(
        None, "--gpu/--no-gpu",
        help="Whether the serving host has GPUs (KIND_GPU warnings); default: ask NVML here.",
    ),
    autofill: bool = typer.Option(
        True, "--autofill/--no-autofill",
        help="Whether the server auto-completes configs from model files (its default); --no-autofill for a "
        "server run with --disable-auto-complete-config or --strict-model-config=true.",
    ),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", min=0,
        help="GPUs on the serving host; instance-group gpu ids are checked against it "
        "(default: the spec's hardware with SPEC, else NVML here).",
    ),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", help="Profiles the repository was rendered with (`render --profiles`); needs SPEC."
    ),
    release: Optional[str] = typer.Option(None, "--triton-release", help=TRITON_RELEASE_HELP),
    output_format: Optional[OutputFormat] = typer.Option(
        None, "--format", "-f", hidden=True, help="Deprecated: --json, --github, or neither for text."
    ),
    spec_option: Optional[Path] = typer.Option(None, "--spec", hidden=True, help="Deprecated: SPEC, the first positional."),
) -> None:
    """Check a model repository the way tritonserver loads it; exit 1 on any error finding."""
    spec, directory = spec_and_directory(paths, spec_option)
    target = triton_release(release)
    chosen = OutputFormat(output_from_format(
        None if output_format is None else output_format.value, {"json": as_json, "github": github}))
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} is not a directory; give the model repository directory")
    count, source = _gpu_count(gpus, spec)
    report = check_repository(directory, gpu_available=gpu, gpu_count=count, gpu_count_source=source,
                              autofill=autofill, extra_rules=_spec_rules(spec, profiles, directory), release=target)
    if chosen is OutputFormat.json:
        typer.echo(report_to_json(report))
    elif chosen is OutputFormat.github:
        for finding in report.findings:
            typer.echo(format_github_line(finding))
        typer.echo(
            f"tritongen check: {report.error_count} error(s), {report.warning_count} warning(s) "
            f"in {len(report.models)} model(s)"
        )
    else:
        for finding in report.findings:
            typer.echo(format_text_line(finding))
        _print_summary(report, Console(highlight=False))
    if not report.ok:
        raise typer.Exit(code=1)
