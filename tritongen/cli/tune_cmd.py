"""`tritongen tune SPEC --profiles DIR --traffic T [--verify [--repo DIR]] [-o DIR] [--json]`.

Searches max batch size, preferred sizes, queue window, instance count and priority policy of
every model with the simulator (`tritongen.core.tune`), optionally confirms the best few on the
embedded server under the same traffic (`tritongen.tuner.verify`), and renders the winner. The
output explains itself: chosen values against the plan's, predicted (and measured) figures, and
the runner-up. Exit 0 when every model has a config that meets its targets, 1 otherwise.

Machine output as on every command: `--json` prints the results as one JSON document on stdout
(the tables then go to stderr); `--report FILE` writes the same document to FILE (atomically) with
the tables on stdout. `--repository` is the old spelling of `--repo`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.cli.shared import renamed, say_calibration
from tritongen.core.plan import DeploymentPlan, ModelEntryPlan
from tritongen.core.profile_types import EngineMeasurement
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.core.engine import EngineModel
from tritongen.core.fmt import fmt_ms
from tritongen.core.live_verdict import capacity_rank, keeps_up, live_verdict, throughput_rank
from tritongen.engine_files import entry_engine, entry_interface
from tritongen.core.served_overheads import choose_overheads, profile_device_curve
from tritongen.core.simulator import ServiceCurve, rate_limit_from_flags
from tritongen.core.traffic import Arrivals
from tritongen.core.tune import (
    Evaluation,
    Params,
    TuneInputs,
    TuneResult,
    apply_candidate,
    apply_results,
    spec_with_tuned_engines,
    CAPACITY_STEPS,
    baseline_params,
    capacity_factor,
    entry_device,
    evaluate,
    memory_budget,
    tune_model,
)
from tritongen.dashboard import write_text_atomic
from tritongen.errors import BadInput
from tritongen.profiles import measured_pads_mb, read_profiles
from tritongen.render import model_dir_tokenizers, render_entry_config, render_plan, write_repository
from tritongen.core.plan import plan_deployment
from tritongen.specio import load_spec
from tritongen.traffic_files import arrivals_from, read_traffic

console = Console()


def entry_arrivals(arrivals: Arrivals, plan: DeploymentPlan, entry: ModelEntryPlan, spec) -> Arrivals:
    """The requests this entry serves: its model's classes (traffic `model:` permitting), its lane."""
    model = next(m for m in spec.models if m.name == entry.spec_model)
    served = {c.name for c in spec.classes_of(model)}
    keep_class = [
        (name in served) and (arrivals.class_model[i] in (None, entry.spec_model))
        for i, name in enumerate(arrivals.class_names)
    ]
    mask = np.asarray(keep_class, dtype=bool)[arrivals.cls] if len(arrivals) else np.zeros(0, dtype=bool)
    if entry.lane == "short" and entry.prompt_tokens_max is not None:
        mask &= arrivals.prompt <= entry.prompt_tokens_max
    elif entry.lane == "long":
        short = next((e for e in plan.entries if e.spec_model == entry.spec_model and e.lane == "short"), None)
        if short is not None and short.prompt_tokens_max is not None:
            mask &= arrivals.prompt > short.prompt_tokens_max
    out = arrivals.take(mask)
    out.class_model = [None] * len(out.class_names)
    return out


def engine_rows(engine: EngineModel, cols: list[Evaluation | None]) -> list[tuple[str, object]]:
    """The engine knobs the search varied (`tune.engine_knobs`), a value the candidate leaves as
    served shown as the engine's with "(served)"; rows only for knobs some column changes."""
    rows: list[tuple[str, object]] = []
    for label, field, show in (
        ("step token budget", "max_batched_tokens", lambda v: "no limit" if v is None else str(v)),
        ("prefix cache", "prefix_caching", lambda v: "on" if v else "off"),
        ("KV capacity policy", "kv_policy", str),
    ):
        if any(e is not None and getattr(e.params, field) is not None for e in cols):
            rows.append((label, lambda e, f=field, s=show: s(getattr(e.params, f)) if getattr(e.params, f) is not None
                         else f"{s(getattr(engine, f))} (served)"))
    return rows


