"""The sidecar's policy file: a strict, versioned JSON document that `tritongen render` writes.
One file (over 500 lines): the policy document is one versioned schema; its sections validate against each
other (classes, models, pools, tenants, admin doors), so splitting would scatter the cross-checks.

`build_sidecar_policy` (tritongen/core/sidecar_policy.py) derives every number here from the
deployment spec, its plan and any profiles; the sidecar only reads it. Unknown keys, impossible
values and contradictions are refused with the field path, both values and the fix, and a policy
that fails validation on reload is refused while the old one stays in force.

Units are in the field names: `_bytes` bytes, `_ms` milliseconds, `_s` seconds.

Tenants (optional): requests name their tenant in `tenant_header` (gRPC: the same lowercase
metadata key); requests without it belong to tenant `default`. A tenant listed in `tenants` gets
its own quota; every other tenant (`default` included, unless listed) gets the `default_tenant`
quota, each tenant on its own, or no limit at all when `default_tenant` is absent. The header is
not authenticated: put the sidecar behind something that sets it (a gateway), or a client can
name itself into another tenant's quota. The name `other` is reserved: the metrics count tenants
that are not listed under it, which keeps their label set bounded.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tritongen.core.engine_window import BASELINE_TTFT_QUANTILE
from tritongen.core.file_names import POLICY_FILE  # noqa: F401  (the name the policy file goes by)
from tritongen.core.strict import Strict
from tritongen.errors import BadInput

POLICY_VERSION = 1

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NAME_MAX_LENGTH = 128
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]
DEFAULT_TENANT = "default"  # the tenant of requests that name none
OTHER_TENANTS = "other"  # the metrics label of every tenant the policy does not list
DEVICE_ID = re.compile(r"^(cpu|gpu[0-9]+)$")


class PolicyError(BadInput):
    """The policy file is missing, not JSON, or does not validate; the message lists every problem."""


class _Strict(Strict):
    """Strict, and defaults validated too: a policy is a file."""

    model_config = ConfigDict(validate_default=True)


class ClassPolicy(_Strict):
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


class PrefillPoint(_Strict):
    prompt_tokens: int = Field(ge=1, description="Prompt length the peak was measured at.")
    peak_bytes: int = Field(ge=0, description="Transient memory over steady state while that prompt is prefilled.")


KVPolicyName = Literal["reserve_wait", "reserve_kill", "grow_preempt", "grow_kill"]


class CappedKV(_Strict):
    """Layers whose cache stops growing at a cap: sliding windows, Llama 4's chunked attention."""

    cap_tokens: int = Field(ge=1, description="Tokens these layers keep at most (the window, or one chunk).")
    bytes_per_token: float = Field(gt=0, description="Bytes a token adds to these layers (per rank), up to the cap.")


