"""How many bytes the sidecar may hold on each memory scope (a device, `gpu0` or `cpu`, or a model's
KV pool, `pool:<m>`), from the latest headroom readings or the plan's static figures. Pure.

Live readings count what the sidecar reserved once: a reading taken while the sidecar held R
bytes on a scope that shows U bytes used means `max(0, U - R)` bytes are held by something else,
so capacity = total - pad - max(0, U - R). Static readings (the plan's arithmetic) do not include
reservations: capacity = total - pad - static used. A live reading older than the policy's
`headroom.stale_after_ms` is not used.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.admission_types import HeadroomSnapshot, Reading
from tritongen.core.sidecar_policy.schema import SidecarPolicy
from tritongen.core.sidecar_policy.sections import DevicePolicy


def static_reading(device: DevicePolicy) -> Reading:
    """The plan's arithmetic for a device: its memory x utilisation cap, less what the plan placed there."""
    return Reading(device.id, int(device.memory_bytes * device.utilization_cap), device.static_used_bytes, "static",
                   live=False)


class Capacity:
    def __init__(self, policy: SidecarPolicy) -> None:
        self.configure(policy)
        self.snapshot: HeadroomSnapshot | None = None
        self._reserved_at_sample: dict[str, int] = {}

    def configure(self, policy: SidecarPolicy) -> None:
        self.policy = policy
        self._devices = {d.id: d for d in policy.devices}

    def observe(self, snapshot: HeadroomSnapshot, reserved: Mapping[str, int]) -> None:
        """A new snapshot, taken while the sidecar held `reserved` bytes per scope."""
        self.snapshot = snapshot
        for scope, reading in snapshot.readings.items():
            if reading.live:
                self._reserved_at_sample[scope] = reserved.get(scope, 0)

    def fresh(self, now: float) -> HeadroomSnapshot | None:
        snap = self.snapshot
        if snap is None or (now - snap.taken_at) * 1000 > self.policy.headroom.stale_after_ms:
            return None
        return snap

    def reading(self, scope: str, now: float) -> Reading | None:
        """The reading in force for a scope: a fresh live one, else the static fallback (devices)."""
        snap = self.fresh(now)
        if snap is not None and scope in snap.readings:
            return snap.readings[scope]
        device = self._devices.get(scope)
        return None if device is None else static_reading(device)

    def capacity(self, scope: str, now: float) -> float | None:
        """Bytes the sidecar may hold on a scope in all (reservations included); None: unconstrained."""
        reading = self.reading(scope, now)
        if reading is None:
            return None
        pad = self.policy.headroom.safety_pad_bytes if not scope.startswith("pool:") else 0
        if reading.live:
            foreign = max(0, reading.used_bytes - self._reserved_at_sample.get(scope, 0))
            return float(reading.total_bytes - pad - foreign)
        return float(reading.total_bytes - pad - reading.used_bytes)

    def queue_delay_s(self, now: float) -> float | None:
        """Triton's longest mean queueing delay over the models, from a fresh snapshot."""
        snap = self.fresh(now)
        if snap is None or not snap.queue_delay_s:
            return None
        return max(snap.queue_delay_s.values())

    def watermark(self, now: float, reserved: Mapping[str, int]) -> float:
        """The fullest device: reserved / capacity over every device a model uses. KV quotas and pools
        are left out: each request's footprint is checked against them exactly, so a full pool is a
        busy engine, not a memory risk, and stepping the limit down for it would only cost goodput."""
        worst = 0.0
        for scope in sorted({d for m in self.policy.models for d in m.devices}):
            cap = self.capacity(scope, now)
            if cap is None:
                continue
            used = reserved.get(scope, 0)
            worst = max(worst, 1.0 if cap <= 0 else used / cap)
        return worst
