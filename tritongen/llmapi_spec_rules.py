"""`check SPEC DIR` on TensorRT-LLM's LLM-API models: does the KV pool each committed model.yaml
lets the engine take fit the budget the spec plans on its GPU (TG410), and does model.yaml still
say what the spec renders (TG411)?

The pool is the engine's own rule (the smaller of max_tokens and free_gpu_memory_fraction of what
it finds free, `core.llmapi_plan.kv_pool_bytes`) with the spec's architecture, weights, GPU and
neighbours; the budget is the plan's (quota - weights - reserve - pad), the one render writes.
Drift compares parsed YAML, key by key, not text: comments may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tritongen.core.findings import Finding
from tritongen.core.llmapi_plan import kv_pool_bytes
from tritongen.core.plan import DeploymentPlan, ModelEntryPlan
from tritongen.core.spec import MIB
from tritongen.core.trtllm_args import MODEL_YAML
from tritongen.llmapi_files import key_line, llmapi_model_yaml

SLACK = 1.001  # render rounds free_gpu_memory_fraction to 4 places


def llmapi_rules(plan: DeploymentPlan, rendered: Mapping[str, str], repository: Path,
                 spec_name: str) -> Callable[[dict], list[Finding]]:
    """An extra rule for check_repository (it gets the parsed configs; this reads model.yaml)."""
    def rule(_configs: dict) -> list[Finding]:
        out: list[Finding] = []
        for entry in plan.entries:
            if entry.llm_args is not None:
                out += _entry_findings(plan, entry, rendered, repository, spec_name)
        return out
    return rule


def _entry_findings(plan: DeploymentPlan, entry: ModelEntryPlan, rendered: Mapping[str, str], repository: Path,
                    spec_name: str) -> list[Finding]:
    found = llmapi_model_yaml(repository / entry.name)
    expected_path = repository / entry.name / "1" / MODEL_YAML
    if found is None or found.data is None:
        if found is None:  # unreadable files are TG401's
            return [Finding("error", "TG411", entry.name, "", f"the spec {spec_name} renders {expected_path} for "
                            f"TensorRT-LLM's LLM-API model {entry.name!r} but the repository has none",
                            f"run `tritongen render {spec_name} -o <repository>`", path=str(expected_path))]
        return []
    path = str(found.path)
    out = _kv_fit(plan, entry, found.data, path, lambda loc: key_line(found.root, loc))
    want = yaml.safe_load(rendered[f"{entry.name}/1/{MODEL_YAML}"])
    differing = _differing(found.data, want)
    if differing:
        first = tuple(differing[0].split("."))
        out.append(Finding("error", "TG411", entry.name, differing[0],
                           f"model.yaml of {entry.name!r} drifted from what {spec_name} renders (differs in: "
                           f"{', '.join(differing)})",
                           f"edit the spec instead of the file, then run `tritongen render {spec_name} -o <repository>`",
                           path=path, line=key_line(found.root, first)))
    return out


def _kv_fit(plan: DeploymentPlan, entry: ModelEntryPlan, data: Mapping[str, Any], path: str,
            line: Callable[[tuple[Any, ...]], int | None]) -> list[Finding]:
    kv = entry.kv
    if kv is None:
        return []
    placement = next(p for p in plan.placements if p.model == entry.spec_model)
    gpu = placement.gpus[0]
    others = [p for p in plan.placements if p.model != entry.spec_model and set(p.gpus) & set(placement.gpus)]
    pool, how = kv_pool_bytes(data, kv, plan.device_bytes[gpu], sum(p.quota_bytes for p in others))
    if pool <= kv.budget_bytes * SLACK:
        return []
    key = "kv_cache_config.max_tokens" if how.startswith("kv_cache_config.max_tokens") else \
        "kv_cache_config.free_gpu_memory_fraction"
    tokens = kv.pool_blocks * kv.block_tokens
    beside = f" beside {', '.join(p.model for p in others)}" if others else ""
    return [Finding(
        "error", "TG410", entry.name, key,
        f"model.yaml lets the engine take {pool / MIB:.0f} MiB of KV cache on GPU {gpu} ({how}), over the "
        f"{kv.budget_bytes / MIB:.0f} MiB the plan leaves it (quota {kv.device_bytes / MIB:.0f} - weights "
        f"{kv.weights_bytes / MIB:.0f} - reserve {kv.reserve_bytes / MIB:.0f} - pad {kv.pad_bytes / MIB:.0f}){beside}: "
        "the GPU runs out of memory under load or when the other models load",
        f"set kv_cache_config.max_tokens to at most {tokens} (and free_gpu_memory_fraction to what render writes), "
        "or raise memory_quota_mb",
        path=path, line=line(tuple(key.split("."))) or line(("kv_cache_config",)))]


def _differing(have: Mapping[str, Any], want: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(have) | set(want), key=str):
        a, b = have.get(key), want.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differing(a, b, f"{prefix}{key}.")
        elif a != b or (key in have) != (key in want):
            out.append(f"{prefix}{key}")
    return out
