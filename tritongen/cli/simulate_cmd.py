"""`tritongen simulate [SPEC] --profiles DIR|--profile P --config C [--config C2 ...] --traffic T`: predict, side by side.

Each config.pbtxt is simulated under the same arrivals (same seed) with the service curve of its
model's profile (`--profiles DIR`, read as every command reads profiles; the one named like the
config's model) or of the one file `--profile` names (a profile, or a hand-written curve), and
the figures print in one table, one column per config: per-class P50/P90/P99 (time to first
token for streaming models), throughput, queue time, rejections and OOM kills, and the model's
utilisation and mean batch. Milliseconds of CPU per config, not minutes of server time.

SPEC, as on profile, render and tune, is the deployment spec the configs' models come from: what
it states travels here instead of being typed again. A streaming model's engine: section and
max_context apply (under `--engine`, over the section the profile carried from the spec it was
profiled with, and over the defaults), and each class's P99 is reported against the spec's target
for it. Without SPEC the engine comes from the backend's files, the profile and `--engine`, and
no target is shown.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.cli.shared import say_calibration
from tritongen.core.class_targets import TargetCheck, check_targets
from tritongen.core.engine import EngineModel
from tritongen.core.profile_types import Profile, StatedEngine, read_profile
from tritongen.core.fmt import fmt_ms
from tritongen.core.spec import EngineSection, ModelSpec, entry_names_of
from tritongen.core.served_overheads import choose_overheads, profile_device_curve
from tritongen.core.simulator import (
    Overheads,
    ServerSim,
    ServiceCurve,
    SimResult,
    model_sim_from_config,
    rate_limit_from_flags,
    simulate,
)
from tritongen.engine_files import as_served, engine_for
from tritongen.errors import BadInput
from tritongen.pbtxt import config_from_served, config_to_text, parse_model_config
from tritongen.profiles import read_profiles
from tritongen.server_flags import flags_near, read_flags_file
from tritongen.specio import LoadedSpec, format_loc, load_spec
from tritongen.traffic_files import arrivals_from, read_traffic

console = Console()


# ---------------------------------------------------------------------------------------------
# Reading inputs


class CurveFile(BaseModel):
    """A hand-written service description (e.g. a GPU-like one for what-if runs) instead of a profile:
    `curve:` for a classic model, `engine:` (a whole `EngineModel`: KV policy, pool, costs) for an LLM."""

    model_config = ConfigDict(extra="forbid")
    curve: ServiceCurve | None = None
    engine: EngineModel | None = None
    overheads: Overheads | None = None


@dataclass
class Service:
    """What `--profile` gave: a classic curve, a streaming profile, or a hand-written engine."""

    curve: ServiceCurve | None = None
    profile: object | None = None  # the Profile it came from (a streaming one's engine section; a classic one's scaling)
    engine: EngineModel | None = None
    overheads: Overheads | None = None

    def engine_for(self, config, config_path: Path | None = None, stated: EngineSection | None = None,
                   spec_model: ModelSpec | None = None, spec_path: Path | None = None) -> EngineModel | None:
        """The engine of a decoupled config: the curve file's, or resolved from the backend's files,
        `--engine` (`stated`), the spec's model `spec_model` (of SPEC at `spec_path`) and the
        profile; None for a classic config."""
        if not (config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled):
            return None
        if self.engine is not None:
            return self.engine
        streaming = self.profile if getattr(self.profile, "kind", None) == "streaming" else None
        return engine_for(
            config, streaming, model_dir=config_path.parent if config_path else None, stated=stated,
            spec=StatedEngine.of(spec_model, spec_path) if spec_model is not None else None,
            max_context=spec_model.max_context if spec_model is not None else None,
        )


def read_service(path: Path) -> Service:
    """A `tritongen profile` JSON, or a curve file (YAML/JSON with `curve:` and/or `engine:`)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"--profile {path}: no such file")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise BadInput(f"{path}: not valid JSON/YAML: {err}") from None
    if isinstance(data, dict) and "schema_version" in data:
        try:
            profile = read_profile(text)
        except ValidationError as err:
            raise BadInput(f"{path}: not a profile this version reads: {err.errors()[0]['msg']}") from None
        return service_of(profile, str(path))
    try:
        cf = CurveFile.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg']}" for e in err.errors())
        raise BadInput(f"{path}: not a profile or curve file: {problems}") from None
    if cf.curve is None and cf.engine is None:
        raise BadInput(f"{path}: a curve file needs `curve:` (fixed_ms, per_item_ms) or `engine:`")
    return Service(curve=cf.curve, engine=cf.engine, overheads=cf.overheads)


