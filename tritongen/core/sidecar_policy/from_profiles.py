"""The sidecar's policy from profiles alone, for a server the user already runs and has no spec for
(issue 43: `tritongen render --profiles DIR -o OUT`, no SPEC). Pure: profiles in, document out.

`build.py` beside this derives the policy from a spec, its plan and profiles. Without a spec there
is no plan, no traffic and no device list, so every number here is either what a profile measured
or an assumption that the policy's `notes` names as one:

* A streaming LLM: its KV pool in tokens as the profile measured it (the engine's metrics, its
  files or the capacity probe), the block size seen, the KV policy the probe saw (None where it did
  not run: the sidecar then reserves each request's footprint, the safe side), the engine's
  sequence limit where the profile saw it bind. Priced in bytes where the profile measured KV bytes
  per token, else in tokens (bytes_per_token 1: the pool and each request in tokens, which is
  exact for the model's own pool; only a model's own `_kv_bytes_per_token` gauge reads in bytes).
  The context is unknown to a profile: the pool bounds it (no sequence longer than the pool runs).
* A non-decoupled LLM: the static-batch probe's tokens (largest batch that ran whole x its tokens)
  are its pool, reserved per request; its largest whole batch is its in-flight limit.
* A classic model: the concurrency at the knee of its load curve, where P99 began to grow faster
  than throughput; its request's memory is not known (0: memory does not bind it).
* One class, `default`, with a P99 target the user states (`--p99-ms`) or, assumed, five times the
  slowest model's P99 (streams: time to first token) at the lowest load it was profiled at.
* One device: GPU 0 where the profiles measured memory through NVML, else the host; its size is not
  in a profile, so its static figure never binds (UNBOUND_DEVICE_BYTES) and live readings (NVML,
  Triton's metrics) decide.

A streaming LLM whose engine queues (grow_preempt: vLLM, read from its metrics) needs no pool: nothing
is reserved for it, the sidecar follows the engine's queue from its sequence limit (seen, else vLLM's
default max_num_seqs) down, and an unknown context is taken as UNKNOWN_CONTEXT (the engine's own
error answers what it cannot hold). Upstream's vLLM backend reports no pool, so this is the policy a
user of it gets without `--kv-capacity-probe`.

A profile that cannot give what its model needs (partial, a streaming LLM without an engine
section, or without a measured pool where the engine reserves) refuses the whole policy with one
message per model: its profile file, what is missing, and the fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from tritongen.core.engine_sources import VLLM_DEFAULT_MAX_NUM_SEQS, VLLM_KV_POLICY, VLLM_KV_POLICY_WHY
from tritongen.core.engine_window import metric_family
from tritongen.core.llm_interface import VLLM_DEFAULT_MAX_TOKENS
from tritongen.core.profile_types import EngineMeasurement, Profile
from tritongen.core.sidecar_policy.build import (
    LIMITS,
    TENANT_HEADER,
    concurrency_section,
    headroom_section,
    prefill_points,
    release_grace_ms,
)
from tritongen.core.sidecar_policy.schema import POLICY_VERSION
from tritongen.core.spec import MIB, Policy
from tritongen.errors import BadInput

VLLM_LABEL = "vLLM backend"  # LLMInterface.label of the vLLM backend's interface, which describe() starts with
CLASS = "default"  # the one class: what requests that name none get, which is every request here
ASSUMED_TARGET_FACTOR = 5.0
"""The assumed target is this many times the slowest model's P99 at low load: the sidecar lets a
request wait for its target less the model's own time, so a request may wait about four of its own
unloaded times before it is refused, instead of being refused as soon as anything is ahead of it."""
UNKNOWN_CONTEXT = 2**31 - 1
"""The context of a model whose profile measured neither its pool nor its context (an engine that
queues, profiled without the capacity probe): larger than any model's, so the sidecar refuses no
request as too long and the engine's own error says what it cannot hold."""
UNBOUND_DEVICE_BYTES = 2**60
"""A device of 1 EiB: more than any device holds, so its static fallback never refuses a request.
No profile records a device's size; the live readings (NVML, Triton's metrics) replace the static
figure wherever they answer."""

# LLMInterface.describe: 'LABEL (TEXT_INPUT, STREAM_INPUT | no stream input, WHERE[; not decoupled...])'
# where WHERE is max_tokens' input, or 'TENSOR.max_tokens' / 'parameters.max_tokens' (in a JSON
# tensor or the request's parameters, which the sidecar reads without a name).
_DESCRIBED = re.compile(r"\((?P<text>[^,()]+), (?P<stream>[^,()]+), (?P<where>[^;()]+)(?:;[^()]*)?\)\s*$")


