"""The policy's sections: traffic classes, models, devices, the adaptive and engine limits, headroom,
tenants, size limits and the admin doors. Each validates itself; what one section says about another
is checked by the whole document (`schema.SidecarPolicy`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tritongen.core.admin_categories import CATEGORIES, SHUT, WHAT
from tritongen.core.engine_window import BASELINE_TTFT_QUANTILE
from tritongen.core.sidecar_policy.base import DEVICE_ID, OTHER_TENANTS, Name, PolicyModel
from tritongen.core.sidecar_policy.kv_cost import KVCost


class ClassPolicy(PolicyModel):
    """A traffic class: its Triton priority and how long and how many of it may wait in the sidecar."""

    name: Name = Field(description="Class name clients put in the class header or request parameter.")
    kind: Literal["interactive", "normal", "batch"] = Field(description="Latency-sensitive, normal or offline.")
    priority: int = Field(ge=1, le=16, description="Triton priority level forwarded upstream; 1 is served first.")
    p99_ms: float = Field(gt=0, description="The class's P99 latency target (TTFT for streaming LLMs).")
    max_queue_wait_ms: float = Field(
        gt=0, description="A request waits at most this long in the sidecar's queue, then gets a 429."
    )
    queue_cap: int | None = Field(
        default=None, ge=0, description="Requests of this class waiting at once; one more gets a 429 at once. None "
        "(the default): no count limit, a request is refused only when its predicted wait exceeds the class's budget."
    )
    budget_fraction: float = Field(
        gt=0, le=1, description="Share of every memory and concurrency limit this class may fill; the rest is "
        "kept for higher classes (1.0 for the most latency-sensitive class)."
    )


class ModelPolicy(PolicyModel):
    """One Triton model entry the sidecar admits requests for."""

    name: Name = Field(description="Triton model name, as clients address it.")
    kind: Literal["llm", "classic"]
    streaming: bool = Field(default=False, description="Decoupled: one response per token.")
    devices: list[str] = Field(min_length=1, description="Device ids (see `devices`) the model's memory lives on.")
    engines: int = Field(default=1, ge=1, description="Independent engines (instances x replicas), each with its own pool.")
    kv: KVCost | None = Field(default=None, description="LLMs: the KV cost model.")
    request_bytes: int = Field(
        default=0, ge=0, description="Classic models: device memory one request holds while it runs."
    )
    request_bytes_source: Literal["profile", "analytic"] = Field(default="analytic")
    memory_quota_bytes: int | None = Field(
        default=None, gt=0, description="KV bytes this model may hold at once (LLMs: KV budget x engines)."
    )
    max_inflight: int | None = Field(
        default=None, ge=1, description="Requests of this model in flight at once (its concurrency quota); None: no "
        "sidecar limit (Triton's own queue bounds it)."
    )
    classes: list[str] | None = Field(default=None, description="Classes this model serves; None: all.")
    priority_levels: int = Field(
        default=0, ge=0, le=16, description="The model's Triton priority levels (0: none, priority is not forwarded)."
    )
    default_priority: int = Field(
        default=0, ge=0, le=16, description="The level Triton gives requests that name none (no rewrite is needed "
        "for a class at this level)."
    )
    release_grace_ms: float = Field(
        default=0, ge=0, description="After a cancellation the engine may hold memory until it notices; the "
        "reservation is kept this long before it is released."
    )
    grpc_streams: Literal["carried", "relay"] | None = Field(
        default=None, description="Streaming LLMs, gRPC ModelStreamInfer behind the native front: 'carried' (nginx "
        "carries the stream, Python decides once when it opens: no Python per token), 'relay' (Python reads every "
        "request of the stream and reserves its KV, and relays every token). None: carried where the engine queues "
        "(kv_policy grow_preempt, reserve_wait), relay where it kills or is not known (sidecar/stream_path.py)."
    )

    @model_validator(mode="after")
    def _kind(self) -> ModelPolicy:
        if self.kind == "llm" and self.kv is None:
            raise ValueError(f"model {self.name!r} is an llm: it needs `kv` (bytes_per_token, max_context, ...)")
        if self.kind == "classic" and self.kv is not None:
            raise ValueError(f"model {self.name!r} is classic: remove `kv` or set kind 'llm'")
        bad = [d for d in self.devices if not DEVICE_ID.match(d)]
        if bad:
            raise ValueError(f"model {self.name!r}: device ids {bad} must be 'cpu' or 'gpu<N>'")
        return self


class DevicePolicy(PolicyModel):
    """A device's memory, for the static fallback and to cap live readings."""

    id: str = Field(description="'cpu' or 'gpu<N>' (N = the NVML index).")
    memory_bytes: int = Field(gt=0, description="Physical memory of the device.")
    utilization_cap: float = Field(gt=0, le=1, description="Static fallback: plan for this fraction of it.")
    static_used_bytes: int = Field(
        ge=0, description="Static fallback: weights, framework reserve and pre-allocated KV pools placed here."
    )

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not DEVICE_ID.match(value):
            raise ValueError(f"device id {value!r} must be 'cpu' or 'gpu<N>'")
        return value

    @property
    def index(self) -> int | None:
        return None if self.id == "cpu" else int(self.id[3:])


