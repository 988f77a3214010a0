"""The sidecar's policy file: a strict, versioned JSON document that `tritongen render` writes.
The whole document and its cross-checks live here; its sections in sections.py, kv_cost.py and
tuning.py.

`build_sidecar_policy` (build.py, beside this) derives every number here from the
deployment spec, its plan and any profiles, and `policy_from_profiles` (from_profiles.py) from
profiles alone, naming what it assumed in `notes`; the sidecar only reads it. Unknown keys, impossible
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
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from tritongen.core.sidecar_policy.base import PolicyModel
from tritongen.core.sidecar_policy.sections import (
    AdminApisPolicy,
    ClassPolicy,
    ConcurrencyPolicy,
    DevicePolicy,
    HeadroomPolicy,
    LimitsPolicy,
    ModelPolicy,
    QueueingEnginePolicy,
    TenantPolicy,
    TenantQuota,
)
from tritongen.core.sidecar_policy.tuning import AdmissionPolicy, LanePolicy
from tritongen.errors import BadInput

POLICY_VERSION = 1


class PolicyError(BadInput):
    """The policy file is missing, not JSON, or does not validate; the message lists every problem."""


class SidecarPolicy(PolicyModel):
    version: int = Field(description="Policy format version: POLICY_VERSION (parse_policy refuses any other).")
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
    admission: AdmissionPolicy = Field(
        default_factory=AdmissionPolicy, description="How sure the wait estimate must be and how far lower "
        "classes give way (defaults: tritongen/core/admission_tuning.py).",
    )
    lane: LanePolicy = Field(
        default_factory=LanePolicy, description="The native front's fast lane: spare slots and sync cadence "
        "(defaults: tritongen/core/lane_tuning.py).",
    )
    notes: list[str] = Field(default_factory=list, description="How the numbers were derived (for humans).")

    @field_validator("version")
    @classmethod
    def _version(cls, version: int) -> int:
        if version != POLICY_VERSION:
            raise ValueError(f"version {version} is not supported (this sidecar reads version {POLICY_VERSION})")
        return version

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

