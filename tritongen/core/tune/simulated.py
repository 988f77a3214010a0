"""A candidate as the simulator's model: its batcher and queue policies (also as the plan views the
renderer writes), its instances, and the engine or curve that serves it."""

from __future__ import annotations

from collections.abc import Sequence

from tritongen.core.plan import QueuePolicyView
from tritongen.core.simulator import BatcherConfig, ModelSim, QueuePolicy, ServerSim
from tritongen.core.spec import DeploymentSpec, TrafficClass
from tritongen.core.tune.engine_knobs import engine_for
from tritongen.core.tune.inputs import Params, TuneInputs


def queue_policies(params: Params, classes: Sequence[TrafficClass], spec: DeploymentSpec) -> tuple[BatcherConfig, list[QueuePolicyView], QueuePolicyView, int, int]:
    """The batcher a candidate asks for, and the same as plan views for rendering."""
    depth = spec.policy.queue_depth_batches * params.max_batch_size * params.instances
    fraction = spec.policy.queue_timeout_fraction if params.policy == "strict" else 1.0
    ordered = sorted(classes, key=lambda c: c.priority)
    normal = [c for c in ordered if c.kind == "normal"]
    default = normal[0] if normal else ordered[-1]

    def view(klass: TrafficClass, level: int | None) -> QueuePolicyView:
        if params.policy == "single":
            return QueuePolicyView(level=level, class_name=klass.name, timeout_us=0, action="REJECT", max_queue_size=depth)
        timeout = int(klass.p99_ms * fraction * 1000)
        action = "DELAY" if klass.kind == "batch" else "REJECT"
        return QueuePolicyView(level=level, class_name=klass.name, timeout_us=timeout, action=action, max_queue_size=depth)

    if params.policy == "single" or len(ordered) < 2:
        levels, default_level = 0, 0
        per_level: list[QueuePolicyView] = []
        default_view = view(default, None)
    else:
        levels = len(spec.traffic_classes)
        default_level = default.priority
        per_level = [view(c, c.priority) for c in ordered]
        default_view = view(default, None)

    def pol(v: QueuePolicyView) -> QueuePolicy:
        return QueuePolicy(timeout_us=v.timeout_us, action=v.action, allow_timeout_override=True, max_queue_size=v.max_queue_size)

    batcher = BatcherConfig(
        preferred_batch_sizes=list(params.preferred),
        max_queue_delay_us=params.delay_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=pol(default_view),
        priority_queue_policy={v.level: pol(v) for v in per_level if v.level is not None},
    )
    return batcher, per_level, default_view, levels, default_level


def model_sim(inputs: TuneInputs, params: Params) -> ModelSim:
    entry = inputs.entry
    batcher, *_ = queue_policies(params, inputs.classes, inputs.spec)
    group = entry.instance_groups[0]
    resources = {"compute": group.compute_units} if group.compute_units else {}
    llm = None
    if entry.kind == "llm":
        if inputs.engine is None:
            raise ValueError(f"model {entry.name!r}: tuning a streaming LLM needs its engine (a streaming profile)")
        llm = engine_for(inputs, params)
    elif inputs.curve is None:
        raise ValueError(f"model {entry.name!r}: tuning needs its profiled latency curve")
    return ModelSim(
        name=entry.name,
        route=entry.spec_model,
        max_batch_size=params.max_batch_size,
        dynamic_batching=batcher if params.max_batch_size > 0 or entry.dynamic_batching is not None else None,
        instances=params.instances,
        devices=list(group.gpus) or [-1],
        resources=resources,
        device_curve=inputs.device_curve if llm is None else None,
        curve=inputs.curve if llm is None else None,
        llm=llm,
        prompt_tokens_max=entry.prompt_tokens_max if entry.lane == "short" else None,
    )


def server_for(inputs: TuneInputs, params: Params) -> ServerSim:
    return ServerSim(
        models=[model_sim(inputs, params)],
        rate_limit=inputs.rate_limit,
        resources=inputs.resources,
        overheads=inputs.overheads,
    )