class KVCost(_Strict):
    """How an LLM request's memory is computed: at its length L (prompt + output tokens, in whole
    blocks), `bytes_per_token x L + sum(capped bytes_per_token x min(L, cap)) + state_bytes`; for a
    classic model (no capped layers, no state) that is L x bytes per token.

    `kv_policy` says what the engine does with it (tritongen/core/engine.py): engines that reserve
    at admission (reserve_wait, reserve_kill) or kill when they run dry (grow_kill) get each
    request's whole footprint reserved against their pool, which is what keeps them from killing;
    a grow-and-preempt engine (vLLM) never kills, so it is admitted by its sequence limit and the
    predicted wait alone, and no KV is reserved for it."""

    bytes_per_token: float = Field(
        ge=0, description="KV-cache bytes per token (per rank) of the layers that keep every token; for a classic "
        "model, of every layer."
    )
    bytes_per_token_source: Literal["profile", "analytic"] = Field(description="Where bytes_per_token comes from.")
    capped: list[CappedKV] = Field(
        default_factory=list, description="Layers that stop growing at a cap, each with the bytes a token adds to "
        "them below it (tritongen.core.kv.KVFootprint). Empty: none, every layer grows with the sequence."
    )
    state_bytes: int = Field(
        default=0, ge=0, description="Fixed bytes one sequence holds whatever its length: the states of linear-"
        "attention and Mamba layers (per rank)."
    )
    block_tokens: int = Field(default=1, ge=1, description="Paged engines allocate whole blocks of this many tokens.")
    max_context: int = Field(
        ge=1, description="Prompt + output tokens at most. A request asking for more output than this is refused at "
        "once (400); an unknown prompt is charged up to it."
    )
    kv_policy: KVPolicyName | None = Field(
        default=None, description="The engine's KV policy (see the class docstring); None: unknown, reserve as "
        "reserve_kill would."
    )
    engine_pool_bytes: int | None = Field(
        default=None, gt=0, description="One engine's whole KV pool: a request whose footprint exceeds it can never "
        "run, and is refused at once (413). None: not known."
    )
    default_max_tokens: int | None = Field(
        default=None, ge=0, description="Output tokens assumed when a request names none (None: up to max_context)."
    )
    prompt_bytes_per_token: float = Field(
        default=1.0, gt=0, description="UTF-8 bytes per prompt token; 1.0 (byte-level tokenizer) is the safe bound."
    )
    tokenizer: str | None = Field(
        default=None, min_length=1, description="A Hugging Face tokenizer.json (relative: to the policy file) the "
        "sidecar counts each prompt's tokens with, when the `tokenizers` package is installed; else, or when a prompt "
        "cannot be read, prompt_bytes_per_token estimates them."
    )
    prompt_input: str = Field(default="text_input", min_length=1, description="Input tensor holding the prompt.")
    max_tokens_input: str = Field(default="max_tokens", min_length=1, description="Input tensor holding max_tokens.")
    preallocated: bool = Field(
        default=True, description="The engine allocates its KV pool up front: KV costs count against the model's "
        "pool, not against free device memory."
    )
    prefill_peak: list[PrefillPoint] = Field(
        default_factory=list, description="Profiled prefill memory peak by prompt length (empty: no profile)."
    )
    prefill_peak_source: Literal["profile", "none"] = Field(default="none")

    @property
    def reserves(self) -> bool:
        """Whether admission reserves each request's KV footprint (every policy but grow_preempt)."""
        return self.kv_policy != "grow_preempt"

    @model_validator(mode="after")
    def _costs_something(self) -> KVCost:
        if self.bytes_per_token == 0 and not self.capped and self.state_bytes == 0:
            raise ValueError("kv: bytes_per_token is 0 and there are no capped layers and no state_bytes: a sequence "
                             "would cost nothing; give the model's KV bytes per token")
        return self

    def bytes_at(self, tokens: float) -> float:
        """Bytes one sequence of `tokens` tokens holds (every layer kind as it grows; 0 when empty)."""
        if tokens <= 0:
            return 0.0
        capped = sum(c.bytes_per_token * min(tokens, c.cap_tokens) for c in self.capped)
        return self.bytes_per_token * tokens + capped + self.state_bytes

    @field_validator("prefill_peak")
    @classmethod
    def _sorted(cls, points: list[PrefillPoint]) -> list[PrefillPoint]:
        lengths = [p.prompt_tokens for p in points]
        if lengths != sorted(set(lengths)):
            raise ValueError(f"prefill_peak prompt lengths {lengths} must be strictly increasing")
        return points


class ModelPolicy(_Strict):
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


class DevicePolicy(_Strict):
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


class ConcurrencyPolicy(_Strict):
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


class QueueingEnginePolicy(_Strict):
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


class HeadroomPolicy(_Strict):
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


class TenantQuota(_Strict):
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


class LimitsPolicy(_Strict):
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above).")
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, description="Largest single header line accepted.")
    max_retry_after_s: int = Field(default=30, ge=1, description="Retry-After never says more than this.")