class ConcurrencyPolicy(PolicyModel):
    """The adaptive in-flight limit: slides between min and max with hysteresis."""

    min: int = Field(ge=1, description="Lowest the limit goes.")
    max: int = Field(ge=1, description="Highest the limit goes.")
    initial: int | None = Field(default=None, ge=1, description="Starting limit (default: max).")
    high_watermark: float = Field(default=0.9, gt=0, le=1, description="Memory reserved/budget at or above this: step down.")
    low_watermark: float = Field(default=0.7, gt=0, le=1, description="At or below this (and short queues): step up.")
    queue_delay_high_ms: float = Field(gt=0, description="Triton's measured queueing delay at or above this: step down.")
    queue_delay_low_ms: float = Field(gt=0, description="At or below this (and a low watermark): step up.")
    adjust_interval_ms: float = Field(default=1000, gt=0, description="At most one change per interval.")
    increase_hold_ms: float = Field(
        default=3000, ge=0, description="After a step down, no step up for this long (hysteresis in time)."
    )
    decrease_factor: float = Field(default=0.9, gt=0, lt=1, description="Multiplicative step down.")
    increase_step: int = Field(default=1, ge=1, description="Additive step up.")

    @model_validator(mode="after")
    def _order(self) -> ConcurrencyPolicy:
        if self.min > self.max:
            raise ValueError(f"concurrency.min {self.min} exceeds concurrency.max {self.max}; swap them")
        if self.initial is not None and not self.min <= self.initial <= self.max:
            raise ValueError(f"concurrency.initial {self.initial} is outside [min {self.min}, max {self.max}]")
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"concurrency.low_watermark {self.low_watermark} must be below high_watermark "
                f"{self.high_watermark}; the gap between them is the hysteresis band"
            )
        if self.queue_delay_low_ms >= self.queue_delay_high_ms:
            raise ValueError(
                f"concurrency.queue_delay_low_ms {self.queue_delay_low_ms} must be below queue_delay_high_ms "
                f"{self.queue_delay_high_ms}"
            )
        return self


FIRST_TOKENS_KEPT = 512  # the queueing-engine law's baseline: times to first token it keeps, per model


class QueueingEnginePolicy(PolicyModel):
    """The in-flight limit of an LLM whose engine queues or preempts (sidecar/engine_concurrency.py):
    it starts at the model's max_inflight and follows what the engine runs. The defaults are counts
    of the engine's own steps and fractions, not times, so they hold on any device."""

    wait_steps: float = Field(
        default=2.0, gt=0, description="A request without a first token this many decode steps past the engine's "
        "baseline time to first token waits for a slot inside the engine (one it has room for starts within "
        "about a step of its prefill)."
    )
    baseline_quantile: float = Field(
        default=BASELINE_TTFT_QUANTILE, gt=0, lt=0.5, description="The engine's baseline time to first token: this "
        f"quantile of the last {FIRST_TOKENS_KEPT} first tokens (tritongen.core.engine_window.BASELINE_TTFT_QUANTILE "
        "says why P10; doctor reads the same)."
    )
    interval_ms: float = Field(default=1000, gt=0, description="At most one move per interval.")
    min_samples: int = Field(default=8, ge=1, description="First tokens measured before the limit moves.")
    increase_fraction: float = Field(
        default=0.25, gt=0, le=1, description="Step up by this fraction of the limit (at least one request)."
    )
    full_judgements: int = Field(
        default=2, ge=1, description="Judgements in a row that must find requests late at the engine before the "
        "limit steps down. A judgement: a full engine keeps requests waiting for a slot from one judgement (an "
        "interval, 1 s by default) to the next, while prompts prefilled one after another on a slow device are "
        "late for a few of its steps only; 2 costs one interval of convergence from a limit too high."
    )
    proven_judgements: int = Field(
        default=30, ge=1, description="The limit never steps below what the engine ran with no request late in any "
        "of this many recent judgements (with the default interval, 30 s). A judgement: long enough to span a "
        "lull in traffic, short enough that an engine whose room shrank (longer sequences in its pool) is "
        "followed within half a minute."
    )
    decrease_fraction: float = Field(
        default=0.25, gt=0, le=1, description="Step down to what the engine runs and one more, but by at most this "
        "fraction of the limit per judgement (1: straight there). A judgement, the same as the step up: from a "
        "limit twice too high the engine's figure is three judgements away, and a late prefill misread as a full "
        "engine costs a quarter of the slots for one interval, not most of them."
    )


    running_share: float = Field(
        default=0.25, gt=0, le=1, description="What the engine runs, as a judgement reads it: the most requests past "
        "their first token at once for at least this share of the interval since the last judgement. Not the peak: a "
        "first token relayed before another request's end (a busy event loop, or nginx's batched reports) lifts the "
        "count above what runs for moments (on the real vLLM at 32 sequences, peaks of 40-45). Not the count at the "
        "instant: sequences that start together end together, and the count dips between one batch and the next."
    )


