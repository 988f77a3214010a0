"""`tritongen deploy SPEC -o DIR`: Kubernetes manifests for hot and cold pools of Triton + sidecar pods.

Pool sizes come from `--hot-replicas/--cold-max`, or from the fleet arithmetic when `--profiles`
and `--peak-qps` are given (the same as `tritongen plan`, with the pre-warm schedule when
`--daily-curve` is given). Files are written atomically, one object per file; files a previous
run wrote that this run no longer produces (e.g. after switching --autoscaler) are removed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tritongen.cli.app import app
from tritongen.core.capacity import DEFAULT_HOT_FRACTION, DEFAULT_SAFETY_FACTOR
from tritongen.dashboard import DashboardOptions, dashboard_uid
from tritongen.errors import BadInput, TritongenError
from tritongen.fleet import DEFAULT_POD_OVERHEAD_S, capacity_from_options
from tritongen.k8s import (
    DEFAULT_IMAGE,
    DEFAULT_KUBECTL_IMAGE,
    DEFAULT_PROMETHEUS_URL,
    DEFAULT_SIDECAR_IMAGE,
    VLLM_IMAGE,
    DeployOptions,
    is_generated,
    render_manifests,
    with_capacity,
)
from tritongen.render import RenderedRepository, render_repository, write_repository
from tritongen.specio import load_spec

console = Console(highlight=False)


@app.command("deploy")
def deploy(
    spec: Path = typer.Argument(..., help="Deployment spec (YAML)."),
    out: Path = typer.Option(..., "-o", "--out", help="Directory for the manifests (created if missing)."),
    image: Optional[str] = typer.Option(
        None, "--image", help=f"Triton image, both pools (default {DEFAULT_IMAGE}; {VLLM_IMAGE} for vLLM specs)."
    ),
    sidecar_image: str = typer.Option(
        DEFAULT_SIDECAR_IMAGE, "--sidecar-image",
        help="The sidecar's image, built from the repository's Containerfile (or FROM it): its entrypoint reads "
        "the TRITONGEN_SIDECAR_* env the pod sets. Push it where the cluster pulls from and name that here.",
    ),
    namespace: str = typer.Option("default", "--namespace", "-n", help="Namespace of every object."),
    model_store: str = typer.Option(
        "pvc", "--model-store",
        help="Where model code and weights come from: pvc:CLAIM (default claim <name>-model-store), "
        "image:IMAGE (copied from its /model-store), or none.",
    ),
    autoscaler: str = typer.Option("hpa", "--autoscaler", help="hpa (autoscaling/v2 + prometheus-adapter) or keda."),
    hot_replicas: int = typer.Option(1, "--hot-replicas", min=1, help="Hot pods, without --profiles."),
    cold_max: int = typer.Option(2, "--cold-max", min=0, help="Most cold pods, without --profiles."),
    profiles: Optional[Path] = typer.Option(None, "--profiles", help="Size the pools from these profiles (with --peak-qps)."),
    peak_qps: Optional[list[str]] = typer.Option(None, "--peak-qps", help="Daily peak: Q, or MODEL=Q (repeatable)."),
    daily_curve: Optional[Path] = typer.Option(None, "--daily-curve", help="Daily curve YAML: pre-warm schedule."),
    safety_factor: float = typer.Option(DEFAULT_SAFETY_FACTOR, "--safety-factor", help="0.70-0.85."),
    hot_fraction: float = typer.Option(DEFAULT_HOT_FRACTION, "--hot-fraction", help="Share of the peak kept resident."),
    cold_start_s: Optional[float] = typer.Option(None, "--cold-start-s", help="Seconds from scale-up to a warm pod."),
    drain_timeout_s: Optional[int] = typer.Option(
        None, "--drain-timeout-s", min=1, help="preStop wait for in-flight work (default: slowest class P99, >= 30 s)."
    ),
    exit_timeout_s: int = typer.Option(15, "--exit-timeout-s", min=1, help="Triton's --exit-timeout-secs after SIGTERM."),
    cpu: Optional[str] = typer.Option(None, "--cpu", help="Triton container CPU request (Kubernetes quantity)."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Triton container memory request and limit."),
    prometheus_url: str = typer.Option(DEFAULT_PROMETHEUS_URL, "--prometheus-url", help="KEDA's Prometheus address."),
    kubectl_image: str = typer.Option(DEFAULT_KUBECTL_IMAGE, "--kubectl-image", help="Image of the pre-warm CronJobs."),
    dashboard: bool = typer.Option(True, "--dashboard/--no-dashboard", help="Also write the Grafana dashboard ConfigMap."),
    templates: Optional[Path] = typer.Option(None, "--templates", help="Directory overriding templates/k8s/*.j2."),
) -> None:
    """Write Deployments (hot, cold), Service, PDB, autoscaler, pre-warm and dashboard manifests."""
    loaded = load_spec(spec)
    rendered = render_repository(loaded)
    options = DeployOptions(
        namespace=namespace, image=image, sidecar_image=sidecar_image, model_store=model_store,
        hot_replicas=hot_replicas, cold_max=cold_max, autoscaler=autoscaler, drain_timeout_s=drain_timeout_s,
        exit_timeout_s=exit_timeout_s, cpu=cpu, memory=memory, prometheus_url=prometheus_url,
        kubectl_image=kubectl_image, dashboard=dashboard,
    )
    if (profiles is None) != (not peak_qps):
        raise BadInput("--profiles and --peak-qps go together: both size the pools from measured throughput")
    if daily_curve is not None and profiles is None:
        raise BadInput("--daily-curve needs --profiles and --peak-qps: the schedule is in pods, from the throughput")
    if profiles is not None and peak_qps:
        capacity = capacity_from_options(
            loaded, profiles, peak_qps, daily_curve, safety_factor, hot_fraction, cold_start_s, None,
            DEFAULT_POD_OVERHEAD_S,
        )
        options = with_capacity(options, capacity)
        for line in capacity.lines:
            typer.echo(line)
    target = min(c.p99_ms for c in loaded.spec.traffic_classes)
    pad = loaded.spec.safety_pad_mb() * 1024 * 1024
    manifests = render_manifests(
        loaded.spec, rendered, options, spec_name=loaded.path.name, templates=templates,
        dashboard=DashboardOptions(title=f"Triton fleet: {loaded.spec.name}", uid=dashboard_uid(loaded.spec.name),
                                   p99_target_ms=target, memory_pad_bytes=pad),
    )
    changed = write_repository(RenderedRepository(files=manifests.files), out)
    stale = [p for p in sorted(Path(out).glob("*.yaml")) if p.name not in manifests.files and is_generated(p)]
    for path in stale:
        try:
            path.unlink()
        except OSError as err:
            raise TritongenError(f"cannot remove the stale manifest {path}: {err}") from None
    console.print(
        f"{len(manifests.files)} manifests in {out} ({len(changed)} changed"
        + (f", {len(stale)} stale removed" if stale else "") + ")"
    )
    for name in manifests.files:
        console.print(f"  {name}")
    for note in manifests.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"apply with: kubectl apply -n {namespace} -f {out}")
