"""The Triton releases a model repository may run on: each container release (24.10) with its server
version (2.51.0) and the TensorRT-LLM its `trtllm-python-py3` container ships, and the ModelConfig
fields added after the embedded server, each with the release that added it.

Why: check parses config.pbtxt with tritonclient's ModelConfig, a newer proto than the embedded
server 2.51. Without this table a field 2.51 does not know would pass although 2.51 refuses the
file ("failed to read text proto"), and a field a newer container knows would be checked by rules
written for 2.51. With it, `--triton-release` says which server the repository is for: a field
newer than that release is an error naming the release that added it; a field the release knows
but tritongen's rules do not model is said once, as a note (never refused, never silently passed).

Sources, read once and written down here (nothing fitted on a machine):
- server version per container: triton-inference-server/server, `TRITON_VERSION` on each
  release branch rYY.MM (r24.10 = 2.51.0 ... r26.07 = 2.71.0; 25.07 is the patch 2.59.1);
- fields: triton-inference-server/common `protobuf/model_config.proto`, compared field by field
  (message.field paths, nested messages included) between the release branches r24.10 (commit
  578491fc) and every rYY.MM up to r26.07 and main (83adf7cf). Two changes only:
  * ModelConfig.model_metrics (message ModelMetrics: metric_control, metric_identifier.family,
    histogram_options.buckets), commit 39485251 "Per-model metric customization (#126)", first on
    r24.11;
  * ModelEnsembling.max_inflight_requests, commit 6a318caf (#141), first on r25.11 (b0b53873 on
    r26.04 changed its comment only);
- TensorRT-LLM per container: the server's docs/introduction/compatibility.md ("Container Name:
  trtllm-python-py3"), server main e1db8a60 (2026-08-19), which lists releases up to 26.07.
The table stops at 26.07, the newest release both sources cover; a later one is an unknown release.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tritongen.core.findings import Finding

EMBEDDED = "24.10"  # the container release of the embedded tritonserver (nvidia-pytriton's 2.51.0)


@dataclass(frozen=True)
class Release:
    """One Triton release: the container tag's YY.MM, the server version, and the TensorRT-LLM
    version of its trtllm-python-py3 container."""

    container: str
    server: str
    trtllm: str


# container, server (TRITON_VERSION on rYY.MM), TensorRT-LLM (compatibility.md)
RELEASES: tuple[Release, ...] = tuple(Release(*row) for row in (
    ("24.10", "2.51.0", "0.14.0"),
    ("24.11", "2.52.0", "0.15.0"),
    ("24.12", "2.53.0", "0.16.0"),
    ("25.01", "2.54.0", "0.17.0"),
    ("25.02", "2.55.0", "0.17.0.post1"),
    ("25.03", "2.56.0", "0.18.0"),
    ("25.04", "2.57.0", "0.18.2"),
    ("25.05", "2.58.0", "0.19.0"),
    ("25.06", "2.59.0", "0.20.0"),
    ("25.07", "2.59.1", "0.20.0"),
    ("25.08", "2.60.0", "0.21.0"),
    ("25.09", "2.61.0", "1.0.0"),
    ("25.10", "2.62.0", "1.0.0"),
    ("25.11", "2.63.0", "1.0.3.2510"),
    ("25.12", "2.64.0", "1.1.0"),
    ("26.01", "2.65.0", "1.1.0"),
    ("26.02", "2.66.0", "1.1.0"),
    ("26.03", "2.67.0", "1.2.0"),
    ("26.04", "2.68.0", "1.2.1"),
    ("26.05", "2.69.0", "1.2.1"),
    ("26.06", "2.70.0", "1.2.1"),
    ("26.07", "2.71.0", "1.2.1"),
))


@dataclass(frozen=True)
class AddedField:
    """A ModelConfig field newer than the embedded server: its proto path (message.field), where a
    config.pbtxt writes it, and the container release that added it."""

    proto: str
    config_path: str
    added_in: str


ADDED_FIELDS: tuple[AddedField, ...] = (
    AddedField("ModelConfig.model_metrics", "model_metrics", "24.11"),
    AddedField("ModelEnsembling.max_inflight_requests", "ensemble_scheduling.max_inflight_requests", "25.11"),
)


class UnknownRelease(ValueError):
    """A --triton-release this table does not hold; the message lists the ones it does."""


def known_releases() -> str:
    return ", ".join(f"{r.container} ({r.server})" for r in RELEASES)


def resolve(spelling: str | None) -> Release:
    """The release a user named, as a container release (24.10, r24.10, 24.10-py3) or a server
    version (2.51, 2.51.0); None is the embedded one."""
    text = (spelling or EMBEDDED).strip().lower().removeprefix("r")
    text = re.sub(r"-.*$", "", text)  # a container tag's suffix: 25.12-trtllm-python-py3
    found: list[Release] = []
    if re.fullmatch(r"\d\d\.\d\d", text):
        found = [r for r in RELEASES if r.container == text]
    elif re.fullmatch(r"2\.\d+(\.\d+)?", text):
        server = text + ".0" if text.count(".") == 1 else text
        found = [r for r in RELEASES if r.server == server]
    if not found:
        raise UnknownRelease(f"unknown Triton release {spelling!r}; known: {known_releases()}")
    return found[0]


def _order(release: Release) -> int:
    return RELEASES.index(release)


def by_container(container: str) -> Release:
    return next(r for r in RELEASES if r.container == container)


def _bare(path: str) -> str:
    return re.sub(r"\[\d+\]", "", path)


def release_field_findings(model: str, written: Iterable[str], release: Release) -> list[Finding]:
    """Findings on the newer ModelConfig fields a config.pbtxt writes (`written`: its dotted field
    paths, repeated messages indexed as pbtxt.field_lines gives them): TG214 (error) when
    `release` predates the field, TG215 (note) when it knows it but tritongen's rules do not."""
    paths = {_bare(p) for p in written}
    out: list[Finding] = []
    for added in ADDED_FIELDS:
        if added.config_path not in paths:
            continue
        since = by_container(added.added_in)
        if _order(release) < _order(since):
            out.append(Finding(
                "error", "TG214", model, added.config_path,
                f"model '{model}': `{added.config_path}` ({added.proto}) was added in Triton {since.container} "
                f"({since.server}); Triton {release.container} ({release.server}) does not know it and refuses "
                "the config (failed to read text proto)",
                f"remove `{added.config_path}`, or target Triton {since.container} or later "
                f"(--triton-release {since.container})",
            ))
        else:
            out.append(Finding(
                "note", "TG215", model, added.config_path,
                f"model '{model}': `{added.config_path}` is known to Triton {release.container} "
                f"(added in {since.container}); tritongen's load rules for it are not modelled, so it is "
                "parsed but not checked",
                "check it against the Triton documentation of that release",
            ))
    return out


def trtllm_note(model: str, path: str, release: Release, table_release: str) -> Finding | None:
    """TG412 (note) when `release` ships another TensorRT-LLM than the one model.yaml's key table
    was read from: its keys are then checked against the table's release, and the user is told."""
    if release.trtllm == table_release:
        return None
    return Finding(
        "note", "TG412", model, "",
        f"model '{model}': Triton {release.container} ships TensorRT-LLM {release.trtllm}; tritongen's "
        f"model.yaml key table is TensorRT-LLM {table_release}'s, so its keys were checked against "
        f"{table_release}",
        f"check keys {table_release} does not have against TensorRT-LLM {release.trtllm}'s LLM() arguments, "
        f"or target a release that ships {table_release}",
        path=path,
    )