class NoPolicyFromProfile(BadInput):
    """A profile that cannot give its model's policy; the message names the file, what is missing
    and the fix (exit 2)."""


def interface_inputs(described: str) -> tuple[str, str] | None:
    """(prompt input, max_tokens input) from a profile's `interface` (LLMInterface.describe's
    line), or None where the line is not in that form. A budget that travels in a JSON tensor or
    in the request's parameters keeps the policy's default name, since the sidecar reads those
    places by their own names."""
    found = _DESCRIBED.search(described)
    if found is None:
        return None
    where = found["where"].strip()
    return found["text"].strip(), ("max_tokens" if "." in where else where)


def _file(files: Mapping[str, str], model: str) -> str:
    return files.get(model, f"the profile of {model!r}")


def _again(profile: Profile, files: Mapping[str, str], extra: str = "") -> str:
    """The fix: profile the model again (the command, with the server and folder it came from), or
    render from a spec, where the spec states what no profile showed."""
    folder = str(PurePath(files[profile.model]).parent) if profile.model in files else "DIR"
    return (f"profile it again (`tritongen profile --model {profile.model} --url {_address(profile)}{extra} "
            f"-o {folder}`), or render from a spec (`tritongen render SPEC --profiles {folder} -o OUT`)")


def _address(profile: Profile) -> str:
    """The server the profile measured, as --url takes it (HOST:PORT)."""
    return profile.server_url.removeprefix("http://")


def _refusal(profile: Profile, files: Mapping[str, str]) -> str | None:
    """Why this profile cannot give its model's policy (None: it can)."""
    where, name = _file(files, profile.model), profile.model
    if not profile.complete:
        reason = profile.error or "no reason recorded"
        return f"{where}: the profile of {name!r} is partial (the run stopped early: {reason}); {_again(profile, files)}"
    if profile.kind == "streaming" and profile.engine is None:
        return (f"{where}: the profile of streaming model {name!r} has no engine section (its KV pool, block size "
                f"and KV policy); {_again(profile, files)}")
    engine = profile.engine
    stated = profile.stated_engine.section if profile.stated_engine is not None else None
    if (engine is not None and not engine.kv_capacity_tokens and not (stated and stated.kv_pool_tokens)
            and _kv_policy(profile)[0] != "grow_preempt"):  # an engine that queues is followed, not reserved
        seen = next((g.unseen for g in profile.gaps if g.measurement == "kv capacity"), "not measured")
        return (f"{where}: the profile of {name!r} has no KV pool size ({seen}); "
                f"{_again(profile, files, ' --kv-capacity-probe')} that states engine.kv_pool_tokens")
    if profile.llm is not None and not profile.llm.kv_capacity_tokens:
        return (f"{where}: the profile of {name!r} has no KV capacity (no batch of its static-batch probe ran "
                f"whole); {_again(profile, files)} that states the model's engine.kv_pool_tokens")
    return None


