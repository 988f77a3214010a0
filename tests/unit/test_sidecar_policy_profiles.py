"""The sidecar policy from profiles alone (issue 43: a server the user runs, profiled without a spec):
each model's limits from what its profile measured, every assumed value named in the notes, the
result valid as the sidecar reads it, and a profile that cannot give its model's policy refused
with its file, what is missing and the fix. The CLI path (`render --profiles DIR -o OUT`, no SPEC)
runs in process. The policy from a spec: test_sidecar_policy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import Action, Request
from sidecar.cost import LLMFacts, cost_for
from tests.helpers import EXAMPLE_PROFILES, EXAMPLES, run_cli
from tests.sidecar_rigs import FakeClock
from tritongen.core.engine_sources import VLLM_DEFAULT_MAX_NUM_SEQS
from tritongen.core.file_names import POLICY_FILE
from tritongen.core.llm_interface import LLMInterface, TensorInfo, detect_interface
from tritongen.core.profile_types import DecodeSample, Profile, UnaryLLMMeasurement, read_profile
from tritongen.core.sidecar_policy.from_profiles import (
    ASSUMED_TARGET_FACTOR,
    UNBOUND_DEVICE_BYTES,
    UNKNOWN_CONTEXT,
    NoPolicyFromProfile,
    interface_inputs,
    policy_from_profiles,
)
from tritongen.core.sidecar_policy.schema import parse_policy, parse_policy_text
from tritongen.errors import BadInput


def example(name: str) -> Profile:
    return read_profile((EXAMPLE_PROFILES / f"{name}.json").read_text())


def with_engine(profile: Profile, **changes: Any) -> Profile:
    assert profile.engine is not None
    return profile.model_copy(update={"engine": profile.engine.model_copy(update=changes)})


def build(*profiles: Profile, p99_ms: float | None = None) -> dict[str, Any]:
    """The policy of these profiles, checked as the sidecar checks it at start."""
    doc = policy_from_profiles({p.model: p for p in profiles}, {p.model: f"profiles/{p.model}.json" for p in profiles},
                               p99_ms)
    parse_policy(doc, "the policy from profiles")
    json.dumps(doc)
    return doc


def model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["name"] == name)


def notes_of(doc: dict[str, Any], name: str) -> str:
    return " | ".join(n for n in doc["notes"] if n.startswith(f"{name}:"))


# ------------------------------------------------------------------------------------------------
# streaming LLMs


def test_a_streaming_llm_whose_probe_saw_reserve_wait_reserves_against_its_measured_pool() -> None:
    profile = with_engine(example("tinyllm"), kv_policy_seen="reserve_wait",
                          kv_policy_evidence="streams past the pool waited and then ran")
    doc = build(profile)
    llm = model(doc, "tinyllm")
    kv = llm["kv"]
    assert (llm["kind"], llm["streaming"], llm["engines"]) == ("llm", True, 1)
    assert kv["kv_policy"] == "reserve_wait"
    assert kv["block_tokens"] == 16 and kv["max_context"] == 6848  # 428 blocks x 16, as the engine's metrics said
    # measured KV bytes per token: priced in bytes, the quota is the pool in bytes
    assert kv["bytes_per_token"] == 514.94 and kv["bytes_per_token_source"] == "profile"
    assert kv["engine_pool_bytes"] == llm["memory_quota_bytes"] == 3526310  # ceil(6848 x 514.94)
    assert [p["prompt_tokens"] for p in kv["prefill_peak"]] == [16, 32, 64, 128, 255]
    assert (kv["prompt_input"], kv["max_tokens_input"]) == ("text_input", "max_tokens")
    assert kv["default_max_tokens"] is None  # a generic backend's default is not in the profile: up to max_context
    assert llm["max_inflight"] is None  # no sequence limit seen: the reserved pool bounds it
    said = notes_of(doc, "tinyllm")
    assert "seen by the capacity probe (streams past the pool waited and then ran)" in said
    assert "assumed: max_context 6848 tokens" in said


def unknown_engine() -> Profile:
    """vllm_standin as an engine that exports no metrics of a known engine: its kv_policy unseen."""
    return with_engine(example("vllm_standin"), engine_metrics=[])


def test_an_engine_that_exports_vllms_metrics_is_taken_for_vllm_which_preempts() -> None:
    doc = build(example("vllm_standin"))  # its profile read vllm:* families
    llm = model(doc, "vllm_standin")
    assert llm["kv"]["kv_policy"] == "grow_preempt" and llm["memory_quota_bytes"] is None  # nothing reserved
    assert "exports vLLM's metrics" in notes_of(doc, "vllm_standin")


def test_vllm_profiled_without_its_pool_is_followed_not_refused() -> None:
    """Triton's upstream vLLM backend reports no pool, so a profile without --kv-capacity-probe has
    none (found running the CLI on the real engine through --url): an engine that queues needs no
    pool reserved, so its policy is made, with the context unknown (the sidecar refuses nothing as
    too long: the engine's own error does) and the following started at vLLM's default limit."""
    doc = build(with_engine(example("vllm_standin"), kv_capacity_tokens=None, kv_capacity_source=None))
    llm = model(doc, "vllm_standin")
    kv = llm["kv"]
    assert kv["kv_policy"] == "grow_preempt" and llm["memory_quota_bytes"] is None
    assert kv["max_context"] == UNKNOWN_CONTEXT and kv["engine_pool_bytes"] is None
    assert llm["max_inflight"] == VLLM_DEFAULT_MAX_NUM_SEQS
    said = notes_of(doc, "vllm_standin")
    assert "pool unknown" in said and "vLLM's default max_num_seqs" in said
    policy = parse_policy(doc).models[0]
    assert policy.kv is not None
    assert cost_for(policy, LLMFacts(prompt_bytes=[40], max_tokens=[100_000])).never is None


def test_a_streaming_llm_whose_kv_policy_was_not_seen_is_reserved_and_priced_in_tokens() -> None:
    doc = build(unknown_engine())
    llm = model(doc, "vllm_standin")
    kv = llm["kv"]
    assert kv["kv_policy"] is None  # the sidecar reserves: the safe side
    assert parse_policy(doc).models[0].kv.reserves  # type: ignore[union-attr]
    # no KV bytes per token measured: the pool, the quota and each request in tokens
    assert (kv["bytes_per_token"], kv["bytes_per_token_source"]) == (1.0, "tokens")
    assert kv["engine_pool_bytes"] == llm["memory_quota_bytes"] == kv["max_context"] == 2688
    assert kv["default_max_tokens"] == 16  # the vLLM backend's own default
    assert kv["prompt_bytes_per_token"] == 4.0  # the backend's token counts the profile saw
    said = notes_of(doc, "vllm_standin")
    assert "priced in tokens" in said and "not seen" in said and "reserved, the safe side" in said


def test_an_engine_that_queues_starts_at_its_seen_sequence_limit_else_at_its_pools_blocks() -> None:
    queueing = with_engine(example("vllm_standin"), kv_policy_seen="grow_preempt", kv_policy_evidence="it preempted")
    doc = build(queueing)
    llm = model(doc, "vllm_standin")
    assert llm["memory_quota_bytes"] is None  # nothing reserved for an engine that preempts
    assert llm["max_inflight"] == 2688 // 16  # no limit seen: the pool's blocks, where the sidecar's law starts
    assert "assumed: the pool's blocks" in notes_of(doc, "vllm_standin")
    assert queueing.engine is not None
    decode = [DecodeSample(concurrency=64, requests=10, mean_gap_ms=9.0, step_ms=8.0, running_seen=32.0),
              *queueing.engine.decode]
    seen = build(with_engine(queueing, decode=decode))
    assert model(seen, "vllm_standin")["max_inflight"] == 32
    assert seen["concurrency"]["max"] == 32  # the adaptive limit counts what the LLMs run


def test_the_profiles_interface_line_names_the_inputs_the_sidecar_reads() -> None:
    """interface_inputs reads LLMInterface.describe's line back: every form it writes."""
    vllm = detect_interface(model="m", backend="vllm", platform=None, inputs=[], outputs=[], max_batch_size=0,
                            decoupled=True)
    generic = detect_interface(
        model="m", backend="python", platform=None, max_batch_size=0, decoupled=False,
        inputs=[TensorInfo(name="prompt", data_type="STRING", dims=[1]),
                TensorInfo(name="max_new_tokens", data_type="INT32", dims=[1], optional=True)],
        outputs=[TensorInfo(name="text", data_type="STRING", dims=[-1])],
    )
    in_parameters = detect_interface(
        model="m", backend="python", platform=None, max_batch_size=0, decoupled=True,
        inputs=[TensorInfo(name="text", data_type="STRING", dims=[1])],
        outputs=[TensorInfo(name="out", data_type="STRING", dims=[-1])],
    )
    cases: list[tuple[LLMInterface, tuple[str, str]]] = [
        (vllm, ("text_input", "max_tokens")), (generic, ("prompt", "max_new_tokens")), (in_parameters, ("text", "max_tokens")),
    ]
    for interface, expected in cases:
        assert interface_inputs(interface.describe()) == expected, interface.describe()
    assert interface_inputs("something else") is None
    assert build(example("vllm_standin"))["models"][0]["kv"]["default_max_tokens"] == 16  # by vllm's describe() label
    assert vllm.describe().startswith("vLLM backend")


# ------------------------------------------------------------------------------------------------
# classic models and LLMs that are not decoupled


def test_a_classic_model_is_held_at_the_knee_of_its_load_curve() -> None:
    doc = build(example("ranker"))
    ranker = model(doc, "ranker")
    assert (ranker["kind"], ranker["streaming"], ranker["max_inflight"], ranker["request_bytes"]) == ("classic", False, 16, 0)
    assert "kv" not in ranker
    assert "knee of its load curve" in notes_of(doc, "ranker")
    no_knee = example("ranker").model_copy(update={"knee": None})
    assert model(build(no_knee), "ranker")["max_inflight"] is None


def test_an_llm_that_is_not_decoupled_reserves_against_its_static_batch_probe() -> None:
    llm = UnaryLLMMeasurement(
        interface="generic (text_input, no stream input, parameters.max_tokens; not decoupled: one response per request)",
        budget_honoured=True, probe_prompt_tokens=32, probe_max_tokens=32,
        batch_fits=[(1, True), (2, True), (4, True), (5, True), (6, False)],
        largest_batch_that_fits=5, smallest_batch_that_fails=6, kv_capacity_tokens=320,
    )
    profile = example("ranker").model_copy(update={"model": "oneshot", "llm": llm, "knee": None})
    doc = build(profile)
    entry = model(doc, "oneshot")
    assert (entry["kind"], entry["streaming"], entry["max_inflight"]) == ("llm", False, 5)
    kv = entry["kv"]
    assert (kv["max_context"], kv["block_tokens"], kv["kv_policy"]) == (320, 1, None)
    assert entry["memory_quota_bytes"] == kv["engine_pool_bytes"] == 320
    assert (kv["prompt_input"], kv["max_tokens_input"]) == ("text_input", "max_tokens")
    assert "prompt_token_ids" not in kv


def test_an_llm_of_token_ids_that_is_not_decoupled_has_its_ids_counted() -> None:
    """Read as text, a batched model's [1, 6] ids were priced as six prompts of 3 bytes (2026-12-07)."""
    llm = UnaryLLMMeasurement(
        interface="token ids (input_ids, no stream input, max_new_tokens; not decoupled: one response per request)",
        interface_kind="token_ids", budget_honoured=True, probe_prompt_tokens=32, probe_max_tokens=32,
        batch_fits=[(1, True), (2, True), (4, True)], largest_batch_that_fits=4, kv_capacity_tokens=256,
    )
    profile = example("ranker").model_copy(update={"model": "idshot", "llm": llm, "knee": None})
    kv = model(build(profile), "idshot")["kv"]
    assert kv["prompt_token_ids"] is True
    assert (kv["prompt_input"], kv["max_tokens_input"]) == ("input_ids", "max_new_tokens")


# ------------------------------------------------------------------------------------------------
# the class, the device, the document


def test_the_class_target_is_stated_or_assumed_from_the_slowest_model_at_low_load() -> None:
    profiles = (example("tinyllm"), example("ranker"))
    assumed = build(*profiles)
    (klass,) = assumed["classes"]
    # ranker's P99 at its lowest level (18.6 ms) is above tinyllm's time to first token (9.2 ms)
    slowest = min(example("ranker").load_levels, key=lambda lv: lv.concurrency).p99_ms
    assert slowest is not None and klass["p99_ms"] == -(-ASSUMED_TARGET_FACTOR * slowest // 1)
    assert assumed["default_class"] == klass["name"] and klass["budget_fraction"] == 1.0
    assert klass["max_queue_wait_ms"] == klass["p99_ms"]
    assert any("assumed: P99 target" in n and "--p99-ms" in n for n in assumed["notes"])
    stated = build(*profiles, p99_ms=500)
    assert stated["classes"][0]["p99_ms"] == 500
    assert stated["concurrency"]["queue_delay_high_ms"] == 125.0
    assert not any("assumed: P99" in n for n in stated["notes"])


def test_the_device_is_the_host_or_gpu0_and_its_static_figure_never_binds() -> None:
    doc = build(example("tinyllm"))
    (device,) = doc["devices"]
    assert device["id"] == "cpu" and device["memory_bytes"] == UNBOUND_DEVICE_BYTES
    assert device["static_used_bytes"] == example("tinyllm").memory.base_bytes  # type: ignore[union-attr]
    assert doc["headroom"]["sources"] == ["triton_metrics", "static"]
    assert doc["headroom"]["safety_pad_bytes"] == int(3.12 * 2**20)  # the profile's measured prefill pad
    on_gpu = example("tinyllm")
    assert on_gpu.memory is not None
    on_gpu = on_gpu.model_copy(update={"memory": on_gpu.memory.model_copy(update={"probe": "nvml"})})
    gpu = build(on_gpu)
    assert gpu["devices"][0]["id"] == "gpu0" and gpu["models"][0]["devices"] == ["gpu0"]
    assert gpu["headroom"]["sources"] == ["nvml", "triton_metrics", "static"]
    assert any("1 EiB" in n and "assumed" in n for n in gpu["notes"])


def test_every_example_profile_that_measured_its_pool_makes_one_valid_policy() -> None:
    doc = build(example("tinyllm"), example("vllm_standin"), example("ranker"))
    assert [m["name"] for m in doc["models"]] == ["ranker", "tinyllm", "vllm_standin"]
    assert doc["deployment"].startswith("triton at ")
    # the adaptive limit over LLM requests: both pools' blocks (no sequence limit was seen)
    assert doc["concurrency"]["max"] == 6848 // 16 + 2688 // 16


def test_the_sidecar_admits_against_a_pool_priced_in_tokens() -> None:
    """The policy as the sidecar runs it: a request's prompt and max_tokens in tokens, in whole
    blocks, reserved against the pool the profile measured; the request that finds it full waits."""
    policy = parse_policy(build(unknown_engine()))
    (llm,) = policy.models
    assert llm.kv is not None
    cost = cost_for(llm, LLMFacts(prompt_bytes=[400], max_tokens=[16]))  # 100 tokens at 4 bytes/token, + 16
    assert cost.kv_bytes == 128 and cost.never is None  # 116 tokens in whole blocks of 16
    state = AdmissionState(policy, FakeClock())
    admitted = [state.submit(Request(f"r{i}", "vllm_standin", "default", cost, "default")) for i in range(2688 // 128)]
    assert all(d.admitted for d in admitted)  # 21 x 128 = 2688 tokens: the whole pool
    waits = state.submit(Request("one-more", "vllm_standin", "default", cost, "default"))
    assert waits.action is Action.QUEUE and waits.limit == "model_memory_quota:vllm_standin"
    whole = cost_for(llm, LLMFacts(prompt_bytes=[4], max_tokens=[2688]))
    assert whole.never is not None  # asks for more than the pool (the context it bounds) holds


# ------------------------------------------------------------------------------------------------
# refusals


def test_a_partial_profile_is_refused_naming_its_file_what_is_missing_and_the_fix() -> None:
    partial = example("tinyllm").model_copy(update={"complete": False, "error": "the server went away"})
    with pytest.raises(NoPolicyFromProfile) as err:
        build(partial)
    text = str(err.value)
    assert isinstance(err.value, BadInput) and err.value.exit_code == 2
    assert text.startswith("profiles/tinyllm.json: the profile of 'tinyllm' is partial")
    assert "the server went away" in text
    assert f"tritongen profile --model tinyllm --url {partial.server_url.removeprefix('http://')} -o profiles" in text
    assert "tritongen render SPEC --profiles profiles -o OUT" in text and "\n" not in text


def test_a_streaming_profile_without_an_engine_section_or_a_pool_is_refused() -> None:
    no_engine = example("tinyllm").model_copy(update={"engine": None})
    with pytest.raises(NoPolicyFromProfile, match=r"^profiles/tinyllm.json: .* has no engine section"):
        build(no_engine)
    no_pool = example("reserve_llm")  # profiled before the capacity probe: no KV pool size
    with pytest.raises(NoPolicyFromProfile) as err:
        build(no_pool, example("ranker"))
    assert "profiles/reserve_llm.json: the profile of 'reserve_llm' has no KV pool size" in str(err.value)
    assert "--kv-capacity-probe" in str(err.value) and "engine.kv_pool_tokens" in str(err.value)


def test_no_latency_measured_and_no_target_stated_is_refused() -> None:
    ranker = example("ranker").model_copy(update={"load_levels": []})
    with pytest.raises(NoPolicyFromProfile, match="--p99-ms"):
        build(ranker)
    assert build(ranker, p99_ms=100)["classes"][0]["p99_ms"] == 100


# ------------------------------------------------------------------------------------------------
# the CLI: `tritongen render --profiles DIR -o OUT`, no SPEC


def profiles_dir(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.json").write_text((EXAMPLE_PROFILES / f"{name}.json").read_text())
    return folder


def test_render_without_a_spec_writes_only_the_policy(tmp_path: Path) -> None:
    folder = profiles_dir(tmp_path, "tinyllm", "ranker")
    out = tmp_path / "repo"
    result = run_cli("render", "--profiles", str(folder), "-o", str(out), "--p99-ms", "300")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == [POLICY_FILE]  # no config.pbtxt: the server's are its own
    policy = parse_policy_text((out / POLICY_FILE).read_text())
    assert [m.name for m in policy.models] == ["ranker", "tinyllm"] and policy.classes[0].p99_ms == 300
    assert "1 file(s) written: sidecar_policy.json" in result.stdout
    assert "tinyllm" in result.stdout and "P99 target 300 ms" in result.stdout
    again = run_cli("render", "--profiles", str(folder), "-o", str(out), "--p99-ms", "300")
    assert "0 file(s) written (already up to date)" in again.stdout
    checked = run_cli("render", "--profiles", str(folder), "-o", str(out), "--p99-ms", "300", "--check")
    assert checked.returncode == 0 and "no drift" in checked.stdout
    drifted = run_cli("render", "--profiles", str(folder), "-o", str(out), "--p99-ms", "400", "--check")
    assert drifted.returncode == 1 and '"p99_ms": 400.0' in drifted.stdout


def test_render_without_a_spec_says_what_it_assumed(tmp_path: Path) -> None:
    folder = profiles_dir(tmp_path, "vllm_standin")
    result = run_cli("render", "--profiles", str(folder), "-o", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "assumed: P99 target" in result.stdout and "priced in tokens" in result.stdout


def one_line_error(result: Any) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_render_without_a_spec_refuses_a_partial_profile_and_leaves_the_policy_in_place(tmp_path: Path) -> None:
    folder = profiles_dir(tmp_path, "tinyllm", "reserve_llm")
    out = tmp_path / "repo"
    out.mkdir()
    (out / POLICY_FILE).write_text("the policy in force\n")
    line = one_line_error(run_cli("render", "--profiles", str(folder), "-o", str(out)))
    assert f"{folder / 'reserve_llm.json'}: the profile of 'reserve_llm' has no KV pool size" in line
    assert (out / POLICY_FILE).read_text() == "the policy in force\n"
    assert sorted(p.name for p in out.iterdir()) == [POLICY_FILE]  # nothing staged is left behind


def test_render_without_a_spec_refuses_what_only_a_spec_can_use(tmp_path: Path) -> None:
    folder = profiles_dir(tmp_path, "tinyllm")
    out = str(tmp_path / "repo")
    assert "give a SPEC" in one_line_error(run_cli("render", "-o", out))
    assert "--templates shapes config.pbtxt" in one_line_error(
        run_cli("render", "--profiles", str(folder), "-o", out, "--templates", str(tmp_path)))
    assert "--triton-release shapes config.pbtxt" in one_line_error(
        run_cli("render", "--profiles", str(folder), "-o", out, "--triton-release", "25.12"))
    assert "--p99-ms 0" in one_line_error(run_cli("render", "--profiles", str(folder), "-o", out, "--p99-ms", "0"))
    with_spec = run_cli("render", str(EXAMPLES / "deployment.yaml"), "-o", out, "--p99-ms", "100")
    assert "traffic_classes" in one_line_error(with_spec)
    assert not (tmp_path / "repo").exists()
