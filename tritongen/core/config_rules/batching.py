"""Rules on batching: `max_batch_size`, the dynamic batcher (preferred sizes, queue delays,
priority levels and queue policies) and the sequence batcher (its controls and strategies)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import BOOL_CONTROLS, CORRID_TYPES, Collector, dtype_name
from tritongen.core.model_config_enums import ControlKind, TimeoutAction

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def _check_preferred(
    sizes: Sequence[int], max_batch_size: int, field: str, out: Collector
) -> None:
    for size in sizes:
        if size <= 0:
            out.error(
                "TG102", field,
                f"{field} contains {size}; every preferred batch size must be positive "
                f"(max_batch_size is {max_batch_size})",
                f"remove {size} from {field}",
            )
        elif size > max_batch_size:
            out.error(
                "TG101", field,
                f"{field} {size} is greater than max_batch_size {max_batch_size}",
                f"lower {field} to at most {max_batch_size}, or raise max_batch_size to at least {size}"
                if max_batch_size > 0
                else f"remove {field} (the model does not batch), or set max_batch_size to at least {size}",
            )


def check_batching(config: ModelConfig, out: Collector) -> None:
    if not config.HasField("dynamic_batching"):
        return
    db = config.dynamic_batching
    mbs = config.max_batch_size
    _check_preferred(list(db.preferred_batch_size), mbs, "dynamic_batching.preferred_batch_size", out)
    queues = db.priority_levels > 0 or db.HasField("default_queue_policy") or len(db.priority_queue_policy) > 0
    if mbs == 0 and not db.preferred_batch_size and not queues:  # queue policies still apply at 0
        out.warning(
            "TG103", "dynamic_batching",
            "dynamic_batching is set but max_batch_size is 0, so the server never batches requests "
            "(the batcher only queues them)",
            "set max_batch_size > 0 (and give inputs without the batch dimension), or remove dynamic_batching",
        )
    levels = db.priority_levels
    default = db.default_priority_level
    if levels > 0:
        if default == 0 or default > levels:
            out.error(
                "TG105", "dynamic_batching.default_priority_level",
                f"dynamic_batching.default_priority_level is {default} but priority_levels is {levels}; "
                f"it must lie in [1, {levels}]",
                f"set default_priority_level to a value in 1..{levels} (1 is the highest priority)",
            )
        for key in sorted(db.priority_queue_policy):
            if key == 0 or key > levels:
                out.error(
                    "TG107", "dynamic_batching.priority_queue_policy",
                    f"dynamic_batching.priority_queue_policy has key {key} but priority_levels is {levels}; "
                    f"keys must lie in [1, {levels}]",
                    f"change key {key} to a level in 1..{levels}, or raise priority_levels to {max(key, 1)}",
                )
    else:
        if default != 0:
            out.warning(
                "TG106", "dynamic_batching.default_priority_level",
                f"dynamic_batching.default_priority_level is {default} but priority_levels is 0, so the "
                "level is ignored",
                f"set priority_levels to at least {default}, or remove default_priority_level",
            )
        if db.priority_queue_policy:
            keys = sorted(db.priority_queue_policy)
            out.warning(
                "TG108", "dynamic_batching.priority_queue_policy",
                f"dynamic_batching.priority_queue_policy sets levels {keys} but priority_levels is 0, so "
                "these policies are ignored",
                f"set priority_levels to at least {max(keys)} with a default_priority_level, or move the "
                "policy to default_queue_policy",
            )
    if db.preserve_ordering:
        if levels > 1:
            out.error(
                "TG109", "dynamic_batching.preserve_ordering",
                f"dynamic_batching.preserve_ordering is true with priority_levels {levels}; only one "
                "priority level is allowed with preserve_ordering",
                "set priority_levels to 0 or 1, or set preserve_ordering: false",
            )
        policies = [("dynamic_batching.default_queue_policy", db.default_queue_policy)]
        policies += [
            (f"dynamic_batching.priority_queue_policy[{k}]", db.priority_queue_policy[k])
            for k in sorted(db.priority_queue_policy)
        ]
        for field, policy in policies:
            if policy.timeout_action == TimeoutAction.DELAY and policy.default_timeout_microseconds != 0:
                out.error(
                    "TG110", f"{field}.timeout_action",
                    f"{field}.timeout_action is DELAY (default_timeout_microseconds "
                    f"{policy.default_timeout_microseconds}) while dynamic_batching.preserve_ordering is "
                    "true; a delayed request would break the ordering",
                    "use timeout_action: REJECT, or set preserve_ordering: false",
                )
    policies = []
    if db.HasField("default_queue_policy"):
        policies.append(("dynamic_batching.default_queue_policy", db.default_queue_policy))
    policies += [
        (f"dynamic_batching.priority_queue_policy[{k}]", db.priority_queue_policy[k])
        for k in sorted(db.priority_queue_policy)
    ]
    for field, policy in policies:
        if (
            policy.timeout_action == TimeoutAction.DELAY
            and policy.default_timeout_microseconds == 0
            and not policy.allow_timeout_override
        ):
            out.warning(
                "TG111", f"{field}.timeout_action",
                f"{field}.timeout_action is DELAY but default_timeout_microseconds is 0 and "
                "allow_timeout_override is false, so no timeout can ever fire",
                "set default_timeout_microseconds (or allow_timeout_override: true), or drop timeout_action",
            )


def check_sequence_batching(config: ModelConfig, out: Collector) -> None:
    if not config.HasField("sequence_batching"):
        return
    sb = config.sequence_batching
    if sb.HasField("oldest"):
        _check_preferred(
            list(sb.oldest.preferred_batch_size), config.max_batch_size,
            "sequence_batching.oldest.preferred_batch_size", out,
        )
    kinds: Counter[int] = Counter()
    for i, ci in enumerate(sb.control_input):
        field = f"sequence_batching.control_input[{i}]"
        if not ci.name:
            out.error(
                "TG115", f"{field}.name",
                f"{field} has no name; every sequence control tensor needs one",
                f"add name: \"...\" to {field} (the tensor name the model reads)",
            )
        for j, control in enumerate(ci.control):
            kind_name = ControlKind.Name(control.kind)
            kinds[control.kind] += 1
            cfield = f"{field}.control[{j}]"
            if control.kind in BOOL_CONTROLS:
                lists = [
                    (n, len(getattr(control, n)))
                    for n in ("int32_false_true", "fp32_false_true", "bool_false_true")
                    if len(getattr(control, n))
                ]
                if not lists:
                    out.error(
                        "TG117", cfield,
                        f"{cfield} ({kind_name}, tensor '{ci.name}') gives no int32_false_true, "
                        "fp32_false_true or bool_false_true",
                        "add exactly one of them with two entries, e.g. int32_false_true: [ 0, 1 ]",
                    )
                elif len(lists) > 1:
                    out.error(
                        "TG117", cfield,
                        f"{cfield} ({kind_name}, tensor '{ci.name}') gives {', '.join(n for n, _ in lists)}; "
                        "only one is allowed",
                        f"keep only one of {', '.join(n for n, _ in lists)}",
                    )
                elif lists[0][1] != 2:
                    n, count = lists[0]
                    out.error(
                        "TG117", f"{cfield}.{n}",
                        f"{cfield}.{n} ({kind_name}, tensor '{ci.name}') has {count} entries; it needs "
                        "exactly 2 (the false value, then the true value)",
                        f"write {n}: [ <false>, <true> ], e.g. [ 0, 1 ]",
                    )
            elif control.kind == ControlKind.CONTROL_SEQUENCE_CORRID:
                dtype = dtype_name(control.data_type)
                if dtype not in CORRID_TYPES:
                    out.error(
                        "TG118", f"{cfield}.data_type",
                        f"{cfield}.data_type is {dtype} for CONTROL_SEQUENCE_CORRID (tensor '{ci.name}'); "
                        f"allowed: {', '.join(CORRID_TYPES)}",
                        "set data_type: TYPE_UINT64 (or TYPE_STRING for string correlation ids)",
                    )
    # The server walks control_input once per control kind and refuses a tensor name it has seen
    # in an earlier entry, whatever the kinds: one entry per tensor.
    entries_of: dict[str, list[int]] = defaultdict(list)
    for i, ci in enumerate(sb.control_input):
        if ci.name:
            entries_of[ci.name].append(i)
    for tensor, entries in sorted(entries_of.items()):
        if len(entries) > 1:
            kinds_named = sorted({ControlKind.Name(c.kind)
                                  for i in entries for c in sb.control_input[i].control})
            out.error(
                "TG112", "sequence_batching.control_input",
                f"sequence control tensor '{tensor}' is declared in {len(entries)} control_input entries "
                f"({', '.join(f'[{i}]' for i in entries)}, kinds {', '.join(kinds_named)}); a tensor may carry "
                "one control",
                f"give each control its own tensor name, e.g. keep '{tensor}' in control_input[{entries[0]}] "
                "and rename the others",
            )
    for kind, count in sorted(kinds.items()):
        if count > 1:
            kind_name = ControlKind.Name(kind)
            out.error(
                "TG116", "sequence_batching.control_input",
                f"sequence_batching.control_input declares {kind_name} {count} times; each control kind "
                "may appear once",
                f"keep one {kind_name} control and remove the others",
            )