def service_of(profile: Profile, where: str) -> Service:
    """A measured profile as a service: a streaming one's engine section, a classic one's curve."""
    if profile.kind == "streaming":
        if profile.engine is None:
            raise BadInput(f"{where}: this streaming profile has no engine section (profile the model again)")
        return Service(profile=profile)
    try:
        return Service(curve=ServiceCurve.from_profile(profile), profile=profile)
    except ValueError as err:
        raise BadInput(f"{where}: {err}") from None


def served_config_files(profile: Optional[Path], profiles: Optional[Path]) -> list[Path]:
    """Without --config: each profile's served config (`Profile.served_config`) written as
    `<model>/config.pbtxt` in a folder of its own (removed at exit), so the rest reads it as any config
    file. A folder with no engine files: the engine comes from the profile and --engine, as it does
    for a server reached only by --url."""
    if (profile is None) == (profiles is None):
        raise BadInput("give --profiles DIR or --profile FILE, one of the two, and --config C unless the profiles "
                       "hold the configs their server reported")
    if profile is not None:
        found = {"": read_service(profile).profile}
    else:
        assert profiles is not None
        found = dict(read_profiles(profiles))
    served = {name: p for name, p in found.items() if p is not None and p.served_config}
    if not served:
        where = profile if profile is not None else profiles
        raise BadInput(f"{where}: no --config given and the profile holds no config its server reported (a curve file, "
                       "or a profile made before tritongen recorded it); give --config path/to/config.pbtxt")
    folder = Path(tempfile.mkdtemp(prefix="tritongen-served-"))
    atexit.register(shutil.rmtree, folder, True)
    files = []
    for p in served.values():
        parsed = config_from_served(p.served_config, f"the profile of {p.model}")
        if not parsed.name:
            parsed.name = p.model
        path = folder / p.model / "config.pbtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_to_text(parsed))
        files.append(path)
    return files


def static_batch_tokens(profile: object | None) -> int | None:
    """The tokens one execution of an LLM that is not decoupled holds (its static-batch probe), which
    the simulator fails a larger batch against; None for any other model."""
    llm = getattr(profile, "llm", None)
    return getattr(llm, "kv_capacity_tokens", None) if llm is not None else None


def services_by_config(profile: Optional[Path], profiles: Optional[Path], configs: list[Path]) -> list[Service]:
    """Each config's service: the one `--profile` file for all of them, or from `--profiles DIR` the
    profile of the config's model (its `name:`, else its directory's name, as Triton names it)."""
    if (profile is None) == (profiles is None):
        raise BadInput("give --profiles DIR (each config's model's profile) or --profile FILE (one profile or curve "
                       "file for every config), one of the two")
    if profile is not None:
        service = read_service(profile)
        return [service] * len(configs)
    assert profiles is not None
    measured = read_profiles(profiles)
    services: list[Service] = []
    for path in configs:
        if not path.is_file():
            raise BadInput(f"--config {path}: no such file")
        name = parse_model_config(path.read_text(), str(path)).name or path.parent.name
        found = measured.get(name)
        if found is None:
            raise BadInput(f"--profiles {profiles}: no profile of model {name!r} (of {path}); it has {sorted(measured)}")
        services.append(service_of(found, f"the profile of {name} in {profiles}"))
    return services


def spec_model_of(loaded: LoadedSpec, name: str, config: Path) -> ModelSpec:
    """The spec model a config serves: the one whose Triton entries (its lanes') include its name.
    A config the spec does not know is an error rather than a silent run without the spec's facts."""
    for model in loaded.spec.models:
        if name in entry_names_of(model):
            return model
    entries = [n for m in loaded.spec.models for n in entry_names_of(m)]
    raise BadInput(f"--config {config}: model {name!r} is not a model entry of {loaded.path} ({entries}); "
                   "name it as the spec does, or leave SPEC out")


def parse_engine_option(text: str | None) -> EngineSection | None:
    """`--engine key=value,...` as the spec's `engine:` section (EngineSection) would state it."""
    if text is None:
        return None
    values: dict[str, object] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise BadInput(f"--engine: expected key=value pairs, got {part!r}")
        values[key.strip()] = value.strip()
    try:
        return EngineSection.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        raise BadInput(f"--engine: {format_loc(tuple(first['loc']))}: {first['msg']}") from None


