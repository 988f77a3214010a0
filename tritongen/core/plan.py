"""From a validated spec to per-model decisions: batch bounds, queue policy, placement, rate limits.

The steps run in order, each reading the spec and the ones before it: memory quotas and placement
(`tritongen.core.placement`), an LLM's KV budget (`tritongen.core.kv_plan`), then here the batching,
queue policies, engine parameters and each model entry. The output is a plain view model
(`DeploymentPlan`) that templates render; every number in it is derived by these steps, with the
arithmetic kept alongside (`KVPlan`, `notes`) so the rendered file can say why it holds what it
holds. Pure: no I/O, no Jinja2.
"""

from __future__ import annotations

from collections.abc import Mapping

from tritongen.core.architecture import Architecture
from tritongen.core.kv_plan import KVPlan, plan_kv, typical_sequences
from tritongen.core.llmapi_plan import llmapi_model_yaml
from tritongen.core.llmapi_spec import LLMAPI
from tritongen.core.placement import Placement, plan_memory
from tritongen.core.spec import (
    MIB,
    VLLM_CPU_FAST_BLOCK_MULTIPLE,
    DeploymentSpec,
    ModelSpec,
    TrafficClass,
    entry_names_of,
)
from tritongen.core.strict import Strict
from tritongen.errors import BadInput, Infeasible


class View(Strict):
    """A view model the templates render (frozen, no extra keys: `Strict`)."""


class TensorView(View):
    name: str
    data_type: str  # TYPE_FP32, ...
    dims: list[int]
    optional: bool = False


class QueuePolicyView(View):
    level: int | None  # None: the default queue policy
    class_name: str
    timeout_us: int
    action: str  # REJECT | DELAY
    max_queue_size: int


class DynamicBatchingView(View):
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    priority_levels: int
    default_priority_level: int
    default_queue_policy: QueuePolicyView
    priority_queue_policies: list[QueuePolicyView]


class InstanceGroupView(View):
    kind: str  # KIND_CPU | KIND_GPU | KIND_MODEL
    count: int
    gpus: list[int]
    compute_units: int | None  # rate-limiter "compute" resource per execution


class ModelEntryPlan(View):
    """One Triton model entry (a spec model, or one lane of it)."""

    name: str
    spec_model: str
    source_model: str  # the entry whose version folder holds the code (lanes share one)
    backend: str
    kind: str
    max_batch_size: int
    inputs: list[TensorView]
    outputs: list[TensorView]
    dynamic_batching: DynamicBatchingView | None
    instance_groups: list[InstanceGroupView]
    decoupled: bool
    parameters: dict[str, str]
    kv: KVPlan | None
    engine_args: dict[str, object] | None  # vLLM model.json
    llm_args: dict[str, object] | None = None  # TensorRT-LLM LLM-API model.yaml (core.llmapi_plan)
    llm_args_why: dict[str, str] = {}  # dotted key of llm_args -> why it holds its value
    lane: str | None
    prompt_tokens_max: int | None
    notes: list[str]


class DeploymentPlan(View):
    name: str
    cpu_only: bool
    entries: list[ModelEntryPlan]
    placements: list[Placement]
    server_flags: list[str]
    device_bytes: list[int]
    utilization_cap: float

    def entry(self, name: str) -> ModelEntryPlan:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# Queueing: windows, priorities, queue policies


