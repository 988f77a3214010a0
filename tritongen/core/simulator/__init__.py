"""A seeded discrete-event simulation of Triton's scheduler, fast enough to search configs with.

Its parts: `inputs` (the models, batchers, curves and overheads a run takes), `results` (what it
reports, shared with live runs), `loop` (the event loop: `Simulation`, `simulate`), `model_state`
(a model entry's queues and how a batch forms), `rate_limiter`, `routing`, `wake_race`, `configs`
(models from Triton's config.pbtxt and flags) and `calibration` (overheads fitted to live runs).
This package names the public API; import it from here.

What it models (server 2.51, the binary in nvidia-pytriton; each point was read in Triton's core
sources and checked on the embedded server, see tests/unit/test_simulator.py and the fidelity test):

* **Dynamic batcher** (`dynamic_batch_scheduler.cc`), one batcher thread per model:
  - Requests queue per priority level (strict: level 1 first, no aging); a request's priority of 0
    or above `priority_levels` falls to `default_priority_level`. Each level has a policy: a queue
    timeout with REJECT or DELAY, and `max_queue_size` (a full level answers "Exceeds maximum
    queue size" at once).
  - A batch forms by scanning the queue in priority order: it is released at once when it reaches
    a preferred batch size (the largest one it can fill), or when it cannot grow past the largest
    preferred size; otherwise it waits until the oldest request has waited
    `max_queue_delay_microseconds`, then takes everything up to `max_batch_size`. With no
    preferred size Triton uses `[max_batch_size]` (it fills that in when it loads the config).
  - The batcher only forms a batch when it has a *payload slot*: with priority levels or any queue
    policy (the usual tritongen config), a slot is an idle instance, so batches form when an
    instance frees up; with no policy at all ("prefetching") up to 2 x instances batches may wait
    ahead, and a waiting batch keeps growing until it is full or an instance takes it.
  - Timeouts are enforced lazily, as the server does: a request is rejected (or, with DELAY, moved
    behind its level's live requests) only when the batcher scans it, or on the batcher's 500 ms
    tick while it waits for a slot. So a 0.5 s timeout fires between 0.5 s and the end of the
    execution that was running (the facts file saw ~0.8 s).
  - A batcher that finds an empty queue sleeps up to 500 ms; an arrival wakes it only if a slot
    is free (and the queue reaches the next preferred size); an execution's start wakes it.
  - An execution's *end* hands the instance back a little after its last response
    (`release_ms`, exponential: the backend's response path and the instance thread's return),
    and its notify sometimes fails to wake the batcher, which then sleeps on until the next
    arrival (a slot is free by then, so the arrival wakes it) or its 500 ms tick. Read off
    Triton's request trace (`tritongen.core.handoff`, `bench/trace_batcher.py`; ranker with queue
    policies on the embedded server): prompt hand-offs took 0.3-0.45 ms on average (P90 ~0.8-1.1
    ms); one instance lost 3-5% of its wakes at 100 req/s, 7-10% at 200 and 9-22% at 300, two
    instances 4-7% at 300 and 520 req/s. So the loss of a batcher asleep on an empty queue grows
    with the host's load (`completion_wake_p_idle` at 200 req/s, `wake_loss_doubling_per_s`;
    the trace counts suggest a doubling every 100 req/s, Triton's mean batch and tail a gentler
    one, every 200), while that of a batcher blocked waiting for a slot does not (`completion_wake_p`). An
    instance that holds rate-limiter resources loses a quarter more (`rate_limited_wake_loss`:
    4.2% of hand-offs against 3.4% for the same config without resources). Another idle instance
    always answers the notify.
* **Instances** execute one batch at a time: `curve(rows) + batch_ms + request_exec_ms x requests`.
  A model's `device_curve` part of that time needs its device exclusively, after the host part: the
  instances on one device (and every model on it) queue for the device in the order their host
  parts end, as kernels of several instances queue on one GPU. So throughput saturates at one
  execution per device part however many instances there are (fitted by the profile's
  instance-scaling levels: `profile_math.fit_instance_scaling`).
* **Rate limiter** (`--rate-limit=execution_count`): an execution needs its instance's resources
  (e.g. `compute: 1`) out of the server's totals; payloads wait in arrival order (then instance
  priority) and the head blocks the rest, as Triton's staging queue does.
* **Length-tiered lanes**: several model entries serve one route; a request goes to the first
  whose prompt-length range holds it.
* **Streaming LLMs** (decoupled models with an `llm` engine): Triton's batcher hands requests to
  the engine (instance time is only the hand-off), and the engine (`tritongen.core.engine`) does
  continuous batching over its KV pool with its own policy: reserve at admission (wait or kill),
  or grow and preempt / kill. Where its values come from: `tritongen.core.engine_sources`.

Overheads (`Overheads`, fitted from live runs on the embedded server, see `fit_overheads`):
  request_ms       time a request spends outside the scheduler and the instance: client encode,
                   HTTP parse, response send and decode. Adds latency, occupies nothing.
  batch_ms         per execution, the instance time outside the profiled curve: Python-backend
                   IPC to the stub, input/output tensor copies, the batcher-to-instance hand-off.
                   Negative (down to -request_exec_ms) where the curve, measured one request per
                   execution, already holds one request's per-request cost: a static-batch LLM
                   decodes each request of a batch, so its curve of rows in one request holds one
                   request's decode, and each further request adds one (oneshot in bench-zoo: the
                   fit's intercept clipped to 0 counted that decode twice, 10.4 ms, and put the
                   simulated latency 18-32% above live below capacity, 2026-12-07).
  request_exec_ms  per request inside an execution (response objects, per-request IPC).
  wake_ms          the batcher thread's wake-up latency after a notify.
  release_ms, completion_wake_p, completion_wake_p_idle, wake_loss_doubling_per_s,
  rate_limited_wake_loss
                   the hand-off above (0 and 1.0 = an ideal server).
  jitter_cv        relative noise of execution times on a shared host (lognormal, mean 1; or gamma,
                   `jitter_shape`, for random service times).

Pure and deterministic: the same inputs and seed give the same result. No I/O.
"""

