"""Read an LLM engine's values from a model directory (config.pbtxt beside the backend's own files:
vLLM's model.json, TensorRT-LLM's LLM-API model.yaml) and resolve them with the profile and the
spec (`tritongen.core.engine_sources`)."""

from __future__ import annotations

import json
from pathlib import Path

from tritongen.core.engine import EngineModel
from tritongen.core.engine_sources import (
    EngineSourceError,
    MeasuredEngine,
    entry_sources,
    measured_from_profile,
    resolve_engine,
)
from tritongen.core.llm_interface import LLMInterface, UnknownInterface, plan_entry_interface
from tritongen.core.profile_types import StatedEngine
from tritongen.core.simulator import Overheads
from tritongen.core.spec import EngineSection
from tritongen.errors import BadInput
from tritongen.llmapi_files import llmapi_args


def vllm_engine_args(model_dir: Path) -> dict | None:
    """The vLLM backend's `<version>/model.json` (the highest numbered version that has one)."""
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name), reverse=True) if model_dir.is_dir() else []
    for version in versions:
        path = version / "model.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise BadInput(f"{path}: not valid JSON: {err}") from None
            if not isinstance(data, dict):
                raise BadInput(f"{path}: expected a JSON object of vLLM engine arguments")
            return data
    return None


def as_served(config, model_dir: Path | None):
    """What the server makes of a config.pbtxt read from a file: the name defaults to the model's
    directory, and the vLLM backend's auto-complete sets `max_batch_size: 0` and the decoupled
    policy (its sample config states neither)."""
    if not config.name and model_dir is not None:
        config.name = model_dir.name
    if config.backend == "vllm":
        config.max_batch_size = 0
        config.model_transaction_policy.decoupled = True
    return config


def config_parameters(config) -> dict[str, str]:
    """string_value of each parameter of a ModelConfig proto."""
    return {key: value.string_value for key, value in config.parameters.items()}


def engine_for(
    config,
    profile,
    *,
    model_dir: Path | None = None,
    stated: EngineSection | None = None,
    stated_where: str = "--engine",
    spec: StatedEngine | None = None,
    max_context: int | None = None,
) -> EngineModel:
    """The engine of a decoupled model read from files: its config (a ModelConfig proto), the
    backend's files in `model_dir`, engine values `stated` elsewhere (the command line), the
    engine: section of a spec named with the files (`spec`, with the spec model's `max_context`),
    and the streaming profile: its measured costs, and the spec's engine: section when the profile
    carried one (`Profile.stated_engine`). Ranked `stated` over `spec` over the carried section,
    value by value: the later statement is the user's current one. A plan entry's engine is
    `entry_engine`'s."""
    if profile is None or getattr(profile, "engine", None) is None:
        raise BadInput(
            f"model {config.name!r} is a streaming LLM: give its streaming profile (`tritongen profile` writes one "
            "with the engine's measured step costs)"
        )
    backend = config.backend or None
    engine_args = vllm_engine_args(model_dir) if backend == "vllm" and model_dir is not None else None
    llm_args = llmapi_args(model_dir, backend) if model_dir is not None else None  # TensorRT-LLM's model.yaml
    carried = getattr(profile, "stated_engine", None)  # profiles written before it have none
    below = [(said.section, f"the spec's engine: section ({said.source}){how}")
             for said, how in ((spec, ""), (carried, ", carried by the profile")) if said is not None]
    try:
        return resolve_engine(
            model=config.name,
            backend=backend,
            parameters=config_parameters(config),
            measured=measured_from_profile(profile.engine),
            engine_args=engine_args,
            llm_args=llm_args,
            spec=stated,
            spec_where=stated_where,
            max_batch_size=int(config.max_batch_size),
            below=below,
            max_context=max_context,
        )
    except EngineSourceError as err:
        raise BadInput(str(err)) from None


def entry_engine(entry, model, profile=None, measured: MeasuredEngine | None = None,
                 device: tuple[int, str] | None = None) -> EngineModel:
    """The engine a plan entry (`ModelEntryPlan`) renders, with the profile's measured costs (and
    capacity), or with given `measured` costs (what-if runs); `device` (bytes, name) is its GPU."""
    if measured is None:
        if profile is None or profile.engine is None:
            raise BadInput(f"profile of {entry.name}: no engine section (profile the model again with this version)")
        measured = measured_from_profile(profile.engine)
    try:
        return resolve_engine(measured=measured, **entry_sources(entry, model, device))
    except EngineSourceError as err:
        raise BadInput(str(err)) from None


def with_request_overhead(overheads: Overheads, profile) -> Overheads:
    """A streaming profile measured its requests' path outside the engine: that replaces the
    overheads' request time (callers keep theirs when the user gave --overheads)."""
    engine = getattr(profile, "engine", None)
    if engine is None:
        return overheads
    return overheads.model_copy(update={"request_ms": engine.request_overhead_ms})


def entry_interface(entry) -> LLMInterface:
    """The LLM interface of a plan entry (`ModelEntryPlan`): what its rendered config declares."""
    try:
        return plan_entry_interface(entry)
    except UnknownInterface as err:
        raise BadInput(str(err)) from None
