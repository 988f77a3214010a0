"""From a search's choice back to a plan: the plan entry with a candidate's settings, what a plan
already holds as a candidate, and the memory a plan leaves an entry's instances."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence

from tritongen.core.plan import DeploymentPlan, DynamicBatchingView, InstanceGroupView, ModelEntryPlan
from tritongen.core.spec import DeploymentSpec, TrafficClass
from tritongen.core.llmapi_spec import KV_POLICY_TO_CAPACITY
from tritongen.core.tune.engine_knobs import home_of, knobs_of
from tritongen.core.tune.inputs import Params, PolicyName
from tritongen.core.tune.simulated import queue_policies


def apply_candidate(entry: ModelEntryPlan, params: Params, classes: Sequence[TrafficClass], spec: DeploymentSpec) -> ModelEntryPlan:
    """The plan entry with the candidate's settings, ready for the config template."""
    _, per_level, default_view, levels, default_level = queue_policies(params, classes, spec)
    batching = DynamicBatchingView(
        preferred_batch_sizes=list(params.preferred),
        max_queue_delay_us=params.delay_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=default_view,
        priority_queue_policies=per_level,
    )
    groups = [
        InstanceGroupView(kind=g.kind, count=params.instances if i == 0 else g.count, gpus=g.gpus, compute_units=g.compute_units)
        for i, g in enumerate(entry.instance_groups)
    ]
    parameters = dict(entry.parameters)
    notes = list(entry.notes)
    engine_args = dict(entry.engine_args) if entry.engine_args is not None else None
    if params.max_num_seqs is not None and "max_num_seqs" in parameters:
        parameters["max_num_seqs"] = str(params.max_num_seqs)
    if params.max_num_seqs is not None and engine_args is not None:
        engine_args["max_num_seqs"] = params.max_num_seqs
    llm_args, llm_why = write_engine_knobs(entry, params, parameters, engine_args, notes)
    notes.append(f"tuned by `tritongen tune`: {params.label()}")
    return entry.model_copy(
        update={
            "engine_args": engine_args,
            "llm_args": llm_args,
            "llm_args_why": llm_why,
            "max_batch_size": params.max_batch_size,
            "dynamic_batching": batching,
            "instance_groups": groups,
            "parameters": parameters,
            "notes": notes,
        }
    )