class HeadroomPolicy(PolicyModel):
    sources: list[Literal["nvml", "triton_metrics", "static"]] = Field(
        default_factory=lambda: ["nvml", "triton_metrics", "static"],
        description="Headroom sources, tried in this order; 'static' always answers.",
    )
    safety_pad_bytes: int = Field(ge=0, description="Device memory kept free beyond reservations (prefill spikes).")
    poll_interval_ms: float = Field(default=500, gt=0, description="How often the sources are read.")
    stale_after_ms: float = Field(default=5000, gt=0, description="A live reading older than this is ignored.")

    @field_validator("sources")
    @classmethod
    def _static_last(cls, sources: list[str]) -> list[str]:
        if len(set(sources)) != len(sources):
            raise ValueError(f"headroom.sources {sources} name a source twice")
        if "static" not in sources:
            raise ValueError(f"headroom.sources {sources} must end with 'static', the fallback that always answers")
        if sources[-1] != "static":
            raise ValueError(f"headroom.sources {sources}: put 'static' last; sources after it would never be used")
        return sources


class TenantQuota(PolicyModel):
    """What one tenant's requests may hold at once, over all models; None: no limit of that kind.

    A class may fill only its `budget_fraction` of these quotas, as of every other limit, so a
    tenant's batch traffic cannot take the room its own interactive traffic needs."""

    max_inflight: int | None = Field(
        default=None, ge=1, description="Requests of this tenant in flight at once (its concurrency quota)."
    )
    max_reserved_bytes: int | None = Field(
        default=None, ge=1, description="Memory this tenant's requests may hold reserved at once: KV, prefill and "
        "per-request bytes, lingering reservations included (its memory quota)."
    )
    classes: list[str] | None = Field(default=None, description="Traffic classes this tenant may send; None: all.")

    @field_validator("classes")
    @classmethod
    def _some_class(cls, classes: list[str] | None) -> list[str] | None:
        if classes is not None and not classes:
            raise ValueError("classes [] would refuse every request of the tenant; list at least one class, or "
                             "leave `classes` out (null) to allow all")
        return classes


class TenantPolicy(TenantQuota):
    """A tenant with its own quota."""

    name: Name = Field(description="Tenant name, as clients send it in the tenant header.")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == OTHER_TENANTS:
            raise ValueError(f"the tenant name {OTHER_TENANTS!r} is reserved (the metrics count the tenants the "
                             "policy does not list under it); rename the tenant")
        return name


class LimitsPolicy(PolicyModel):
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above).")
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, description="Largest single header line accepted.")
    max_retry_after_s: int = Field(default=30, ge=1, description="Retry-After never says more than this.")


class AdminApisPolicy(PolicyModel):
    """Triton's admin APIs behind the sidecar (sidecar/admin_apis.py): the categories in
    `tritongen.core.admin_categories.SHUT` are served only to requests with the sidecar's admin token
    (`--token-file`); a category listed in `open` is served to every client."""

    open: list[str] = Field(
        default_factory=list, description="Admin API categories every client may use without the token: "
        + ", ".join(f"'{name}' ({WHAT[name]})" for name in SHUT) + ". Empty: all of them need the token.",
    )

    @field_validator("open", mode="before")
    @classmethod
    def _known(cls, names: Any) -> Any:
        if not isinstance(names, list):
            return names  # the type error says what is expected
        for name in names:
            if name in CATEGORIES and name not in SHUT:
                raise ValueError(f"{name!r} is never shut by the sidecar; only {list(SHUT)} can be opened")
            if not isinstance(name, str) or name not in SHUT:
                raise ValueError(f"unknown admin API category {name!r}; the valid ones are {list(SHUT)}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"admin_apis.open names {dupes} more than once")
        return names
