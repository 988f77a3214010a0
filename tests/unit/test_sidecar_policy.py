"""The sidecar policy: derived from spec + plan (+ profiles) by hand, and its strict schema.
The limits it takes from engines and from Triton: test_sidecar_policy_engines.py."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from sidecar.cost import kv_bytes_for
from tests.helpers import EXAMPLES, run_cli, write_hybrid_spec
from tests.import_closure import import_closure, project_modules
from tritongen.core.file_names import POLICY_FILE
from tritongen.core.plan import plan_deployment
from tritongen.core.profile_types import Profile
from tritongen.core.sidecar_policy.build import build_sidecar_policy
from tritongen.core.sidecar_policy.schema import POLICY_VERSION, PolicyError, parse_policy, parse_policy_text
from tritongen.core.spec import MIB
from tritongen.errors import BadInput
from tritongen.shared.policy_file import load_policy
from tritongen.specio import load_spec


def cpu() -> tuple[Any, Any]:
    loaded = load_spec(EXAMPLES / "deployment.yaml")
    return loaded.spec, plan_deployment(loaded.spec, loaded.architectures)


def gpu() -> tuple[Any, Any]:
    loaded = load_spec(EXAMPLES / "gpu-deployment.yaml")
    return loaded.spec, plan_deployment(loaded.spec, loaded.architectures)


def model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["name"] == name)


def test_file_name_and_version_are_stated_once() -> None:
    assert POLICY_FILE == "sidecar_policy.json"
    spec, plan = cpu()
    assert build_sidecar_policy(spec, plan)["version"] == POLICY_VERSION == 1


def test_cpu_example_by_hand() -> None:
    spec, plan = cpu()
    doc = build_sidecar_policy(spec, plan)
    policy = parse_policy(doc)  # the builder's output is a valid policy
    json.dumps(doc)  # and plain JSON
    assert doc["version"] == 1 and doc["deployment"] == spec.name
    assert doc["default_class"] == "normal" and doc["starvation_guard_ms"] == 200
    classes = {c["name"]: c for c in doc["classes"]}
    assert [c["name"] for c in doc["classes"]] == ["interactive", "normal", "batch"]
    # queue wait: the whole target (the sidecar subtracts the measured upstream time itself)
    assert classes["interactive"]["max_queue_wait_ms"] == 250 and classes["batch"]["max_queue_wait_ms"] == 5000
    assert [c["budget_fraction"] for c in doc["classes"]] == [1.0, 0.9, 0.8]

    kv = plan.entry("tinyllm").kv
    tiny = model(doc, "tinyllm")
    assert tiny["kind"] == "llm" and tiny["streaming"] is True and tiny["devices"] == ["cpu"]
    assert tiny["kv"]["bytes_per_token"] == kv.kv_bytes_per_token == 512
    assert tiny["kv"]["bytes_per_token_source"] == "analytic"
    assert tiny["kv"]["block_tokens"] == 16 and tiny["kv"]["max_context"] == 256
    assert tiny["kv"]["default_max_tokens"] == 16  # from the model's parameters
    # the engine's own pool (whole blocks of the budget) and its sequence limit, as rendered
    assert tiny["kv"]["kv_policy"] == "grow_kill" and tiny["kv"]["prompt_bytes_per_token"] == 1
    assert tiny["memory_quota_bytes"] == tiny["kv"]["engine_pool_bytes"] == kv.pool_blocks * 16 * 512  # one engine
    assert tiny["max_inflight"] == kv.max_sequences
    assert tiny["priority_levels"] == 3 and tiny["default_priority"] == 2
    assert tiny["kv"]["prefill_peak"] == [] and tiny["release_grace_ms"] == 500

    ranker = model(doc, "ranker")
    assert ranker["kind"] == "classic" and "kv" not in ranker
    assert ranker["request_bytes"] == 32 * 4 + 1 * 4  # FEATURES fp32[32] + SCORES fp32[1]
    # what Triton accepts: one batch of 32 running + three priority queues of 4 batches each
    assert ranker["max_inflight"] == 32 + 3 * 4 * 32

    total = tiny["max_inflight"]  # the adaptive limit counts LLM requests only
    assert all(c["queue_cap"] is None for c in doc["classes"])  # refused by predicted wait, not by count
    assert doc["concurrency"]["max"] == total and doc["concurrency"]["min"] == -(-total // 3)
    assert doc["concurrency"]["queue_delay_high_ms"] == 250 * 0.25
    assert doc["headroom"]["sources"] == ["triton_metrics", "static"]  # no NVML on a CPU-only node
    assert doc["headroom"]["safety_pad_bytes"] == int(spec.policy.kv_safety_pad_mb * MIB)
    (device,) = doc["devices"]
    assert device["id"] == "cpu" and device["memory_bytes"] == int(spec.hardware.cpu_memory_mb * MIB)
    reserve = int(spec.policy.framework_reserve_mb * MIB)
    weights = {m.name: m.weights.parameters * 4 for m in spec.models}  # both fp32 by parameter count
    assert device["static_used_bytes"] == (weights["ranker"] + reserve) + (weights["tinyllm"] + reserve + kv.budget_bytes)
    assert policy.digest() == parse_policy(copy.deepcopy(doc)).digest()
    # no tenant quotas from the spec: the header is named, the list is empty, every tenant is unlimited
    assert doc["tenant_header"] == "x-tenant" and doc["tenants"] == [] and "default_tenant" not in doc
    assert policy.default_tenant is None and policy.tenant_quota("anyone") is None


def test_gpu_example_lanes_devices_and_engines() -> None:
    spec, plan = gpu()
    doc = build_sidecar_policy(spec, plan)
    parse_policy(doc)
    names = [m["name"] for m in doc["models"]]
    assert names == [e.name for e in plan.entries]  # one entry per Triton model (lanes included)
    short = model(doc, "llama3-8b_short")
    kv = plan.entry("llama3-8b_short").kv
    assert short["kv"]["bytes_per_token"] == kv.kv_bytes_per_token == 131072
    assert short["devices"] == [f"gpu{i}" for i in next(p for p in plan.placements if p.model == "llama3-8b").gpus]
    # vLLM grows and preempts, never kills: no KV reservation, only its sequence limit and the pool's size
    assert short["engines"] == 1 and short["memory_quota_bytes"] is None
    assert short["kv"]["kv_policy"] == "grow_preempt"
    assert short["kv"]["engine_pool_bytes"] == kv.pool_blocks * 16 * 131072
    assert short["max_inflight"] == plan.entry("llama3-8b_short").engine_args["max_num_seqs"]
    assert short["kv"]["default_max_tokens"] == 16  # vLLM's own default when a request names none
    assert short["priority_levels"] == 0  # vLLM entries have no Triton batcher: priority is not forwarded
    qwen = model(doc, "qwen2.5-7b")
    assert qwen["classes"] == ["normal", "batch"]
    reranker = model(doc, "reranker")
    assert reranker["engines"] == 2 * 2  # 2 instances on each of 2 GPUs
    assert reranker["request_bytes"] == 512 * 8 * 2 + 4
    assert doc["headroom"]["sources"] == ["nvml", "triton_metrics", "static"]
    assert [d["id"] for d in doc["devices"]] == ["gpu0", "gpu1"]
    assert all(d["static_used_bytes"] < d["memory_bytes"] * d["utilization_cap"] for d in doc["devices"])


def profile(model_name: str, **memory: Any) -> Profile:
    return Profile.model_validate({
        "model": model_name, "kind": "streaming", "server_version": "2.51.0", "server_url": "127.0.0.1:8001",
        "created_at": datetime(2026, 1, 1, tzinfo=timezone.utc).isoformat(), "tritongen_version": "0.1.0",
        "complete": True, "duration_s": 1.0, "max_batch_size": 19,
        "settings": {"quick": True, "concurrency_levels": [1], "stream_concurrency_levels": [1], "warmup_s": 0.1,
                     "window_s": 0.1, "min_windows": 1, "max_windows": 1, "agreement": 0.1, "pad_margin": 1.5,
                     "kv_probe_mb": 0, "seed": 0},
        "memory": {"probe": "rss", **memory},
        "streaming": {"prompt_tokens": 32, "max_tokens": 32, "levels": [
            {"concurrency": 1, "requests": 1, "errors": 0, "tokens": 32, "duration_s": 1, "windows": 1,
             "converged": True, "window_tokens_per_s": [32], "tokens_per_s": 32, "stream_tokens_per_s_p50": 32,
             "ttft_p50_ms": 5, "ttft_p99_ms": 9, "itl_p50_ms": 3, "itl_p99_ms": 20}]},
    })


def test_a_hybrid_model_is_charged_its_footprint_at_its_own_length(tmp_path: Path) -> None:
    loaded = load_spec(write_hybrid_spec(tmp_path))
    doc = build_sidecar_policy(loaded.spec, plan_deployment(loaded.spec, loaded.architectures))
    kv = model(doc, "nemotron-h-8b")["kv"]
    # 4 attention layers x 4096 B a token grow; 24 Mamba2 layers hold 4255744 B each (test_kv HYBRID).
    assert kv["bytes_per_token"] == 16384 and kv["capped"] == [] and kv["state_bytes"] == 102_137_856
    assert kv["engine_pool_bytes"] == 22_721_814_528  # the plan's budget, in bytes
    cost = parse_policy(doc).model_named("nemotron-h-8b").kv
    # 1000 + 24 tokens = 64 blocks of 16: 1024 x 16384 + 102137856; at 8192 tokens 236355584 B,
    # where bytes per token x length (1024 x 16384 = 16777216) would miss the state.
    assert kv_bytes_for(cost, 1000 + 24) == 1024 * 16384 + 102_137_856 == 118_915_072
    assert kv_bytes_for(cost, 8192) == 236_355_584
    note = next(n for n in doc["notes"] if n.startswith("nemotron-h-8b: engine"))
    assert "16384 KV bytes/token (analytic); on the growing layers only; 102137856 B of fixed state a sequence" in note


def test_profile_numbers_win_over_arithmetic() -> None:
    spec, plan = cpu()
    prof = profile(
        "tinyllm", kv_bytes_per_token_measured=530.5,
        prefill=[
            {"prompt_tokens": 200, "steady_bytes": 1, "peak_bytes": 9, "peak_delta_bytes": 90000, "samples": 3, "method": "sampled"},
            {"prompt_tokens": 16, "steady_bytes": 1, "peak_bytes": 2, "peak_delta_bytes": 1000, "samples": 3, "method": "sampled"},
        ],
    )
    doc = build_sidecar_policy(spec, plan, {"tinyllm": prof})
    tiny = model(doc, "tinyllm")
    assert tiny["kv"]["bytes_per_token"] == 530.5 and tiny["kv"]["bytes_per_token_source"] == "profile"
    assert tiny["kv"]["prefill_peak"] == [{"prompt_tokens": 16, "peak_bytes": 1000},
                                          {"prompt_tokens": 200, "peak_bytes": 90000}]
    assert tiny["kv"]["prefill_peak_source"] == "profile"
    assert tiny["release_grace_ms"] == 16 * 20  # 16 x the worst inter-token P99
    assert any("530.5 KV bytes/token (profile)" in n for n in doc["notes"])
    parse_policy(doc)


def test_measurement_below_the_arithmetic_is_not_trusted() -> None:
    spec, plan = cpu()
    doc = build_sidecar_policy(spec, plan, {"tinyllm": profile("tinyllm", kv_bytes_per_token_measured=490.0)})
    kv = model(doc, "tinyllm")["kv"]
    assert kv["bytes_per_token"] == 512 and kv["bytes_per_token_source"] == "analytic"
    assert any("measured 490 KV bytes/token is below the analytic 512" in n for n in doc["notes"])


def test_profile_without_memory_falls_back_to_arithmetic() -> None:
    spec, plan = cpu()
    prof = profile("tinyllm")
    doc = build_sidecar_policy(spec, plan, {"tinyllm": prof})
    assert model(doc, "tinyllm")["kv"]["bytes_per_token"] == 512
    assert model(doc, "tinyllm")["kv"]["bytes_per_token_source"] == "analytic"


def test_builder_is_pure_and_deterministic() -> None:
    spec, plan = cpu()
    assert build_sidecar_policy(spec, plan) == build_sidecar_policy(spec, plan)


# ------------------------------------------------------------------------------------------------
# schema


def base() -> dict[str, Any]:
    spec, plan = cpu()
    return build_sidecar_policy(spec, plan)


def refused(doc: Any) -> str:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc, "p.json")
    assert isinstance(err.value, BadInput)  # the CLI maps it to exit code 2
    return str(err.value)


def test_unknown_key_is_refused_with_its_path() -> None:
    doc = base()
    doc["models"][1]["kv"]["bytes_per_tokn"] = 1
    message = refused(doc)
    assert "p.json: 1 problem in the sidecar policy" in message
    assert "models[1].kv.bytes_per_tokn: unknown key; check the spelling" in message


def test_every_problem_is_listed() -> None:
    doc = base()
    doc["classes"][0]["priority"] = 0
    doc["headroom"]["poll_interval_ms"] = -1
    message = refused(doc)
    assert "2 problems" in message and "classes[0].priority" in message and "headroom.poll_interval_ms" in message


def test_unsupported_version() -> None:
    doc = base()
    doc["version"] = 2
    assert "policy version 2 is not supported (this sidecar reads version 1)" in refused(doc)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(default_class="vip"), "default_class 'vip' is not one of the classes"),
        (lambda d: d["models"][0].update(devices=["gpu0"]), "devices ['gpu0'] are not in `devices` ['cpu']"),
        (lambda d: d["models"][0].update(devices=["tpu0"]), "must be 'cpu' or 'gpu<N>'"),
        (lambda d: d["models"][1].pop("kv"), "is an llm: it needs `kv`"),
        (lambda d: d["models"][0].update(kv=d["models"][1]["kv"]), "is classic: remove `kv`"),
        (lambda d: d["models"][0].update(classes=["gold"]), "classes ['gold'] are not in `classes`"),
        (lambda d: d["classes"][1].update(priority=1), "give each class its own level"),
        (lambda d: d["classes"].append(dict(d["classes"][0])), "names ['interactive'] appear more than once"),
        (lambda d: d["concurrency"].update(min=100, max=10), "concurrency.min 100 exceeds concurrency.max 10"),
        (lambda d: d["concurrency"].update(initial=500), "concurrency.initial 500 is outside"),
        (lambda d: d["concurrency"].update(low_watermark=0.95), "must be below high_watermark"),
        (lambda d: d["concurrency"].update(queue_delay_low_ms=100), "must be below queue_delay_high_ms"),
        (lambda d: d["headroom"].update(sources=["nvml"]), "must end with 'static'"),
        (lambda d: d["headroom"].update(sources=["static", "nvml"]), "put 'static' last"),
        (lambda d: d["headroom"].update(sources=["static", "static"]), "name a source twice"),
        (lambda d: d["models"][1]["kv"].update(prefill_peak=[{"prompt_tokens": 9, "peak_bytes": 1},
                                                             {"prompt_tokens": 3, "peak_bytes": 1}]),
         "must be strictly increasing"),
        (lambda d: d["classes"][0].update(budget_fraction=1.5), "less than or equal to 1"),
        (lambda d: d.update(tenants=[{"name": "a"}, {"name": "a"}]), "tenants: names ['a'] appear more than once"),
        (lambda d: d.update(tenants=[{"name": "other"}]),
         ("tenants[0].name: the tenant name 'other' is reserved (the metrics count the tenants the policy does "
          "not list under it); rename the tenant")),
        (lambda d: d.update(tenants=[{"name": "a b"}]), "tenants[0].name: String should match pattern"),
        (lambda d: d.update(tenants=[{"name": "a", "classes": ["gold"]}]),
         ("tenants[0] ('a'): classes ['gold'] are not in `classes` ['batch', 'interactive', 'normal']; name "
          "classes the policy defines, or leave `classes` out to allow all")),
        (lambda d: d.update(default_tenant={"classes": ["gold"]}), "default_tenant: classes ['gold'] are not in"),
        (lambda d: d.update(tenants=[{"name": "a", "classes": []}]),
         "tenants[0].classes: classes [] would refuse every request of the tenant"),
        (lambda d: d.update(tenants=[{"name": "a", "max_inflight": 0}]),
         "tenants[0].max_inflight: Input should be greater than or equal to 1"),
        (lambda d: d.update(default_tenant={"max_reserved_bytes": -1}),
         "default_tenant.max_reserved_bytes: Input should be greater than or equal to 1"),
        (lambda d: d.update(tenants=[{"name": "a", "max_bytes": 1}]), "tenants[0].max_bytes: unknown key"),
        (lambda d: d.update(default_tenant={"name": "x"}), "default_tenant.name: unknown key"),
        (lambda d: d.update(tenant_header="x-traffic-class"),
         "tenant_header 'x-traffic-class' is also the class_header 'x-traffic-class'"),
        (lambda d: d.update(tenant_header="X-Tenant"), "tenant_header: String should match pattern"),
    ],
)
def test_cross_field_rules(edit: Any, message: str) -> None:
    doc = base()
    edit(doc)
    assert message in refused(doc)


def test_tenants_section() -> None:
    doc = base()
    doc["tenants"] = [{"name": "acme", "max_inflight": 4, "max_reserved_bytes": 1_000_000, "classes": ["batch"]},
                      {"name": "internal"}]
    doc["default_tenant"] = {"max_inflight": 2}
    doc["tenant_header"] = "x-org"
    policy = parse_policy(doc)
    acme = policy.tenant_quota("acme")
    assert acme is not None and (acme.max_inflight, acme.max_reserved_bytes, acme.classes) == (4, 1_000_000, ["batch"])
    internal = policy.tenant_quota("internal")  # listed without limits: unlimited, not the default quota
    assert internal is not None and (internal.max_inflight, internal.max_reserved_bytes, internal.classes) == (None,) * 3
    assert policy.tenant_quota("unlisted") == policy.tenant_quota("default") == policy.default_tenant
    assert policy.default_tenant is not None and policy.default_tenant.max_inflight == 2
    assert policy.digest() != parse_policy(base()).digest()


def test_not_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{\n  "version": 1,\n  oops\n}')
    with pytest.raises(PolicyError, match=r"p.json:3:3: not valid JSON"):
        load_policy(path)
    with pytest.raises(PolicyError, match="cannot read the sidecar policy"):
        load_policy(tmp_path / "missing.json")
    with pytest.raises(PolicyError, match="must be a JSON object|valid dictionary|Input should be"):
        parse_policy_text("[1]")


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    doc = base()
    path = tmp_path / POLICY_FILE
    path.write_text(json.dumps(doc, indent=2))
    assert load_policy(path).model_dump(mode="json") == parse_policy(doc).model_dump(mode="json")


# ------------------------------------------------------------------------------------------------
# layering


PROJECT = project_modules("tritongen", "sidecar")


def test_the_sidecar_never_imports_the_cli() -> None:
    assert not [m for m in import_closure(["sidecar.run"], PROJECT).ours if m.startswith("tritongen.cli")]


def test_the_admission_state_is_pure() -> None:
    """Read from the source (tests/import_closure.py): what a library imports on its own
    (typing_extensions 4.15 imports asyncio) is the library's, not ours, and is not followed."""
    closure = import_closure(["sidecar.admission", "sidecar.cost", "sidecar.protocol"], PROJECT)
    assert not {"asyncio", "aiohttp", "grpc", "httpx", "prometheus_client"} & closure.outside