class AdminApisPolicy(_Strict):
    """Triton's admin APIs behind the sidecar (sidecar/admin_apis.py): model repository, logging,
    trace and shared memory are shut, served only to requests with the sidecar's admin token
    (`--token-file`); a category listed in `open` is served to every client."""

    open: list[Literal["model-repository", "logging", "trace", "shared-memory"]] = Field(
        default_factory=list, description="Admin API categories every client may use without the token: "
        "'model-repository' (index, load, unload), 'logging', 'trace' (global and per-model settings), "
        "'shared-memory' (system and CUDA status, register, unregister). Empty: all four need the token.",
    )

    @field_validator("open", mode="before")
    @classmethod
    def _known(cls, names: Any) -> Any:
        shut = ("model-repository", "logging", "trace", "shared-memory")
        always_open = ("health", "metadata", "inference", "model-config", "statistics")
        if not isinstance(names, list):
            return names  # the type error says what is expected
        for name in names:
            if name in always_open:
                raise ValueError(f"{name!r} is never shut by the sidecar; only {list(shut)} can be opened")
            if not isinstance(name, str) or name not in shut:
                raise ValueError(f"unknown admin API category {name!r}; the valid ones are {list(shut)}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"admin_apis.open names {dupes} more than once")
        return names


class SidecarPolicy(_Strict):
    version: Literal[1] = Field(description="Policy format version.")
    deployment: str = Field(min_length=1, description="The spec's deployment name.")
    class_header: str = Field(default="x-traffic-class", pattern=r"^[a-z0-9-]+$", description="Header naming the class.")
    class_parameter: str = Field(default="traffic_class", min_length=1, description="Request parameter naming the class.")
    tenant_header: str = Field(
        default="x-tenant", pattern=r"^[a-z0-9-]+$",
        description="Header (gRPC: metadata key) naming the tenant; requests without it belong to tenant 'default'.",
    )
    default_class: str = Field(description="Class of requests that name none.")
    starvation_guard_ms: float = Field(gt=0, description="A queued request is promoted one level per this much waiting.")
    classes: list[ClassPolicy] = Field(min_length=1)
    devices: list[DevicePolicy] = Field(min_length=1)
    models: list[ModelPolicy] = Field(default_factory=list)
    tenants: list[TenantPolicy] = Field(default_factory=list, description="Tenants with quotas of their own.")
    default_tenant: TenantQuota | None = Field(
        default=None, description="The quota of each tenant not listed in `tenants` (tenant 'default' included "
        "unless listed); None: unlimited.",
    )
    concurrency: ConcurrencyPolicy
    queueing_engines: QueueingEnginePolicy = Field(
        default_factory=QueueingEnginePolicy, description="How the in-flight limit of an LLM whose engine queues "
        "(kv_policy grow_preempt) follows the engine."
    )
    headroom: HeadroomPolicy
    limits: LimitsPolicy = Field(default_factory=LimitsPolicy)
    admin_apis: AdminApisPolicy = Field(
        default_factory=AdminApisPolicy, description="Triton's admin APIs: shut without the admin token, "
        "unless opened here.",
    )
    notes: list[str] = Field(default_factory=list, description="How the numbers were derived (for humans).")

    @model_validator(mode="after")
    def _cross(self) -> SidecarPolicy:
        for where, names in (
            ("classes", [c.name for c in self.classes]),
            ("models", [m.name for m in self.models]),
            ("devices", [d.id for d in self.devices]),
            ("tenants", [t.name for t in self.tenants]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{where}: names {dupes} appear more than once")
        classes = {c.name for c in self.classes}
        if self.default_class not in classes:
            raise ValueError(f"default_class {self.default_class!r} is not one of the classes {sorted(classes)}")
        levels = [c.priority for c in self.classes]
        if len(set(levels)) != len(levels):
            raise ValueError(f"classes use priorities {levels}; give each class its own level")
        devices = {d.id for d in self.devices}
        for model in self.models:
            missing = sorted(set(model.devices) - devices)
            if missing:
                raise ValueError(f"model {model.name!r}: devices {missing} are not in `devices` {sorted(devices)}")
            unknown = sorted(set(model.classes or []) - classes)
            if unknown:
                raise ValueError(f"model {model.name!r}: classes {unknown} are not in `classes` {sorted(classes)}")
        self._check_tenants(classes)
        self._check_admissible()
        return self

    def _check_admissible(self) -> None:
        """A policy under which no request could ever be admitted is refused here, at render (which
        validates what it writes) and at sidecar start, instead of refusing every request later."""
        pad = self.headroom.safety_pad_bytes
        used_devices = {d for m in self.models for d in m.devices}
        for i, device in enumerate(self.devices):
            if device.id not in used_devices:
                continue
            where = f"devices[{i}] ({device.id!r})"
            if pad >= device.memory_bytes:
                raise ValueError(
                    f"headroom.safety_pad_bytes {pad} ({_mib(pad)}) is not below {where}.memory_bytes "
                    f"{device.memory_bytes} ({_mib(device.memory_bytes)}): no request could ever be admitted; lower "
                    "the spec's policy.kv_safety_pad_mb (it renders safety_pad_bytes)"
                )
            budget = device.memory_bytes * device.utilization_cap
            free = budget - pad - device.static_used_bytes
            if free <= 0:
                raise ValueError(
                    f"{where}: no request could ever be admitted: memory_bytes {_mib(device.memory_bytes)} x "
                    f"utilization_cap {device.utilization_cap:g} = {_mib(budget)}, less headroom.safety_pad_bytes "
                    f"{_mib(pad)} and static_used_bytes {_mib(device.static_used_bytes)} leaves {_mib(free)}; lower "
                    "the spec's policy.kv_safety_pad_mb (safety_pad_bytes) or the memory placed on the device, or "
                    "raise its memory / memory_utilization_cap"
                )
        for i, model in enumerate(self.models):
            kv = model.kv
            if kv is None or model.memory_quota_bytes is None or not kv.reserves:
                continue
            smallest = math.ceil(kv.bytes_at(kv.block_tokens))
            if model.memory_quota_bytes < smallest:
                raise ValueError(
                    f"models[{i}] ({model.name!r}): memory_quota_bytes {model.memory_quota_bytes} is below one KV "
                    f"block ({smallest} bytes): no request could ever be admitted; give the model a KV pool (the "
                    "spec's memory_quota_mb or engine.kv_pool_tokens)"
                )

    def _check_tenants(self, classes: set[str]) -> None:
        if self.tenant_header == self.class_header:
            raise ValueError(
                f"tenant_header {self.tenant_header!r} is also the class_header {self.class_header!r}; one header "
                "cannot name both the tenant and the traffic class: give the tenant its own header"
            )
        quotas: list[tuple[str, TenantQuota]] = [
            (f"tenants[{i}] ({t.name!r})", t) for i, t in enumerate(self.tenants)
        ]
        if self.default_tenant is not None:
            quotas.append(("default_tenant", self.default_tenant))
        for where, quota in quotas:
            unknown = sorted(set(quota.classes or []) - classes)
            if unknown:
                raise ValueError(
                    f"{where}: classes {unknown} are not in `classes` {sorted(classes)}; name classes the policy "
                    "defines, or leave `classes` out to allow all"
                )

    # -- lookups ---------------------------------------------------------------------------------

    def class_named(self, name: str) -> ClassPolicy | None:
        return next((c for c in self.classes if c.name == name), None)

    def model_named(self, name: str) -> ModelPolicy | None:
        return next((m for m in self.models if m.name == name), None)

    def tenant_quota(self, name: str) -> TenantQuota | None:
        """The quota a tenant gets: its own if listed, else `default_tenant` (None: unlimited)."""
        return next((t for t in self.tenants if t.name == name), self.default_tenant)

    def digest(self) -> str:
        """A short fingerprint of the policy's content (status and logs say which policy is in force)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(top level)"


def _describe(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key; check the spelling"
    if kind == "missing":
        return "required key is missing"
    msg = str(error.get("msg", ""))
    return msg.removeprefix("Value error, ")


def parse_policy(data: Any, source: str = "policy") -> SidecarPolicy:
    """Validate a decoded policy document; PolicyError lists every problem with its field path."""
    if isinstance(data, dict) and "version" in data and data["version"] != POLICY_VERSION:
        raise PolicyError(
            f"{source}: policy version {data['version']!r} is not supported (this sidecar reads version "
            f"{POLICY_VERSION}); render the policy again with this tritongen"
        )
    try:
        return SidecarPolicy.model_validate(data)
    except ValidationError as err:
        problems = [f"  {_loc(tuple(e['loc']))}: {_describe(e)}" for e in err.errors()]
        noun = "problem" if len(problems) == 1 else "problems"
        raise PolicyError(f"{source}: {len(problems)} {noun} in the sidecar policy:\n" + "\n".join(problems)) from None


def parse_policy_text(text: str, source: str = "policy") -> SidecarPolicy:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PolicyError(f"{source}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from None
    return parse_policy(data, source)


def load_policy(path: Path) -> SidecarPolicy:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PolicyError(f"cannot read the sidecar policy {path}: {err.strerror or err}") from None
    return parse_policy_text(text, str(path))
