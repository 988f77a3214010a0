"""Where an LLM engine's values come from: the backend's own files first, then the spec's
documented `engine:` section, then what the profile measured.

- vLLM backend (`backend: "vllm"`): `1/model.json` engine arguments (`max_num_seqs`,
  `max_num_batched_tokens`, `block_size`, `max_model_len`, `num_gpu_blocks_override`,
  `enable_prefix_caching`); the KV policy is grow-and-preempt. Without `num_gpu_blocks_override`
  the pool is what vLLM sized from the GPU, which only the engine's metrics (or a probe) can tell.
  Without `enable_prefix_caching` the prefix cache is on: vLLM V1's default; without
  `max_num_batched_tokens` the step budget is V1's default for the GPU (`core.vllm_defaults`).
- TensorRT-LLM (`backend: "tensorrtllm"`): config parameters `batch_scheduler_policy`
  (`guaranteed_no_evict` reserves at admission, `max_utilization` pauses and resumes),
  `max_tokens_in_paged_kv_cache`, `enable_chunked_context`, `enable_kv_cache_reuse` (the
  executor's `enable_block_reuse`; off when unset, the backend's default). Tokens per block and
  the runtime batch are engine build options: the spec's `engine:` section names them.
- TensorRT-LLM's LLM-API model (a Python-backend model with `1/model.yaml`, `llm_args`):
  `scheduler_config.capacity_scheduler_policy` (GUARANTEED_NO_EVICT reserves at admission and
  waits, MAX_UTILIZATION grows and pauses; STATIC_BATCH is not modelled), `max_batch_size` (the
  sequences the engine runs), `max_num_tokens`, `max_seq_len`, `kv_cache_config.tokens_per_block`
  and `kv_cache_config.max_tokens` (the pool; `free_gpu_memory_fraction` alone sizes it from
  memory only the plan knows, which then fills it), `kv_cache_config.enable_block_reuse` (the
  prefix cache). Unstated values are the release's defaults (`core.trtllm_args`).
- Any other backend (tinyllm, a user's Python backend): tritongen's documented engine parameters
  in the config (`kv_policy`, `max_num_seqs`, `kv_block_tokens`, `kv_pool_blocks`,
  `max_batched_tokens`, `max_context`, `prefix_caching`), which `render` writes from the spec's
  `engine:` section for backends that read them (`engine.render_parameters`), or the spec's
  section itself. Where none states `prefix_caching`, the engine is assumed not to cache
  prefixes (a hand-written engine rarely does), and its source says so.

Two sources that both state a value and disagree are an error naming both: the simulation would
otherwise model an engine the server does not run.

A model whose layers do not all grow alike (a footprint that is not uniform: windows, chunks, a
recurrent state) gets a pool in bytes beside the blocks (`EngineLimits.kv_pool_bytes`, see
tritongen.core.engine): the KV plan's budget when the plan sized the pool, else the stated pool
read as that many tokens of every attention layer (blocks x block tokens x the attention layers'
bytes per token), which is what a block of an engine that pages attention tokens holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from tritongen.core.engine import KV_POLICIES, EngineModel, LLMCurve
from tritongen.core.kv import KVFootprint
from tritongen.core.llmapi_spec import KV_POLICY_TO_CAPACITY
from tritongen.core.profile_types import ArrivalBurst
from tritongen.core.spec import EngineSection
from tritongen.core.trtllm_args import CAPACITY_POLICIES, MODEL_YAML, RELEASE, default_of
from tritongen.core.vllm_defaults import (VLLM_CHUNKED_PREFILL, VLLM_DEFAULT_BLOCK_SIZE, VLLM_DEFAULT_MAX_NUM_SEQS,
                                          vllm_default_batched_tokens)

# tritongen's documented engine parameters (config.pbtxt `parameters`), read for backends other
# than vLLM and TensorRT-LLM.
ENGINE_PARAMETERS = ("kv_policy", "max_num_seqs", "kv_block_tokens", "kv_pool_blocks", "max_batched_tokens", "max_context",
                     "prefix_caching")

TRTLLM_POLICIES = {"guaranteed_no_evict": "reserve_wait", "max_utilization": "grow_preempt"}
VLLM_KV_POLICY = "grow_preempt"  # vLLM never kills for want of KV: it preempts a sequence and recomputes it
VLLM_KV_POLICY_WHY = "the vLLM backend (preempts and recomputes)"


class EngineSourceError(ValueError):
    """The engine's values are missing or contradict each other (message names the sources)."""