def explain(result: TuneResult, baseline: Evaluation | None, measured: dict[str, object] | None,
            engine: EngineModel | None = None) -> None:
    w, r = result.winner, result.runner_up
    table = Table(title=f"{result.model}: {result.candidates} candidates simulated, {result.feasible} meet every target")
    table.add_column("")
    table.add_column("plan (baseline)")
    table.add_column("winner", style="green")
    table.add_column("runner-up")
    cols = [baseline, w, r]

    def cell(e: Evaluation | None, f) -> str:
        return "-" if e is None else f(e)

    rows = [
        ("max_batch_size", lambda e: str(e.params.max_batch_size)),
        ("preferred sizes", lambda e: " ".join(map(str, e.params.preferred)) or "(= max)"),
        ("queue window", lambda e: f"{e.params.delay_us / 1000:g} ms"),
        ("instances", lambda e: str(e.params.instances)),
        ("priority policy", lambda e: e.params.policy),
    ]
    if any(e is not None and e.params.max_num_seqs for e in cols):
        rows.append(("max_num_seqs", lambda e: str(e.params.max_num_seqs)))
    if engine is not None:
        rows += engine_rows(engine, cols)
    for name in w.p99_ms:
        rows.append((f"{name} P99 ms (pred.)", lambda e, n=name: fmt_ms(e.p99_ms.get(n))))
    rows += [
        ("throughput /s (pred.)", lambda e: f"{e.throughput_per_s:.1f}"),
        ("capacity within targets", lambda e: "-" if e.capacity_factor is None else f"x{e.capacity_factor:.2f} = {e.capacity_factor * e.offered_per_s:.0f}/s"),
        ("utilisation (pred.)", lambda e: f"{e.utilisation:.0%}"),
        ("meets targets", lambda e: "yes" if e.feasible else f"no: {e.reason}"),
    ]
    for label, f in rows:
        table.add_row(label, *[cell(e, f) for e in cols])
    if measured:
        for label, values in measured.items():
            table.add_row(label, *values)  # type: ignore[arg-type]
    console.print(table)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")


