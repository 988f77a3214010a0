"""The adapters around the fleet arithmetic of `tritongen.core.capacity`, shared by `plan` and
`deploy`: the daily-curve file, the `--peak-qps` words, each entry's demand from its profile, and
the cold start (given, measured on the embedded server, or assumed)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import yaml
from pydantic import ValidationError

from tritongen.core.capacity import (
    DEFAULT_COLD_START_S,
    CapacityPlan,
    DailyCurve,
    ModelDemand,
    peak_qps_per_model,
    plan_capacity,
    throughput_at_target,
)
from tritongen.core.plan import DeploymentPlan, plan_deployment
from tritongen.core.profile_types import Profile
from tritongen.errors import BadInput, RunFailed
from tritongen.profiles import read_profiles
from tritongen.specio import LoadedSpec, format_loc

DEFAULT_POD_OVERHEAD_S = 60.0


def read_daily_curve(path: Path) -> DailyCurve:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"--daily-curve {path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise BadInput(f"--daily-curve {path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"--daily-curve {path}: a mapping with `hourly` (24 factors) or `points` is expected")
    try:
        return DailyCurve.model_validate(data)
    except ValidationError as err:
        problems = "\n  ".join(
            f"{format_loc(tuple(e['loc']))}: {str(e['msg']).removeprefix('Value error, ')}" for e in err.errors()
        )
        raise BadInput(f"--daily-curve {path}:\n  {problems}") from None


def parse_peaks(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """['400', 'ranker=300'] -> (400.0, {'ranker': 300.0})."""
    default: float | None = None
    per_model: dict[str, float] = {}
    for text in values:
        name, sep, number = text.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            raise BadInput(f"--peak-qps {text!r}: give a number (every model) or MODEL=NUMBER") from None
        if value < 0:
            raise BadInput(f"--peak-qps {text!r}: must be >= 0")
        if sep:
            per_model[name] = value
        else:
            default = value
    return default, per_model


def demands_for(
    loaded: LoadedSpec, plan: DeploymentPlan, profiles: dict[str, Profile], peaks: dict[str, float]
) -> list[ModelDemand]:
    spec = loaded.spec
    missing = [e.name for e in plan.entries if e.name not in profiles]
    if missing:
        raise BadInput(
            f"no profile for model entries {missing} (profiles found: {sorted(profiles)}); run "
            f"`tritongen profile` for them"
        )
    demands = []
    models = {m.name: m for m in spec.models}
    for entry in plan.entries:
        model = models[entry.spec_model]
        target = min(c.p99_ms for c in spec.classes_of(model))
        measured = throughput_at_target(profiles[entry.name], target)
        # Rounded to 0.01 req/s so the printed arithmetic can be redone exactly from the printed numbers.
        rate = round(measured.requests_per_s, 2)
        gpus = 0 if spec.hardware.cpu_only else model.tensor_parallel * model.replicas
        instances = sum(g.count * max(1, len(g.gpus)) for g in entry.instance_groups)
        demands.append(
            ModelDemand(
                model=entry.name, peak_qps=peaks[entry.name], throughput_per_s=rate,
                target_ms=target, source=measured.source, instances_per_pod=instances, gpus_per_pod=gpus,
            )
        )
    return demands


def _selfcheck_module():
    from tritongen.render import builtin_templates_dir

    path = builtin_templates_dir() / "k8s" / "scripts" / "selfcheck.py"
    module_spec = importlib.util.spec_from_file_location("tritongen_selfcheck", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def measure_cold_start(repo: Path, plan: DeploymentPlan) -> float:
    """Seconds from starting the embedded tritonserver on REPO to every model answering its warm-up request."""
    from tritongen.k8s_warmup import warmup_requests
    from tritongen.server import ServerOptions, TritonServer
    from tritongen.server_flags import server_flags_from

    selfcheck = _selfcheck_module()
    server = TritonServer(ServerOptions(repository=Path(repo).resolve(), extra_args=server_flags_from(repo)))
    start = time.monotonic()
    with server:
        problems = selfcheck.check(server.http_url, warmup_requests(plan), 60.0)
        took = time.monotonic() - start
    if problems:
        raise RunFailed(f"--measure-cold-start {repo}: the warm-up requests failed: {'; '.join(problems)}")
    return took


def capacity_from_options(
    loaded: LoadedSpec,
    profiles_dir: Path,
    peak_qps: list[str],
    daily_curve: Path | None,
    safety_factor: float,
    hot_fraction: float,
    cold_start_s: float | None,
    measure_repo: Path | None,
    pod_overhead_s: float,
) -> CapacityPlan:
    plan = plan_deployment(loaded.spec, loaded.architectures)
    profiles = read_profiles(profiles_dir)
    default, overrides = parse_peaks(peak_qps)
    peaks = peak_qps_per_model([e.name for e in plan.entries], default, overrides)
    demands = demands_for(loaded, plan, profiles, peaks)
    curve = read_daily_curve(daily_curve) if daily_curve is not None else None
    if cold_start_s is not None:
        cold, note = cold_start_s, "given with --cold-start-s"
    elif measure_repo is not None:
        measured = measure_cold_start(measure_repo, plan)
        cold = measured + pod_overhead_s
        note = (f"measured: {measured:.1f} s start-to-warm on the embedded server + {pod_overhead_s:g} s "
                "for scheduling and image start")
    elif curve is not None and curve.cold_start_s is not None:
        cold, note = curve.cold_start_s, f"from {daily_curve}"
    else:
        cold, note = DEFAULT_COLD_START_S, "assumed; measure it with --measure-cold-start REPO or pass --cold-start-s"
    gpus_per_pod = sum(g.count for g in loaded.spec.hardware.gpus)
    return plan_capacity(demands, gpus_per_pod, safety_factor, hot_fraction, curve, cold, note)
