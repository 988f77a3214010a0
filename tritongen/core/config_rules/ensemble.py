"""Rules on ensembles: the steps of one ensemble, and across models the steps against the models
they call, decoupled branches and cycles of ensembles calling each other."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import Collector, dims_text, dtype_name, full_shape, is_ensemble, shapes_compatible
from tritongen.core.findings import Finding
from tritongen.core.model_config_enums import DataType

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_ensemble(config: ModelConfig, out: Collector) -> None:
    has_sched = config.HasField("ensemble_scheduling")
    if not is_ensemble(config):
        out.error(
            "TG154", "ensemble_scheduling",
            f"ensemble_scheduling is set but platform is '{config.platform}' (backend '{config.backend}')",
            "set platform: \"ensemble\" and remove backend, or remove ensemble_scheduling",
        )
        return
    if not has_sched:
        out.error(
            "TG153", "platform",
            "platform is 'ensemble' but there is no ensemble_scheduling",
            "add ensemble_scheduling { step [ ... ] } describing the pipeline",
        )
        return
    for fname, present in (
        ("instance_group", len(config.instance_group) > 0),
        ("optimization", config.HasField("optimization")),
        ("model_warmup", len(config.model_warmup) > 0),
    ):
        if present:
            out.error(
                "TG155", fname,
                f"{fname} is set on an ensemble; ensembles run no instances of their own",
                f"remove {fname} from the ensemble (set it on the step models instead)",
            )
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        out.error(
            "TG180", "ensemble_scheduling.step",
            "ensemble_scheduling has no step",
            "add at least one step { model_name, input_map, output_map }",
        )
        return
    producers: dict[str, int] = {}
    broken = False
    for i, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{i}]"
        if not step.model_name:
            out.error("TG181", f"{field}.model_name", f"{field} has no model_name", f"add model_name to {field}")
            broken = True
        for mname in ("input_map", "output_map"):
            if not getattr(step, mname):
                out.error(
                    "TG182", f"{field}.{mname}",
                    f"{field} (model '{step.model_name}') has no {mname}",
                    f"add {mname} {{ key: \"<tensor of {step.model_name}>\" value: \"<ensemble tensor>\" }}",
                )
                broken = True
        for key in sorted(step.output_map):
            tensor = step.output_map[key]
            if tensor in producers:
                out.error(
                    "TG183", f"{field}.output_map",
                    f"ensemble tensor '{tensor}' is written by step {producers[tensor]} and again by step {i} "
                    f"(model '{step.model_name}', output '{key}')",
                    f"give one of them a different ensemble tensor name than '{tensor}'",
                )
                broken = True
            else:
                producers[tensor] = i
    if broken:
        return
    ens_inputs = [i.name for i in config.input]
    ens_outputs = [o.name for o in config.output]
    consumed = {t for s in steps for t in s.input_map.values()}
    for name in ens_inputs:
        if name not in consumed:
            out.error(
                "TG184", "input",
                f"ensemble input '{name}' is not read by any step (the steps read {sorted(consumed)})",
                f"map '{name}' into a step's input_map, or remove the input",
            )
    # Data flow: a step runs once every tensor it reads is available.
    available = set(ens_inputs)
    ran: set[int] = set()
    progress = True
    while progress:
        progress = False
        for i, step in enumerate(steps):
            if i not in ran and set(step.input_map.values()) <= available:
                ran.add(i)
                available |= set(step.output_map.values())
                progress = True
    for i, step in enumerate(steps):
        if i in ran:
            continue
        missing = sorted(t for t in step.input_map.values() if t not in available)
        out.error(
            "TG186", f"ensemble_scheduling.step[{i}].input_map",
            f"ensemble_scheduling.step[{i}] (model '{step.model_name}') reads {missing}, which neither an "
            f"ensemble input ({ens_inputs}) nor an earlier step produces (or the steps form a cycle)",
            f"produce {missing} in an earlier step's output_map, or read an ensemble input instead",
        )
    for name in ens_outputs:
        if name not in producers:
            out.error(
                "TG185", "output",
                f"ensemble output '{name}' is not written by any step (the steps write {sorted(producers)})",
                f"map a step output to '{name}' in its output_map, or remove the output",
            )
    outputs = set(ens_outputs)
    for tensor, i in sorted(producers.items()):
        if tensor not in consumed and tensor not in outputs and i in ran:
            out.error(
                "TG187", f"ensemble_scheduling.step[{i}].output_map",
                f"ensemble tensor '{tensor}' written by step {i} (model '{steps[i].model_name}') is never "
                "read by a step nor an ensemble output",
                f"read '{tensor}' in a later step, declare it as an ensemble output, or remove it from the output_map",
            )


def check_ensemble_references(name: str, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> list[Finding]:
    out = Collector(name)
    # tensor -> list of (source description, data_type, full shape, batching)
    seen: dict[str, list[tuple[str, int, list[int], bool]]] = defaultdict(list)
    ens_batching = config.max_batch_size > 0
    for io in list(config.input) + list(config.output):
        seen[io.name].append((f"ensemble '{name}'", io.data_type, full_shape(io.dims, config.max_batch_size), ens_batching))
    for i, step in enumerate(config.ensemble_scheduling.step):
        field = f"ensemble_scheduling.step[{i}]"
        target = configs.get(step.model_name)
        if not step.model_name:
            continue
        if target is None:
            out.error(
                "TG190", f"{field}.model_name",
                f"{field} calls model '{step.model_name}', which is not in the repository "
                f"(models: {sorted(configs)})",
                f"add model '{step.model_name}' to the repository or fix the step's model_name",
            )
            continue
        if not target.input and not target.output:
            continue  # auto-completed model: its tensors are unknown here
        t_inputs = {i.name: i for i in target.input}
        t_outputs = {o.name: o for o in target.output}
        unmapped = [inp.name for inp in target.input if not inp.optional and inp.name not in step.input_map]
        # no input_map at all is TG182; a key that is not an input is TG191 (the likely typo)
        if unmapped and step.input_map and all(key in t_inputs for key in step.input_map):
            out.error(
                "TG195", f"{field}.input_map",
                f"{field} calls model '{step.model_name}' but maps none of the ensemble's tensors to its "
                f"required input{'s' * (len(unmapped) > 1)} {unmapped} (the step maps {sorted(step.input_map)})",
                f"add input_map {{ key: \"{unmapped[0]}\" value: \"<ensemble tensor>\" }} to the step, or mark "
                f"'{unmapped[0]}' optional in '{step.model_name}'",
            )
        for key in sorted(step.input_map):
            if key not in t_inputs:
                out.error(
                    "TG191", f"{field}.input_map",
                    f"{field} maps ensemble tensor '{step.input_map[key]}' to '{key}', which is not an input "
                    f"of model '{step.model_name}' (its inputs: {sorted(t_inputs)})",
                    f"use one of {sorted(t_inputs)} as the input_map key",
                )
            else:
                io = t_inputs[key]
                seen[step.input_map[key]].append(
                    (f"model '{step.model_name}' input '{key}'", io.data_type,
                     full_shape(io.dims, target.max_batch_size), target.max_batch_size > 0)
                )
        for key in sorted(step.output_map):
            if key not in t_outputs:
                out.error(
                    "TG192", f"{field}.output_map",
                    f"{field} maps '{key}' to ensemble tensor '{step.output_map[key]}', but '{key}' is not "
                    f"an output of model '{step.model_name}' (its outputs: {sorted(t_outputs)})",
                    f"use one of {sorted(t_outputs)} as the output_map key",
                )
            else:
                io = t_outputs[key]
                seen[step.output_map[key]].append(
                    (f"model '{step.model_name}' output '{key}'", io.data_type,
                     full_shape(io.dims, target.max_batch_size), target.max_batch_size > 0)
                )
        if target.max_batch_size > 0 and config.max_batch_size > target.max_batch_size:
            out.error(
                "TG193", "max_batch_size",
                f"max_batch_size is {config.max_batch_size} but step {i} calls model '{step.model_name}' "
                f"whose max_batch_size is {target.max_batch_size}",
                f"lower the ensemble's max_batch_size to {target.max_batch_size}, or raise "
                f"'{step.model_name}' max_batch_size to {config.max_batch_size}",
            )
    _decoupled_branches(config, configs, out)
    for tensor in sorted(seen):
        entries = seen[tensor]
        first = entries[0]
        for other in entries[1:]:
            if first[1] != DataType.TYPE_INVALID and other[1] != DataType.TYPE_INVALID and first[1] != other[1]:
                out.error(
                    "TG194", "ensemble_scheduling.step",
                    f"ensemble tensor '{tensor}' is {dtype_name(first[1])} for {first[0]} but "
                    f"{dtype_name(other[1])} for {other[0]}",
                    "make the data types equal on both sides of the mapping",
                )
                break
            if first[3] == other[3] and first[2] and other[2] and not shapes_compatible(first[2], other[2]):
                out.error(
                    "TG194", "ensemble_scheduling.step",
                    f"ensemble tensor '{tensor}' has shape {dims_text(first[2])} for {first[0]} but "
                    f"{dims_text(other[2])} for {other[0]} (batch dimension included)",
                    "make the dims agree on both sides of the mapping (-1 matches any size)",
                )
                break
    return out.findings


def _decoupled_branches(config: ModelConfig, configs: Mapping[str, ModelConfig], out: Collector) -> None:
    """The server labels every ensemble tensor with the decoupled step it descends from (the
    ensemble's inputs: none; a decoupled step's outputs: a label of their own; any other step's:
    its inputs' label) and refuses a step whose inputs carry two labels: the responses of two
    decoupled models cannot be paired up."""
    label = {inp.name: 0 for inp in config.input}
    steps = list(enumerate(config.ensemble_scheduling.step))
    fresh = 0
    while steps:
        ready = [(i, st) for i, st in steps if all(t in label for t in st.input_map.values())]
        if not ready:
            return  # a tensor nothing produces, or a cycle: TG186 says so
        for i, step in ready:
            steps.remove((i, step))
            origins = sorted({label[t] for t in step.input_map.values()})
            if len(origins) > 1:
                out.error(
                    "TG197", f"ensemble_scheduling.step[{i}].input_map",
                    f"ensemble_scheduling.step[{i}] (model '{step.model_name}') reads tensors "
                    f"{sorted(step.input_map.values())} that descend from different decoupled models; the server "
                    "cannot pair their responses",
                    "feed the step from one decoupled branch only (or make one of the upstream models non-decoupled)",
                )
            target = configs.get(step.model_name)
            if target is not None and target.model_transaction_policy.decoupled:
                fresh += 1
                outgoing = fresh
            else:
                outgoing = origins[0] if origins else 0
            for tensor in step.output_map.values():
                label.setdefault(tensor, outgoing)
    outputs = [o.name for o in config.output if o.name in label]
    if len({label[o] for o in outputs}) > 1:
        out.error(
            "TG197", "output",
            f"the ensemble's outputs {outputs} descend from different decoupled models; the server cannot "
            "pair their responses into one",
            "produce every ensemble output from one decoupled branch (or make the upstream models non-decoupled)",
        )


def check_ensemble_cycles(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    """An ensemble that reaches itself through its steps' ensembles never finishes loading."""
    calls = {name: [st.model_name for st in c.ensemble_scheduling.step if st.model_name in configs and is_ensemble(configs[st.model_name])]
             for name, c in configs.items() if is_ensemble(c)}
    findings: list[Finding] = []
    for start in sorted(calls):
        path, stack = [start], [(start, iter(calls[start]))]
        found = None
        while stack and found is None:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
            elif child == start:
                found = path + [start]
            elif child not in path and child in calls:
                path.append(child)
                stack.append((child, iter(calls[child])))
        if found is not None:
            out = Collector(start)
            out.error(
                "TG196", "ensemble_scheduling.step",
                f"ensemble '{start}' calls itself: {' -> '.join(found)}; the server refuses the whole cycle",
                "break the cycle: no ensemble may call itself directly or through other ensembles",
            )
            findings += out.findings
    return findings