def _kv(profile: Profile, pool_tokens: int | None, block: int, policy: str | None,
        interface: str | None, notes: list[str]) -> dict[str, Any]:
    """The cost model of an LLM from its profile: measured bytes per token, else priced in tokens.
    Without a pool (only for an engine that queues, `_refusal`) the context is unknown too, so it is
    taken as UNKNOWN_CONTEXT: the sidecar then never refuses a request as too long, and a request
    past the engine's real context gets the engine's own error, verbatim."""
    memory = profile.memory
    measured = memory.kv_bytes_per_token_measured if memory is not None else None
    bpt = float(measured) if measured else 1.0
    pool = pool_tokens // block * block if pool_tokens else None
    inputs = interface_inputs(interface) if interface else None
    engine = profile.engine
    prompt_bpt = (float(engine.bytes_per_token) if engine is not None
                  and engine.bytes_per_token_source == "backend token counts" else 1.0)
    prefill = prefill_points(profile)
    if inputs is None:
        notes.append(f"{profile.model}: assumed: the prompt in input 'text_input' and max_tokens in 'max_tokens' "
                     f"(the profile's interface {interface!r} does not name them); a request whose prompt is not "
                     "there is charged the whole context")
    priced = (f"bytes ({measured:g} KV bytes/token measured)" if measured else "tokens (bytes_per_token 1: the "
              "profile measured no KV bytes per token, so the pool, the quota and each request are counted in tokens)")
    counted = "the backend's token counts" if prompt_bpt != 1.0 else "the bound that never under-counts"
    context = (f"max_context {pool} tokens, the pool (a profile does not see the context; no longer sequence runs)"
               if pool else f"max_context {UNKNOWN_CONTEXT} tokens (unknown: neither context nor pool measured; the "
               "engine refuses what it cannot hold, with its own error)")
    notes.append(f"{profile.model}: priced in {priced}; assumed: {context}; prompts at {prompt_bpt:g} bytes/token ({counted}); "
                 f"prefill peaks: {len(prefill) or 'none'}")
    return {
        "bytes_per_token": bpt,
        "bytes_per_token_source": "profile" if measured else "tokens",
        "block_tokens": block,
        "max_context": pool or UNKNOWN_CONTEXT,
        "kv_policy": policy,
        "engine_pool_bytes": math.ceil(pool * bpt) if pool else None,
        # What the backend generates when a request names no max_tokens: vLLM's default, else unknown
        # (the sidecar then charges up to max_context).
        "default_max_tokens": VLLM_DEFAULT_MAX_TOKENS if (interface or "").startswith(VLLM_LABEL) else None,
        "prompt_bytes_per_token": prompt_bpt,
        "tokenizer": None,
        "prompt_input": inputs[0] if inputs else "text_input",
        # a model the profile fed token ids (only then written): the sidecar counts each prompt's ids, exactly
        **({"prompt_token_ids": True} if _speaks_token_ids(profile) else {}),
        "max_tokens_input": inputs[1] if inputs else "max_tokens",
        "preallocated": True,
        "prefill_peak": prefill,
        "prefill_peak_source": "profile" if prefill else "none",
        # the profile's probe saw a repeated prompt served from a cache (engine_sources reads it alike)
        **({"prefix_caching": True} if engine is not None and engine.prefix_cache is not None
           and engine.prefix_cache.caches else {}),
    }


def _speaks_token_ids(profile: Profile) -> bool:
    """Whether the profile fed the model token ids, decoupled (its engine section) or not (its llm
    section): read as text, a prompt of ids would be priced as one prompt per id (a batched model's
    [1, 6] ids as six 3-byte prompts, 2026-12-07)."""
    measured = profile.engine if profile.engine is not None else profile.llm
    return measured is not None and measured.interface_kind == "token_ids"


def _sequence_limit(engine: EngineMeasurement, stated: int | None) -> tuple[int | None, str]:
    """The sequences the engine runs at once: stated by the spec the profile carried, else where a
    decode level saw fewer run than its streams (the engine's limit, `DecodeSample.running_seen`)."""
    if stated:
        return stated, "the spec the profile carried"
    seen = [int(d.running_seen) for d in engine.decode if d.running_seen]
    return (max(seen), "the profile's decode levels (fewer ran than were sent)") if seen else (None, "")


def _kv_policy(profile: Profile) -> tuple[str | None, bool]:
    """(the engine's KV policy, whether it was taken from vLLM's metrics): stated by the spec the
    profile carried, else seen by the capacity probe, else vLLM's own where the profile read vLLM's
    metrics (its pool then came from them, so the probe did not run); None: not known."""
    engine = profile.engine
    assert engine is not None
    stated = profile.stated_engine.section if profile.stated_engine is not None else None
    policy = (stated.kv_policy if stated else None) or engine.kv_policy_seen
    vllm = policy is None and any(metric_family(name) == "vllm" for name in engine.engine_metrics)
    return (VLLM_KV_POLICY if vllm else policy), vllm


