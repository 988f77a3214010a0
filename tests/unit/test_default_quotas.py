"""Default memory quotas fit under the cap on any device size; stated quotas never shrink (issue 16).

A model without `memory_quota_mb` asks for weights + policy.framework_reserve_mb (classic) or a
whole device (LLM). When those do not fit together, each default shrinks to an equal share of what
the stated quotas and the weights leave, by hand here; the plan, the rendered configs, the sidecar
policy and the render command say which default was used.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import run_cli
from tritongen.core.plan import plan_deployment
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.core.spec import MIB, DeploymentSpec
from tritongen.errors import Infeasible
from tritongen.render import render_repository
from tritongen.specio import LoadedSpec

CLASSES = [
    {"name": "interactive", "kind": "interactive", "priority": 1, "p99_ms": 50, "share": 0.3},
    {"name": "normal", "kind": "normal", "priority": 2, "p99_ms": 200, "share": 0.5},
    {"name": "batch", "kind": "batch", "priority": 3, "p99_ms": 1000, "share": 0.2},
]


def classic(name: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name, "backend": "python", "kind": "classic", "max_batch_size": 64,
        "inputs": [{"name": "x", "data_type": "FP32", "dims": [24]}],
        "outputs": [{"name": "score", "data_type": "FP32", "dims": [2]}],
        **over,
    }


def cpu_doc(*models: dict[str, Any], cpu_memory_mb: float = 256, **policy: Any) -> dict[str, Any]:
    """A classic-only CPU deployment like examples/classic_standins: no quota, no policy stated."""
    doc: dict[str, Any] = {
        "version": 1, "name": "small", "hardware": {"gpus": [], "cpu_memory_mb": cpu_memory_mb},
        "models": list(models) or [classic("scorer")], "traffic_classes": CLASSES,
    }
    if policy:
        doc["policy"] = policy
    return doc


def plan_of(doc: dict[str, Any]):
    return plan_deployment(DeploymentSpec.model_validate(doc), {})


def placement(plan, model: str):
    return next(p for p in plan.placements if p.model == model)


def test_a_classic_default_on_a_small_cpu_pool_gets_a_fair_share() -> None:
    plan = plan_of(cpu_doc())
    scorer = placement(plan, "scorer")
    # 256 MiB x 0.85 = 217.6 MiB left; one model without a quota and one share kept free: half each
    assert scorer.quota_bytes == int(256 * MIB * 0.85) // 2
    assert scorer.reserve_bytes == scorer.quota_bytes  # no weights: the quota is all reserve
    assert scorer.quota_default and scorer.quota_fitted
    (note,) = plan.entry("scorer").notes
    assert note.startswith("memory quota 108.8 MiB, default: weights 0.0 MiB + framework reserve 108.8 MiB")
    assert "policy.framework_reserve_mb's default 1024 MiB does not fit" in note and "on cpu under the 85% cap" in note


def test_defaults_share_what_stated_quotas_and_weights_leave() -> None:
    doc = cpu_doc(
        classic("a", weights={"bytes": 10 * MIB}),
        classic("b", weights={"bytes": 20 * MIB}),
        classic("c", weights={"bytes": 5 * MIB}, memory_quota_mb=100),
    )
    plan = plan_of(doc)
    left = int(256 * MIB * 0.85) - 100 * MIB - 10 * MIB - 20 * MIB
    share = left // 3  # two defaults and the share kept free
    assert placement(plan, "a").quota_bytes == 10 * MIB + share
    assert placement(plan, "b").quota_bytes == 20 * MIB + share
    assert placement(plan, "a").reserve_bytes == placement(plan, "b").reserve_bytes == share
    stated = placement(plan, "c")
    assert stated.quota_bytes == 100 * MIB and not stated.quota_default and not stated.quota_fitted
    assert stated.quota_source == "memory_quota_mb 100 MiB"
    # a stated classic quota is weights + reserve: the default reserve fits inside it
    assert stated.reserve_bytes == 95 * MIB
    assert plan.entry("c").notes == []  # a quota as stated needs no note
    assert sum(p.quota_bytes for p in plan.placements) < int(256 * MIB * 0.85)


def test_defaults_that_fit_keep_the_whole_reserve() -> None:
    plan = plan_of(cpu_doc(cpu_memory_mb=4096))
    scorer = placement(plan, "scorer")
    assert scorer.quota_bytes == scorer.reserve_bytes == 1024 * MIB
    assert scorer.quota_default and not scorer.quota_fitted
    assert scorer.quota_source == "default: weights 0.0 MiB + policy.framework_reserve_mb 1024 MiB (its default)"
    assert plan.entry("scorer").notes == []


def test_a_stated_quota_that_does_not_fit_is_still_refused_by_name() -> None:
    with pytest.raises(Infeasible) as info:
        plan_of(cpu_doc(classic("scorer", memory_quota_mb=300)))
    message = str(info.value)
    assert "model 'scorer' needs 300 MiB on 1 device(s) (its memory quota)" in message
    assert "cpu: 218 of 218 MiB free" in message and "lower memory_quota_mb" in message


def test_a_stated_reserve_is_not_scaled_down() -> None:
    with pytest.raises(Infeasible) as info:
        plan_of(cpu_doc(framework_reserve_mb=1024))
    message = str(info.value)
    assert "(default: weights 0.0 MiB + policy.framework_reserve_mb 1024 MiB)" in message
    assert "lower policy.framework_reserve_mb, state memory_quota_mb, add memory (hardware.cpu_memory_mb)" in message


def test_weights_that_do_not_fit_are_named() -> None:
    with pytest.raises(Infeasible) as info:
        plan_of(cpu_doc(classic("scorer", weights={"bytes": 300 * MIB})))
    message = str(info.value)
    assert "needs 300 MiB on 1 device(s) (its weights 300 MiB, which cannot shrink" in message
    assert "add memory (hardware.cpu_memory_mb)" in message


def test_a_cpu_pool_of_unknown_size_has_nothing_to_share() -> None:
    doc = cpu_doc()
    del doc["hardware"]["cpu_memory_mb"]
    with pytest.raises(Infeasible, match=r"'scorer' needs 1024 MiB \(default: .*\) but hardware.cpu_memory_mb is not set"):
        plan_of(doc)


def test_an_llm_default_takes_the_rest_of_its_device_after_the_classic_share() -> None:
    llm = {
        "name": "llm", "backend": "python", "kind": "llm", "max_context": 1024,
        "architecture": {"family": "llama", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                         "num_kv_heads": 8, "head_dim": 64, "dtype": "fp16", "attention": "mha"},
        "weights": {"bytes": 2000 * MIB},
        "inputs": [{"name": "text_input", "data_type": "STRING", "dims": [1]}],
        "outputs": [{"name": "text_output", "data_type": "STRING", "dims": [1]}],
    }
    doc = {
        "version": 1, "name": "one-gpu", "hardware": {"gpus": [{"name": "small", "memory_mb": 16000}]},
        "models": [llm, classic("ranker", weights={"bytes": 4000 * MIB})], "traffic_classes": CLASSES,
    }
    spec = DeploymentSpec.model_validate(doc)
    plan = plan_deployment(spec, {"llm": spec.models[0].architecture})
    left = int(16000 * MIB * 0.85) - 2000 * MIB - 4000 * MIB
    ranker, engine = placement(plan, "ranker"), placement(plan, "llm")
    assert ranker.quota_bytes == 4000 * MIB + 1024 * MIB  # its share (left / 3) holds the whole reserve
    assert ranker.reserve_bytes == 1024 * MIB
    assert engine.quota_bytes == 2000 * MIB + left - 1024 * MIB  # the rest
    assert engine.quota_fitted and "an equal share of the rest" in engine.quota_source
    kv = plan.entry("llm").kv
    assert kv is not None and kv.device_bytes == engine.quota_bytes
    assert plan.entry("llm").notes[0].startswith(f"memory quota {engine.quota_bytes / MIB:.1f} MiB, default:")


def test_the_sidecar_policy_counts_the_fitted_reserve_and_no_pad_without_llms() -> None:
    spec = DeploymentSpec.model_validate(cpu_doc())
    plan = plan_deployment(spec, {})
    doc = build_sidecar_policy(spec, plan)
    (device,) = doc["devices"]
    assert device["static_used_bytes"] == placement(plan, "scorer").reserve_bytes
    assert doc["headroom"]["safety_pad_bytes"] == 0
    assert any(n.startswith("headroom: no safety pad") for n in doc["notes"])
    stated = DeploymentSpec.model_validate(cpu_doc(kv_safety_pad_mb=4))
    assert build_sidecar_policy(stated, plan_deployment(stated, {}))["headroom"]["safety_pad_bytes"] == 4 * MIB


def test_render_of_a_classic_only_spec_without_quotas(tmp_path: Path) -> None:
    doc = cpu_doc()
    spec_path = tmp_path / "deployment.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    rendered = render_repository(LoadedSpec(spec=DeploymentSpec.model_validate(doc), architectures={}, path=spec_path))
    assert "# memory quota 108.8 MiB, default:" in rendered.files["scorer/config.pbtxt"]
    assert json.loads(rendered.files["sidecar_policy.json"])["headroom"]["safety_pad_bytes"] == 0

    out = tmp_path / "repo"
    result = run_cli("render", str(spec_path), "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())  # rich wraps long lines
    assert "memory quota of scorer: 108.8 MiB, default: weights 0.0 MiB + framework reserve 108.8 MiB" in said
    assert (out / "scorer" / "config.pbtxt").is_file()


def test_fitting_only_runs_when_the_defaults_do_not_fit() -> None:
    """Specs that render with their defaults keep every number (the examples render identically)."""
    doc = cpu_doc(classic("a"), classic("b"), cpu_memory_mb=4096)
    before = plan_of(doc)
    assert [p.quota_bytes for p in before.placements] == [1024 * MIB, 1024 * MIB]
    tight = copy.deepcopy(doc)
    tight["hardware"]["cpu_memory_mb"] = 2048  # 1740.8 MiB under the cap: two whole reserves do not fit
    after = plan_of(tight)
    assert [p.quota_bytes for p in after.placements] == [int(2048 * MIB * 0.85) // 3] * 2
