"""Names that several files must agree on resolve through one registry each, and an unknown name
is an error that lists the known ones (not an `else` branch that silently means something)."""

from __future__ import annotations

import typing

import pytest

from sidecar.headroom import HEADROOM_SOURCES, SourceInputs, build_sources
from tritongen.core.sidecar_policy.schema import parse_policy
from tritongen.core.sidecar_policy.sections import HeadroomPolicy
from tests.sidecar_rigs import policy_doc
from tritongen.core.traffic import ARRIVAL_PROCESSES, TrafficSpec, arrival_process


def _literal_names(annotation: object) -> set[str]:
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is list:
        return _literal_names(args[0])
    return set(args)


def test_every_traffic_shape_has_an_arrival_process() -> None:
    shapes = _literal_names(TrafficSpec.model_fields["shape"].annotation)
    assert shapes == set(ARRIVAL_PROCESSES) | {"trace"}  # a trace is replayed, not generated


def test_an_unknown_traffic_shape_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: bursty, daily, poisson, trace"):
        arrival_process("weekly")


def test_every_policy_headroom_source_has_a_builder_whose_source_carries_its_name() -> None:
    names = _literal_names(HeadroomPolicy.model_fields["sources"].annotation)
    assert names == set(HEADROOM_SOURCES)
    policy = parse_policy(policy_doc(), "test")

    async def fetch() -> str:
        return ""

    inputs = SourceInputs(policy, nvml=object(), clock=lambda: 0.0, fetch_triton_metrics=fetch)
    assert [s.name for s in build_sources(list(HEADROOM_SOURCES), inputs)] == list(HEADROOM_SOURCES)


def test_an_unknown_headroom_source_names_the_known_ones() -> None:
    policy = parse_policy(policy_doc(), "test")
    with pytest.raises(ValueError, match="unknown headroom source.*'dcgm'.*known: nvml, triton_metrics, static"):
        build_sources(["dcgm", "static"], SourceInputs(policy))
