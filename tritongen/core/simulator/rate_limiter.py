"""The rate limiter's resources (`--rate-limit=execution_count`): what the server holds per
(name, device), and whether an instance's execution can take its share now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tritongen.core.simulator.model_state import ModelState

ResourceKey = tuple[str, int]  # (resource name, device; -1 = global)


def _key(declared: str) -> ResourceKey:
    """'name' or 'name:device' as the server flag gives it."""
    name, _, dev = declared.partition(":")
    return (name, int(dev) if dev else -1)


def resource_totals(declared: Mapping[str, int], models: Sequence[ModelState]) -> dict[ResourceKey, int]:
    """The server's totals: the declared ones, and for an undeclared resource the largest single need
    (as Triton sizes it). A model needing more than a declared total is refused, as Triton refuses to load it."""
    totals: dict[ResourceKey, int] = {}
    for key, count in declared.items():
        totals[_key(key)] = count
    for m in models:
        for name, need in m.cfg.resources.items():
            for dev in set(m.inst_device):
                k = (name, dev) if (name, dev) in totals else (name, -1)
                if k not in totals or totals[k] < need:
                    if k in totals and k in {_key(d) for d in declared}:
                        raise ValueError(
                            f"model {m.cfg.name!r} needs {need} of resource {name!r} but the server declares "
                            f"{totals[k]}; Triton refuses to load it"
                        )
                    totals[k] = max(totals.get(k, 0), need)
    return totals


class ResourcePool:
    """The free resources while the simulation runs; an instance takes its model's resources on its
    device (or the global ones where the device has none) for the length of an execution."""

    def __init__(self, totals: dict[ResourceKey, int]) -> None:
        self.free = totals

    def fits(self, m: ModelState, inst: int) -> bool:
        dev = m.inst_device[inst]
        for name, need in m.cfg.resources.items():
            k = (name, dev) if (name, dev) in self.free else (name, -1)
            if self.free.get(k, 0) < need:
                return False
        return True

    def take(self, m: ModelState, inst: int, sign: int) -> None:
        """Take (sign +1) or give back (sign -1) the resources of one execution of `inst`."""
        dev = m.inst_device[inst]
        for name, need in m.cfg.resources.items():
            k = (name, dev) if (name, dev) in self.free else (name, -1)
            self.free[k] = self.free.get(k, 0) - sign * need
