"""Semantic rules over a parsed Triton `ModelConfig`: pure, no filesystem, no network.

The error rules are the checks tritonserver (2.51, the binary in nvidia-pytriton) runs when it
loads a model: each was confirmed by loading a deliberately broken config on the real server
(see tests/integration/test_check_vs_server.py, which re-proves them). Warnings are settings the
server accepts but ignores or that cannot work, and settings that fail only under conditions the
checker cannot see (a host without GPUs, `--rate-limit=execution_count`).

Entry points:
- `check_model_config(config, model=..., gpu_available=...)`: one model on its own.
- `check_cross_model(configs)`: rules that need several models (ensemble steps, rate-limiter
  resources shared between models).
`RULES` lists every code with its severity and what the server does.

One module per concern, each a `check_<concern>(config, out)` over the shared `base.Collector`:
catalogue (the rules table), model_level, batching, instances, tensors, ensemble, rate_limiter.
A new load-time rule is a row in `catalogue.RULES` and a check in its concern's module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import Collector, is_ensemble, is_tensorrt
from tritongen.core.config_rules.catalogue import RULES, Rule, rule_table
from tritongen.core.config_rules.batching import check_batching, check_sequence_batching
from tritongen.core.config_rules.ensemble import check_ensemble, check_ensemble_cycles, check_ensemble_references
from tritongen.core.config_rules.instances import check_gpu_ids, check_instance_groups
from tritongen.core.config_rules.model_level import check_model_level, check_version_policy, check_warmup
from tritongen.core.config_rules.tensors import check_batch_io, check_io
from tritongen.core.config_rules.rate_limiter import check_rate_limiter_scopes
from tritongen.core.findings import Finding

__all__ = ["RULES", "Rule", "check_cross_model", "check_model_config", "is_ensemble", "is_tensorrt", "rule_table"]

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_model_config(
    config: ModelConfig,
    *,
    model: str | None = None,
    gpu_available: bool | None = None,
    gpu_count: int | None = None,
    gpu_count_source: str = "the serving host",
    model_file: str | None = None,
    autofill_source: str | None = None,
) -> list[Finding]:
    """Every single-model rule. `model` is the directory name (the name the server loads it by);
    `gpu_available=False` turns on the KIND_GPU warning, `None` (unknown) and `True` leave it off.
    `gpu_count` is how many GPUs the serving host has (from NVML or the spec, named by
    `gpu_count_source`): instance-group ids at or beyond it are errors; unknown (None), ids are
    only checked for sign and a warning says they could not be checked further.
    `model_file` is the `model.<ext>` the server would infer the backend from (e.g. "1/model.plan");
    `autofill_source` says what the server's auto-complete would fill missing fields from (None:
    auto-complete is off or has nothing to read): what it fills is not decided here, and says so."""
    name = model or config.name or "<unnamed>"
    out = Collector(name)
    check_model_level(config, model, out)
    check_batching(config, out)
    check_sequence_batching(config, out)
    if is_ensemble(config) or config.HasField("ensemble_scheduling"):
        check_ensemble(config, out)
    if not is_ensemble(config):
        check_instance_groups(config, gpu_available, out, model_file)
        check_gpu_ids(config, gpu_count, gpu_count_source, out)
    check_io(config, out, autofill_source)
    check_batch_io(config, out)
    check_warmup(config, out)
    check_version_policy(config, out)
    return out.findings


def check_cross_model(configs: Mapping[str, ModelConfig]) -> list[Finding]:
    """Rules across models: ensemble steps against the models they call, rate-limiter resources."""
    findings: list[Finding] = []
    for name in sorted(configs):
        config = configs[name]
        if is_ensemble(config) and config.HasField("ensemble_scheduling"):
            findings.extend(check_ensemble_references(name, config, configs))
    findings.extend(check_ensemble_cycles(configs))
    findings.extend(check_rate_limiter_scopes(configs))
    return findings