# ---------------------------------------------------------------------------------------------
# Printing


def target_cell(check: TargetCheck | None) -> str:
    if check is None:
        return "-"
    return f"{'met' if check.met else '[red]missed[/]'} ({check.target_ms:g})"


def results_table(title: str, labels: list[str], results: list[SimResult], streaming: bool,
                  targets: list[dict[str, TargetCheck]] | None = None) -> Table:
    """The configs side by side; with `targets` (simulate SPEC), each class's P99 against the spec's."""
    table = Table(title=title, show_lines=False)
    table.add_column("", style="bold")
    for label in labels:
        table.add_column(label, justify="right")
    names = [c.name for c in results[0].classes]
    for name in names:
        cs = [r.klass(name) for r in results]
        table.add_row(f"[cyan]{name}[/] P50 / P90 / P99 ms", *[f"{fmt_ms(c.p50_ms)} / {fmt_ms(c.p90_ms)} / {fmt_ms(c.p99_ms)}" for c in cs])
        if streaming:
            table.add_row("  TTFT P50 / P99 ms", *[f"{fmt_ms(c.ttft_p50_ms)} / {fmt_ms(c.ttft_p99_ms)}" for c in cs])
        if targets is not None:
            table.add_row(f"  P99{' (TTFT)' if streaming else ''} target ms",
                          *[target_cell(t.get(name)) for t in targets])
        table.add_row("  throughput /s", *[f"{c.throughput_per_s:.1f}" for c in cs])
        table.add_row("  queue P99 ms", *[fmt_ms(c.queue_p99_ms) for c in cs])
        table.add_row("  rejected (full / timeout)", *[f"{c.rejected_queue_full} / {c.rejected_timeout}" for c in cs])
        if streaming:
            table.add_row("  OOM killed", *[str(c.oom_killed) for c in cs])
    if streaming:
        table.add_row("preemptions", *[", ".join(str(m.preemptions) for m in r.models) for r in results])
    if any(m.prefix_cache_hit_rate is not None for r in results for m in r.models):
        # prompt tokens the engine's prefix cache served, where the traffic's prompts share
        table.add_row("prefix cache hits", *[", ".join("-" if m.prefix_cache_hit_rate is None else f"{m.prefix_cache_hit_rate:.0%}"
                                                       for m in r.models) for r in results])
    table.add_row("[bold]total throughput /s", *[f"{r.throughput_per_s:.1f}" for r in results])
    table.add_row("utilisation", *[", ".join(f"{m.utilisation:.0%}" for m in r.models) for r in results])
    table.add_row("device busy", *[", ".join(f"{v:.0%}" for v in r.device_busy.values()) or "-" for r in results])
    table.add_row("mean batch", *[", ".join("-" if m.mean_batch_rows is None else f"{m.mean_batch_rows:.2f}" for m in r.models) for r in results])
    table.add_row("executions", *[", ".join(str(m.executions) for m in r.models) for r in results])
    return table


