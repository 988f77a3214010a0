"""The sidecar's Prometheus metrics, on an explicit registry (tests use a fresh one).

Label sets stay bounded whatever clients send: models the policy does not list are counted as
`other`, and so are tenants (`sidecar_tenant_*`: the listed tenants, `default` and `other`).

`sidecar_prompt_tokens` (per model; LLM requests whose prompts the sidecar can read, counted when
admitted, one observation per sequence) is what `tritongen doctor` reads for rule DR103 (prompt
lengths spread widely on one queue: split into length lanes); its name and `model` label are the
ones tritongen/core/diagnosis_inputs.py expects (`PROMPT_HISTOGRAM`). The buckets are powers of two: the
doctor interpolates quantiles within a bucket, and with bounds a factor of 2 apart the P95 / P50
it reads for a narrow distribution stays well under its 4x threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
PROMPT_TOKEN_BUCKETS = tuple(float(2**n) for n in range(4, 18))  # 16 .. 131072 tokens
PROMPT_TOKENS_METRIC = "sidecar_prompt_tokens"


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.admitted = Counter("sidecar_requests_admitted", "Requests admitted upstream.", ["class", "model"], registry=r)
        self.queued = Counter("sidecar_requests_queued", "Requests that had to wait in the sidecar's queue, by the "
                              "limit that held them at arrival, by kind (sidecar/admission_types.py: concurrency_limit, "
                              "model_concurrency_quota, model_memory_quota, tenant_*, headroom, lower_class_share; "
                              "queue_order: a request ahead).", ["class", "model", "limit"], registry=r)
        self.rejected = Counter("sidecar_requests_rejected", "Requests refused by the sidecar, by the limit hit.",
                                ["class", "model", "reason"], registry=r)
        self.outcomes = Counter("sidecar_requests_finished", "Admitted requests by how they ended.",
                                ["class", "model", "outcome"], registry=r)
        self.inflight = Gauge("sidecar_inflight_requests", "Requests admitted and not yet finished.", ["model"], registry=r)
        self.inflight_total = Gauge("sidecar_inflight_requests_total", "All requests in flight.", registry=r)
        self.waiting = Gauge("sidecar_queue_depth", "Requests waiting in the sidecar's queue.", ["class"], registry=r)
        self.reserved = Gauge("sidecar_reserved_bytes", "Memory reserved by admitted requests (lingering included).",
                              ["model"], registry=r)
        self.reserved_total = Gauge("sidecar_reserved_bytes_total", "All memory reserved by the sidecar.", registry=r)
        self.oom_risk = Gauge("sidecar_oom_risk_ratio", "Leading OOM indicator: in-flight sequences x mean sequence "
                              "length x KV bytes per token / KV budget (>= 1: an engine that allocates as it goes "
                              "runs out).", ["model"], registry=r)
        self.headroom = Gauge("sidecar_headroom_bytes", "Memory the sidecar may still reserve on a scope.",
                              ["scope", "source"], registry=r)
        self.capacity = Gauge("sidecar_memory_capacity_bytes", "Memory the sidecar may hold on a scope in all.",
                              ["scope", "source"], registry=r)
        self.source_up = Gauge("sidecar_headroom_source_up", "1 when the headroom source answered at its last poll.",
                               ["source"], registry=r)
        self.source_failures = Counter("sidecar_headroom_source_failures", "Failed polls of a headroom source.",
                                       ["source"], registry=r)
        self.limit = Gauge("sidecar_concurrency_limit", "The adaptive in-flight limit.", registry=r)
        self.engine_limit = Gauge("sidecar_engine_limit", "In-flight limit of an LLM whose engine queues: what the "
                                  "engine was seen to run, and one more (sidecar/engine_concurrency.py).", ["model"],
                                  registry=r)
        self.prompt_ratio = Gauge("sidecar_prompt_bytes_per_token", "Prompt bytes per token the sidecar counts an "
                                  "LLM's prompts with, by source: learnt (from the engine's prompt-token counter) or "
                                  "policy (stated, profiled, or 1, the bound); absent with a tokenizer.",
                                  ["model", "source"], registry=r)
        self.watermark = Gauge("sidecar_memory_watermark_ratio", "Fullest memory limit: reserved / capacity.", registry=r)
        self.triton_queue_delay = Gauge("sidecar_triton_queue_delay_seconds",
                                        "Triton's measured queueing delay (worst model).", registry=r)
        self.gpu_utilization = Gauge("sidecar_gpu_utilization_ratio", "GPU utilisation from NVML (0..1).", ["device"],
                                     registry=r)
        self.upstream_up = Gauge("sidecar_upstream_up", "1 when Triton answered its last readiness probe.", registry=r)
        self.reloads = Counter("sidecar_policy_reloads", "Policy reloads by result.", ["result"], registry=r)
        self.policy_info = Gauge("sidecar_policy_info", "The policy in force (value 1).", ["digest", "deployment"],
                                 registry=r)
        self.queue_wait = Histogram("sidecar_queue_wait_seconds", "Time admitted requests waited in the sidecar.",
                                    ["class"], buckets=WAIT_BUCKETS, registry=r)
        self.latency = Histogram("sidecar_request_duration_seconds",
                                 "End-to-end time of admitted requests, whatever their outcome.",
                                 ["class", "model"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("sidecar_time_to_first_token_seconds", "Arrival to first streamed response.",
                              ["class", "model"], buckets=LATENCY_BUCKETS, registry=r)
        self.loop_lag = Histogram("sidecar_event_loop_lag_seconds", "How late the event loop ran a timer due now: "
                                  "time every request spends unseen, before its arrival is stamped.",
                                  buckets=LOOP_LAG_BUCKETS, registry=r)
        self.front_wait = Histogram("sidecar_front_wait_seconds", "Time a request the native front carries spent in "
                                    "nginx before the sidecar could judge it (nginx's accept queue, the decision "
                                    "socket's backlog); counted in its class's wait and its time to first token.",
                                    buckets=WAIT_BUCKETS, registry=r)
        self.unavailable = Counter("sidecar_requests_upstream_unavailable",
                                   "Requests answered 503 / UNAVAILABLE at once because Triton was down.",
                                   ["protocol"], registry=r)
        self.tenant_admitted = Counter("sidecar_tenant_requests_admitted", "Requests admitted upstream, by tenant.",
                                       ["tenant"], registry=r)
        self.tenant_rejected = Counter("sidecar_tenant_requests_rejected", "Requests refused by the sidecar, by "
                                       "tenant and the reason.", ["tenant", "reason"], registry=r)
        self.tenant_inflight = Gauge("sidecar_tenant_inflight_requests", "Requests of a tenant admitted and not "
                                     "yet finished.", ["tenant"], registry=r)
        self.tenant_reserved = Gauge("sidecar_tenant_reserved_bytes", "Memory reserved by a tenant's requests "
                                     "(lingering included).", ["tenant"], registry=r)
        self.prompt_tokens = Histogram(PROMPT_TOKENS_METRIC, "Prompt length in tokens of admitted LLM requests, "
                                       "one observation per sequence (prompts the sidecar can read).", ["model"],
                                       buckets=PROMPT_TOKEN_BUCKETS, registry=r)
        self.malformed = Counter("sidecar_requests_malformed", "Requests refused with 400 before admission.",
                                 ["protocol"], registry=r)
        self.admin_refused = Counter("sidecar_admin_refused", "Requests for Triton's admin APIs (model-repository, "
                                     "logging, trace, shared-memory) refused: no valid admin token and the category "
                                     "not opened by the policy's admin_apis.open.", ["category", "protocol"],
                                     registry=r)

        # the native front's fast lane (sidecar/lane.py): requests nginx sent straight to Triton
        self.lane_requests = Counter("sidecar_lane_requests", "Requests the native front's lane sent straight to "
                                     "Triton (finished), by class and model.", ["class", "model"], registry=r)
        self.lane_overflow = Counter("sidecar_lane_overflow", "Lane requests that found no free slot and went "
                                     "through the Python path (admission, queue).", ["class", "model"], registry=r)
        self.lane_slots = Gauge("sidecar_lane_slots", "Slots the lane holds: reservations in the admission state "
                                "that nginx may fill without asking (counted in sidecar_inflight_requests).",
                                ["class", "model"], registry=r)

        # gRPC ModelStreamInfer: which way each stream went (sidecar/stream_path.py)
        self.grpc_streams = Counter("sidecar_grpc_streams", "gRPC ModelStreamInfer calls, by the way they went: "
                                    "'carried' (nginx, one decision per stream) or 'relay' (Python, every request "
                                    "and token).", ["path"], registry=r)
        self.stream_requests = Counter("sidecar_carried_stream_requests", "Requests inside the streams nginx "
                                       "carried, as its response frames showed them ending: 'ended' (final flag), "
                                       "'error' (an error response), 'unfinished' (the stream closed first).",
                                       ["model", "outcome"], registry=r)

    def exposition(self, names: Sequence[str] = ()) -> bytes:
        """The text format; only the series `names` when given (`GET /metrics?name[]=...`, as
        prometheus_client's own handlers take it): a watcher that samples one gauge often need not
        make the sidecar format every histogram each time."""
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)


def add_observations(child: object, per_bucket: Sequence[int], seconds: float) -> None:
    """Observations made elsewhere added to one histogram series: how many fell in each of its buckets
    (not cumulative, +Inf last) and their summed seconds. nginx's lane counts its requests this way
    (sidecar/tritongen_lane.lua) so the latency panels see them beside the Python path's.
    prometheus_client has no public call for it: this adds to the series' bucket and sum values as
    its `observe` does."""
    buckets = child._buckets  # type: ignore[attr-defined]
    if len(per_bucket) != len(buckets):
        raise ValueError(f"{len(per_bucket)} bucket counts for a histogram of {len(buckets)} buckets")
    child._sum.inc(seconds)  # type: ignore[attr-defined]
    for value, n in zip(buckets, per_bucket):
        if n > 0:
            value.inc(n)