@dataclass(frozen=True)
class MeasuredEngine:
    """What a profile measured: step costs and, where it could see it, the KV pool."""

    curve: LLMCurve
    kv_capacity_tokens: int | None = None
    kv_capacity_source: str | None = None
    kv_block_tokens: int | None = None
    kv_policy: str | None = None  # what the capacity probe saw the engine do (EngineMeasurement.kv_policy_seen), and why
    kv_policy_evidence: str | None = None
    prefix_caching: bool | None = None  # what a probe saw: a repeated prompt's first token sooner than a fresh one's
    prefix_caching_evidence: str | None = None
    prompt_added_tokens: int = 0  # what the engine adds to every prompt (EngineMeasurement.prompt_added_tokens)
    arrival_bursts: tuple[ArrivalBurst, ...] = ()  # arrivals with a cached prefix (PrefixCacheProbe.arrivals)


@dataclass
class _Claims:
    model: str
    values: dict[str, tuple[object, str]] = field(default_factory=dict)

    def add(self, name: str, value: object, source: str) -> None:
        if value is None:
            return
        if name in self.values:
            old, where = self.values[name]
            if old != value:
                raise EngineSourceError(
                    f"model {self.model!r}: {name} is {old} in {where} but {value} in {source}; "
                    f"make them agree (the backend runs what its own files say)"
                )
            return
        self.values[name] = (value, source)

    def get(self, name: str) -> object | None:
        found = self.values.get(name)
        return found[0] if found else None


