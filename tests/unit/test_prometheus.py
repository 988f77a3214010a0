"""The one Prometheus text parser (tritongen.core.prometheus) the sidecar, profiler and doctor share."""

from __future__ import annotations

import math

import pytest

from tritongen.core.prometheus import kv_gauges, parse_prometheus


def test_samples_keep_their_names_labels_and_order() -> None:
    text = ('# HELP c a counter\n# TYPE c counter\nfoo{a="x\\"y",b = "z\\\\w"} 1.5\n  bar 2  \nbad line\n'
            'nv_inference_request_success{model="a,b"} 3 1700000000\nbaz{} 3e2\nneg -1 -5\n')
    samples = parse_prometheus(text)
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("foo", {"a": 'x"y', "b": "z\\w"}, 1.5), ("bar", {}, 2.0),
        ("nv_inference_request_success", {"model": "a,b"}, 3.0),  # a counter is not renamed to *_total
        ("baz", {}, 300.0), ("neg", {}, -1.0),
    ]


def test_nan_is_a_sample_and_wanted_filters_by_name() -> None:
    samples = parse_prometheus("a NaN\nb 1\nc 2\n")
    assert math.isnan(samples[0].value)
    assert [s.name for s in parse_prometheus("a NaN\nb 1\nc 2\n", lambda name: name != "a")] == ["b", "c"]


def test_strict_refuses_a_page_that_is_not_prometheus_text() -> None:
    with pytest.raises(ValueError):
        parse_prometheus("<html>not found</html>\n", strict=True)
    assert parse_prometheus("", strict=True) == []
    assert len(parse_prometheus("junk here\nok 1\n", strict=True)) == 1


def test_kv_gauges_sum_counts_and_take_the_largest_size() -> None:
    samples = parse_prometheus(
        'm_kv_blocks_used{model="m",instance="0"} 3\nm_kv_blocks_used{model="m",instance="1"} 4\n'
        'm_kv_blocks_total{model="m"} 20\nm_kv_bytes_per_token{model="m"} 512\nm_kv_block_tokens{model="m"} 16\n'
        'o_kv_blocks_used{model="o"} 9\n'
    )
    got = kv_gauges(samples, "m")
    assert (got.blocks_used, got.blocks_total, got.bytes_per_token, got.block_tokens) == (7, 20, 512.0, 16)
    assert got.present and not kv_gauges(samples, "absent").present
