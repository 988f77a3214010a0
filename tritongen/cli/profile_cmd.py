"""`tritongen profile SPEC|--model NAME [--kind NAME=llm|classic] [--url HOST:PORT [--repo DIR] | --repo DIR] -o DIR [--quick]`.

Measures each model on a live Triton and writes `<DIR>/<model>.json` (a versioned `Profile`) and
`<DIR>/report.html` (the curves as inline SVG). With --repo alone the embedded server is started on
DIR (and may reload models for the KV-pool probe); with --url an external server is measured as it
is, and --repo beside it names the repository that server serves, so the engine's own files (its
pool, its sequence limit) are read instead of inferred from its answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tritongen.cli.app import app
from tritongen.cli.shared import KIND_HELP, kind_flags
from tritongen.core.fmt import fmt_ms
from tritongen.core.profile_types import Profile
from tritongen.errors import BadInput, RunFailed, TritongenError
from tritongen.profiler.report import write_report
from tritongen.profiler.run import Profiler, default_probe_factory, default_settings
from tritongen.profiler.targets import Target, resolve_targets, spec_entries
from tritongen.server import ServerOptions, TritonServer
from tritongen.server_flags import server_flags_from
from tritongen.shared.reach import check_grpc, derived, metrics_problem
from tritongen.specio import load_spec
from tritongen.triton_admin import Endpoints, TritonAdmin, endpoints_from_url

console = Console()
err_console = Console(stderr=True)


def _prefix_cache_cell(probe) -> str:
    """The prefix-cache probe's verdict in a few words: its longest telling length's first tokens."""
    if probe is None:
        return "-"
    verdict = {True: "cached", False: "not cached", None: "could not tell"}[probe.caches]
    longest = max(probe.samples, key=lambda s: s.prompt_tokens, default=None)
    if longest is None:
        return verdict
    return (f"{verdict}: {fmt_ms(longest.repeat_ttft_ms)} vs {fmt_ms(longest.fresh_ttft_ms)} ms at "
            f"{longest.prompt_tokens} tokens")

def _levels(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise BadInput(f"{option} takes a comma-separated list of whole numbers, e.g. 1,2,4,8; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise BadInput(f"{option} needs concurrency levels >= 1, got {text!r}")
    return sorted(set(values))


class RichReporter:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def start(self, model: str, total: int) -> None:
        self.task = self.progress.add_task(f"{model}: starting", total=total)

    def update(self, description: str, advance: int = 0) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=description, advance=advance)

    def finish(self) -> None:
        if self.task is not None:
            task = self.progress.tasks[self.task]
            self.progress.update(self.task, completed=task.total)
            self.task = None


def results_tables(profiles: list[Profile]) -> list[Table]:
    tables = []
    classic = [p for p in profiles if p.kind == "classic"]
    if classic:
        t = Table(title="Classic models: load levels (client-side latency, Triton's batches)")
        for col in ("model", "clients", "inf/s", "P50 ms", "P90 ms", "P99 ms", "mean batch", "errors", "windows"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for p in classic:
            for lv in p.load_levels:
                knee = " (knee)" if p.knee and p.knee.concurrency == lv.concurrency else ""
                t.add_row(
                    p.model,
                    f"{lv.concurrency}{knee}",
                    f"{lv.throughput_per_s:,.0f}",
                    fmt_ms(lv.p50_ms),
                    fmt_ms(lv.p90_ms),
                    fmt_ms(lv.p99_ms),
                    "-" if lv.mean_batch_size is None else f"{lv.mean_batch_size:.1f}",
                    str(lv.errors),
                    f"{lv.windows}{'' if lv.converged else '*'}",
                )
        tables.append(t)
    streaming = [p for p in profiles if p.kind == "streaming" and p.streaming]
    if streaming:
        t = Table(title="Streaming models: per-token latency (gRPC streams)")
        for col in ("model", "streams", "tok/s", "TTFT P50", "TTFT P99", "ITL P50", "ITL P99", "errors"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for p in streaming:
            for lv in p.streaming.levels:  # type: ignore[union-attr]
                t.add_row(
                    p.model, str(lv.concurrency), f"{lv.tokens_per_s:,.0f}", fmt_ms(lv.ttft_p50_ms), fmt_ms(lv.ttft_p99_ms),
                    fmt_ms(lv.itl_p50_ms), fmt_ms(lv.itl_p99_ms), str(lv.errors),
                )
        tables.append(t)
    engines = [p for p in profiles if p.engine is not None]
    if engines:
        t = Table(title="LLM engines: what simulate and tune use (measured through the model's own interface)")
        for col in ("model", "interface", "prefill", "decode step", "request path", "KV capacity", "bytes/token",
                    "prefix cache (repeat vs fresh TTFT)"):
            t.add_column(col)
        for p in engines:
            e = p.engine
            assert e is not None
            capacity = "-" if e.kv_capacity_tokens is None else f"{e.kv_capacity_tokens:,} tokens ({e.kv_capacity_source})"
            t.add_row(
                p.model, e.interface,
                f"{e.prefill_fixed_ms:.2f} ms + {e.prefill_ms_per_token * 1000:.1f} µs/token",
                f"{e.decode_fixed_ms:.2f} ms + {e.decode_ms_per_seq:.3f} ms/seq",
                f"{e.request_overhead_ms:.2f} ms", capacity, f"{e.bytes_per_token:g} ({e.bytes_per_token_source})",
                _prefix_cache_cell(e.prefix_cache),
            )
        tables.append(t)
    unary = [p for p in profiles if p.llm is not None]
    if unary:
        t = Table(title="LLMs that are not decoupled: one response per request, so TTFT is the end-to-end time")
        for col in ("model", "interface", "end-to-end by budget", "budget honoured", "static batch (probe)", "KV capacity"):
            t.add_column(col)
        for p in unary:
            u = p.llm
            assert u is not None
            by_budget = ", ".join(f"{b}: {fmt_ms(ms)} ms" for b, ms in u.latency_ms_by_budget) or "-"
            honoured = "-" if u.budget_honoured is None else ("yes" if u.budget_honoured else "no")
            fits = ", ".join(f"{b}{'' if ok else ' OOM'}" for b, ok in u.batch_fits) or "-"
            capacity = "-" if u.kv_capacity_tokens is None else f"{u.kv_capacity_tokens:,} tokens"
            t.add_row(p.model, u.interface, by_budget, honoured, fits, capacity)
        tables.append(t)
    gapped = [p for p in profiles if p.gaps]
    if gapped:
        t = Table(title="What the models did not show (optional measurements), and what was taken instead")
        for col in ("model", "measurement", "not seen", "taken instead"):
            t.add_column(col)
        for p in gapped:
            for gap in p.gaps:
                t.add_row(p.model, gap.measurement, gap.unseen, gap.inferred)
        tables.append(t)
    scaled = [p for p in classic if p.scaling is not None or p.overheads is not None]
    if scaled:
        t = Table(title="Classic models: overheads and instance scaling on one device (what simulate and tune use)")
        for col in ("model", "overheads", "instances: executions/s", "device part of an execution"):
            t.add_column(col)
        for p in scaled:
            ov = p.overheads
            over = "-" if ov is None else f"request {ov.request_ms:.2f} ms, batch {ov.batch_ms:.2f} ms + {ov.request_exec_ms:.3f} ms/request"
            sc = p.scaling
            levels = "-" if sc is None else "; ".join(
                f"{r} row(s): " + ", ".join(f"{lv.instances}: {lv.executions_per_s:,.0f}" for lv in sc.levels if lv.rows == r)
                for r in sorted({lv.rows for lv in sc.levels})
            )
            device = "-" if sc is None else "; ".join(
                f"{d.rows} row(s): {d.device_ms:.2f} of {d.execution_ms:.2f} ms (fit error {d.max_rel_error:.1%})" for d in sc.parts
            )
            t.add_row(p.model, over, levels, device)
        tables.append(t)
    summary = Table(title="Profiles")
    for col in ("model", "status", "curve fit (compute_infer)", "fit error max/mean", "KV B/token measured vs analytic", "safety pad"):
        summary.add_column(col)
    for p in profiles:
        fit = "-"
        err = "-"
        if p.fit is not None:
            fit = f"{p.fit.overhead_ms:.2f} ms + {p.fit.per_item_ms:.3f} ms x batch ({p.fit.kind})"
            err = f"{p.fit.max_rel_error:.1%} / {p.fit.mean_rel_error:.1%}"
        kv = "-"
        mem = p.memory
        if mem is not None and mem.kv_bytes_per_token_measured is not None:
            kv = f"{mem.kv_bytes_per_token_measured:.1f}"
            if mem.kv_bytes_per_token_analytic is not None:
                kv += f" vs {mem.kv_bytes_per_token_analytic}"
            if mem.kv_relative_difference is not None:
                kv += f" ({mem.kv_relative_difference:+.1%})"
        pad = "-" if mem is None or mem.recommended_kv_safety_pad_mb is None else f"{mem.recommended_kv_safety_pad_mb:.2f} MiB"
        status = "[green]complete[/]" if p.complete else "[red]partial[/]"
        summary.add_row(p.model, status, fit, err, kv, pad)
    tables.append(summary)
    return tables


@app.command("profile")
def profile(
    spec: Optional[Path] = typer.Argument(None, help="Deployment spec (YAML): profile each of its model entries."),
    model: list[str] = typer.Option([], "--model", "-m", help="Model to profile (repeatable); without SPEC, its inputs come from the server's config."),
    kind: list[str] = typer.Option([], "--kind", help=KIND_HELP),
    url: Optional[str] = typer.Option(None, "--url", help="HTTP address HOST:PORT of a running Triton."),
    grpc_url: Optional[str] = typer.Option(None, "--grpc-url", help="gRPC HOST:PORT (default: port 8001 on the --url host)."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="Metrics URL (default: http://HOST:8002/metrics)."),
    repo: Optional[Path] = typer.Option(
        None, "--repo",
        help="The model repository: alone, the embedded Triton is started on it; with --url, the repository that server "
        "serves, whose engine files (vLLM's model.json, backend parameters) the profile reads.",
    ),
    out: Path = typer.Option(..., "-o", "--out", help="Directory for <model>.json profiles and report.html."),
    quick: bool = typer.Option(False, "--quick", help="Fewer levels and short windows (smoke tests, CI)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Classic models: clients per level, e.g. 1,2,4,8,16,32."),
    stream_concurrency: Optional[str] = typer.Option(None, "--stream-concurrency", help="Streaming models: streams per level, e.g. 1,2,4,8."),
    window: Optional[float] = typer.Option(None, "--window", min=0.1, help="Seconds per measurement window."),
    kv_probe_mb: Optional[float] = typer.Option(None, "--kv-probe-mb", min=0.0, help="Size of the KV-pool resize probe in MiB (0: skip; only with --repo)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random input features."),
    allow_reload: bool = typer.Option(
        False, "--allow-reload",
        help="With --url: the server runs in explicit model-control mode and the profile may load config variants "
        "(a batching variant, 1/2/4 instances) through the model load API; the original config is loaded back after.",
    ),
    kv_capacity_probe: bool = typer.Option(
        False, "--kv-capacity-probe",
        help="Streaming LLMs that export no KV metrics: raise concurrency until the first out-of-memory answer or preemption.",
    ),
) -> None:
    """Measure models on a live Triton: latency-vs-batch curve, load levels, memory, streaming latency."""
    if spec is None and not model:
        raise BadInput("give a deployment SPEC or at least one --model NAME to profile")
    if url is None and repo is None:
        raise BadInput("give --url HOST:PORT (a running Triton; with --repo DIR, the repository it serves) or --repo DIR "
                       "alone (start the embedded Triton on it)")
    embedded = url is None
    if embedded and allow_reload:
        raise BadInput("--allow-reload goes with --url; with --repo alone the embedded server is tritongen's own and may "
                       "always reload")
    if embedded and (grpc_url or metrics_url):
        raise BadInput("--grpc-url and --metrics-url go with --url; with --repo alone the embedded server's ports are used")
    stated = kind_flags(kind, list(dict.fromkeys(model)), spec is not None)
    loaded = load_spec(spec) if spec is not None else None
    if loaded is not None:
        spec_entries(loaded, model)  # unknown names are bad input before any server is touched
    settings = default_settings(quick, seed)
    updates: dict[str, object] = {}
    if (levels := _levels(concurrency, "--concurrency")) is not None:
        updates["concurrency_levels"] = levels
    if (levels := _levels(stream_concurrency, "--stream-concurrency")) is not None:
        updates["stream_concurrency_levels"] = levels
    if window is not None:
        updates["window_s"] = window
    if kv_probe_mb is not None:
        updates["kv_probe_mb"] = kv_probe_mb
    settings = settings.model_copy(update=updates)

    server: TritonServer | None = None
    if repo is not None and not repo.is_dir():
        raise BadInput(f"--repo {repo}: not a directory")
    if embedded:
        assert repo is not None
        options = ServerOptions(
            repository=repo.resolve(),
            model_control="explicit",  # so the KV-pool probe may reload a model with another pool size
            load_models=["*"],
            extra_args=server_flags_from(repo),
        )
        server = TritonServer(options)
        with err_console.status(f"starting tritonserver on {repo}..."):
            server.start()
        endpoints = Endpoints(http=server.http_url, grpc=server.grpc_url, metrics=server.metrics_url)
    else:
        assert url is not None
        endpoints = endpoints_from_url(url, grpc_url, metrics_url)

    def server_check() -> str | None:
        ended = server.exit_report() if server is not None else None
        return f"the embedded {ended}" if ended is not None else None

    admin = TritonAdmin(endpoints)
    profiler: Profiler | None = None
    try:
        targets = resolve_targets(admin, model, loaded, stated)
        _check_endpoints(endpoints, targets, server is not None, grpc_url, metrics_url)
        for target in targets:  # said before the run, so a wrong guess costs no measurement
            if target.kind_gap is not None:
                err_console.print(f"[yellow]note:[/] {escape(target.name)}: {escape(target.kind_gap.inferred)}", highlight=False)
        progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err_console,
        )
        profiler = Profiler(
            admin,
            endpoints,
            settings,
            out,
            reporter=RichReporter(progress),
            probe_factory=default_probe_factory(endpoints, server.process.pid if server and server.process else None),
            can_reload=server is not None or allow_reload,
            server_check=server_check,
            kv_capacity_probe=kv_capacity_probe,
            repository=repo.resolve() if repo is not None else None,
        )
        try:
            with progress:
                profiler.run(targets)
        except KeyboardInterrupt:
            raise RunFailed("interrupted (Ctrl-C)" + _kept(profiler, out)) from None
        except TritongenError as err:
            err.args = (str(err) + _kept(profiler, out),)
            raise
    finally:
        admin.close()
        if server is not None:
            server.stop()

    assert profiler is not None
    for table in results_tables(profiler.profiles):
        console.print(table)
    for p in profiler.profiles:
        if p.variant:
            console.print(f"[yellow]note[/] {p.model}: the load levels ran on {p.variant}")
        for note in p.notes:
            console.print(f"[yellow]note[/] {p.model}: {note}")
    report = write_report(profiler.profiles, out)
    console.print(f"[green]wrote[/] {', '.join(str(p) for p in profiler.written)} and {report}")


def _check_endpoints(
    endpoints: Endpoints, targets: list[Target], embedded: bool, grpc_url: str | None, metrics_url: str | None
) -> None:
    """Before any measurement: streaming models need Triton's gRPC endpoint (an error naming the
    address and --grpc-url); the metrics endpoint is optional (a note naming it and --metrics-url)."""
    def how(given: str | None, option: str, form: str) -> str:
        return "the embedded server's" if embedded else option if given else derived(option, "--url", form)

    if any(t.kind == "streaming" for t in targets):
        check_grpc(endpoints.grpc, how(grpc_url, "--grpc-url", "HOST:PORT"))
    problem = metrics_problem(endpoints.metrics, how(metrics_url, "--metrics-url", "URL"))
    if problem:
        err_console.print(f"[yellow]note:[/] {escape(problem)}; profiling without Triton's metrics (no KV or engine "
                          "gauges)", highlight=False)


def _kept(profiler: Profiler, out: Path) -> str:
    """Say what was kept; write the report of what was measured, partial profiles included."""
    if not profiler.profiles:
        return ""
    try:
        report = write_report(profiler.profiles, out)
    except OSError:
        report = None
    partial = [p.model for p in profiler.profiles if not p.complete]
    kept = ", ".join(str(p) for p in profiler.written)
    extra = f" and {report}" if report else ""
    return f"\nkept what was measured ({'partial: ' + ', '.join(partial) if partial else 'all complete'}): {kept}{extra}"
