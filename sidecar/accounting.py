"""One accounting for every admitted request, whichever path carried it, and one classification of
how it ended.

The Python relays (through the admission block's `Ticket`), nginx for the requests the decision
socket admitted (its `end` message) and nginx's lane (counts read at each sync) each learn how a
request ended; `outcome` is the one rule that names the end from what a carrier saw, and
`Accounting` the one place that counts it. Why one: the lane counted its own ends and skipped the
tenant and queue-wait counters, and the three classifications could drift apart (issue 45).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.admission_types import Cost, Decision
from sidecar.metrics import SidecarMetrics, add_observations
from tritongen.core.engine_metrics import is_out_of_memory
from tritongen.core.engine_window import SIDECAR_OOM_OUTCOME
from tritongen.core.sidecar_policy.base import DEFAULT_TENANT

# How a carrier says a request ended (nginx's `how`, and the relays' through `Ticket`)
ENDED = "ok"  # it carried the request to its end, or the client left (the status says which)
DOWN = "down"  # Triton could not be reached
UNSENT = "unsent"  # granted, but the client left before it went upstream
CLIENT_CLOSED = 499  # nginx's status for a client that went away

# The outcomes `sidecar_requests_finished_total` counts
OK = "ok"
UPSTREAM_ERROR = "upstream_error"  # Triton answered with an error
OOM = SIDECAR_OOM_OUTCOME  # ... its engine killed the request for want of KV memory
UPSTREAM_FAILED = "upstream_failed"  # the connection to Triton broke
CLIENT_DISCONNECT = "client_disconnect"
CANCELLED = "cancelled"  # the relay's task was cancelled (the sidecar stopping)
ERROR = "error"  # the relay failed itself


def upstream_outcome(error: bytes | str) -> str:
    """How an admitted request that Triton answered with an error ended: "oom" when its engine
    killed it for want of KV memory (doctor's DR112 counts these), else "upstream_error"."""
    text = error.decode("utf-8", errors="replace") if isinstance(error, bytes) else error
    return OOM if is_out_of_memory(text) else UPSTREAM_ERROR


def outcome(how: str, status: int, error: bytes | str | None = None) -> str:
    """How a request ended, from what its carrier saw: `how`, the HTTP status the client got (a gRPC
    call that failed counts as 500, one whose client left as 499) and Triton's error text if any.
    Any status below 400 without an error is OK: nginx's lane tallies the others alone."""
    if how == UNSENT:
        return CLIENT_DISCONNECT
    if how == DOWN:
        return UPSTREAM_FAILED
    if status == CLIENT_CLOSED:
        return CLIENT_DISCONNECT
    if status >= 400 or error:
        return upstream_outcome(error or b"")
    return OK


@dataclass(frozen=True)
class Series:
    """The metric children every admitted request of one (class, model label) touches."""

    klass: str
    mlabel: str
    admitted: Any
    queue_wait: Any
    latency: Any
    outcomes: dict[str, Any]


class Accounting:
    """The counters of admitted and refused requests (sidecar/metrics.py), labelled so that what
    clients send cannot grow the label sets: models the policy does not list are `other`, tenants
    by the state's `tenant_label`."""

    def __init__(self, state: Any, metrics: SidecarMetrics) -> None:  # state: sidecar.admission.AdmissionState
        self.state = state
        self.metrics = metrics
        self._children: dict[tuple[Any, ...], Any] = {}
        self._series: dict[tuple[str, str], Series] = {}  # (class, model label) -> its per-request children

    def label(self, model: str) -> str:
        return model if self.state.known_model(model) else "other"

    def child(self, metric: Any, *labels: str) -> Any:
        """prometheus_client's labels() lookup is not free; keep the children per label set."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def series(self, klass: str, mlabel: str) -> Series:
        found = self._series.get((klass, mlabel))
        if found is None:
            m = self.metrics
            found = self._series[(klass, mlabel)] = Series(
                klass, mlabel, m.admitted.labels(klass, mlabel), m.queue_wait.labels(klass),
                m.latency.labels(klass, mlabel), {})
        return found

    def admitted(self, series: Series, tenant: str, waited_s: float, cost: Cost | None = None, count: int = 1) -> None:
        """`count` requests admitted, each having waited `waited_s` in the sidecar's queue. Prompt
        lengths are observed here, not on arrival: the histogram describes what reached Triton's
        queue (DR103 judges that queue), and a refused request that is retried would otherwise be
        counted once per try."""
        series.admitted.inc(count)
        self.child(self.metrics.tenant_admitted, self.state.tenant_label(tenant)).inc(count)
        if count == 1:
            series.queue_wait.observe(waited_s)
        else:
            add_observations(series.queue_wait, _in_bucket(series.queue_wait, waited_s, count), waited_s * count)
        if cost is not None and cost.prompt_lengths:
            histogram = self.child(self.metrics.prompt_tokens, series.mlabel)
            for length in cost.prompt_lengths:
                histogram.observe(length)

    def ended(self, series: Series, how: str, seconds: float | None, count: int = 1) -> None:
        """`count` admitted requests ended as `how` (an outcome); `seconds`: the one's end-to-end time
        (every admitted request's, whatever its outcome, so one latency panel reads every path), None
        when the caller adds the durations itself (the lane's, per bucket)."""
        found = series.outcomes.get(how)
        if found is None:
            found = series.outcomes[how] = self.metrics.outcomes.labels(series.klass, series.mlabel, how)
        found.inc(count)
        if seconds is not None:
            series.latency.observe(seconds)

    def rejected(self, decision: Decision, klass: str, mlabel: str, tenant: str) -> None:
        self.child(self.metrics.rejected, klass, mlabel, decision.reason).inc()
        self.child(self.metrics.tenant_rejected, self.state.tenant_label(tenant), decision.reason).inc()

    def lane_ended(self, model: str, klass: str, done: int, ends: Mapping[tuple[str, int], int],
                   per_bucket: Sequence[int], seconds: float) -> None:
        """`done` requests nginx's lane carried ended, taking `seconds` in all: counted as the Python
        path counts its own (a lane slot is a reservation of the default tenant, and a request that
        finds a free slot waits nothing in the sidecar), counted when nginx reports them finished.
        `ends`: how many ended per (how, status) nginx tallied apart, which `outcome` names; the
        rest ended OK. `per_bucket`: how many fell in each latency bucket (may be empty)."""
        mlabel = self.label(model)
        series = self.series(klass, mlabel)
        self.admitted(series, DEFAULT_TENANT, 0.0, count=done)
        named: dict[str, int] = {}
        for (how, status), n in ends.items():
            name = outcome(how, status)
            named[name] = named.get(name, 0) + n
        named[OK] = named.get(OK, 0) + done - sum(ends.values())
        for name, n in named.items():
            if n > 0:
                self.ended(series, name, None, n)
        if per_bucket:  # the same histogram as the Python path's requests: one latency panel sees both
            add_observations(series.latency, per_bucket, seconds)
        self.metrics.lane_requests.labels(klass, mlabel).inc(done)


def _in_bucket(histogram: Any, value: float, count: int) -> list[int]:
    """`count` observations of one `value` as per-bucket counts of `histogram` (+Inf last)."""
    bounds = histogram._upper_bounds  # prometheus_client's, +Inf included
    at = next(i for i, bound in enumerate(bounds) if value <= bound)
    return [count if i == at else 0 for i in range(len(bounds))]