def test_the_policy_builder_is_core() -> None:
    closure = import_closure(["tritongen.core.sidecar_policy.build", "tritongen.core.sidecar_policy.schema"], PROJECT)
    assert not [m for m in closure.ours if m.split(".")[0] == "sidecar" or m.startswith("tritongen.cli")]
    assert not {"aiohttp", "grpc", "httpx", "jinja2"} & closure.outside


# ------------------------------------------------------------------------------------------------
# the command line


def test_cli_refuses_a_bad_policy_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    doc = base()
    doc["concurrency"]["min"] = 0
    bad.write_text(json.dumps(doc))
    result = run_cli("sidecar", "--policy", str(bad), "--url", "127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert "problem in the sidecar policy" in result.stderr and "concurrency.min" in result.stderr
    assert "Traceback" not in result.stderr

    good = tmp_path / "good.json"
    good.write_text(json.dumps(base()))
    short = tmp_path / "token"
    short.write_text("abc")
    result = run_cli("sidecar", "--policy", str(good), "--url", "127.0.0.1:1", "--token-file", str(short))
    assert result.returncode == 2 and "at least 16 characters" in result.stderr
    result = run_cli("sidecar", "--policy", str(good), "--url", "127.0.0.1:1", "--listen", "127.0.0.1:http")
    assert result.returncode == 2 and "--listen" in result.stderr
    result = run_cli("sidecar", "--url", "127.0.0.1:1")
    assert result.returncode == 2 and "--policy" in result.stderr


def test_the_sidecar_refuses_to_start_on_a_policy_nothing_could_pass(tmp_path: Path) -> None:
    doc = base()
    doc["headroom"]["safety_pad_bytes"] = doc["devices"][0]["memory_bytes"] * 2
    path = tmp_path / POLICY_FILE
    path.write_text(json.dumps(doc))
    result = run_cli("sidecar", "--policy", str(path), "--url", "127.0.0.1:1")
    message = result.stdout + result.stderr
    assert result.returncode == 2 and "no request could ever be admitted" in message and "Traceback" not in message
