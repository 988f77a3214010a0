"""The policy in force, looked up by name: models, classes, tenants and each model's most urgent
class. Built again on every policy (re)load, so a lookup never sees half of two policies. Pure."""

from __future__ import annotations

from tritongen.core.sidecar_policy.base import DEFAULT_TENANT, OTHER_TENANTS
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.core.sidecar_policy.sections import ClassPolicy, DevicePolicy, ModelPolicy, TenantQuota

UNKNOWN_MODELS_KEPT = 1024  # policies made up for models the policy does not list, at most (a memory bound)


class PolicyIndex:
    def __init__(self, policy: SidecarPolicy) -> None:
        self.policy = policy
        self.top_level = min(c.priority for c in policy.classes)
        self.models: dict[str, ModelPolicy] = {m.name: m for m in policy.models}
        # Each model's most urgent class (1 is the top): whose first tokens LowerShare judges.
        tops = {m.name: min((c for c in policy.classes if m.classes is None or c.name in m.classes),
                            key=lambda c: c.priority, default=None) for m in policy.models}
        self.top_class: dict[str, ClassPolicy] = {name: top for name, top in tops.items() if top is not None}
        self.classes: dict[str, ClassPolicy] = {c.name: c for c in policy.classes}
        self.devices: dict[str, DevicePolicy] = {d.id: d for d in policy.devices}
        self.tenants = {t.name: t for t in policy.tenants}
        self._unknown_models: dict[str, ModelPolicy] = {}

    def model_policy(self, name: str) -> ModelPolicy:
        found = self.models.get(name)
        if found is not None:
            return found
        # A model the policy does not know: admitted under the global limit only, at no memory cost.
        unknown = self._unknown_models.get(name)
        if unknown is None:
            if len(self._unknown_models) > UNKNOWN_MODELS_KEPT:
                self._unknown_models.clear()
            unknown = ModelPolicy.model_construct(
                name=name, kind="classic", streaming=False, devices=[d.id for d in self.policy.devices],
                engines=1, kv=None, request_bytes=0, request_bytes_source="analytic", memory_quota_bytes=None,
                max_inflight=None, classes=None, release_grace_ms=0.0,
                priority_levels=16, default_priority=0,
            )
            self._unknown_models[name] = unknown
        return unknown

    def top_priority(self, model: ModelPolicy) -> int:
        """The most urgent class level the model serves (1 is the top)."""
        found = self.top_class.get(model.name)
        return found.priority if found is not None else self.top_level

    def class_policy(self, name: str | None) -> ClassPolicy:
        found = self.classes.get(name) if name else None
        if found is None:
            found = self.classes[self.policy.default_class]
        return found

    def tenant_quota(self, tenant: str) -> TenantQuota | None:
        """The tenant's own quota, else the policy's `default_tenant` (None: unlimited)."""
        return self.tenants.get(tenant, self.policy.default_tenant)

    def tenant_label(self, tenant: str) -> str:
        """The tenant's metrics label: listed tenants and `default` by name, any other `other`, so a
        client cannot grow the label set by inventing names."""
        return tenant if tenant in self.tenants or tenant == DEFAULT_TENANT else OTHER_TENANTS
