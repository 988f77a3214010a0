"""Device memory: each spec model's quota, and which devices hold it.

The first step of planning (`tritongen.core.plan`): a quota is what one replica may hold on each of
its devices (weights + KV + pad), stated by the spec or built from its defaults, and placement
is a first-fit of those quotas onto the devices under the utilisation cap. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from tritongen.core.architecture import Architecture
from tritongen.core.kv import weight_bytes
from tritongen.core.spec import MIB, DeploymentSpec, ModelSpec
from tritongen.core.strict import Strict
from tritongen.errors import Infeasible


class Placement(Strict):
    """Where one spec model runs and the memory quota it holds on each of its devices."""

    model: str
    gpus: list[int]
    quota_bytes: int
    reserve_bytes: int  # the framework reserve (runtime memory outside weights and KV) it counts on
    quota_source: str  # the spec field that states the quota, or the default it came from
    quota_default: bool  # no memory_quota_mb states it
    quota_fitted: bool  # a default scaled down to its share of the device (see fit_default_quotas)



class Quota(Strict):
    """What one replica of a spec model asks for on each of its devices, and what it cannot do without.

    A quota the spec states (`memory_quota_mb` of the model or of the policy) is both; so is a
    default built only from values the spec states. A default built on a policy default (the
    framework reserve of a classic model, the whole device of an LLM) may shrink to `floor` when
    the defaults do not fit (`fit_default_quotas`).
    """

    bytes: int
    floor: int
    weights_bytes: int
    reserve_bytes: int
    source: str
    stated: bool  # memory_quota_mb (the model's or the policy's) states it

    @property
    def fits_down(self) -> bool:
        return self.floor < self.bytes


def model_quota(spec: DeploymentSpec, model: ModelSpec, arch: Architecture | None) -> Quota:
    """Device memory one replica of `model` may hold on each of its GPUs (weights + KV + pad)."""
    policy = spec.policy
    weights = (weights_bytes_of(model, arch) if model.weights else 0) // model.tensor_parallel
    reserve = int(policy.framework_reserve_mb * MIB)
    if model.memory_quota_mb is not None or policy.memory_quota_mb is not None:
        field = "memory_quota_mb" if model.memory_quota_mb is not None else "policy.memory_quota_mb"
        quota = int((model.memory_quota_mb or policy.memory_quota_mb) * MIB)  # type: ignore[operator]
        if model.kind == "classic" and not _reserve_stated(spec):
            reserve = min(reserve, max(0, quota - weights))  # a classic quota is weights + reserve
        return Quota(bytes=quota, floor=quota, weights_bytes=weights, reserve_bytes=reserve,
                     source=f"{field} {quota / MIB:g} MiB", stated=True)
    cap = policy.memory_utilization_cap
    if model.kind == "llm":  # an LLM without a quota takes a whole device
        whole = int(min(spec.hardware.devices_mb()) * cap * MIB)
        return Quota(bytes=whole, floor=min(weights, whole), weights_bytes=weights, reserve_bytes=reserve,
                     source=f"default: a whole device under the {cap:.0%} cap", stated=False)
    stated = _reserve_stated(spec)
    return Quota(
        bytes=weights + reserve, floor=weights + reserve if stated else weights, weights_bytes=weights,
        reserve_bytes=reserve,
        source=f"default: weights {weights / MIB:.1f} MiB + policy.framework_reserve_mb {reserve / MIB:g} MiB"
        + ("" if stated else " (its default)"),
        stated=False,
    )


def plan_memory(spec: DeploymentSpec, architectures: Mapping[str, Architecture]) -> list[Placement]:
    """Each spec model's quota and devices: the quotas as asked for when they fit, else the defaults
    fitted to what the stated quotas leave (`fit_default_quotas`). A stated quota never shrinks."""
    quotas = {m.name: model_quota(spec, m, architectures.get(m.name)) for m in spec.models}
    try:
        placed = place_models(spec, {name: q.bytes for name, q in quotas.items()}, _needs(spec, quotas))
    except Infeasible:
        if not any(q.fits_down for q in quotas.values()):
            raise
        return fit_default_quotas(spec, quotas)
    return [_placement(name, gpus, quotas[name]) for name, gpus in placed.items()]


def fit_default_quotas(spec: DeploymentSpec, quotas: Mapping[str, Quota]) -> list[Placement]:
    """Defaults that do not fit, shrunk to a fair share of what the stated quotas leave.

    Every model is placed at its floor first (a stated quota, or its weights), then on each device
    the memory left under the cap is shared out: classic models' framework reserves first, each at
    most an equal share of what is left with one share more kept free (their requests' tensors are
    in no quota), and never more than the policy's reserve; LLMs without a quota then split the
    rest equally (their KV budget comes out of it, their pad keeps room for spikes).
    """
    if spec.hardware.cpu_only and spec.hardware.cpu_memory_mb is None:
        name, q = next((n, q) for n, q in quotas.items() if q.fits_down)
        raise Infeasible(
            f"model {name!r} needs {q.bytes / MIB:.0f} MiB ({q.source}) but hardware.cpu_memory_mb is not set, so "
            "the CPU pool has no memory to share out; set it to the memory the model instances may use"
        )
    gpus = place_models(spec, {name: q.floor for name, q in quotas.items()}, _needs(spec, quotas))
    kind = {m.name: m.kind for m in spec.models}
    left = _capacities(spec)
    for name, devices in gpus.items():
        for d in devices:
            left[d] -= quotas[name].floor
    shared = list(left)  # what the floors leave, before sharing
    extra: dict[str, int] = {}
    pending = [name for name in gpus if quotas[name].fits_down]
    for tier, kept_free in (("classic", 1), ("llm", 0)):
        members = [name for name in pending if kind[name] == tier]
        holders = [sum(1 for name in pending if d in gpus[name]) + kept_free for d in range(len(left))]
        shares = {name: min(left[d] // holders[d] for d in gpus[name]) for name in members}
        for name in members:
            extra[name] = max(0, min(quotas[name].bytes - quotas[name].floor, shares[name]))
            for d in gpus[name]:
                left[d] -= extra[name]
        pending = [name for name in pending if name not in members]
    cap = spec.policy.memory_utilization_cap
    out = []
    for name, devices in gpus.items():
        q = quotas[name]
        if name not in extra:  # a quota that does not shrink: its floor is all of it
            out.append(_placement(name, devices, q))
            continue
        where = (f"{min(shared[d] for d in devices) / MIB:.1f} MiB that stated quotas and weights leave on "
                 f"{', '.join(_device_name(spec, d) for d in devices)} under the {cap:.0%} cap")
        if kind[name] == "classic":
            reserve = extra[name]
            source = (
                f"default: weights {q.weights_bytes / MIB:.1f} MiB + framework reserve {reserve / MIB:.1f} MiB "
                f"(policy.framework_reserve_mb's default {q.reserve_bytes / MIB:g} MiB does not fit: an equal share "
                f"of the {where}, one share kept free for requests)"
            )
        else:
            reserve = q.reserve_bytes
            source = f"default: weights {q.weights_bytes / MIB:.1f} MiB + an equal share of the rest of the {where}"
        out.append(Placement(model=name, gpus=devices, quota_bytes=q.floor + extra[name], reserve_bytes=reserve,
                             quota_source=source, quota_default=True, quota_fitted=True))
    return out


def _needs(spec: DeploymentSpec, quotas: Mapping[str, Quota]) -> dict[str, tuple[str, str]]:
    """What each default quota needs and the fix, for `place_models`' message (a stated quota keeps
    its own). A default that shrinks needs its weights only: `place_models` only refuses it there."""
    more = "add memory (hardware.cpu_memory_mb)" if spec.hardware.cpu_only else "add GPUs"
    out = {}
    for name, q in quotas.items():
        if q.stated:
            continue
        if q.fits_down:
            out[name] = (f"its weights {q.weights_bytes / MIB:.0f} MiB, which cannot shrink as the rest of its "
                         "default quota does", f"{more}, or move a model")
        else:  # built from values the spec states
            out[name] = (q.source, f"lower policy.framework_reserve_mb, state memory_quota_mb, {more}, or move a model")
    return out


def _placement(model: str, gpus: list[int], quota: Quota) -> Placement:
    return Placement(model=model, gpus=gpus, quota_bytes=quota.bytes, reserve_bytes=quota.reserve_bytes,
                     quota_source=quota.source, quota_default=not quota.stated, quota_fitted=False)


def _reserve_stated(spec: DeploymentSpec) -> bool:
    return "framework_reserve_mb" in spec.policy.model_fields_set


def _capacities(spec: DeploymentSpec) -> list[int]:
    cap = spec.policy.memory_utilization_cap
    return [int(mb * MIB * cap) for mb in spec.hardware.devices_mb()]


def _device_name(spec: DeploymentSpec, index: int) -> str:
    return "cpu" if spec.hardware.cpu_only else f"gpu{index}"


def place_models(
    spec: DeploymentSpec, quotas: Mapping[str, int], why: Mapping[str, tuple[str, str]] | None = None
) -> dict[str, list[int]]:
    """First-fit decreasing of quotas onto devices, each capped at memory x utilisation cap: each
    model's devices, in the spec's order of models.

    CPU-only deployments have one device (the CPU pool). A model with tensor parallelism needs its
    quota on `tensor_parallel` distinct devices. `why`: what a model's need is and the fix, where the
    need is not a memory quota the spec states (for the message when it does not fit).
    """
    cap = spec.policy.memory_utilization_cap
    capacity = _capacities(spec)
    free = list(capacity)
    order = sorted(spec.models, key=lambda m: (-quotas[m.name] * m.tensor_parallel, m.name))
    placed: dict[str, list[int]] = {}
    for model in order:
        need = quotas[model.name]
        width = 1 if spec.hardware.cpu_only else model.tensor_parallel * model.replicas
        fitting = [i for i in range(len(free)) if free[i] >= need]
        if len(fitting) < width:
            state = ", ".join(
                f"{_device_name(spec, i)}: {f / MIB:.0f} of {c / MIB:.0f} MiB free"
                for i, (f, c) in enumerate(zip(free, capacity))
            )
            need_is, fix = (why or {}).get(model.name, ("its memory quota", "lower memory_quota_mb, add GPUs, or move a model"))
            raise Infeasible(
                f"model {model.name!r} needs {need / MIB:.0f} MiB on {width} device(s) ({need_is}) but only "
                f"{len(fitting)} device(s) have that much left under the {cap:.0%} utilisation cap ({state}); {fix}"
            )
        chosen = sorted(fitting, key=lambda i: (free[i], i))[:width]  # tightest fit keeps big holes
        for i in chosen:
            free[i] -= need
        placed[model.name] = sorted(chosen)
    return {m.name: placed[m.name] for m in spec.models}


def weights_bytes_of(model: ModelSpec, arch: Architecture | None) -> int:
    """Stored weights of one replica (all ranks): the spec's bytes, or its parameters x dtype."""
    assert model.weights is not None
    if model.weights.bytes is not None:
        return model.weights.bytes
    assert model.weights.parameters is not None and model.weights.dtype is not None
    return weight_bytes(model.weights.parameters, model.weights.dtype)
