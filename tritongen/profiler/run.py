"""Orchestration of one profile run: which models, in which order, what to measure, what to write.

The runner owns no server: the CLI hands it endpoints (an external Triton, or the embedded one it
started) and whether it may reload models (only on a server it started itself). Every model's
profile is written as soon as it is measured; a model that fails mid-run, or a Ctrl-C, still
writes what was measured with `"complete": false` before the error goes up.

Classic models (`tritongen.profiler.classic`): closed-loop load at rising concurrency, then a
client-side batch scan, so the latency-versus-batch curve comes from Triton's own `batch_stats`
(compute time per batch size, no client noise) whatever config is served, fitted by
`profile_math.fit_curve`; throughput and client-side percentiles per level; the knee; overheads
from Triton's statistics; instance scaling on one device where configs may be loaded.

Streaming (decoupled) models, in this order so each memory reading starts from a fresh instance:
  1. KV-pool resize probe (a server we own, a model with `kv_pool_blocks`/`kv_block_tokens`
     parameters): reload with a pool larger by ~`kv_probe_mb`, read the instance memory, reload the
     original config, read again: bytes per token = memory delta / pool-token delta.
  2. Prefill scan: single requests with growing prompts up to the model's max context, memory
     sampled every ~2 ms (and the kernel's peak RSS where it can be reset): the transient peak per
     prompt length and the recommended KV safety pad.
  3. KV hold: a few long streams held open; the model's own KV gauges (blocks used) against the
     tokens in flight.
  4. TTFT, inter-token latency and tokens/s versus concurrency over gRPC streaming.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import httpx
import numpy as np

from tritongen import __version__
from tritongen.client import tensors_from_config
from tritongen.core import profile_math as pm
from tritongen.core.kv import kv_shape, weight_bytes
from tritongen.core.plan import ModelEntryPlan, TensorView, plan_deployment
from tritongen.core.llm_interface import LLMInterface
from tritongen.core.profile_types import (
    EngineMeasurement,
    KVMeasurement,
    LoadLevel,
    MemorySection,
    PrefillPoint,
    Profile,
    ProfileSettings,
    StreamingSection,
    StreamLevel,
)
from tritongen.errors import BadInput, RunFailed, TritongenError
from tritongen.profiler.classic import SCALING_INSTANCES, ClassicProfiler, ClassicResult, batch_scan_rows
from tritongen.core.prometheus import kv_gauges, parse_prometheus
from tritongen.profiler.engine import EngineProfiler, engine_settings, interface_of
from tritongen.profiler.engine import stream_inputs as engine_stream_inputs
from tritongen.profiler.load import ModelFailed, RequestRecord, StreamLoad, StreamRecord, Window
from tritongen.profiler.memory import (
    MemoryProbe,
    NullProbe,
    NvmlProbe,
    PeakSampler,
    ProcFS,
    StubRssProbe,
    steady_value,
    stub_parents,
)
from tritongen.specio import LoadedSpec

# ---------------------------------------------------------------------------------------------
# Settings


def default_settings(quick: bool = False, seed: int = 0) -> ProfileSettings:
    """Full: six levels, 1 s windows, up to 5 per level. Quick: three levels, short windows."""
    if quick:
        return ProfileSettings(
            quick=True,
            concurrency_levels=[1, 4, 16],
            stream_concurrency_levels=[1, 4],
            warmup_s=0.2,
            window_s=0.4,
            min_windows=2,
            max_windows=3,
            agreement=0.10,
            prefill_repeats=2,
            pad_margin=1.25,
            kv_probe_mb=32.0,
            seed=seed,
        )
    return ProfileSettings(
        quick=False,
        concurrency_levels=[1, 2, 4, 8, 16, 32],
        stream_concurrency_levels=[1, 2, 4, 8],
        warmup_s=0.5,
        window_s=1.0,
        min_windows=2,
        max_windows=5,
        agreement=0.10,
        prefill_repeats=3,
        pad_margin=1.25,
        kv_probe_mb=32.0,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------
# Talking to Triton


@dataclass(frozen=True)
class Endpoints:
    http: str  # host:port
    grpc: str  # host:port
    metrics: str  # full URL of /metrics


def _host_port(url: str, option: str) -> tuple[str, int | None]:
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise BadInput(f"{option} {url!r} is not HOST:PORT: {err}") from None
    if not parts.hostname:
        raise BadInput(f"{option} {url!r} has no host; use HOST:PORT, e.g. 127.0.0.1:8000")
    return parts.hostname, port


def endpoints_from_url(url: str, grpc_url: str | None = None, metrics_url: str | None = None) -> Endpoints:
    """`--url HOST:PORT` (HTTP); gRPC and metrics default to ports 8001 and 8002 on the same host."""
    host, port = _host_port(url, "--url")
    http = f"{host}:{port or 8000}"
    if grpc_url:
        g_host, g_port = _host_port(grpc_url, "--grpc-url")
        grpc = f"{g_host}:{g_port or 8001}"
    else:
        grpc = f"{host}:8001"
    if metrics_url:
        m_host, m_port = _host_port(metrics_url, "--metrics-url")
        path = urlsplit(metrics_url if "://" in metrics_url else f"http://{metrics_url}").path or "/metrics"
        metrics = f"http://{m_host}:{m_port or 8002}{path}"
    else:
        metrics = f"http://{host}:8002/metrics"
    return Endpoints(http=http, grpc=grpc, metrics=metrics)


class TritonAdmin:
    """The HTTP calls the profiler makes besides inference: metadata, configs, stats, loads, metrics."""

    def __init__(self, endpoints: Endpoints, timeout_s: float = 30.0) -> None:
        self.endpoints = endpoints
        self.client = httpx.Client(base_url=f"http://{endpoints.http}", timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self.client.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise RunFailed(
                f"cannot reach Triton at http://{self.endpoints.http} ({type(err).__name__}: {err}); "
                "is the server running and is --url its HTTP address?"
            ) from None

    def server_metadata(self) -> dict:
        response = self._call("GET", "/v2")
        if response.status_code != 200:
            raise RunFailed(f"http://{self.endpoints.http}/v2 answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def models(self) -> list[dict]:
        response = self._call("POST", "/v2/repository/index", json={})
        if response.status_code != 200:
            raise RunFailed(f"cannot list the server's models ({response.status_code}): {response.text[:200]}")
        return response.json()

    def config(self, model: str) -> dict:
        response = self._call("GET", f"/v2/models/{model}/config")
        if response.status_code != 200:
            raise RunFailed(f"cannot read the config of {model!r} ({response.status_code}): {response.text[:200]}")
        return response.json()

    def model_ready(self, model: str) -> bool:
        return self._call("GET", f"/v2/models/{model}/ready").status_code == 200

    def stats(self, model: str) -> dict:
        response = self._call("GET", f"/v2/models/{model}/stats")
        if response.status_code != 200:
            raise RunFailed(f"cannot read the statistics of {model!r} ({response.status_code}): {response.text[:200]}")
        stats = response.json().get("model_stats") or [{}]
        return stats[0]

    def load(self, model: str, config: dict | None = None) -> None:
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        response = self._call("POST", f"/v2/repository/models/{model}/load", json=body)
        if response.status_code != 200:
            raise RunFailed(f"reloading {model!r} failed ({response.status_code}): {response.text[:300]}")

    def metrics(self) -> str | None:
        try:
            response = httpx.get(self.endpoints.metrics, timeout=10.0)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


# ---------------------------------------------------------------------------------------------
# What to profile


@dataclass(frozen=True)
class Target:
    """One model entry on the server, with what the spec (if any) says about it."""

    name: str
    kind: str  # classic | streaming
    max_batch_size: int
    inputs: list[TensorView]
    outputs: list[TensorView]
    config: dict
    spec_model: str | None = None
    kv_bytes_per_token_analytic: int | None = None
    weights_bytes_analytic: int | None = None
    max_context: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    max_prompt_tokens: int | None = None  # a short lane takes prompts up to its split only
    bytes_per_token: float | None = None  # the spec's tokenizer ratio
    interface: LLMInterface | None = None  # streaming models: the LLM interface they speak

    @property
    def parameters(self) -> dict[str, str]:
        raw = self.config.get("parameters") or {}
        return {k: (v.get("string_value", "") if isinstance(v, dict) else str(v)) for k, v in raw.items()}

    def int_parameter(self, key: str) -> int | None:
        try:
            return int(self.parameters[key])
        except (KeyError, ValueError):
            return None

    @property
    def instance_kinds(self) -> set[str]:
        return {g.get("kind", "KIND_AUTO") for g in self.config.get("instance_group") or []}

    @property
    def gpus(self) -> list[int]:
        return sorted({int(i) for g in self.config.get("instance_group") or [] for i in g.get("gpus") or []})


def _server_target(name: str, config: dict, **spec_fields) -> Target:
    decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
    target = Target(
        name=name,
        kind="streaming" if decoupled else "classic",
        max_batch_size=int(config.get("max_batch_size", 0)),
        inputs=tensors_from_config(config.get("input") or []),
        outputs=tensors_from_config(config.get("output") or []),
        config=config,
        **spec_fields,
    )
    if target.max_context is None and target.int_parameter("max_context"):
        target = replace(target, max_context=target.int_parameter("max_context"))
    return target


def unknown_model_error(names: Sequence[str], available: Sequence[str], where: str) -> BadInput:
    listing = ", ".join(sorted(available)) or "(none)"
    missing = ", ".join(repr(n) for n in names)
    return BadInput(f"model {missing} is not on the server at {where}; the server has: {listing}")


def spec_entries(loaded: LoadedSpec, names: Sequence[str] = ()) -> list[ModelEntryPlan]:
    """The spec's model entries (lanes included), or those named by entry or spec-model name."""
    entries = list(plan_deployment(loaded.spec, loaded.architectures).entries)
    if names:
        unknown = [n for n in names if not any(e.name == n or e.spec_model == n for e in entries)]
        if unknown:
            raise BadInput(
                f"{loaded.path}: no model entry named {', '.join(map(repr, unknown))}; "
                f"the spec has: {', '.join(e.name for e in entries)}"
            )
        entries = [e for e in entries if e.name in names or e.spec_model in names]
    return entries