def preferred_batch_sizes(max_batch_size: int, min_batch: int) -> list[int]:
    """Quarter, half and full batch: sizes the batcher should release at without waiting.

    Without a profile, the curve's knee is unknown; these three give the batcher early exits at
    moderate load and full batches at peak. `tune` replaces them with measured choices.
    """
    if max_batch_size < 2:
        return []
    return sorted({s for s in (max_batch_size // 4, max_batch_size // 2, max_batch_size) if s >= max(2, min_batch)})


def queue_policy_for(
    klass: TrafficClass, level: int | None, spec: DeploymentSpec, max_queue_size: int
) -> QueuePolicyView:
    """Interactive and normal traffic is shed when it cannot meet its target; batch traffic waits."""
    timeout_us = int(klass.p99_ms * spec.policy.queue_timeout_fraction * 1000)
    action = "DELAY" if klass.kind == "batch" else "REJECT"
    return QueuePolicyView(
        level=level, class_name=klass.name, timeout_us=timeout_us, action=action, max_queue_size=max_queue_size
    )


def plan_batching(
    spec: DeploymentSpec,
    model: ModelSpec,
    max_batch_size: int,
    window_ms: float,
    total_instances: int,
    preferred: list[int],
) -> DynamicBatchingView | None:
    if max_batch_size == 0:
        return None  # Triton's dynamic batcher needs a batch dimension
    classes = spec.classes_of(model)
    depth = spec.policy.queue_depth_batches * max_batch_size * total_instances
    fallback = default_class(classes)
    levels = len(spec.traffic_classes) if len(classes) > 1 else 0
    # Levels keep their global numbers so one client-side priority means the same on every model.
    policies = [queue_policy_for(c, c.priority, spec, depth) for c in sorted(classes, key=lambda c: c.priority)]
    return DynamicBatchingView(
        preferred_batch_sizes=preferred,
        max_queue_delay_us=int(window_ms * 1000),
        priority_levels=levels,
        default_priority_level=fallback.priority if levels else 0,
        default_queue_policy=queue_policy_for(fallback, None, spec, depth),
        priority_queue_policies=policies if levels else [],
    )


def default_class(classes: list[TrafficClass]) -> TrafficClass:
    """Requests that name no class are treated as 'normal' (or the lowest priority there is)."""
    normal = [c for c in classes if c.kind == "normal"]
    if normal:
        return min(normal, key=lambda c: c.priority)
    return max(classes, key=lambda c: c.priority)


def window_for(spec: DeploymentSpec, model: ModelSpec, lane: str | None) -> float:
    if lane == "short":
        return spec.policy.short_window_ms
    if lane == "long":
        return spec.policy.long_window_ms
    latency_sensitive = any(c.kind == "interactive" for c in spec.classes_of(model))
    return spec.policy.short_window_ms if latency_sensitive else spec.policy.long_window_ms


# ---------------------------------------------------------------------------------------------
# The whole plan


def _tensors(specs: list) -> list[TensorView]:
    return [
        TensorView(name=t.name, data_type=f"TYPE_{t.data_type}", dims=list(t.dims), optional=t.optional)
        for t in specs
    ]


def _instance_groups(spec: DeploymentSpec, model: ModelSpec, placement: Placement) -> list[InstanceGroupView]:
    if spec.hardware.cpu_only:
        # One vLLM engine holds the whole pool the plan sized (as KIND_MODEL count 1 does on GPUs):
        # a second instance would allocate a second pool of num_gpu_blocks_override blocks.
        count = 1 if model.backend == "vllm" else model.instances
        return [InstanceGroupView(kind="KIND_CPU", count=count, gpus=[], compute_units=model.compute_quota)]
    if model.tensor_parallel > 1 or model.backend in ("vllm", LLMAPI):
        # The engine spreads itself over its GPUs (vLLM needs KIND_MODEL for tensor parallelism;
        # TensorRT-LLM's LLM-API model starts its own ranks).
        return [InstanceGroupView(kind="KIND_MODEL", count=1, gpus=[], compute_units=model.compute_quota)]
    return [
        InstanceGroupView(kind="KIND_GPU", count=model.instances, gpus=placement.gpus, compute_units=model.compute_quota)
    ]


def engine_parameters(kv: KVPlan, model: ModelSpec) -> dict[str, str]:
    """tritongen's documented engine parameters (`engine_sources.ENGINE_PARAMETERS`), written only
    for backends that read them (`engine.render_parameters`): another backend's config never gets
    knobs it does not know."""
    engine = model.engine
    if engine is None or not engine.render_parameters:
        return {}
    if engine.kv_policy is None:
        raise BadInput(
            f"model {model.name!r}: engine.render_parameters needs engine.kv_policy (what the backend does "
            "when its KV pool runs dry), so the rendered config says which engine it describes"
        )
    seqs = min(kv.max_sequences, engine.max_num_seqs) if engine.max_num_seqs else kv.max_sequences
    out = {
        "kv_policy": engine.kv_policy,
        "max_context": str(model.max_context),
        "kv_block_tokens": str(kv.block_tokens),
        "kv_pool_blocks": str(kv.pool_blocks),
        "max_num_seqs": str(seqs),
    }
    if engine.max_batched_tokens:
        out["max_batched_tokens"] = str(engine.max_batched_tokens)
    return out


def _vllm_engine_args(spec: DeploymentSpec, model: ModelSpec, kv: KVPlan, device_bytes: int) -> dict[str, object]:
    """vLLM's `1/model.json` (AsyncEngineArgs). No `disable_log_requests`: vLLM 0.13 removed it
    (`enable_log_requests`, default off, replaced it) and refuses the unknown name."""
    kv_dtype = {"auto": "auto", "fp8": "fp8", "int8": "fp8"}.get(model.kv_dtype, "auto")
    seqs = typical_sequences(model, kv)
    if model.engine is not None and model.engine.max_num_seqs:
        seqs = min(seqs, model.engine.max_num_seqs)
    args: dict[str, object] = {
        "model": model.hf_model,
        "max_num_seqs": seqs,
        "max_model_len": model.max_context,
        "tensor_parallel_size": model.tensor_parallel,
        "kv_cache_dtype": kv_dtype,
        "block_size": kv.block_tokens,
    }
    if spec.hardware.cpu_only:
        args.update(_vllm_cpu_pool(model, kv))
    else:
        # vLLM's fraction is of the device's total memory and covers weights + KV + activations.
        args["gpu_memory_utilization"] = round(kv.device_bytes / device_bytes, 4)
    if model.engine is not None and model.engine.max_batched_tokens:
        args["max_num_batched_tokens"] = model.engine.max_batched_tokens
    if model.engine is not None and model.engine.prefix_caching is not None:
        args["enable_prefix_caching"] = model.engine.prefix_caching  # unstated: vLLM V1's default, on
    clash = sorted(set(args) & set(model.engine_args))
    if clash:
        raise BadInput(
            f"model {model.name!r}: engine_args {clash} are derived by tritongen from the spec (KV plan, max_context, "
            "engine: section); remove them from engine_args and change those spec fields instead"
        )
    return {**args, **model.engine_args}


def _vllm_cpu_pool(model: ModelSpec, kv: KVPlan) -> dict[str, object]:
    """The KV pool of vLLM without GPUs (vllm-cpu), in its own blocks.

    vllm-cpu ignores `gpu_memory_utilization`: it sizes the pool from the environment variable
    VLLM_CPU_KVCACHE_SPACE (whole GiB; half the host's memory when unset), or takes
    `num_gpu_blocks_override` blocks of `block_size` tokens. The override is the one a model.json
    can state, and in blocks it says the plan's pool exactly: the KV budget in whole blocks
    (`kv.pool_blocks`, blocks of `kv.block_tokens` tokens, a size the spec checked the CPU
    kernels take), or the spec's `engine.kv_pool_tokens` when it states the pool. A model whose
    layers hold only a fixed state has no token blocks: vLLM sizes that pool itself.
    """
    stated = model.engine.kv_pool_tokens if model.engine is not None else None
    blocks = stated // kv.block_tokens if stated else kv.pool_blocks
    return {"num_gpu_blocks_override": blocks} if blocks else {}


def _vllm_cpu_note(args: Mapping[str, object]) -> str:
    """What vllm-cpu is told about its pool, and a block size that takes its slower kernel."""
    block = int(args["block_size"])  # type: ignore[call-overload]
    blocks = args.get("num_gpu_blocks_override")
    pool = (f"num_gpu_blocks_override {blocks} x block_size {block} = {int(blocks) * block} tokens"  # type: ignore[call-overload]
            if blocks else "no token blocks: vLLM sizes the pool from VLLM_CPU_KVCACHE_SPACE")
    slow = (f"; block_size {block} takes vLLM's slower vec16 CPU attention, engine.kv_block_tokens a multiple of "
            f"{VLLM_CPU_FAST_BLOCK_MULTIPLE} the faster kernels" if block % VLLM_CPU_FAST_BLOCK_MULTIPLE else "")
    return f"vllm-cpu KV pool: {pool} (no gpu_memory_utilization without GPUs){slow}"


def _merge_parameters(model: ModelSpec, derived: dict[str, str]) -> dict[str, str]:
    clash = sorted(set(derived) & set(model.parameters))
    if clash:
        raise BadInput(
            f"model {model.name!r}: parameters {clash} are derived by tritongen from the spec "
            "(architecture, KV budget); remove them from `parameters` and change the spec fields instead"
        )
    return dict(sorted({**derived, **model.parameters}.items()))


def plan_deployment(
    spec: DeploymentSpec,
    architectures: Mapping[str, Architecture],
    measured_pads_mb: Mapping[str, float] | None = None,
) -> DeploymentPlan:
    """`measured_pads_mb`: per spec model, the pad derived from its profile's prefill peak."""
    pads = dict(measured_pads_mb or {})
    placements = {p.model: p for p in plan_memory(spec, architectures)}
    device_bytes = [int(mb * MIB) for mb in spec.hardware.devices_mb()]
    entries: list[ModelEntryPlan] = []
    for model in spec.models:
        placement = placements[model.name]
        groups = _instance_groups(spec, model, placement)
        total_instances = sum(g.count * max(1, len(g.gpus)) for g in groups)
        lanes: list[tuple[str | None, int | None, float]] = [(None, None, 1.0)]
        if model.lanes is not None:
            lanes = [
                ("short", model.lanes.split_prompt_tokens, model.lanes.short_share),
                ("long", model.max_context, 1.0 - model.lanes.short_share),
            ]
        neighbours = [p for p in placements.values() if p.model != model.name and set(p.gpus) & set(placement.gpus)]
        for (lane, prompt_max, share), entry_name in zip(lanes, entry_names_of(model)):
            entries.append(
                _plan_entry(spec, model, architectures.get(model.name), placement, groups, total_instances,
                            lane, prompt_max, share, entry_name, device_bytes, pads.get(model.name), neighbours)
            )
    flags = server_flags(spec)
    return DeploymentPlan(
        name=spec.name,
        cpu_only=spec.hardware.cpu_only,
        entries=entries,
        placements=[placements[m.name] for m in spec.models],
        server_flags=flags,
        device_bytes=device_bytes,
        utilization_cap=spec.policy.memory_utilization_cap,
    )


def _plan_entry(
    spec: DeploymentSpec,
    model: ModelSpec,
    arch: Architecture | None,
    placement: Placement,
    groups: list[InstanceGroupView],
    total_instances: int,
    lane: str | None,
    prompt_max: int | None,
    share: float,
    entry_name: str,
    device_bytes: list[int],
    pad_mb: float | None = None,
    neighbours: list[Placement] | None = None,
) -> ModelEntryPlan:
    policy = spec.policy
    notes: list[str] = []
    if placement.quota_fitted:  # a quota as asked for says nothing new; one fitted to the device does
        notes.append(f"memory quota {placement.quota_bytes / MIB:.1f} MiB, {placement.quota_source}")
    preferred: list[int]
    kv: KVPlan | None = None
    engine_args: dict[str, object] | None = None
    llm_args = None
    derived: dict[str, str] = {}
    window = window_for(spec, model, lane)
    if model.kind == "llm":
        assert arch is not None and model.max_context is not None
        context = model.max_context
        if lane == "short" and prompt_max is not None:
            output = model.typical_output_tokens or (model.max_context - prompt_max)
            context = min(model.max_context, prompt_max + output)
        try:
            kv = plan_kv(spec, model, arch, placement.quota_bytes, context, share, model.max_batch_size, pad_mb)
        except Infeasible as err:
            raise Infeasible(f"model {entry_name!r}: {err}") from None
        notes.append(
            f"KV budget {kv.budget_bytes / MIB:.1f} MiB = quota {kv.device_bytes / MIB:.1f} MiB"
            f" - weights {kv.weights_bytes / MIB:.1f} - reserve {kv.reserve_bytes / MIB:.1f}"
            f" - pad {kv.pad_bytes / MIB:.1f}{' (measured prefill peak)' if kv.pad_measured else ''}"
            + (f" (lane share {share:.2f} of the quota)" if share != 1.0 else "")
        )
        notes.append(kv.sequence_note())
        if model.backend == "vllm":
            max_batch = 0  # the vLLM backend batches inside its engine; Triton passes requests through
            engine_args = _vllm_engine_args(spec, model, kv, device_bytes[placement.gpus[0]])
            notes.append(
                f"vLLM batches inside its engine: max_num_seqs {engine_args['max_num_seqs']} in 1/model.json (the pool "
                "at the typical sequence; it preempts beyond); priorities and admission are the sidecar's job"
            )
            if spec.hardware.cpu_only:
                notes.append(_vllm_cpu_note(engine_args))
        elif model.backend == LLMAPI:
            max_batch = 0  # as upstream's triton_config: the engine batches, Triton passes requests through
            others = neighbours or []
            llm_args = llmapi_model_yaml(model, kv, device_bytes[placement.gpus[0]], sum(p.quota_bytes for p in others),
                                         ", ".join(p.model for p in others))
            notes.append(
                f"TensorRT-LLM's LLM-API model: its engine arguments are in 1/model.yaml (max_batch_size "
                f"{llm_args.data['max_batch_size']}, kv_cache_config.max_tokens {llm_args.data['kv_cache_config']['max_tokens']}); "
                "copy model.py and helpers.py from TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/"
            )
        else:
            max_batch = kv.max_sequences
            derived = engine_parameters(kv, model)
        preferred = []  # the engine batches continuously; Triton only queues and orders
        if lane is None:
            # A queue delay would only add to time-to-first-token: the engine, not Triton, forms
            # batches. Lanes keep their short/long windows: there the spec asked for tiering.
            window = 0.0
    else:
        max_batch = min(model.max_batch_size or 0, policy.max_batch)
        if (model.max_batch_size or 0) > policy.max_batch:
            notes.append(f"max_batch_size {model.max_batch_size} capped at policy.max_batch {policy.max_batch}")
        preferred = preferred_batch_sizes(max_batch, policy.min_batch)
    batching = plan_batching(spec, model, max_batch, window, total_instances, preferred)
    return ModelEntryPlan(
        name=entry_name,
        spec_model=model.name,
        source_model=entry_names_of(model)[0] if lane else model.name,
        backend="python" if model.backend == LLMAPI else model.backend,
        kind=model.kind,
        max_batch_size=max_batch,
        inputs=_tensors(model.inputs),
        outputs=_tensors(model.outputs),
        dynamic_batching=batching,
        instance_groups=groups,
        decoupled=model.kind == "llm" and model.streaming,
        parameters=_merge_parameters(model, derived),
        kv=kv,
        engine_args=engine_args,
        llm_args=llm_args.data if llm_args is not None else None,
        llm_args_why=llm_args.why if llm_args is not None else {},
        lane=lane,
        prompt_tokens_max=prompt_max,
        notes=notes,
    )


def server_flags(spec: DeploymentSpec) -> list[str]:
    """Flags the server needs for what the configs ask of it (rate-limiter resources)."""
    if not any(m.compute_quota for m in spec.models):
        return []
    units = spec.policy.compute_units
    flags = ["--rate-limit=execution_count"]
    if spec.hardware.cpu_only:
        flags.append(f"--rate-limit-resource=compute:{units}")
    else:
        flags.extend(f"--rate-limit-resource=compute:{units}:{i}" for i in range(len(spec.hardware.devices_mb())))
    return flags