@app.command("simulate")
def simulate_cmd(
    spec: Optional[Path] = typer.Argument(
        None,
        help="Deployment spec the configs' models come from: its engine: sections and class targets apply.",
    ),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", help="Directory of profiles from `tritongen profile`: each config gets its model's."
    ),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="Instead of --profiles: one profile JSON, or a curve file (curve:/engine:), for every config."
    ),
    config: list[Path] = typer.Option(
        [], "--config", help="config.pbtxt to simulate; repeat to compare several. Default: the config the server "
        "reported when each profile was taken (a model profiled through --url alone needs no repository)."),
    traffic: Path = typer.Option(..., "--traffic", help="Traffic file (examples/traffic/*.yaml)."),
    requests: Optional[int] = typer.Option(None, "--requests", min=1, help="Simulate this many requests (default: the traffic's duration)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrivals and the simulation."),
    overheads: Optional[str] = typer.Option(
        None, "--overheads",
        help="Default: those the profile measured on its server. 'embedded' (constants fitted on tritongen's 2-core CPU "
        "host), 'none' (an ideal server), or key=value,... over the default.",
    ),
    server_flags: Optional[Path] = typer.Option(
        None, "--server-flags", help="Server flags file (rate limiter); default: server_flags.txt of the config's repository."
    ),
    engine: Optional[str] = typer.Option(
        None, "--engine",
        help="Streaming LLMs whose backend files do not say: kv_policy=..,max_num_seqs=..,kv_block_tokens=..,"
        "kv_pool_tokens=..,max_batched_tokens=.. (the spec's engine: section). SPEC's section applies, and a profile "
        "made from a spec carries that section; a value given here replaces both. A value that contradicts the "
        "files is an error.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON instead of a table."),
) -> None:
    """Predict tail latency, throughput and utilisation of configs from their profiles, in milliseconds."""
    stated = parse_engine_option(engine)
    loaded = load_spec(spec) if spec is not None else None
    if not config:
        config = served_config_files(profile, profiles)
        if not as_json:
            console.print(f"[dim]no --config: the config{'s' if len(config) > 1 else ''} the server reported when "
                          f"profiled ({', '.join(c.parent.name for c in config)})[/]")
    services = services_by_config(profile, profiles, config)
    tspec, trace_text = read_traffic(traffic)
    arrivals = arrivals_from(tspec, trace_text, seed, requests, str(traffic))
    if loaded is not None:  # the spec's class priorities, as tune simulates them (a class it names wins)
        arrivals = arrivals.with_priorities({c.name: c.priority for c in loaded.spec.traffic_classes})
    # One model per run: every class goes to the config under test.
    arrivals.class_model = [None] * len(arrivals.class_names)
    results: list[SimResult] = []
    labels: list[str] = []
    calibrations: list[tuple[str, ServiceCurve | None, str | None]] = []  # per config: what say_calibration says
    targets: list[dict[str, TargetCheck]] = []  # per config, with SPEC: its classes against the spec's targets
    streaming = False
    started = time.perf_counter()
    for path, service in zip(config, services):
        if not path.is_file():
            raise BadInput(f"--config {path}: no such file")
        ov, overheads_used = choose_overheads(overheads, service.profile, service.overheads)
        device_curve, share_note = profile_device_curve(service.profile)
        calibrations.append((overheads_used, device_curve, share_note))
        parsed = as_served(parse_model_config(path.read_text(), str(path)), path.parent)
        spec_model = spec_model_of(loaded, parsed.name, path) if loaded is not None else None
        try:
            served = service.engine_for(parsed, path, stated, spec_model, spec)
            model = model_sim_from_config(parsed, curve=service.curve, engine=served, device_curve=device_curve,
                                          static_batch_tokens=static_batch_tokens(service.profile))
        except ValueError as err:
            raise BadInput(f"{path}: {err}") from None
        streaming = streaming or model.llm is not None
        flags = read_flags_file(server_flags) if server_flags else flags_near(path)
        try:
            enabled, resources = rate_limit_from_flags(flags)
            server = ServerSim(models=[model], rate_limit=enabled, resources=resources, overheads=ov)
            results.append(simulate(server, arrivals, seed=seed))
        except ValueError as err:
            raise BadInput(f"{path}: {err}") from None
        if loaded is not None and spec_model is not None:
            targets.append(check_targets(results[-1], loaded.spec.classes_of(spec_model), model.llm is not None))
        label = path.parent.name if path.name == "config.pbtxt" else path.stem
        if label in labels and path.name == "config.pbtxt":
            label = f"{path.resolve().parent.parent.name}/{path.parent.name}"
        while label in labels:
            label += "'"
        labels.append(label)
    elapsed = time.perf_counter() - started
    if as_json:
        docs = [r.model_dump() for r in results]
        for doc, checks in zip(docs, targets):  # with SPEC only: without it the document is unchanged
            doc["targets"] = {name: check.model_dump() for name, check in checks.items()}
        print(json.dumps(dict(zip(labels, docs)), indent=2))
        return
    title = (
        f"{len(arrivals)} requests, {tspec.shape} at {arrivals.mean_rate:.0f}/s (seed {seed}), "
        f"{len(config)} config(s) simulated in {elapsed * 1000:.0f} ms"
    )
    console.print(results_table(title, labels, results, streaming, targets if loaded is not None else None))
    console.print(f"[dim]figures over the window after the {tspec.warmup_s:g} s warm-up[/]")
    if all(c == calibrations[0] for c in calibrations):
        say_calibration(console, *calibrations[0])
    else:  # the configs' profiles differ (--profiles): each column's calibration
        for label, calibration in zip(labels, calibrations):
            say_calibration(console, *calibration, prefix=f"{label}: ")