def resolve_targets(admin: TritonAdmin, names: Sequence[str], loaded: LoadedSpec | None) -> list[Target]:
    """Spec entries (all, or those named) or the named models, checked against the server."""
    entries = spec_entries(loaded, names) if loaded is not None else []
    wanted = [e.name for e in entries] if loaded is not None else list(dict.fromkeys(names))
    index = admin.models()
    available = {m["name"]: m for m in index}
    missing = [n for n in wanted if n not in available]
    if missing:
        raise unknown_model_error(missing, list(available), f"http://{admin.endpoints.http}")
    not_ready = [n for n in wanted if str(available[n].get("state", "READY")) != "READY" or not admin.model_ready(n)]
    if not_ready:
        states = ", ".join(f"{n} ({available[n].get('state') or 'not ready'}: {available[n].get('reason', '')})" for n in not_ready)
        raise RunFailed(f"model(s) not ready on the server: {states}")
    targets = []
    if loaded is None:
        return [_server_target(n, admin.config(n)) for n in wanted]
    for entry in entries:
        model = next(m for m in loaded.spec.models if m.name == entry.spec_model)
        arch = loaded.architectures.get(model.name)
        kv_analytic = entry.kv.kv_bytes_per_token if entry.kv else None
        if kv_analytic is None and arch is not None:
            kv_analytic = kv_shape(arch, model.kv_dtype, model.tensor_parallel).kv_bytes_per_token
        weights = None
        if model.weights is not None:
            weights = model.weights.bytes
            if weights is None and model.weights.parameters is not None and model.weights.dtype is not None:
                weights = weight_bytes(model.weights.parameters, model.weights.dtype)
        targets.append(
            _server_target(
                entry.name,
                admin.config(entry.name),
                spec_model=model.name,
                kv_bytes_per_token_analytic=kv_analytic,
                weights_bytes_analytic=weights,
                max_context=model.max_context,
                prompt_tokens=model.typical_prompt_tokens,
                output_tokens=model.typical_output_tokens,
                max_prompt_tokens=entry.prompt_tokens_max,
                bytes_per_token=model.bytes_per_token,
            )
        )
    return targets