def write_engine_knobs(entry: ModelEntryPlan, params: Params, parameters: dict[str, str],
                       engine_args: dict[str, object] | None, notes: list[str]) -> tuple[dict[str, object] | None, dict[str, str]]:
    """The candidate's engine knobs (`tune.engine_knobs`) where render takes them: vLLM's model.json
    (`engine_args`, its reason a config.pbtxt note, as render explains model.json), the LLM-API's
    model.yaml (`llm_args`, its reason the comment above the key) or the config parameters the
    backend reads. Returns the new llm_args and their reasons; the others are changed in place."""
    llm_args = copy.deepcopy(entry.llm_args) if entry.llm_args is not None else None
    llm_why = dict(entry.llm_args_why)
    home = home_of(entry)
    chosen = {"max_batched_tokens": params.max_batched_tokens, "prefix_caching": params.prefix_caching,
              "kv_policy": params.kv_policy}
    for knob, key in knobs_of(entry).items():
        value = chosen[knob]
        if value is None:
            continue
        if knob == "kv_policy":
            value = KV_POLICY_TO_CAPACITY[str(value)]
        why = "chosen by `tritongen tune`: the most capacity within the targets on this traffic in simulation"
        if home == "engine_args" and engine_args is not None:
            was = json.dumps(engine_args[key]) if key in engine_args else "unset: vLLM's default"
            engine_args[key] = value
            notes.append(f"{key} {json.dumps(value)} in 1/model.json: {why} (was {was})")
        elif home == "llm_args" and llm_args is not None:
            head, _, tail = key.partition(".")
            section = llm_args.setdefault(head, {}) if tail else llm_args
            assert isinstance(section, dict)
            was = section.get(tail or head, "unset: the release's default")
            section[tail or head] = value
            llm_why[key] = f"{why} (was {was})"
        else:
            parameters[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return llm_args, llm_why


TUNED_SECTION_FIELDS = ("max_num_seqs", "max_batched_tokens", "prefix_caching", "kv_policy")
"""The spec's engine: fields a candidate may change (Params' fields of the same names)."""


def spec_with_tuned_engines(spec: DeploymentSpec, plan: DeploymentPlan,
                            choices: Mapping[str, Params]) -> tuple[DeploymentSpec, list[str]]:
    """The spec whose engine: sections say what the tuned files run, and one note per changed value.

    The engine's own files (model.json, model.yaml) are what it runs, and a spec section that
    contradicts them is refused wherever both are read (the sidecar's policy among them). A value
    the spec states and tune changed would otherwise stop tune itself: the tuned repository needs
    the tuned spec beside it, and the note tells the user which line of theirs to change."""
    notes: list[str] = []
    models = []
    for model in spec.models:
        chosen = [choices[e.name] for e in plan.entries if e.spec_model == model.name and e.name in choices]
        section = model.engine
        if not chosen or section is None:
            models.append(model)
            continue
        update = {}
        for field in TUNED_SECTION_FIELDS:
            stated, value = getattr(section, field), getattr(chosen[0], field)
            if stated is not None and value is not None and value != stated:
                update[field] = value
                notes.append(f"{model.name}: the spec's engine.{field} is {stated}, the tuned files run {value}: "
                             f"change it in the spec to render the same repository again")
        models.append(model.model_copy(update={"engine": section.model_copy(update=update)}) if update else model)
    return spec.model_copy(update={"models": models}), notes


def apply_results(plan: DeploymentPlan, choices: Mapping[str, ModelEntryPlan]) -> DeploymentPlan:
    return plan.model_copy(update={"entries": [choices.get(e.name, e) for e in plan.entries]})


def baseline_params(entry: ModelEntryPlan) -> Params:
    """What the plan (or a hand-written config) already holds, as a candidate."""
    db = entry.dynamic_batching
    group = entry.instance_groups[0]
    seqs = entry.kv.max_sequences if entry.kind == "llm" and entry.kv is not None else None
    if db is None:
        return Params(max_batch_size=entry.max_batch_size, preferred=(), delay_us=0, instances=group.count, policy="single", max_num_seqs=seqs)
    policy: PolicyName = "strict" if db.priority_levels else "single"
    return Params(
        max_batch_size=entry.max_batch_size,
        preferred=tuple(db.preferred_batch_sizes),
        delay_us=db.max_queue_delay_us,
        instances=group.count,
        policy=policy,
        max_num_seqs=seqs,
    )


def entry_device(spec: DeploymentSpec, plan: DeploymentPlan, entry: ModelEntryPlan) -> tuple[int, str] | None:
    """(total bytes, name) of the first GPU the entry's model is placed on, where an engine default
    depends on it (`core.vllm_defaults`); None on the CPU."""
    own = next((p for p in plan.placements if p.model == entry.spec_model), None)
    names = [g.name for g in spec.hardware.gpus for _ in range(g.count)]
    if plan.cpu_only or own is None or not own.gpus or own.gpus[0] >= min(len(names), len(plan.device_bytes)):
        return None
    return plan.device_bytes[own.gpus[0]], names[own.gpus[0]]


def memory_budget(plan: DeploymentPlan, entry: ModelEntryPlan) -> tuple[int | None, int]:
    """(bytes the entry's instances may use, bytes one instance needs) from the plan's placement.

    One instance needs its model's quota (weights + framework reserve for a classic model; the
    whole KV budget for an LLM engine). What the instances may use is the device memory under the
    utilisation cap minus every other model's quota on the same devices.
    """
    placements = {p.model: p for p in plan.placements}
    own = placements.get(entry.spec_model)
    if own is None:
        return None, 0
    lanes = sum(1 for e in plan.entries if e.spec_model == entry.spec_model)
    per_instance = own.quota_bytes // max(1, lanes)
    devices = own.gpus or [0]
    free = []
    for d in devices:
        if d >= len(plan.device_bytes):
            continue
        capacity = int(plan.device_bytes[d] * plan.utilization_cap)
        others = sum(p.quota_bytes for p in plan.placements if p.model != entry.spec_model and (d in (p.gpus or [0])))
        free.append(capacity - others)
    if not free:
        return None, per_instance
    return max(0, min(free)) // max(1, lanes), per_instance
