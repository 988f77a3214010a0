"""Rules on the model as a whole: its name against its directory, platform and backend, the
version policy and the warm-up samples."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import Collector, KNOWN_PLATFORMS, dims_text, dtype_name, is_ensemble, shapes_compatible

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_model_level(config: ModelConfig, directory: str | None, out: Collector) -> None:
    if directory and config.name and config.name != directory:
        out.error(
            "TG150", "name",
            f"name is '{config.name}' but the model directory is '{directory}'; the server loads a "
            "model only when they are equal",
            f"set name: \"{directory}\" (or remove the name line), or rename the directory to '{config.name}'",
        )
    if not config.backend and config.platform and config.platform not in KNOWN_PLATFORMS:
        out.error(
            "TG151", "platform",
            f"platform '{config.platform}' is not one the server knows and backend is empty",
            f"set backend (e.g. \"python\", \"onnxruntime\") or a platform among {sorted(KNOWN_PLATFORMS)}",
        )
    if is_ensemble(config) and config.backend:
        out.error(
            "TG152", "backend",
            f"platform is 'ensemble' but backend is '{config.backend}'; ensembles must have no backend",
            "remove the backend line from the ensemble",
        )
    if config.max_batch_size < 0:
        out.error(
            "TG104", "max_batch_size",
            f"max_batch_size is {config.max_batch_size}; it must be 0 (no batching) or positive",
            "set max_batch_size to 0 or a positive batch size",
        )
    if config.runtime and (config.runtime.startswith("/") or posixpath.normpath(config.runtime).startswith("..")):
        out.error(
            "TG147", "runtime",
            f"runtime is '{config.runtime}', a path that leaves the backend directory; the server only loads "
            "backend libraries from inside it",
            "give the library's name (e.g. \"libtriton_identity.so\", or \"model.py\" for a Python-based backend) "
            "and install it under the backend directory",
        )
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        out.error(
            "TG156", "response_cache.enable",
            "response_cache.enable is true and model_transaction_policy.decoupled is true; the "
            "response cache does not support decoupled models",
            "remove response_cache (or set enable: false), or make the model non-decoupled",
        )


def check_warmup(config: ModelConfig, out: Collector) -> None:
    if is_ensemble(config):
        return
    inputs = {i.name: i for i in config.input}
    mbs = config.max_batch_size
    for i, warm in enumerate(config.model_warmup):
        field = f"model_warmup[{i}]"
        label = f"{field}" + (f" ('{warm.name}')" if warm.name else "")
        limit = max(mbs, 1)
        if warm.batch_size > limit:
            crash = " (with max_batch_size 0 the server crashes on it)" if mbs == 0 else ""
            out.error(
                "TG157", f"{field}.batch_size",
                f"{label}.batch_size is {warm.batch_size} but max_batch_size is {mbs}, so at most "
                f"{limit} is allowed{crash}",
                f"set batch_size to at most {limit}",
            )
        if not inputs:
            continue  # inputs come from auto-completion; nothing to compare against
        for name in sorted(warm.inputs):
            if name not in inputs:
                out.warning(
                    "TG160", f"{field}.inputs",
                    f"{label}.inputs has '{name}' but the model's inputs are {sorted(inputs)}",
                    f"rename '{name}' to one of {sorted(inputs)}, or remove it",
                )
                continue
            warm_in = warm.inputs[name]
            model_in = inputs[name]
            if warm_in.WhichOneof("input_data_type") is None:
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has no data source",
                    "add zero_data: true, random_data: true or input_data_file: \"...\"",
                )
            if warm_in.data_type != model_in.data_type:
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has data_type {dtype_name(warm_in.data_type)} but the model "
                    f"input is {dtype_name(model_in.data_type)}",
                    f"set data_type: {dtype_name(model_in.data_type)}",
                )
            if list(model_in.dims) and not shapes_compatible(list(warm_in.dims), list(model_in.dims)):
                out.error(
                    "TG159", f"{field}.inputs",
                    f"{label} input '{name}' has dims {dims_text(warm_in.dims)} but the model input has dims "
                    f"{dims_text(model_in.dims)} (without the batch dimension)",
                    f"give dims matching {dims_text(model_in.dims)}, with a concrete size for each -1",
                )
        missing = sorted(n for n, inp in inputs.items() if not inp.optional and n not in warm.inputs)
        if missing:
            out.error(
                "TG158", f"{field}.inputs",
                f"{label} gives inputs {sorted(warm.inputs)} but the model requires {missing} as well",
                f"add warmup data for {missing}",
            )


def check_version_policy(config: ModelConfig, out: Collector) -> None:
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "latest" and config.version_policy.latest.num_versions == 0:
        out.error(
            "TG162", "version_policy.latest.num_versions",
            "version_policy.latest.num_versions is 0, so no version can be loaded",
            "set num_versions: 1 (or remove version_policy)",
        )
    if which == "specific" and not config.version_policy.specific.versions:
        out.error(
            "TG162", "version_policy.specific.versions",
            "version_policy.specific.versions is empty, so no version can be loaded",
            "list the versions to serve, e.g. versions: [ 1 ], or use latest",
        )