# ---------------------------------------------------------------------------------------------
# Inputs


def stream_inputs(target: Target, prompt_tokens: int, max_tokens: int) -> dict[str, np.ndarray]:
    """A streaming request in the model's own interface (`target.interface`), stream on; the prompt
    is `prompt_tokens` bytes (the memory probes count bytes as tinyllm's byte tokenizer does)."""
    assert target.interface is not None
    return engine_stream_inputs(target.interface, prompt_tokens, max_tokens, 1.0)


# ---------------------------------------------------------------------------------------------
# Progress


class Reporter(Protocol):
    def start(self, model: str, total: int) -> None: ...

    def update(self, description: str, advance: int = 0) -> None: ...

    def finish(self) -> None: ...


class SilentReporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self, model: str, total: int) -> None:
        self.lines.append(f"start {model} ({total} steps)")

    def update(self, description: str, advance: int = 0) -> None:
        self.lines.append(description)

    def finish(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Memory probes


def local_host(endpoints: Endpoints) -> bool:
    host = endpoints.http.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def default_probe_factory(endpoints: Endpoints, server_pid: int | None, proc: ProcFS | None = None, nvml=None) -> Callable[[Target], tuple[MemoryProbe, list[str]]]:
    """GPU instances: NVML over their GPUs. CPU instances of a local server: the stubs' RSS."""

    def make(target: Target) -> tuple[MemoryProbe, list[str]]:
        notes: list[str] = []
        if target.instance_kinds & {"KIND_GPU", "KIND_MODEL"}:
            probe = NvmlProbe.open(target.gpus or None, nvml=nvml)
            if probe is not None:
                return probe, notes
            notes.append("GPU instances but NVML is not available here: no device-memory readings")
        if server_pid is None and not local_host(endpoints):
            notes.append(f"the server at {endpoints.http} is remote: instance memory cannot be read from here")
            return NullProbe("remote"), notes
        fs = proc or ProcFS()
        pid = server_pid
        if pid is None:  # a local server we did not start: find it by the port it listens on
            pid = fs.listening_pid(int(endpoints.http.rsplit(":", 1)[1]))
        probe = StubRssProbe(target.name, pid, fs)
        if probe.refresh() == 0:
            notes.append(f"no Python-backend stub process of {target.name!r} found: instance memory not read")
            return NullProbe("no stubs"), notes
        if pid is None and len(stub_parents(fs, probe.instances)) > 1:
            notes.append(f"stubs of {target.name!r} belong to several local servers: instance memory not read")
            return NullProbe("ambiguous"), notes
        return probe, notes

    return make


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class _Builder:
    """What has been measured so far for one model; `build` makes a (possibly partial) Profile."""

    target: Target
    settings: ProfileSettings
    server_version: str
    server_url: str
    started: float = field(default_factory=time.monotonic)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    memory: MemorySection | None = None
    streaming: StreamingSection | None = None
    engine: EngineMeasurement | None = None
    classic: ClassicResult = field(default_factory=ClassicResult)

    def build(self, complete: bool, error: str | None) -> Profile:
        c = self.classic
        knee = (
            pm.find_knee([(lv.concurrency, lv.throughput_per_s, lv.p99_ms) for lv in c.levels])
            if len(c.levels) >= 2
            else None
        )
        return Profile(
            model=self.target.name,
            kind=self.target.kind,  # type: ignore[arg-type]
            spec_model=self.target.spec_model,
            server_version=self.server_version,
            server_url=self.server_url,
            created_at=self.created_at,
            tritongen_version=__version__,
            complete=complete,
            error=error,
            duration_s=round(time.monotonic() - self.started, 3),
            max_batch_size=self.target.max_batch_size,
            settings=self.settings,
            curve=c.curve,
            fit=c.fit,
            load_levels=c.levels,
            knee=knee,
            memory=self.memory,
            streaming=self.streaming,
            engine=self.engine,
            overheads=c.overheads,
            scaling=c.scaling,
            variant=c.variant,
            notes=c.notes,
        )


def write_profile(profile: Profile, out_dir: Path) -> Path:
    """Atomic: written beside, then renamed over `<out>/<model>.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{profile.model}.json"
    tmp = out_dir / f".{profile.model}.json.tmp-{os.getpid()}"
    tmp.write_text(profile.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path


_QUEUE_REJECTIONS = ("Request timeout expired", "Exceeds maximum queue size")


def _distinct(errors: Sequence[str | None], limit: int = 3) -> list[str]:
    out: list[str] = []
    for e in errors:
        if e and e not in out and e != "stopped":
            out.append(e)
        if len(out) >= limit:
            break
    return out


class Profiler:
    """Profiles targets one after another; each profile is written as soon as it exists."""

    def __init__(
        self,
        admin: TritonAdmin,
        endpoints: Endpoints,
        settings: ProfileSettings,
        out_dir: Path,
        reporter: Reporter | None = None,
        probe_factory: Callable[[Target], tuple[MemoryProbe, list[str]]] | None = None,
        can_reload: bool = False,
        server_check: Callable[[], str | None] | None = None,
        kv_capacity_probe: bool = False,
    ) -> None:
        self.kv_capacity_probe = kv_capacity_probe
        self.admin = admin
        self.endpoints = endpoints
        self.settings = settings
        self.out_dir = out_dir
        self.reporter = reporter or SilentReporter()
        self.probe_factory = probe_factory or default_probe_factory(endpoints, None)
        self.can_reload = can_reload
        self.server_check = server_check
        self.server_version = "unknown"
        self.written: list[Path] = []
        self.profiles: list[Profile] = []

    # -- entry point -----------------------------------------------------------------------------

    def run(self, targets: Sequence[Target]) -> list[Profile]:
        self.server_version = str(self.admin.server_metadata().get("version", "unknown"))
        for target in targets:
            self.profile(target)
        return self.profiles

    def profile(self, target: Target) -> Profile:
        builder = _Builder(target, self._settings_for(target), self.server_version, f"http://{self.endpoints.http}")
        steps = len(self.settings.concurrency_levels) + 3
        if target.kind == "streaming":
            steps = len(self.settings.stream_concurrency_levels) + 3
        self.reporter.start(target.name, steps)
        try:
            if target.kind == "classic":
                self._classic(target, builder)
            else:
                self._streaming(target, builder)
        except KeyboardInterrupt:
            self.reporter.update(f"{target.name}: interrupted")
            self._keep(builder.build(False, "interrupted (Ctrl-C) before the profile was complete"))
            raise
        except TritongenError as err:
            self.reporter.update(f"{target.name}: failed")
            reason = self._server_reason()
            message = f"{err}\n{reason}" if reason else str(err)
            self._keep(builder.build(False, message))
            if reason:
                raise RunFailed(message) from None
            raise
        except Exception as err:
            self._keep(builder.build(False, f"{type(err).__name__}: {err}"))
            raise
        self.reporter.finish()
        profile = builder.build(True, None)
        self._keep(profile)
        return profile

    def _keep(self, profile: Profile) -> None:
        self.written.append(write_profile(profile, self.out_dir))
        self.profiles.append(profile)

    def _server_reason(self) -> str | None:
        return self.server_check() if self.server_check else None

    def _settings_for(self, target: Target) -> ProfileSettings:
        if target.kind == "classic":
            return self.settings.model_copy(
                update={
                    "batch_scan_rows": batch_scan_rows(target.max_batch_size, self.settings.quick),
                    "scaling_instances": list(SCALING_INSTANCES) if self.can_reload else [],
                }
            )
        prompt, output = self._stream_lengths(target)
        return self.settings.model_copy(
            update={
                "prompt_tokens": prompt,
                "output_tokens": output,
                "prefill_prompt_lengths": self._prefill_lengths(target),
            }
        )

    def _decide(self) -> Callable[[list[float]], bool]:
        s = self.settings
        return lambda rates: pm.level_done(rates, s.min_windows, s.max_windows, s.agreement)[0]

    def _on_window(self, label: str, unit: str) -> Callable[[Window], None]:
        def show(window: Window) -> None:
            errors = f", {window.errors} errors" if window.errors else ""
            self.reporter.update(f"{label}: window {window.index + 1}, {window.rate:,.0f} {unit}{errors}")

        return show

    # -- classic ---------------------------------------------------------------------------------

    def _classic(self, target: Target, builder: _Builder) -> None:
        probe, notes = self.probe_factory(target)
        memory = MemorySection(probe=probe.name, notes=notes, weights_bytes_analytic=target.weights_bytes_analytic)
        memory.instances = probe.refresh() or None
        memory.base_bytes = steady_value(probe)
        builder.memory = memory
        self.reporter.update(f"{target.name}: memory read", advance=1)
        ClassicProfiler(
            self.admin, self.endpoints.http, self.settings, target, self.can_reload, self._wait_ready,
            lambda text, advance: self.reporter.update(text, advance=advance), self._decide(), self._on_window,
            self._classic_level, builder.classic,
        ).run()

    def _classic_level(
        self, concurrency: int, records: list[RequestRecord], windows: list[Window], start: float, delta
    ) -> LoadLevel:
        s = self.settings
        end = start + len(windows) * s.window_s
        measured = [r for r in records if start <= r.end < end]
        ok = [r.latency_s for r in measured if r.error is None]
        p50, p90, p99 = pm.percentiles_ms(ok)
        rates = [w.rate for w in windows]
        return LoadLevel(
            concurrency=concurrency,
            requests=len(ok),
            errors=len(measured) - len(ok),
            duration_s=round(end - start, 3),
            windows=len(windows),
            converged=pm.level_done(rates, 1, max(1, len(rates)), s.agreement)[1],
            window_throughputs=[round(r, 2) for r in rates],
            throughput_per_s=len(ok) / (end - start) if end > start else 0.0,
            p50_ms=p50,
            p90_ms=p90,
            p99_ms=p99,
            mean_batch_size=pm.mean_batch_size(delta),
            error_samples=_distinct([r.error for r in measured]),
        )

    # -- streaming -------------------------------------------------------------------------------

    def _stream_lengths(self, target: Target) -> tuple[int, int]:
        prompt = target.prompt_tokens or 32
        output = target.output_tokens or 32
        if target.max_prompt_tokens:
            prompt = min(prompt, target.max_prompt_tokens)
        if target.max_context:
            prompt = min(prompt, max(1, target.max_context // 2))
            output = max(1, min(output, target.max_context - prompt))
        return prompt, output

    def _prefill_lengths(self, target: Target) -> list[int]:
        if not target.max_context or target.max_context < 2:
            return []
        longest = target.max_context - 1  # one token generated
        if target.max_prompt_tokens:
            longest = min(longest, target.max_prompt_tokens)
        count = 4 if self.settings.quick else 6
        return pm.prefill_lengths(longest, count=count)

    def _streaming(self, target: Target, builder: _Builder) -> None:
        s = builder.settings
        interface = interface_of(target.name, target.config)
        target = replace(target, interface=interface)
        stream = StreamLoad(self.endpoints.grpc, target.name, {}, interface.text_output)
        probe, notes = self.probe_factory(target)
        memory = MemorySection(
            probe=probe.name,
            notes=notes,
            weights_bytes_analytic=target.weights_bytes_analytic,
            kv_bytes_per_token_analytic=target.kv_bytes_per_token_analytic,
            kv_block_tokens=target.int_parameter("kv_block_tokens"),
            kv_pool_blocks=target.int_parameter("kv_pool_blocks"),
            pad_margin=s.pad_margin,
        )
        builder.memory = memory
        memory.instances = probe.refresh() or None

        self.reporter.update(f"{target.name}: KV pool resize probe")
        self._resize_probe(target, probe, memory)
        memory.instances = probe.refresh() or memory.instances
        memory.base_bytes = steady_value(probe)
        self.reporter.update(f"{target.name}: KV pool resize probe", advance=1)

        self._prefill_scan(target, probe, memory, stream, s)
        self.reporter.update(f"{target.name}: prefill scan", advance=1)

        self._kv_hold(target, memory, stream)
        self._summarise_kv(memory)
        self.reporter.update(f"{target.name}: KV gauges", advance=1)

        assert s.prompt_tokens is not None and s.output_tokens is not None
        section = StreamingSection(prompt_tokens=s.prompt_tokens, max_tokens=s.output_tokens)
        builder.streaming = section

        def level(load: StreamLoad, concurrency: int):
            label = f"{target.name}: {concurrency} stream(s)"
            self.reporter.update(f"{label}: warming up")
            found = load.run_level(concurrency, s.warmup_s, s.window_s, self._decide(), self._on_window(label, "tok/s"))
            section.levels.append(self._stream_level(concurrency, *found))
            self.reporter.update(label, advance=1)
            return found

        profiler = EngineProfiler(
            self.admin, self.endpoints.grpc, target.name, target.config,
            engine_settings(target.max_context, s.prompt_tokens, s.output_tokens, s.quick, s.stream_concurrency_levels,
                            capacity_probe=self.kv_capacity_probe),
            target.bytes_per_token, level, lambda what: self.reporter.update(f"{target.name}: {what}"),
            max_context=target.max_context,
        )
        builder.engine = profiler.measure()

    def _stream_level(self, concurrency: int, records: list[StreamRecord], windows: list[Window], start: float) -> StreamLevel:
        s = self.settings
        end = start + len(windows) * s.window_s
        finished = [r for r in records if r.end is not None and start <= r.end < end]
        ok = [r for r in finished if r.error is None]
        started = [r for r in records if start <= r.start < end and r.error is None and r.token_times]
        ttfts = [r.ttft_s for r in started if r.ttft_s is not None]
        gaps = [g for r in records for g in pm.inter_token_gaps([t for t in r.token_times if start <= t < end])]
        tokens = sum(1 for r in records for t in r.token_times if start <= t < end)
        rates = [(len(r.token_times) - 1) / (r.token_times[-1] - r.token_times[0]) for r in ok if len(r.token_times) >= 2 and r.token_times[-1] > r.token_times[0]]
        ttft50, ttft99 = pm.percentiles_ms(ttfts, (50, 99))
        itl50, itl99 = pm.percentiles_ms(gaps, (50, 99))
        win_rates = [w.rate for w in windows]
        return StreamLevel(
            concurrency=concurrency,
            requests=len(ok),
            errors=len(finished) - len(ok),
            tokens=tokens,
            duration_s=round(end - start, 3),
            windows=len(windows),
            converged=pm.level_done(win_rates, 1, max(1, len(win_rates)), s.agreement)[1],
            window_tokens_per_s=[round(r, 2) for r in win_rates],
            tokens_per_s=tokens / (end - start) if end > start else 0.0,
            stream_tokens_per_s_p50=pm.percentile(rates, 50),
            ttft_p50_ms=ttft50,
            ttft_p99_ms=ttft99,
            itl_p50_ms=itl50,
            itl_p99_ms=itl99,
            error_samples=_distinct([r.error for r in finished]),
        )

    # -- memory of streaming models ----------------------------------------------------------------

    def _resize_probe(self, target: Target, probe: MemoryProbe, memory: MemorySection) -> None:
        """Reload with a bigger KV pool and back; the memory delta over the pool-token delta."""
        s = self.settings
        blocks, block_tokens = memory.kv_pool_blocks, memory.kv_block_tokens
        why = None
        if s.kv_probe_mb <= 0:
            why = "KV pool resize probe disabled (--kv-probe-mb 0)"
        elif not self.can_reload:
            why = "KV pool resize probe skipped: it reloads the model, done only on a server tritongen started (--repo)"
        elif blocks is None or block_tokens is None:
            why = "KV pool resize probe skipped: the model has no kv_pool_blocks / kv_block_tokens parameters"
        elif probe.name == "none":
            why = "KV pool resize probe skipped: no memory source for this model"
        if why:
            memory.notes.append(why)
            return
        assert blocks is not None and block_tokens is not None
        guess = target.kv_bytes_per_token_analytic or self._reported_bytes_per_token(target.name) or 512
        extra = pm.probe_blocks(s.kv_probe_mb * pm.MIB, block_tokens, guess)
        original = target.config
        bigger = json.loads(json.dumps(original))
        bigger["parameters"]["kv_pool_blocks"] = {"string_value": str(blocks + extra)}
        readings: dict[str, int] = {}
        try:
            for label, config in (("bigger", bigger), ("original", original)):
                old = probe.instances
                self.admin.load(target.name, config)
                self._wait_ready(target.name)
                self._await_new_instances(probe, old)
                self._await_retired(probe, old)
                value = steady_value(probe, samples=7)
                if value is None:
                    memory.notes.append("KV pool resize probe: the instance memory could not be read after reload")
                    return
                readings[label] = value
        finally:
            if "original" not in readings:  # failed half-way: put the original config back
                try:
                    self.admin.load(target.name, original)
                    self._wait_ready(target.name)
                    probe.refresh()
                except TritongenError:
                    pass
        delta = readings["bigger"] - readings["original"]
        tokens = extra * block_tokens
        bpt = pm.bytes_per_token_from_delta(delta, tokens)
        memory.kv_measurements.append(
            KVMeasurement(
                source="nvml" if probe.name == "nvml" else "rss",
                bytes_per_token=round(bpt, 2),
                relative_difference=pm.relative_difference(bpt, target.kv_bytes_per_token_analytic),
                detail=(
                    f"pool {blocks} -> {blocks + extra} blocks (+{tokens} tokens): instance memory "
                    f"{readings['original']} -> {readings['bigger']} bytes (+{delta})"
                ),
            )
        )

    def _await_new_instances(self, probe: MemoryProbe, old: Sequence[int], timeout_s: float = 10.0) -> None:
        """After a reload the old stub lingers a while: read only the new instance processes."""
        if probe.name != "rss":
            time.sleep(0.5)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if probe.refresh(exclude=old) > 0:
                time.sleep(0.2)  # let its initialize() settle
                probe.refresh(exclude=old)
                return
            time.sleep(0.05)
        raise RunFailed("after reloading, no new instance process of the model appeared")

    @staticmethod
    def _await_retired(probe: MemoryProbe, old: Sequence[int], timeout_s: float = 15.0) -> None:
        """Let the replaced instances exit (they share the CPU and, on a GPU, the device memory)."""
        alive = getattr(probe, "alive", None)
        if alive is None:
            time.sleep(0.5)
            return
        deadline = time.monotonic() + timeout_s
        while alive(old) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_ready(self, model: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.admin.model_ready(model):
                return
            time.sleep(0.05)
        raise RunFailed(f"model {model!r} was not ready {timeout_s:.0f} s after reloading it")

    def _reported_bytes_per_token(self, model: str) -> float | None:
        text = self.admin.metrics()
        return kv_gauges(parse_prometheus(text), model).bytes_per_token if text else None

    def _prefill_scan(self, target: Target, probe: MemoryProbe, memory: MemorySection, stream: StreamLoad, s: ProfileSettings) -> None:
        lengths = s.prefill_prompt_lengths
        if not lengths:
            memory.notes.append("prefill scan skipped: the model's max context is unknown (no spec, no max_context parameter)")
            return
        if probe.name == "none":
            memory.notes.append("prefill scan skipped: no memory source for this model")
            return
        # Warm up first: a fresh instance allocates for good on its first requests (buffers,
        # lazily built state), which is not a prefill transient.
        for _warm in range(2):
            record = self._single(stream, stream_inputs(target, min(16, lengths[0]), 4), memory)
            if record.error is not None:
                raise ModelFailed(f"model {target.name!r} failed a warm-up request: {record.error}")
        steady = steady_value(probe, samples=7)
        if steady is None:
            memory.notes.append("prefill scan skipped: the instance memory could not be read")
            return
        for length in lengths:
            self.reporter.update(f"{target.name}: prefill scan, prompt {length} tokens")
            peak, samples, hwm = steady, 0, False
            for _repeat in range(max(1, s.prefill_repeats)):
                with PeakSampler(probe) as sampler:
                    record = self._single(stream, stream_inputs(target, length, 1), memory)
                if record.error is not None:
                    raise ModelFailed(f"model {target.name!r} failed a single request with a {length}-token prompt: {record.error}")
                peak = max(peak, sampler.peak or steady)
                samples += sampler.samples
                hwm = hwm or sampler.used_hwm
            memory.prefill.append(
                PrefillPoint(
                    prompt_tokens=length,
                    steady_bytes=steady,
                    peak_bytes=peak,
                    peak_delta_bytes=pm.peak_delta(steady, peak),
                    samples=samples,
                    method="sampled+hwm" if hwm else "sampled",
                )
            )
        longest = memory.prefill[-1]
        memory.prefill_peak_bytes_at_longest = longest.peak_delta_bytes
        memory.recommended_kv_safety_pad_mb = pm.recommended_pad_mb(longest.peak_delta_bytes, s.pad_margin)

    @staticmethod
    def _single(stream: StreamLoad, inputs, memory: MemorySection, attempts: int = 3) -> StreamRecord:
        """One request; a queue rejection (timeout, queue full) is retried, anything else is final.

        Triton 2.51 with priority levels holds the odd request in its queue until the queue
        timeout fires even when the server is idle, so a lone request can fail that way."""
        record = stream.one(inputs)
        for _ in range(attempts - 1):
            if record.error is None or not any(s in record.error for s in _QUEUE_REJECTIONS):
                break
            memory.notes.append(f"a single request was rejected by the queue and retried: {record.error}")
            record = stream.one(inputs)
        return record

    def _kv_hold(self, target: Target, memory: MemorySection, stream: StreamLoad) -> None:
        """Hold a few long streams open and read the model's KV gauges against the tokens in flight."""
        text = self.admin.metrics()
        gauges = kv_gauges(parse_prometheus(text), target.name) if text else None
        if gauges is None or not gauges.present:
            memory.notes.append("the model exports no *_kv_* gauges on the metrics endpoint: KV blocks not read")
            return
        if gauges.bytes_per_token is not None:
            memory.kv_measurements.append(
                KVMeasurement(
                    source="metrics",
                    bytes_per_token=gauges.bytes_per_token,
                    relative_difference=pm.relative_difference(gauges.bytes_per_token, target.kv_bytes_per_token_analytic),
                    detail="the model's own kv_bytes_per_token gauge (what it says it allocates)",
                )
            )
        memory.kv_block_tokens = memory.kv_block_tokens or gauges.block_tokens
        memory.kv_pool_blocks = gauges.blocks_total or memory.kv_pool_blocks
        block = memory.kv_block_tokens
        context = target.max_context or 64
        prompt = max(1, context // 2)
        max_tokens = max(1, context - prompt - 1)
        # Enough streams that the engine's steps take a while: a metrics scrape takes tens of ms
        # (hundreds on a busy host), and a handful of streams on a small model finish within two.
        streams = min(16, target.int_parameter("max_num_seqs") or 16)
        if memory.kv_pool_blocks and block:
            per_stream = -(-context // block)
            streams = max(1, min(streams, memory.kv_pool_blocks // per_stream))
        readings: list[tuple[int, float]] = []
        workers: list = []
        for _attempt in range(3):
            workers, readings = self._hold_once(target, stream, streams, prompt, max_tokens, block)
            if readings:
                break
            self._wait_pool_drained(target.name)
        errors = [r.error for w in workers for r in w.records if r.error not in (None, "stopped")]
        if errors:
            memory.notes.append(f"KV hold: {len(errors)} of {streams} streams failed: {errors[0]}")
        if not readings:
            if not errors:
                memory.notes.append("KV hold: the streams ended before the gauges could be read")
            return
        # The earliest reading with every stream admitted: later ones may count tokens of a stream
        # that already finished (streams arrive a few engine steps apart) while its blocks are free.
        used, tokens = min(readings, key=lambda r: r[1])
        memory.kv_streams = streams
        memory.kv_blocks_used = int(used)
        memory.kv_tokens_in_flight = int(round(tokens))
        if block and gauges.bytes_per_token:
            paged = pm.paged_bytes_per_token(int(used), block, gauges.bytes_per_token, int(round(tokens)))
            if paged is not None:
                memory.kv_measurements.append(
                    KVMeasurement(
                        source="blocks",
                        bytes_per_token=round(paged, 2),
                        relative_difference=pm.relative_difference(paged, target.kv_bytes_per_token_analytic),
                        detail=(
                            f"{used} blocks x {block} tokens x {gauges.bytes_per_token:g} B held for {tokens:.0f} "
                            f"tokens in flight over {streams} streams of a {prompt}-token prompt (partly filled "
                            f"blocks included; the gauges come from one scrape but are published one by one, so "
                            f"expect a step of slack per stream; whole blocks for those tokens: "
                            f"{pm.blocks_needed([round(tokens / streams)] * streams, block)})"
                        ),
                    )
                )
        self._wait_pool_drained(target.name)

    def _hold_once(self, target: Target, stream: StreamLoad, streams: int, prompt: int, max_tokens: int, block: int | None):
        """Run `streams` long requests; read (blocks used, tokens in flight) while all of them run."""
        text = self.admin.metrics()
        generated_before = kv_gauges(parse_prometheus(text), target.name).generated_tokens if text else None
        admitted = streams * -(-prompt // block) if block else 1
        workers, stop = stream.start(streams, limit=1, inputs=stream_inputs(target, prompt, max_tokens), together=True)
        readings: list[tuple[int, float]] = []
        try:
            # The engine outruns the client (responses arrive in bursts, later than tokens are made),
            # so read the gauges as fast as the endpoint answers while the streams run, and count
            # tokens with the engine's own counter where it has one.
            deadline = time.monotonic() + 30.0
            while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
                before = self._in_flight(workers, prompt)
                text = self.admin.metrics()
                after = self._in_flight(workers, prompt)
                now = kv_gauges(parse_prometheus(text), target.name) if text else None
                if now is None or not now.blocks_used or now.blocks_used < admitted:
                    continue
                if generated_before is not None and now.generated_tokens is not None:
                    generated = now.generated_tokens - generated_before
                    if not streams <= generated <= streams * (max_tokens - 2):
                        continue  # not all admitted yet, or some already finished
                    # a sequence that has produced g tokens holds K/V for prompt + g - 1 of them
                    tokens = streams * (prompt - 1) + generated
                else:
                    tokens = (before + after) / 2
                readings.append((now.blocks_used, tokens))
        finally:
            StreamLoad.finish(workers, stop)
        if any(r.error not in (None, "stopped") for w in workers for r in w.records):
            readings = []  # fewer streams than counted ran: the token count would be wrong
        return workers, readings

    @staticmethod
    def _in_flight(workers, prompt: int) -> int:
        return sum(prompt - 1 + len(w.current.token_times) for w in workers if w.current is not None)

    def _wait_pool_drained(self, model: str, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.admin.metrics()
            used = kv_gauges(parse_prometheus(text), model).blocks_used if text else None
            if not used:
                return
            time.sleep(0.05)

    @staticmethod
    def _summarise_kv(memory: MemorySection) -> None:
        preferred = {m.source: m for m in memory.kv_measurements}
        for source in ("nvml", "rss", "metrics"):
            if source in preferred:
                chosen = preferred[source]
                memory.kv_bytes_per_token_measured = chosen.bytes_per_token
                memory.kv_relative_difference = chosen.relative_difference
                break
        if memory.kv_bytes_per_token_measured and memory.kv_pool_blocks and memory.kv_block_tokens:
            memory.kv_pool_bytes_measured = int(
                memory.kv_bytes_per_token_measured * memory.kv_pool_blocks * memory.kv_block_tokens
            )