from tritongen.core.simulator.inputs import (
    EMBEDDED_CPU_OVERHEADS,
    WAKE_LOSS_REFERENCE_PER_S,
    BatcherConfig,
    ModelSim,
    Overheads,
    QueuePolicy,
    ServerSim,
    ServiceCurve,
)
from tritongen.core.simulator.results import (
    NO_ROUTE,
    OK,
    OOM,
    QUEUE_FULL,
    STATUS_NAMES,
    TIMEOUT,
    TOO_LARGE,
    ClassStats,
    ModelStats,
    SimResult,
    measurement_window,
    percentile_ms,
    summarize_requests,
)
from tritongen.core.simulator.loop import Simulation, simulate, simulate_detail
from tritongen.core.simulator.configs import model_sim_from_config, rate_limit_from_flags
from tritongen.core.simulator.calibration import (
    BatchedRun,
    Handoff,
    LiveObservation,
    TracedRun,
    fit_handoff,
    fit_overheads,
    fit_wake_chances,
)

__all__ = [
    "EMBEDDED_CPU_OVERHEADS", "WAKE_LOSS_REFERENCE_PER_S", "BatcherConfig", "ModelSim", "Overheads", "QueuePolicy",
    "ServerSim", "ServiceCurve",
    "NO_ROUTE", "OK", "OOM", "QUEUE_FULL", "STATUS_NAMES", "TIMEOUT", "TOO_LARGE", "ClassStats", "ModelStats",
    "SimResult", "measurement_window", "percentile_ms", "summarize_requests",
    "Simulation", "simulate", "simulate_detail",
    "model_sim_from_config", "rate_limit_from_flags",
    "BatchedRun", "Handoff", "LiveObservation", "TracedRun", "fit_handoff", "fit_overheads", "fit_wake_chances",
]
