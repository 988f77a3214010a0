"""Rules across models on the rate limiter: a resource's scope (global or per device) must agree
in every model that names it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tritongen.core.findings import Finding

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_rate_limiter_scopes(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    scopes: dict[str, dict[bool, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for name in sorted(configs):
        for i, group in enumerate(configs[name].instance_group):
            for j, res in enumerate(group.rate_limiter.resources):
                if res.name:
                    scopes[res.name][bool(getattr(res, "global"))].append(
                        (name, f"instance_group[{i}].rate_limiter.resources[{j}]")
                    )
    findings = []
    for rname in sorted(scopes):
        by_scope = scopes[rname]
        if by_scope.get(True) and by_scope.get(False):
            global_users = sorted({m for m, _ in by_scope[True]})
            device_users = sorted({m for m, _ in by_scope[False]})
            for model, field in by_scope[True]:
                findings.append(
                    Finding(
                        "warning", "TG128", model, f"{field}.global",
                        f"model '{model}': rate_limiter resource '{rname}' is global here but per-device in "
                        f"{device_users}; with --rate-limit=execution_count the server refuses the model "
                        "loaded second",
                        f"use one scope for '{rname}' everywhere (global: true in {device_users} too, or "
                        f"drop global in {global_users}), or rename one of them",
                    )
                )
    return findings