def _int(value: object, name: str, where: str, model: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise EngineSourceError(f"model {model!r}: {name} in {where} is {value!r}, not an integer") from None
    if number < 1:
        raise EngineSourceError(f"model {model!r}: {name} in {where} is {number}; it must be at least 1")
    return number


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _switch(value: object, name: str, where: str, model: str) -> bool | None:
    """An on/off setting as a backend's file writes it (JSON true, "true", "1", ...); None unset."""
    if value is None or value == "":
        return None
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise EngineSourceError(f"model {model!r}: {name} in {where} is {value!r}, not true or false")


def _from_vllm(claims: _Claims, args: Mapping[str, object]) -> None:
    where = "model.json"
    m = claims.model
    claims.add("kv_policy", VLLM_KV_POLICY, VLLM_KV_POLICY_WHY)
    claims.add("max_num_seqs", _int(args.get("max_num_seqs"), "max_num_seqs", where, m), where)
    claims.add("kv_block_tokens", _int(args.get("block_size"), "block_size", where, m), where)
    claims.add("max_batched_tokens", _int(args.get("max_num_batched_tokens"), "max_num_batched_tokens", where, m), where)
    claims.add("max_context", _int(args.get("max_model_len"), "max_model_len", where, m), where)
    blocks = _int(args.get("num_gpu_blocks_override"), "num_gpu_blocks_override", where, m)
    claims.add("kv_pool_blocks", blocks, where)
    claims.add("prefix_caching", _switch(args.get("enable_prefix_caching"), "enable_prefix_caching", where, m), where)


def vllm_stated(model: str, args: Mapping[str, object]) -> dict[str, object]:
    """What vLLM's model.json states, by engine field (kv_pool_blocks, kv_block_tokens, max_num_seqs,
    ...), read as the resolver reads it; EngineSourceError names a value that is not a count."""
    claims = _Claims(model)
    _from_vllm(claims, args)
    return {name: value for name, (value, _where) in claims.values.items()}


def _from_trtllm(claims: _Claims, parameters: Mapping[str, str]) -> None:
    where = "config.pbtxt parameters"
    m = claims.model
    policy = str(parameters.get("batch_scheduler_policy", "guaranteed_no_evict")).strip().lower()
    if policy not in TRTLLM_POLICIES:
        raise EngineSourceError(
            f"model {m!r}: batch_scheduler_policy {policy!r} in {where} is not one of {sorted(TRTLLM_POLICIES)}"
        )
    claims.add("kv_policy", TRTLLM_POLICIES[policy], f"batch_scheduler_policy {policy} ({where})")
    tokens = _int(parameters.get("max_tokens_in_paged_kv_cache"), "max_tokens_in_paged_kv_cache", where, m)
    if tokens is not None:
        claims.add("kv_pool_tokens", tokens, where)
    reuse = _switch(parameters.get("enable_kv_cache_reuse"), "enable_kv_cache_reuse", where, m)
    claims.add("prefix_caching", reuse, f"enable_kv_cache_reuse ({where})")


LLMAPI_POLICIES = {capacity: policy for policy, capacity in KV_POLICY_TO_CAPACITY.items()}


def _from_llmapi(claims: _Claims, args: Mapping[str, object]) -> None:
    """TensorRT-LLM's LLM-API model.yaml (module docstring)."""
    where = MODEL_YAML
    m = claims.model
    kv = args.get("kv_cache_config") or {}
    scheduler = args.get("scheduler_config") or {}
    if not isinstance(kv, Mapping) or not isinstance(scheduler, Mapping):
        raise EngineSourceError(f"model {m!r}: kv_cache_config and scheduler_config in {where} must be mappings")
    stated = "capacity_scheduler_policy" in scheduler
    capacity = str(scheduler.get("capacity_scheduler_policy", default_of("scheduler_config", "capacity_scheduler_policy")))
    if capacity not in LLMAPI_POLICIES:
        known = "not modelled by the engine model (it admits a new batch only when the running one ends)" \
            if capacity in CAPACITY_POLICIES else f"not one of {list(CAPACITY_POLICIES)}"
        raise EngineSourceError(f"model {m!r}: scheduler_config.capacity_scheduler_policy {capacity!r} in {where} is "
                                f"{known}; simulate {' or '.join(LLMAPI_POLICIES)}")
    claims.add("kv_policy", LLMAPI_POLICIES[capacity],
               f"capacity_scheduler_policy {capacity} ({where}" + ("" if stated else f", TensorRT-LLM {RELEASE}'s default") + ")")
    block = kv.get("tokens_per_block")
    claims.add("kv_block_tokens", _int(block if block is not None else default_of("kv_cache_config", "tokens_per_block"),
                                       "kv_cache_config.tokens_per_block", where, m),
               where if block is not None else f"TensorRT-LLM {RELEASE}'s default tokens_per_block")
    claims.add("max_num_seqs", _int(args.get("max_batch_size"), "max_batch_size", where, m), f"max_batch_size ({where})")
    tokens = args.get("max_num_tokens")
    claims.add("max_batched_tokens", _int(tokens if tokens is not None else default_of("max_num_tokens"),
                                          "max_num_tokens", where, m),
               f"max_num_tokens ({where})" if tokens is not None else f"TensorRT-LLM {RELEASE}'s default max_num_tokens")
    claims.add("max_context", _int(args.get("max_seq_len"), "max_seq_len", where, m), f"max_seq_len ({where})")
    claims.add("kv_pool_tokens", _int(kv.get("max_tokens"), "kv_cache_config.max_tokens", where, m),
               f"kv_cache_config.max_tokens ({where})")
    reuse = kv.get("enable_block_reuse")
    claims.add("prefix_caching", bool(default_of("kv_cache_config", "enable_block_reuse") if reuse is None else reuse),
               f"kv_cache_config.enable_block_reuse ({where})" if reuse is not None
               else f"TensorRT-LLM {RELEASE}'s default enable_block_reuse")


def _from_parameters(claims: _Claims, parameters: Mapping[str, str]) -> None:
    where = "config.pbtxt parameters"
    m = claims.model
    policy = parameters.get("kv_policy")
    if policy is not None:
        if policy not in KV_POLICIES:
            raise EngineSourceError(f"model {m!r}: kv_policy {policy!r} in {where} is not one of {list(KV_POLICIES)}")
        claims.add("kv_policy", policy, where)
    for name in ("max_num_seqs", "kv_block_tokens", "kv_pool_blocks", "max_batched_tokens", "max_context"):
        claims.add(name, _int(parameters.get(name), name, where, m), where)
    claims.add("prefix_caching", _switch(parameters.get("prefix_caching"), "prefix_caching", where, m), where)


# The values of the spec's engine: section a source states (EngineSection less render_parameters).
_SECTION_VALUES = ("kv_policy", "max_num_seqs", "kv_block_tokens", "kv_pool_tokens", "max_batched_tokens", "prefix_caching")


def _unstated_in(section: EngineSection, above: Sequence[EngineSection]) -> EngineSection:
    """`section` less the values a section in `above` states: a source ranked above it replaces
    those values (the command line over the spec, the spec over what a profile carried), where two
    files would contradict each other."""
    return section.model_copy(update={name: None for name in _SECTION_VALUES
                                      if any(getattr(a, name) is not None for a in above)})


def _from_section(claims: _Claims, section: EngineSection, where: str, backend: str | None) -> None:
    """What an engine: section states (the spec's, the command line's, or one a profile carried)."""
    model = claims.model
    claims.add("kv_policy", section.kv_policy, where)
    claims.add("max_num_seqs", section.max_num_seqs, where)
    claims.add("kv_block_tokens", section.kv_block_tokens, where)
    claims.add("max_batched_tokens", section.max_batched_tokens, where)
    claims.add("prefix_caching", section.prefix_caching, where)
    if section.kv_pool_tokens is not None:
        stated = claims.values.get("kv_pool_blocks") or claims.values.get("kv_pool_tokens")
        if stated is None:
            claims.add("kv_pool_tokens", section.kv_pool_tokens, where)
        else:
            # Blocks in the backend's files, tokens in the spec: they agree when the blocks of the
            # resolved block size hold exactly the stated tokens.
            block = claims.get("kv_block_tokens") or (section.kv_block_tokens if section.kv_block_tokens else None)
            if block is None and backend == "vllm":
                block = VLLM_DEFAULT_BLOCK_SIZE
            in_blocks = "kv_pool_blocks" in claims.values
            in_tokens = int(stated[0]) * int(block) if in_blocks and block else stated[0]  # type: ignore[call-overload]
            if in_blocks and not block:
                raise EngineSourceError(
                    f"model {model!r}: the KV pool is {stated[0]} blocks in {stated[1]}, of a size nothing states, "
                    f"but kv_pool_tokens {section.kv_pool_tokens} in {where}; state engine.kv_block_tokens so the "
                    "two can be compared"
                )
            if in_tokens != section.kv_pool_tokens:
                raise EngineSourceError(
                    f"model {model!r}: the KV pool is {in_tokens} tokens in {stated[1]} but kv_pool_tokens "
                    f"{section.kv_pool_tokens} in {where}; make them agree, or remove the spec's (the backend runs "
                    "what its own files say)"
                )


@dataclass(frozen=True)
class EngineLimits:
    """What bounds an engine, without its costs: what the sidecar admits against (its policy needs
    no profile), and what `resolve_engine` completes with the measured curve."""

    kv_policy: str
    kv_block_tokens: int
    kv_pool_blocks: int
    max_num_seqs: int
    max_batched_tokens: int | None
    max_context: int | None
    sources: dict[str, str]
    kv_footprint: KVFootprint | None = None  # set, with kv_pool_bytes, for a model that is not uniform
    kv_pool_bytes: int | None = None
    prefix_caching: bool = False
    chunked_prefill: bool = False

    @property
    def pool_tokens(self) -> int:
        return self.kv_pool_blocks * self.kv_block_tokens


def resolve_engine(*, measured: MeasuredEngine | None, **where: object) -> EngineModel:
    """The engine model of one decoupled LLM, each value labelled with its source
    (`resolve_engine_limits`'s arguments, the profile's measured costs)."""
    limits = resolve_engine_limits(measured=measured, **where)  # type: ignore[arg-type]
    if measured is None:
        raise EngineSourceError(f"model {where.get('model')!r}: its step costs are unknown; profile it "
                                "(`tritongen profile`) and pass the profile")
    fields = {k: v for k, v in asdict(limits).items() if k in EngineModel.model_fields}
    added = {"prompt_added_tokens": "the profile (the engine's token counts at two prompt sizes)"} if measured.prompt_added_tokens else {}
    return EngineModel(**{**fields, "curve": measured.curve, "prompt_added_tokens": measured.prompt_added_tokens,
                          "sources": {**limits.sources, "curve": "the profile", **added}}).with_cached_prefill(measured.arrival_bursts)



def entry_sources(entry, model, device: tuple[int, str] | None = None) -> dict[str, object]:
    """What a plan entry (`ModelEntryPlan`) of spec model `model` tells `resolve_engine(_limits)`:
    the backend's files and parameters as rendered, the spec's engine section and the KV plan
    (and the GPU it runs on, `device`, where the plan knows it)."""
    return dict(
        device=device,
        model=entry.name, backend=entry.backend, parameters=entry.parameters, engine_args=entry.engine_args,
        llm_args=getattr(entry, "llm_args", None),
        spec=model.engine, max_context=model.max_context, max_batch_size=entry.max_batch_size,
        # The plan counts its pool in blocks of ITS block size (spec.kv_block_tokens), which need
        # not be the engine's (a token-granular engine, vLLM's default): tokens are what both share.
        planned_pool_tokens=entry.kv.pool_blocks * entry.kv.block_tokens if entry.kv is not None else None,
        footprint=entry.kv.footprint if entry.kv is not None else None,
        planned_pool_bytes=entry.kv.budget_bytes if entry.kv is not None else None,
    )


def resolve_engine_limits(
    *,
    model: str,
    backend: str | None,
    parameters: Mapping[str, str],
    measured: MeasuredEngine | None = None,
    engine_args: Mapping[str, object] | None = None,
    llm_args: Mapping[str, object] | None = None,
    spec: EngineSection | None = None,
    spec_where: str = "the spec's engine: section",
    below: Sequence[tuple[EngineSection, str]] = (),
    max_context: int | None = None,
    max_batch_size: int = 0,
    planned_pool_tokens: int | None = None,
    footprint: KVFootprint | None = None,
    planned_pool_bytes: int | None = None,
    device: tuple[int, str] | None = None,
) -> EngineLimits:
    """The KV policy, pool and sequence limits of one decoupled LLM, each labelled with its source;
    `measured` (optional here) adds what the profile saw of the pool. `below` holds engine:
    sections ranked under `spec`, highest first, each with where it was stated (the spec named on
    the command line, then what a profile carried from its spec, `StatedEngine`): a section above
    overrides one below value by value instead of contradicting it, since the user restating a
    value is a change, not a conflict (a value that contradicts the backend's files is still an
    error). With a `footprint` that is not uniform the pool is in bytes too (module docstring).
    `planned_pool_tokens` is the KV plan's pool in tokens (its blocks x its block tokens),
    re-blocked here at the engine's block size: a block count is only meaningful with the block
    size it was counted in. `device` (total bytes, name) is the GPU the engine runs on, where an
    unstated value's default depends on it (vLLM's max_num_batched_tokens)."""
    claims = _Claims(model)
    if llm_args is not None:
        _from_llmapi(claims, llm_args)
    elif backend == "vllm":
        _from_vllm(claims, engine_args or {})
    elif backend == "tensorrtllm":
        _from_trtllm(claims, parameters)
    else:
        _from_parameters(claims, parameters)
    above: list[EngineSection] = []
    for section, where in ((spec, spec_where), *below):
        if section is not None:
            _from_section(claims, _unstated_in(section, above), where, backend)
            above.append(section)
    claims.add("max_context", max_context, "the spec's max_context")
    if measured is not None and measured.kv_block_tokens is not None and claims.get("kv_block_tokens") is None:
        claims.add("kv_block_tokens", measured.kv_block_tokens, f"the profile ({measured.kv_capacity_source})")

    if claims.get("kv_policy") is None and measured is not None and measured.kv_policy is not None:
        # stated values win; the probe's reading only fills what nothing states
        claims.add("kv_policy", measured.kv_policy, f"the profile's capacity probe ({measured.kv_policy_evidence})")
    policy = claims.get("kv_policy")
    if policy is None:
        raise EngineSourceError(
            f"model {model!r} (backend {backend or '?'}): its KV policy is unknown (its config does not state it); "
            f"set engine.kv_policy in the spec, or pass --engine kv_policy=POLICY, to one of {list(KV_POLICIES)} "
            "(what the backend does when its KV memory runs out), or profile with --kv-capacity-probe, which "
            "sees it"
        )
    sources = {name: where for name, (_value, where) in claims.values.items()}
    block = claims.get("kv_block_tokens")
    if block is None:
        if backend == "vllm":
            block, sources["kv_block_tokens"] = VLLM_DEFAULT_BLOCK_SIZE, "vLLM's default block_size"
        elif policy in ("reserve_kill", "reserve_wait") and backend != "tensorrtllm":
            block, sources["kv_block_tokens"] = 1, "token-granular reservation (no block size stated)"
        else:
            raise EngineSourceError(
                f"model {model!r}: tokens per KV block are unknown; set engine.kv_block_tokens in the spec"
            )
    block = int(block)  # type: ignore[arg-type]
    pool_blocks = claims.get("kv_pool_blocks")
    pool_tokens = claims.get("kv_pool_tokens")
    if pool_blocks is None and pool_tokens is not None:
        pool_blocks = int(pool_tokens) // block  # type: ignore[arg-type]
        sources["kv_pool_blocks"] = sources.pop("kv_pool_tokens")
    if pool_blocks is None and measured is not None and measured.kv_capacity_tokens:
        pool_blocks = measured.kv_capacity_tokens // block
        sources["kv_pool_blocks"] = f"the profile ({measured.kv_capacity_source})"
    from_plan = pool_blocks is None and bool(planned_pool_tokens)
    if from_plan:
        pool_blocks = int(planned_pool_tokens) // block  # type: ignore[arg-type]  # whole blocks of the engine's
        sources["kv_pool_blocks"] = "tritongen's KV plan (budget / bytes per token, in whole blocks)"
    if pool_blocks == 0:  # tokens (stated, measured or planned) short of one of the engine's blocks
        raise EngineSourceError(
            f"model {model!r}: its KV pool ({sources['kv_pool_blocks']}) holds no whole block of {block} tokens; "
            "state engine.kv_pool_tokens and engine.kv_block_tokens that agree with the engine"
        )
    if not pool_blocks:
        raise EngineSourceError(
            f"model {model!r}: the size of its KV pool is unknown: neither the backend's files, the engine's "
            "metrics in the profile nor the spec state it; set engine.kv_pool_tokens in the spec (simulate: "
            "--engine kv_pool_tokens=N), or profile with --kv-capacity-probe"
        )
    seqs = claims.get("max_num_seqs")
    if seqs is None:
        if backend == "vllm":
            seqs, sources["max_num_seqs"] = VLLM_DEFAULT_MAX_NUM_SEQS, "vLLM's default max_num_seqs"
        elif max_batch_size > 0:
            seqs, sources["max_num_seqs"] = max_batch_size, "Triton's max_batch_size (no engine limit stated)"
        else:
            seqs = int(pool_blocks)  # type: ignore[arg-type]
            sources["max_num_seqs"] = "no limit stated: the pool bounds it"
    batched = claims.get("max_batched_tokens")
    if batched is None and backend == "vllm" and llm_args is None:
        batched, sources["max_batched_tokens"] = vllm_default_batched_tokens(device)
    pool_bytes = None
    if footprint is not None and not footprint.uniform:
        pool_bytes = planned_pool_bytes if from_plan and planned_pool_bytes else (
            int(pool_blocks) * block * footprint.kv_bytes_per_token)  # type: ignore[call-overload]
        sources["kv_pool_bytes"] = (sources["kv_pool_blocks"] + (", as bytes" if from_plan else
                                    ", read as tokens of every attention layer"))
    caching = _prefix_caching(claims, sources, backend, measured, bytes_pool=pool_bytes is not None)
    chunked = (bool(llm_args.get("enable_chunked_prefill", default_of("enable_chunked_prefill"))) if llm_args is not None
               else backend == "vllm" and _truthy((engine_args or {}).get("enable_chunked_prefill", VLLM_CHUNKED_PREFILL)))
    return EngineLimits(
        kv_policy=str(policy),
        kv_block_tokens=block,
        kv_pool_blocks=int(pool_blocks),  # type: ignore[arg-type]
        max_num_seqs=int(seqs),  # type: ignore[arg-type]
        max_batched_tokens=int(batched) if batched is not None else None,  # type: ignore[arg-type]
        max_context=claims.get("max_context"),  # type: ignore[arg-type]
        sources=sources,
        kv_footprint=footprint if pool_bytes else None,
        kv_pool_bytes=pool_bytes or None,
        prefix_caching=caching,
        chunked_prefill=chunked,
    )


# Whether an engine caches prefixes when nothing states it, by backend, with the reason.
PREFIX_CACHING_DEFAULTS = {
    "vllm": (True, "vLLM V1's default (model.json does not set enable_prefix_caching, and V1 turns it on)"),
    "tensorrtllm": (False, "the TensorRT-LLM backend's default (enable_kv_cache_reuse unset: no block reuse)"),
}
ASSUMED_NO_PREFIX_CACHING = ("assumed off: neither the config's parameters nor the spec's engine: section state "
                             "prefix_caching (a hand-written engine rarely caches prefixes)")


def _prefix_caching(claims: _Claims, sources: dict[str, str], backend: str | None, measured: MeasuredEngine | None,
                    bytes_pool: bool) -> bool:
    """Whether the engine model keeps a prefix cache, its source written into `sources`: what a
    file or the spec states, else what a probe saw, else the backend's default (or an assumption
    that says so). A byte pool is not modelled with one (`engine.EngineModel`), which its source
    says where the engine does cache."""
    stated = claims.get("prefix_caching")
    if stated is not None:
        on, where = bool(stated), sources["prefix_caching"]
    elif measured is not None and measured.prefix_caching is not None:
        on, where = measured.prefix_caching, f"the profile ({measured.prefix_caching_evidence})"
    else:
        on, where = PREFIX_CACHING_DEFAULTS.get(backend or "", (False, ASSUMED_NO_PREFIX_CACHING))
    if on and bytes_pool:
        on, where = False, (f"not modelled: {where} says the engine caches prefixes, but a model whose layers do "
                            "not all grow alike is pooled in bytes, where shared blocks are not followed")
    sources["prefix_caching"] = where
    return on


def measured_from_profile(engine) -> MeasuredEngine:
    """A profile's `EngineMeasurement` as the resolver reads it."""
    return MeasuredEngine(
        curve=LLMCurve(
            prefill_fixed_ms=engine.prefill_fixed_ms,
            prefill_ms_per_token=engine.prefill_ms_per_token,
            decode_fixed_ms=engine.decode_fixed_ms,
            decode_ms_per_seq=engine.decode_ms_per_seq,
            prefill_in_step=bool(getattr(engine, "prefill_in_step", False)),
        ),
        kv_capacity_tokens=engine.kv_capacity_tokens,
        kv_capacity_source=engine.kv_capacity_source,
        kv_block_tokens=engine.kv_block_tokens,
        kv_policy=getattr(engine, "kv_policy_seen", None),
        kv_policy_evidence=getattr(engine, "kv_policy_evidence", None),
        prefix_caching=probe.caches if (probe := getattr(engine, "prefix_cache", None)) is not None else None,
        prefix_caching_evidence=probe.evidence if probe is not None else None,
        prompt_added_tokens=getattr(engine, "prompt_added_tokens", None) or 0,
        arrival_bursts=tuple(probe.arrivals) if probe is not None else (),
    )
