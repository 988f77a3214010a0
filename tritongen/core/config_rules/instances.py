"""Rules on instance groups: kinds against the host's GPUs and the backend, and GPU ids against
the number of GPUs the serving host has."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tritongen.core.config_rules.base import Collector, dims_text, is_tensorrt
from tritongen.core.model_config_enums import InstanceKind

if TYPE_CHECKING:  # annotations only: core imports no tritonclient (its package imports gRPC)
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_gpu_ids(config: ModelConfig, gpu_count: int | None, source: str, out: Collector) -> None:
    """The server resolves each listed id against the CUDA devices it sees at load: a negative id
    is refused everywhere, an id past the last device on that host."""
    unchecked: list[int] = []
    for i, group in enumerate(config.instance_group):
        if group.kind in (InstanceKind.KIND_CPU, InstanceKind.KIND_MODEL):
            continue  # TG122/TG123 already refuse gpus on these kinds
        field = f"instance_group[{i}].gpus"
        label = f"instance_group[{i}]" + (f" ('{group.name}')" if group.name else "")
        ids = list(group.gpus)
        negative = [g for g in ids if g < 0]
        if negative:
            out.error(
                "TG119", field,
                f"{label}.gpus is {dims_text(ids)}; GPU id {negative[0]} is negative (ids are 0 or more)",
                "use the device indices nvidia-smi lists (0 .. N-1), or leave gpus out to use every GPU",
            )
        valid = [g for g in ids if g >= 0]
        if gpu_count is not None:
            beyond = [g for g in valid if g >= gpu_count]
            if beyond:
                have = f"ids 0..{gpu_count - 1}" if gpu_count > 0 else "none"
                out.error(
                    "TG129", field,
                    f"{label}.gpus is {dims_text(ids)} but {source} has {gpu_count} GPU(s) ({have}); "
                    f"GPU {beyond[0]} does not exist there",
                    f"list ids below {gpu_count}, or leave gpus out to use every GPU" if gpu_count > 0
                    else "use kind: KIND_CPU without gpus on a host without GPUs",
                )
        else:
            unchecked += valid
    if unchecked:
        out.warning(
            "TG114", "instance_group.gpus",
            f"instance groups list GPU ids {dims_text(sorted(set(unchecked)))}, but the number of GPUs on the "
            "serving host is not known here (no NVML, no --gpus, no spec), so the ids were not checked "
            "against it",
            "pass --gpus N (the serving host's GPU count) or the spec (`check SPEC DIR`), or run check on the serving host",
        )


def check_instance_groups(config: ModelConfig, gpu_available: bool | None, out: Collector,
                     model_file: str | None = None) -> None:
    tensorrt = is_tensorrt(config) or (not config.platform and not config.backend and bool(model_file)
                                       and model_file.endswith(".plan"))
    for i, group in enumerate(config.instance_group):
        field = f"instance_group[{i}]"
        label = f"{field}" + (f" ('{group.name}')" if group.name else "")
        kind = InstanceKind.Name(group.kind)
        gpus = list(group.gpus)
        if group.count < 0:  # 0 is the same as leaving count out (proto3): one instance
            out.warning(
                "TG120", f"{field}.count",
                f"{label}.count is {group.count}; the server treats a count below 1 as 1",
                "set count: 1 (or the number of instances you want) explicitly",
            )
        wants_gpu = group.kind == InstanceKind.KIND_GPU or (
            group.kind == InstanceKind.KIND_AUTO and gpus
        )
        if wants_gpu and gpu_available is False:
            out.warning(
                "TG121", f"{field}.kind",
                f"{label}.kind is {kind}{' with gpus ' + dims_text(gpus) if gpus else ''} but this host has "
                "no GPU; the server here refuses it (no GPUs are available)",
                "fine if the target host has GPUs; to load it here use kind: KIND_CPU without gpus",
            )
        if group.kind == InstanceKind.KIND_CPU and gpus:
            out.error(
                "TG122", f"{field}.gpus",
                f"{label}.kind is KIND_CPU but gpus is {dims_text(gpus)}",
                "remove gpus, or set kind: KIND_GPU",
            )
        if group.kind == InstanceKind.KIND_MODEL and gpus:
            out.error(
                "TG123", f"{field}.gpus",
                f"{label}.kind is KIND_MODEL but gpus is {dims_text(gpus)}; with KIND_MODEL the model "
                "places itself",
                "remove gpus, or set kind: KIND_GPU",
            )
        if group.profile and not tensorrt:
            out.error(
                "TG124", f"{field}.profile",
                f"{label}.profile is {list(group.profile)} but the model is not TensorRT "
                f"(platform '{config.platform}', backend '{config.backend}')",
                "remove profile (it only selects TensorRT optimization profiles)",
            )
        if group.HasField("rate_limiter"):
            names: Counter[str] = Counter()
            for j, res in enumerate(group.rate_limiter.resources):
                rfield = f"{field}.rate_limiter.resources[{j}]"
                names[res.name] += 1
                if not res.name:
                    out.warning(
                        "TG125", f"{rfield}.name",
                        f"{rfield} has no name (count {res.count}); with --rate-limit=execution_count "
                        "the server refuses it (resource \"\" limited to 0)",
                        "give the resource a name, e.g. name: \"R_GPU\"",
                    )
                if res.count == 0:
                    out.warning(
                        "TG126", f"{rfield}.count",
                        f"{rfield} ('{res.name}') has count 0, so it never limits anything",
                        "set count to the units one execution consumes (>= 1), or remove the resource",
                    )
            for rname, count in sorted(names.items()):
                if count > 1 and rname:
                    out.warning(
                        "TG127", f"{field}.rate_limiter.resources",
                        f"{field}.rate_limiter.resources names '{rname}' {count} times",
                        f"keep one entry for '{rname}' with the total count",
                    )