def _streaming(profile: Profile, device: str, notes: list[str]) -> dict[str, Any]:
    engine = profile.engine
    assert engine is not None
    stated = profile.stated_engine.section if profile.stated_engine is not None else None
    policy, vllm = _kv_policy(profile)
    block = engine.kv_block_tokens or (stated.kv_block_tokens if stated else None) or 1
    pool_tokens = engine.kv_capacity_tokens or (stated.kv_pool_tokens if stated else None)
    kv = _kv(profile, pool_tokens, block, policy, engine.interface, notes)
    seqs, seqs_from = _sequence_limit(engine, stated.max_num_seqs if stated else None)
    reserves = policy != "grow_preempt"
    if seqs is None and not reserves and pool_tokens:
        # An engine that queues is followed by the sidecar from its limit down; no engine runs more
        # sequences than its pool has blocks, so that bound is where the following starts.
        seqs, seqs_from = max(1, pool_tokens // block), "assumed: the pool's blocks (every sequence holds one at least)"
    elif seqs is None and not reserves:
        seqs, seqs_from = VLLM_DEFAULT_MAX_NUM_SEQS, ("assumed: vLLM's default max_num_seqs (no pool and no sequence "
                                                      "limit seen); the sidecar follows the engine's queue down from it")
    if stated and stated.kv_policy:
        policy_from = "stated by the spec the profile carried"
    elif vllm:
        policy_from = f"the engine exports vLLM's metrics: {VLLM_KV_POLICY_WHY}"
    elif policy:
        policy_from = f"seen by the capacity probe ({engine.kv_policy_evidence})"
    else:
        policy_from = ("not seen (the capacity probe did not run or could not tell): each request's footprint is "
                       "reserved, the safe side; a spec's engine.kv_policy states it")
    block_from = "" if engine.kv_block_tokens or (stated and stated.kv_block_tokens) else " (assumed: no block size seen)"
    limit = f"{seqs} ({seqs_from})" if seqs else "none (no sequence limit seen; the reserved pool bounds it)"
    pool = (f"pool {pool_tokens} tokens ({engine.kv_capacity_source or 'the spec the profile carried'})" if pool_tokens
            else "pool unknown (not measured: an engine that queues needs none reserved; --kv-capacity-probe measures it)")
    notes.append(f"{profile.model}: {pool} "
                 f"in blocks of {block}{block_from}; kv_policy {policy or 'unknown'}: {policy_from}; max_inflight {limit}")
    return {
        "name": profile.model, "kind": "llm", "streaming": True, "devices": [device], "engines": 1,
        "classes": None, "priority_levels": 0, "default_priority": 0, "kv": kv,
        "memory_quota_bytes": kv["engine_pool_bytes"] if reserves else None,
        "max_inflight": seqs, "release_grace_ms": release_grace_ms(profile),
    }


def _unary_llm(profile: Profile, device: str, notes: list[str]) -> dict[str, Any]:
    llm = profile.llm
    assert llm is not None and llm.kv_capacity_tokens
    kv = _kv(profile, llm.kv_capacity_tokens, 1, None, llm.interface, notes)
    bound = "" if llm.smallest_batch_that_fails else ", a lower bound: no batch ran out of memory"
    notes.append(f"{profile.model}: not decoupled; pool {llm.kv_capacity_tokens} tokens (the static-batch probe: "
                 f"{llm.largest_batch_that_fits} requests of {llm.probe_prompt_tokens} + {llm.probe_max_tokens} tokens "
                 f"ran whole{bound}), each request's footprint reserved (kv_policy unknown); max_inflight "
                 f"{llm.largest_batch_that_fits} (the largest batch that ran whole)")
    return {
        "name": profile.model, "kind": "llm", "streaming": False, "devices": [device], "engines": 1,
        "classes": None, "priority_levels": 0, "default_priority": 0, "kv": kv,
        "memory_quota_bytes": kv["engine_pool_bytes"], "max_inflight": llm.largest_batch_that_fits,
        "release_grace_ms": release_grace_ms(profile),
    }


def _classic(profile: Profile, device: str, notes: list[str]) -> dict[str, Any]:
    knee = profile.knee.concurrency if profile.knee is not None else None
    limit = (f"{knee} (the knee of its load curve: P99 grew faster than throughput from there)" if knee else
             "none (no knee in the levels profiled: Triton's queue bounds it)")
    notes.append(f"{profile.model}: classic; max_inflight {limit}; request_bytes 0 (a profile does not record tensor "
                 "sizes: memory does not bind it)")
    return {
        "name": profile.model, "kind": "classic", "streaming": False, "devices": [device], "engines": 1,
        "classes": None, "priority_levels": 0, "default_priority": 0, "request_bytes": 0,
        "max_inflight": knee, "release_grace_ms": 0.0,
    }


def low_load_p99_ms(profile: Profile) -> float | None:
    """The model's P99 at the lowest load profiled: time to first token for a stream, the whole
    request otherwise; None where no level measured one."""
    if profile.streaming is not None:
        levels = sorted((lv.concurrency, lv.ttft_p99_ms) for lv in profile.streaming.levels if lv.ttft_p99_ms)
        if levels:
            return levels[0][1]
    levels = sorted((lv.concurrency, lv.p99_ms) for lv in profile.load_levels if lv.p99_ms)
    return levels[0][1] if levels else None


def _target(profiles: list[Profile], p99_ms: float | None, notes: list[str]) -> float:
    if p99_ms is not None:
        notes.append(f"class {CLASS}: P99 target {p99_ms:g} ms as stated (--p99-ms)")
        return p99_ms
    measured = {p.model: low_load_p99_ms(p) for p in profiles}
    known = {m: v for m, v in measured.items() if v}
    if not known:
        raise NoPolicyFromProfile("no profile measured a latency at low load, which the assumed class target is "
                                  "derived from; state the target with --p99-ms MS")
    slowest = max(known, key=lambda m: known[m])
    target = float(math.ceil(ASSUMED_TARGET_FACTOR * known[slowest]))
    notes.append(f"class {CLASS}: assumed: P99 target {target:g} ms = {ASSUMED_TARGET_FACTOR:g} x {known[slowest]:.1f} ms, "
                 f"{slowest}'s P99 at its lowest profiled load (streams: time to first token); without a spec there "
                 "is no traffic: state the target with --p99-ms, or classes in a spec")
    return target


def _device(profiles: list[Profile], notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    probes = {p.memory.probe for p in profiles if p.memory is not None and p.memory.probe != "none"}
    gpu = probes == {"nvml"}
    used = sum(p.memory.base_bytes or 0 for p in profiles if p.memory is not None)
    device = "gpu0" if gpu else "cpu"
    which = ("the profiles measured GPU memory through NVML; which GPU is not recorded" if gpu else
             "the host: no profile measured GPU memory")
    notes.append(f"devices: {device} ({which}), static_used_bytes {used} (the models' memory at idle, measured); "
                 "assumed: memory_bytes 2^60 (1 EiB: a profile records no device size, so the static figure never "
                 "binds and the live readings decide)")
    device_entry = {"id": device, "memory_bytes": UNBOUND_DEVICE_BYTES, "utilization_cap": Policy().memory_utilization_cap,
                    "static_used_bytes": used}
    return device_entry, ["nvml", "triton_metrics", "static"] if gpu else ["triton_metrics", "static"]


def policy_from_profiles(
    profiles: Mapping[str, Profile], files: Mapping[str, str] | None = None, p99_ms: float | None = None,
) -> dict[str, Any]:
    """The policy document (POLICY_VERSION) for the profiled models of one server, without a spec.
    `files` (model -> the profile's file) names each profile in messages; `p99_ms` is the user's
    class target (None: assumed from the profiles, and said so). NoPolicyFromProfile lists every
    profile that cannot give its model's policy."""
    files = files or {}
    ordered = [profiles[m] for m in sorted(profiles)]
    refused = [why for p in ordered if (why := _refusal(p, files)) is not None]
    if refused:
        raise NoPolicyFromProfile("; ".join(refused))
    if not ordered:
        raise NoPolicyFromProfile("no profiles: profile the server's models first (`tritongen profile --model M "
                                  "--url HOST:PORT -o DIR`)")
    notes: list[str] = []
    device, sources = _device(ordered, notes)
    models = [_streaming(p, device["id"], notes) if p.kind == "streaming" else
              _unary_llm(p, device["id"], notes) if p.llm is not None else _classic(p, device["id"], notes)
              for p in ordered]
    target = _target(ordered, p99_ms, notes)
    # The adaptive limit counts LLM requests (classic ones are bounded by what Triton takes); a model
    # without a sequence limit counts its pool's blocks, the most sequences it could hold.
    total = sum(m["max_inflight"] or max(1, m["kv"]["max_context"] // m["kv"]["block_tokens"])
                for m in models if m["kind"] == "llm")
    pads = [p.memory.recommended_kv_safety_pad_mb for p in ordered if p.memory and p.memory.recommended_kv_safety_pad_mb]
    notes.append(f"headroom: safety pad {max(pads):g} MiB (the largest measured prefill peak x its margin)" if pads else
                 "headroom: no safety pad (no profile measured a prefill peak); each request's profiled prefill "
                 "peak is still reserved")
    servers = sorted({_address(p) for p in ordered})
    return {
        "version": POLICY_VERSION,
        "deployment": f"triton at {', '.join(servers)}",
        "class_header": "x-traffic-class",
        "class_parameter": "traffic_class",
        "default_class": CLASS,
        "starvation_guard_ms": Policy().starvation_guard_ms,
        "tenant_header": TENANT_HEADER,
        "tenants": [],
        "classes": [{"name": CLASS, "kind": "normal", "priority": 1, "p99_ms": target, "max_queue_wait_ms": target,
                     "queue_cap": None, "budget_fraction": 1.0}],
        "devices": [device],
        "models": models,
        "concurrency": concurrency_section(max(1, total), target),
        "headroom": headroom_section(sources, int(max(pads) * MIB) if pads else 0),
        "limits": dict(LIMITS),
        "notes": notes,
    }
