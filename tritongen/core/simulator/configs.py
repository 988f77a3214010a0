"""A simulation's models from Triton's own configuration: a parsed config.pbtxt and the server's
rate-limiter flags."""

from __future__ import annotations

from collections.abc import Sequence

from tritongen.core.engine import EngineModel
from tritongen.core.simulator.inputs import BatcherConfig, ModelSim, QueuePolicy, ServiceCurve


def _policy_from_proto(p) -> QueuePolicy:
    action = "DELAY" if int(p.timeout_action) == 1 else "REJECT"
    return QueuePolicy(
        timeout_us=int(p.default_timeout_microseconds),
        action=action,
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


def model_sim_from_config(
    config,
    curve: ServiceCurve | None = None,
    engine: EngineModel | None = None,
    route: str | None = None,
    prompt_tokens_max: int | None = None,
    prompt_tokens_min: int = 0,
    device_curve: ServiceCurve | None = None,
    static_batch_tokens: int | None = None,
) -> ModelSim:
    """A `ModelSim` from Triton's `ModelConfig` proto (a parsed config.pbtxt).

    `device_curve`: the part of each execution its instances take in turns on their device (a
    classic profile's instance scaling); None = instances scale linearly. `static_batch_tokens`: an
    LLM that is not decoupled, the tokens one execution's memory holds (ModelSim's field).

    A decoupled model is a streaming LLM: it needs its `engine` (`engine_sources.resolve_engine`
    reads it from the backend's files, the spec and the profile); a classic model its `curve`.
    """
    batcher = None
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        batcher = BatcherConfig(
            preferred_batch_sizes=sorted(set(int(x) for x in db.preferred_batch_size)),
            max_queue_delay_us=int(db.max_queue_delay_microseconds),
            priority_levels=int(db.priority_levels),
            default_priority_level=int(db.default_priority_level),
            default_queue_policy=_policy_from_proto(db.default_queue_policy) if db.HasField("default_queue_policy") else QueuePolicy(),
            priority_queue_policy={int(k): _policy_from_proto(v) for k, v in db.priority_queue_policy.items()},
        )
    count = 0
    devices: list[int] = []
    resources: dict[str, int] = {}
    rl_priority = 0
    for group in config.instance_group or []:
        count = max(count, int(group.count) or 1)
        devices.extend(int(g) for g in group.gpus)
        if group.HasField("rate_limiter"):
            for res in group.rate_limiter.resources:
                resources[res.name] = int(res.count)
            rl_priority = int(group.rate_limiter.priority)
    if not config.instance_group:
        count = 1
    llm = None
    decoupled = config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled
    if decoupled:
        if engine is None:
            raise ValueError(
                f"model {config.name!r} is a streaming LLM: the simulation needs its engine "
                "(a streaming profile, and the engine's values from its backend files or the spec's `engine:` section)"
            )
        llm = engine
    if llm is None and curve is None:
        raise ValueError(f"model {config.name!r}: the simulation needs its service curve (a classic profile)")
    return ModelSim(
        name=config.name,
        route=route,
        max_batch_size=int(config.max_batch_size),
        dynamic_batching=batcher,
        instances=count,
        devices=devices or [-1],
        resources=resources,
        rate_limiter_priority=rl_priority,
        curve=curve if llm is None else None,
        llm=llm,
        device_curve=device_curve if llm is None else None,
        prompt_tokens_min=prompt_tokens_min,
        prompt_tokens_max=prompt_tokens_max,
        static_batch_tokens=static_batch_tokens if llm is None else None,
    )


def rate_limit_from_flags(flags: Sequence[str]) -> tuple[bool, dict[str, int]]:
    """(`--rate-limit=execution_count` given?, declared resources) from server flags."""
    enabled = False
    resources: dict[str, int] = {}
    for flag in flags:
        flag = flag.strip()
        if flag.startswith("--rate-limit="):
            enabled = flag.split("=", 1)[1] == "execution_count"
        elif flag.startswith("--rate-limit-resource="):
            parts = flag.split("=", 1)[1].split(":")
            if len(parts) < 2:
                raise ValueError(f"{flag}: expected NAME:COUNT[:DEVICE]")
            key = parts[0] if len(parts) == 2 else f"{parts[0]}:{parts[2]}"
            resources[key] = int(parts[1])
    return enabled, resources
