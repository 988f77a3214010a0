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

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from tritongen.core import profile_math as pm
from tritongen.core.profile_types import LoadLevel, MemorySection, Profile, ProfileSettings
from tritongen.errors import RunFailed, TritongenError
from tritongen.profiler.engine import ASSUMED_BYTES_PER_TOKEN, assumed_bytes_per_token_gap
from tritongen.profiler.classic import SCALING_INSTANCES, ClassicProfiler, batch_scan_rows, gathering_variant
from tritongen.profiler.load import RequestRecord, Window, distinct_errors, model_errors, queue_rejected
from tritongen.profiler.memory import MemoryProbe, NullProbe, NvmlProbe, ProcFS, StubRssProbe, steady_value, stub_parents
from tritongen.profiler.profile_builder import ProfileBuilder
from tritongen.profiler.streaming_steps import StreamingSteps
from tritongen.profiler.unary_llm import UnaryLLMProfiler, unary_inputs
from tritongen.profiler.targets import Target, resolve_targets, spec_entries  # noqa: F401  (the run's entry points)
from tritongen.triton_admin import Endpoints, TritonAdmin, endpoints_from_url  # noqa: F401

# ---------------------------------------------------------------------------------------------
# Settings


GATHERING_WINDOW_US = 200_000  # the static-batch probe's batcher window where the profile may reload: a client's burst meets in it


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


def write_profile(profile: Profile, out_dir: Path) -> Path:
    """Atomic: written beside, then renamed over `<out>/<model>.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{profile.model}.json"
    tmp = out_dir / f".{profile.model}.json.tmp-{os.getpid()}"
    tmp.write_text(profile.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path


class Profiler(StreamingSteps):
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
        repository: Path | None = None,
    ) -> None:
        self.kv_capacity_probe = kv_capacity_probe
        self.repository = repository  # the served repository, where readable: the backends' own files
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
        builder = ProfileBuilder(target, self._settings_for(target), self.server_version, f"http://{self.endpoints.http}")
        if target.kind_note:  # who decided what the model is, in a partial profile too
            builder.classic.notes.append(target.kind_note)
        if target.kind_gap:
            builder.gaps.append(target.kind_gap)
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

    def _classic(self, target: Target, builder: ProfileBuilder) -> None:
        probe, notes = self.probe_factory(target)
        memory = MemorySection(probe=probe.name, notes=notes, weights_bytes_analytic=target.weights_bytes_analytic)
        memory.instances = probe.refresh() or None
        memory.base_bytes = steady_value(probe)
        builder.memory = memory
        self.reporter.update(f"{target.name}: memory read", advance=1)
        settings = self.settings
        unary = self._unary_llm(target, builder)
        if unary is not None:
            # first: a served max_batch_size whose batch does not fit would fail the load levels whole
            builder.llm = unary.measure()
            fit, fail = builder.llm.largest_batch_that_fits, builder.llm.smallest_batch_that_fails
            if fail is not None:
                levels = sorted({min(c, fit or 1) for c in settings.concurrency_levels})
                settings = settings.model_copy(update={"concurrency_levels": levels})
                builder.classic.notes.append(
                    f"a batch of {fail} requests of {unary.prompt_tokens} + {unary.output_tokens} tokens ran out of memory "
                    f"(the served max_batch_size is {target.max_batch_size}): the load levels kept at most {fit or 1} "
                    f"in flight ({levels}); render max_batch_size {fit or 1} or less for requests of this size"
                )
        classic = ClassicProfiler(
            self.admin, self.endpoints.http, settings, target, self.can_reload, self._wait_ready,
            lambda text, advance: self.reporter.update(text, advance=advance), self._decide(), self._on_window,
            self._classic_level, builder.classic,
        )
        if unary is not None:
            classic.llm_inputs = lambda rows: unary_inputs(unary.interface, unary.prompt_tokens, unary.output_tokens,
                                                           unary.bytes_per_token, rows)
        classic.run()

    def _unary_llm(self, target: Target, builder: ProfileBuilder) -> UnaryLLMProfiler | None:
        """The LLM measurement of a model that is not decoupled, where it was classified as an LLM
        (`core.model_kind`: stated in the spec or with --kind, else an LLM interface by role in its
        config); None for a classic model."""
        interface = target.interface
        if interface is None:
            return None
        prompt, output = self._stream_lengths(target)
        bpt = target.bytes_per_token
        if interface.speaks_token_ids:
            bpt = 1.0  # one id per token: exact, nothing assumed (stream_inputs sizes the ids)
        elif not bpt:
            bpt = ASSUMED_BYTES_PER_TOKEN
            builder.gaps.append(assumed_bytes_per_token_gap(
                "the model is not decoupled, returns no token count, and the spec states no bytes_per_token"))
        builder.classic.notes.append(
            f"an LLM that is not decoupled ({interface.describe()}): one response holds the whole completion, so its "
            f"time to first token is its end-to-end time; loaded with {prompt}-token prompts and a budget of {output}"
        )
        unary = UnaryLLMProfiler(self.endpoints.http, target.name, interface, target.max_batch_size, prompt, output, bpt,
                                 lambda what: self.reporter.update(f"{target.name}: {what}"))
        unary.gaps = builder.gaps  # kept in a partial profile too
        if self.can_reload:
            unary.batch_window = lambda: self._gathering(target)
        return unary

    @contextmanager
    def _gathering(self, target: Target) -> Iterator[None]:
        """The static-batch probe's batches on a config whose batcher waits for them
        (`classic.gathering_variant`), the served config loaded back after, whatever happened."""
        self.admin.load(target.name, gathering_variant(target.config, GATHERING_WINDOW_US))
        try:
            self._wait_ready(target.name)
            yield
        finally:
            self.admin.load(target.name, target.config)
            self._wait_ready(target.name)

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
            errors=len(model_errors([r.error for r in measured])),
            rejected=sum(1 for r in measured if queue_rejected(r.error)),
            duration_s=round(end - start, 3),
            windows=len(windows),
            converged=pm.level_done(rates, 1, max(1, len(rates)), s.agreement)[1],
            window_throughputs=[round(r, 2) for r in rates],
            throughput_per_s=len(ok) / (end - start) if end > start else 0.0,
            p50_ms=p50,
            p90_ms=p90,
            p99_ms=p99,
            mean_batch_size=pm.mean_batch_size(delta),
            error_samples=distinct_errors([r.error for r in measured]),
        )

    # -- streaming -------------------------------------------------------------------------------