@app.command("tune")
def tune(
    spec: Path = typer.Argument(..., help="Deployment spec (YAML)."),
    profiles: Path = typer.Option(..., "--profiles", help="Directory of profiles from `tritongen profile`."),
    traffic: Path = typer.Option(..., "--traffic", help="Traffic file (examples/traffic/*.yaml); classes named as in the spec."),
    verify: bool = typer.Option(False, "--verify", help="Run the best candidates on the embedded server and keep the measured winner."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write the tuned repository here (default: print only)."),
    repo: Optional[Path] = typer.Option(
        None, "--repo", help="Where the models' code is, for --verify (default: -o DIR, else ./model_repository)."
    ),
    requests: int = typer.Option(4000, "--requests", min=200, help="Requests per simulation during the search."),
    verify_requests: int = typer.Option(2000, "--verify-requests", min=100, help="Requests per live run with --verify."),
    verify_top: int = typer.Option(3, "--verify-top", min=1, max=6, help="Candidates per model to run live."),
    seed: int = typer.Option(0, "--seed"),
    overheads: Optional[str] = typer.Option(
        None, "--overheads",
        help="Default: those each profile measured on its server. 'embedded' (constants fitted on tritongen's 2-core "
        "CPU host), 'none' (an ideal server), or key=value,... over the default.",
    ),
    objective: str = typer.Option(
        "targets", "--objective",
        help="'targets': the best config that meets every target at the traffic's rate (then the most capacity); "
        "'capacity': the config that carries the highest rate of this traffic's mix within every target.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the results as one JSON document on stdout; the tables go to stderr."
    ),
    report: Optional[Path] = typer.Option(
        None, "--report", metavar="FILE",
        help="Also write the JSON --json prints to FILE (atomically), the tables staying on stdout.",
    ),
    max_error: float = typer.Option(0.01, "--max-error", min=0.0, max=1.0, help="Largest share of a class that may be rejected or killed."),
    only: Optional[list[str]] = typer.Option(None, "--model", "-m", help="Tune only these model entries (repeat); the rest keep the plan."),
    repository: Optional[Path] = typer.Option(None, "--repository", hidden=True, help="Deprecated: --repo."),
) -> None:
    """Find each model's best config for the traffic with the simulator; optionally confirm it live."""
    repo = renamed(repo, repository, "--repo", "--repository")
    # With --json stdout carries the JSON document alone: this module's console (tables, notes, the
    # spinner) writes to stderr for this run, where a human still sees it and a pipe does not.
    console.stderr = as_json
    loaded = load_spec(spec)
    profs = read_profiles(profiles)
    plan = plan_deployment(loaded.spec, loaded.architectures, measured_pads_mb(profs))
    tspec, trace_text = read_traffic(traffic)
    spec_classes = {c.name: c for c in loaded.spec.traffic_classes}
    unknown = [c.name for c in tspec.classes if c.name not in spec_classes]
    if unknown:
        raise BadInput(f"{traffic}: classes {unknown} are not traffic classes of {spec} ({sorted(spec_classes)})")
    arrivals = arrivals_from(tspec, trace_text, seed, requests if tspec.shape != "trace" else None, str(traffic))
    arrivals = arrivals.with_priorities({name: c.priority for name, c in spec_classes.items()})
    if objective not in ("targets", "capacity"):
        raise BadInput(f"--objective {objective!r}: choose 'targets' or 'capacity'")
    flags = plan.server_flags
    rate_limit, resources = rate_limit_from_flags(flags)
    started = time.perf_counter()
    results: dict[str, TuneResult] = {}
    inputs_by: dict[str, TuneInputs] = {}
    engines: dict[str, EngineMeasurement | None] = {}  # per entry: what sizes a live check's prompts (salt surplus, word tokens)
    baselines: dict[str, Evaluation] = {}
    names = {e.name for e in plan.entries}
    unknown_models = sorted(set(only or []) - names)
    if unknown_models:
        raise BadInput(f"--model {unknown_models}: not entries of the plan ({sorted(names)})")
    for entry in plan.entries:
        if only and entry.name not in only:
            continue
        profile = profs.get(entry.name) or profs.get(entry.spec_model)
        if profile is None:
            console.print(f"[yellow]skip[/] {entry.name}: no profile in {profiles}; it keeps the plan's settings")
            continue
        model = next(m for m in loaded.spec.models if m.name == entry.spec_model)
        if (entry.kind == "llm") != (profile.kind == "streaming"):
            console.print(f"[yellow]skip[/] {entry.name}: its profile is {profile.kind}, the plan says {entry.kind}")
            continue
        curve: ServiceCurve | None = None
        engine: EngineModel | None = None
        try:
            if profile.kind == "streaming":
                engine = entry_engine(entry, model, profile, device=entry_device(loaded.spec, plan, entry))
            else:
                curve = ServiceCurve.from_profile(profile)
        except ValueError as err:
            raise BadInput(f"profile of {entry.name}: {err}") from None
        arr = entry_arrivals(arrivals, plan, entry, loaded.spec)
        if len(arr) < 50:
            console.print(f"[yellow]skip[/] {entry.name}: the traffic sends it {len(arr)} requests")
            continue
        available, per_instance = memory_budget(plan, entry)
        ov, overheads_used = choose_overheads(overheads, profile)
        device_curve, share_note = profile_device_curve(profile)
        say_calibration(console, overheads_used, device_curve, share_note, f"{entry.name}: ")
        inputs = TuneInputs(
            spec=loaded.spec, entry=entry, arrivals=arr, classes=loaded.spec.classes_of(model), curve=curve,
            engine=engine, overheads=ov, memory_available_bytes=available,
            instance_bytes=per_instance, rate_limit=rate_limit, resources=resources,
            max_error_fraction=max_error, seed=seed, device_curve=device_curve, objective=objective,  # type: ignore[arg-type]
        )
        with console.status(f"tuning {entry.name} ({len(arr)} requests per simulation)..."):
            results[entry.name] = tune_model(inputs)
            baselines[entry.name] = evaluate(inputs, baseline_params(entry))[0]
            if objective == "capacity":
                base = baselines[entry.name]
                base.capacity_factor = capacity_factor(inputs, base.params, inputs.arrivals, steps=CAPACITY_STEPS, below=True)
        inputs_by[entry.name] = inputs
        engines[entry.name] = profile.engine
    if not results:
        raise BadInput(f"nothing to tune: no plan entry of {spec} has a profile in {profiles}")
    search_s = time.perf_counter() - started
    choices: dict[str, Params] = {name: r.winner.params for name, r in results.items()}
    measured_rows: dict[str, dict[str, object]] = {}
    measured_capacity: dict[str, dict[Params, float | None]] = {}
    verify_started = time.perf_counter()
    if verify and objective == "capacity":
        choices, measured_rows, measured_capacity = _verify_capacity(
            loaded, plan, results, baselines, inputs_by, tspec, trace_text, seed, verify_requests, verify_top,
            repo or out or Path("model_repository"), spec.name, engines,
        )
    elif verify:
        choices, measured_rows = _verify(
            loaded, plan, results, baselines, inputs_by, tspec, trace_text, seed, verify_requests, verify_top,
            repo or out or Path("model_repository"), spec.name, engines,
        )
    verify_s = time.perf_counter() - verify_started if verify else 0.0
    for name, result in results.items():
        explain(result, baselines.get(name), measured_rows.get(name), inputs_by[name].engine)
        if verify and choices[name] != result.winner.params:
            console.print(f"[bold]{name}:[/] the live measurement preferred [green]{choices[name].label()}[/] over the simulator's pick")
    tuned = apply_results(
        plan,
        {name: apply_candidate(plan.entry(name), p, inputs_by[name].classes, loaded.spec) for name, p in choices.items()},
    )
    tuned_spec, spec_notes = spec_with_tuned_engines(loaded.spec, plan, choices)
    for note in spec_notes:
        console.print(f"note: {note}")
    policy = build_sidecar_policy(tuned_spec, tuned, profs, model_dir_tokenizers(loaded, tuned))
    rendered = render_plan(tuned, spec.name, sidecar_policy=policy)
    console.print(f"[dim]search: {sum(r.candidates for r in results.values())} simulations in {search_s:.1f} s[/]")
    doc = report_doc(results, choices, measured_capacity, inputs_by, search_s, verify_s)
    if report is not None:
        write_text_atomic(report, json.dumps(doc, indent=2) + "\n")  # a reader never sees half a report
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    if out is not None:
        changed = write_repository(rendered, out)
        console.print(f"{len(changed)} file(s) written to {out}" + (": " + ", ".join(changed) if changed else " (already up to date)"))
    else:
        for name in choices:
            console.print(f"[bold]{name}/config.pbtxt[/] (pass -o DIR to write):")
            console.print(rendered.files[f"{name}/config.pbtxt"], highlight=False, markup=False)
    met = [r.winner.feasible if r.objective == "targets" else (r.winner.capacity_factor or 0.0) > 0 for r in results.values()]
    if not all(met):
        raise typer.Exit(code=1)


def report_doc(results, choices, measured_capacity, inputs_by, search_s: float, verify_s: float) -> dict[str, object]:
    """The results for scripts and benches: what --json prints and --report writes."""
    doc: dict[str, object] = {"search_s": round(search_s, 3), "verify_s": round(verify_s, 3), "models": {}}
    for name, result in results.items():
        rate = inputs_by[name].arrivals.mean_rate
        chosen = choices[name]
        by_params = {e.params: e for e in result.table}
        e = by_params.get(chosen, result.winner)
        live = measured_capacity.get(name, {}).get(chosen)
        doc["models"][name] = {  # type: ignore[index]
            "objective": result.objective,
            "chosen": chosen.model_dump(),
            "label": chosen.label(),
            "simulator_winner": result.winner.params.label(),
            "feasible": e.feasible,
            "offered_per_s": rate,
            "predicted_capacity_per_s": None if e.capacity_factor is None else e.capacity_factor * rate,
            "measured_capacity_per_s": None if live is None else live * rate,
            "predicted_p99_ms": e.p99_ms,
            "candidates": result.candidates,
            "notes": result.notes,
        }
    return doc


def _picks(result: TuneResult, top: int) -> list[Evaluation]:
    """The winner, the runner-up and the next best, distinct, up to `top` (feasible ones first)."""
    picks: list[Evaluation] = []
    for e in [result.winner, result.runner_up, *result.table]:
        if e is not None and e.params not in [p.params for p in picks] and (e.feasible or not picks or result.objective == "capacity"):
            picks.append(e)
        if len(picks) >= top:
            break
    return picks


def _load_target(loaded, entry: ModelEntryPlan, engines: Mapping[str, EngineMeasurement | None]):
    from tritongen.loadgen import LoadTarget

    streaming = entry.kind == "llm" and entry.decoupled
    measured = engines.get(entry.name)
    return streaming, LoadTarget(
        entry.name, streaming=streaming, batched=entry.max_batch_size > 0, inputs=tuple(entry.inputs),
        interface=entry_interface(entry) if streaming else None,
        bytes_per_token=next(m.bytes_per_token for m in loaded.spec.models if m.name == entry.spec_model) or 1.0,
        salt_surplus_tokens=(measured.salt_surplus_tokens or 0) if measured else 0,
        text_words=measured.text_words if measured else None,
    )


def _live_load(loaded, plan, entry: ModelEntryPlan, arrivals_all, engines: Mapping[str, EngineMeasurement | None]):
    """What the live runs of one entry send: its share of the live traffic, whether it streams,
    the load targets per candidate (`verify`'s `targets_for`), and the first 200 requests as warm-up."""
    arr = entry_arrivals(arrivals_all, plan, entry, loaded.spec)
    streaming, target = _load_target(loaded, entry, engines)

    def targets_for(_candidate):
        return {cn: target for cn in arr.class_names}, {entry.name: 1}, ([entry.name] if streaming else [])

    warm = arr.take(np.arange(len(arr)) < min(200, len(arr)))
    return arr, streaming, targets_for, warm


def _live_arrivals(loaded, tspec, trace_text, seed: int, n: int, repository: Path):
    """The live runs' traffic (another seed than the search's), once the models' code is found."""
    if not repository.is_dir():
        raise BadInput(f"--verify needs the models' code: {repository} is not a directory (use --repo DIR)")
    arrivals = arrivals_from(tspec, trace_text, seed + 1, n if tspec.shape != "trace" else None, "traffic")
    return arrivals.with_priorities({c.name: c.priority for c in loaded.spec.traffic_classes})


def _candidates(loaded, plan, name: str, picks: list[Evaluation], inputs: TuneInputs, spec_name: str) -> list:
    from tritongen.tuner.verify import Candidate

    entry = plan.entry(name)
    out = []
    for i, e in enumerate(picks):
        tuned = apply_results(plan, {name: apply_candidate(entry, e.params, inputs.classes, loaded.spec)})
        out.append(Candidate(label=f"#{i + 1} {e.params.label()}", model=name, config_text=render_entry_config(tuned, name, spec_name)))
    return out


def _verify_capacity(loaded, plan, results, baselines, inputs_by, tspec, trace_text, seed, n, top, repository: Path, spec_name: str,
                     engines: Mapping[str, EngineMeasurement | None]):
    """--objective capacity --verify: measure the best candidates' capacity live; keep the highest."""
    from tritongen.tuner.verify import measure_capacities

    arrivals_all = _live_arrivals(loaded, tspec, trace_text, seed, n, repository)
    choices: dict[str, Params] = {}
    measured_rows: dict[str, dict[str, object]] = {}
    measured: dict[str, dict[Params, float | None]] = {}
    for name, result in results.items():
        inputs: TuneInputs = inputs_by[name]
        entry = plan.entry(name)
        picks = [e for e in _picks(result, top) if (e.capacity_factor or 0.0) > 0]
        if not picks:
            choices[name] = result.winner.params
            continue
        cands = _candidates(loaded, plan, name, picks, inputs, spec_name)
        arr, streaming, targets_for, warm = _live_load(loaded, plan, entry, arrivals_all, engines)

        def passes(run, factor, _inputs=inputs, _s=streaming, _rate=arr.mean_rate):
            ok, worst, lost = live_verdict(run.classes, _inputs.classes, _inputs.max_error_fraction, _s)
            offered = _rate * factor
            ok = ok and keeps_up(run.throughput_per_s, offered)
            return ok, f"{run.throughput_per_s:.0f}/s of {offered:.0f}/s, worst P99/target {worst:.2f}, lost {lost:.1%}"

        with console.status(f"measuring the capacity of {len(cands)} candidates of {name} on the embedded server..."):
            found = measure_capacities(
                repository, cands, arr, targets_for, passes, [e.capacity_factor or 1.0 for e in picks],
                server_flags=plan.server_flags, warmup=warm, seed=seed,
            )
        measured[name] = {e.params: m.factor for e, m in zip(picks, found)}
        # The highest measured capacity wins; within a band (live_verdict.CAPACITY_BAND) the simulator's order.
        scored = [(capacity_rank(m.factor), i, e.params) for i, (e, m) in enumerate(zip(picks, found))]
        choices[name] = min(scored)[2] if any(m.factor for m in found) else result.winner.params
        rate = inputs.arrivals.mean_rate  # the search's: measured and predicted multiples on one scale
        cols = [baselines.get(name), result.winner, result.runner_up]

        def cell(e, _m=measured[name], _rate=rate):
            if e is None or e.params not in _m:
                return "-" if e is None else "not run"
            f = _m[e.params]
            return "failed" if f is None else f"{f * _rate:.0f}/s"

        measured_rows[name] = {"capacity (measured live)": [cell(e) for e in cols]}
        for m in found:
            trail = "; ".join(f"{p.factor * arr.mean_rate:.0f}/s {'pass' if p.passed else 'miss'} ({p.detail})" for p in m.probes)
            console.print(f"[dim]{m.candidate.label}: {trail or m.error}[/]")
    return choices, measured_rows, measured


def _verify(loaded, plan, results, baselines, inputs_by, tspec, trace_text, seed, n, top, repository: Path, spec_name: str,
            engines: Mapping[str, EngineMeasurement | None]):
    """Run the top candidates live; keep the measured winner per model."""
    from tritongen.tuner.verify import verify_candidates

    arrivals_all = _live_arrivals(loaded, tspec, trace_text, seed, n, repository)
    choices: dict[str, Params] = {}
    measured_rows: dict[str, dict[str, object]] = {}
    for name, result in results.items():
        inputs: TuneInputs = inputs_by[name]
        entry = plan.entry(name)
        picks = _picks(result, top)
        cands = _candidates(loaded, plan, name, picks, inputs, spec_name)
        arr, streaming, targets_for, warm = _live_load(loaded, plan, entry, arrivals_all, engines)
        with console.status(f"verifying {len(cands)} candidates of {name} on the embedded server..."):
            verified = verify_candidates(
                repository, cands, arr, targets_for, server_flags=plan.server_flags, warmup=warm, seed=seed,
            )
        best: tuple | None = None
        rows: dict[str, object] = {}
        measured_by_params: dict[Params, str] = {}
        for e, v in zip(picks, verified):
            if v.run is None:
                measured_by_params[e.params] = f"failed: {v.error}"
                continue
            ok, worst, _lost = live_verdict(v.run.classes, inputs.classes, inputs.max_error_fraction, streaming)
            # Meeting the targets live comes first; then throughput, in steps of the offered rate
            # (live_verdict.THROUGHPUT_STEP); then the simulator's order.
            key = (0 if ok else 1, throughput_rank(v.run.throughput_per_s, arr.mean_rate), picks.index(e))
            if best is None or key < best[0]:
                best = (key, e.params)
            measured_by_params[e.params] = (
                f"{v.run.throughput_per_s:.1f}/s, worst P99/target {worst:.2f}" + ("" if ok else " (misses)")
            )
        choices[name] = best[1] if best is not None else result.winner.params
        cols = [baselines.get(name), result.winner, result.runner_up]
        rows["measured (live)"] = [
            "-" if e is None else measured_by_params.get(e.params, "not run") for e in cols
        ]
        measured_rows[name] = rows
    return choices, measured_rows
