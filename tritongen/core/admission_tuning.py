"""The constants that shape the sidecar's admission decisions, each with where its value comes from.

Why here and not beside the code that reads them: a number that decides who is refused should be
found, questioned and changed in one place, with its provenance, and the ones a deployer may need to
move are policy fields (`tritongen.core.sidecar_policy.tuning`) whose defaults are these values, so
a policy that does not name them behaves as before.

Provenance words used below: *a standard* (a textbook bound or convention), *a definition* (the
value follows from what is counted), *measured* (a recorded measurement says so), *a judgement*
(chosen when the code was written, never fitted), *checked on one run* (a judgement that one bench
or demo run on one host was read against, which is not a fit), *a memory bound* (caps what is kept).
"""

from __future__ import annotations

# -- the wait estimate -------------------------------------------------------------------------------

WAIT_Z = 2.0
"""How sure a request below the top class must be of leaving the queue within its class's wait
before it is queued instead of refused: its wait is taken at z standard deviations above the mean,
(n + z sqrt n) / rate for n departures counted as Poisson. Policy field `admission.wait_z`.

Value: a standard, z = 2 is the one-sided normal bound at 97.7 % (docs say "98th percentile"). It
was compared, not fitted, against 0 (the mean) in bench/bench_admission.py's event simulation of a
32-sequence LLM (commit a3c6de9, medians of 3 seeds): at 1.5x load 62 against 270 refusals told
late, 1,665 against 1,669 served; one live bench_llm_guard run followed. Higher: fewer requests wait
their whole budget and are then refused late, more are refused up front that would have made it."""

STARVED_FRACTION = 0.05
"""When the top class's arrivals take all but this fraction of a model's drain rate, a lower-class
request is predicted to wait for ever. Value: a judgement (commit 2e1934e); it only bounds a
division by a rate near zero."""

# -- the measurements the estimate reads ----------------------------------------------------------------

LATENCY_QUANTILE = 0.9
"""Which quantile of a model's recent upstream time (admission to first response, or to the end of
a unary request) is subtracted from a class's latency target to get how long its requests may wait.
Policy field `admission.latency_quantile`. Value: a judgement from the first sidecar (commit
6c70a46), never fitted. Higher: shorter waits, more refusals, the served ones more surely in time;
lower: longer waits and more of the served ones late."""

LATENCY_SAMPLES = 64
"""Upstream-time samples kept per model for that quantile. A judgement (commit 6c70a46): enough for
a P90 to be the 58th of 64, few enough to follow a change of load within seconds."""

LATENCY_MIN_SAMPLES = 5
"""Below this many samples there is no upstream time and a request may wait its class's whole
`max_queue_wait_ms`. A judgement (commit 6c70a46)."""

SERVICE_ALPHA = 0.2
"""Weight of the newest sample in the moving mean of a model's service time (admitted to released),
which Little's law turns into a drain rate. A judgement (commit 6c70a46): about the last five
requests count. Higher: follows changes sooner and noisier."""

SEQ_LEN_ALPHA = 0.2
"""The same weight for the moving mean of a sequence's length (prompt + output tokens), which the
out-of-memory indicator reads. A judgement (commit 6c70a46)."""

DRAIN_WINDOW_S = 10.0
"""Completions of the last this many seconds give a model's completion rate. A judgement (commit
6c70a46). Longer: steadier and slower to follow a change."""

DRAIN_MIN_SAMPLES = 2
"""Fewer completions (or arrivals) than this in the window give no rate. Value: a definition, two
stamps are the least that span an interval."""

COMPLETIONS_KEPT = 512
"""Completion times kept per model (a memory bound; at most this many count in the window). A
judgement (commit 6c70a46)."""

ARRIVAL_WINDOW_S = 5.0
"""Arrivals of the last this many seconds give the rate at which higher classes pass a waiting
request. A judgement (commit 2e1934e)."""

ARRIVALS_KEPT = 2048
"""Arrivals kept per model in that window, the oldest dropped first: a memory and time bound under
a burst (commit 30181bd, which measured the decision's cost, not this value's effect)."""

# -- the lower classes' share of an LLM (LowerShare) ------------------------------------------------------

SHARE_MIN = 0.5
"""The least share of an LLM's rooms its lower classes keep while the top class's first tokens come
late: what they lose is throughput, and the engine must stay busy (issue 15). Policy field
`admission.lower_share.min`. Value: a judgement (commit 2e1934e), read against that commit's
bench_llm_guard runs on one host, not fitted. Lower: the top class is protected harder, at the
cost of lower-class goodput."""

SHARE_HIGH = 0.8
"""The lower classes' share shrinks while the top class's recent first-token latency (at
SHARE_QUANTILE) is above this fraction of its target. Policy field `admission.lower_share.high`.
Value: a judgement (commit 2e1934e): act before the target is missed, not at it. Lower: acts
sooner, and gives lower classes less while the top class is still in time."""

SHARE_LOW = 0.5
"""The share grows back while that latency is below this fraction of the target, or the top class is
quiet; between SHARE_LOW and SHARE_HIGH it holds (hysteresis). Policy field
`admission.lower_share.low`. Value: a judgement (commit 2e1934e)."""

SHARE_DECREASE = 0.7
"""Multiplicative step down of the share. A judgement (commit 2e1934e): from 1.0 the floor of 0.5 is
two steps away."""

SHARE_INCREASE = 0.1
"""Additive step up of the share. A judgement (commit 2e1934e): slower up than down, as for the
adaptive concurrency limit."""

SHARE_STEP_S = 0.5
"""At most one move of the share per this many seconds. A judgement (commit 2e1934e)."""

SHARE_WINDOW_S = 3.0
"""The top class's first tokens of the last this many seconds are judged. A judgement (commit
2e1934e)."""

SHARE_QUANTILE = 0.9
"""The quantile of those first tokens compared with SHARE_HIGH and SHARE_LOW. A judgement (commit
2e1934e), the same P90 the upstream time uses."""

SHARE_MIN_SAMPLES = 3
"""Fewer first tokens than this in the window read as a quiet top class. A judgement."""

SHARE_SAMPLES_KEPT = 256
"""First-token samples kept per model for the share (a memory bound)."""
