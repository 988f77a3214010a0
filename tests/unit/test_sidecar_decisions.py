"""What the decision socket reads from nginx's admit message without a live nginx."""

from __future__ import annotations

from sidecar.decisions import MAX_BEFORE_S, before_sidecar_s


def test_the_time_a_request_spent_in_nginx_is_read_from_its_start() -> None:
    assert before_sidecar_s("1000.250", 1000.5) == 0.25


def test_a_start_that_cannot_be_a_wait_counts_as_none() -> None:
    """A start in the future (nginx's cached clock, a clock step), one further back than any class
    may wait, or a field that is not a number: the request is judged as arriving now."""
    assert before_sidecar_s("1001.0", 1000.0) == 0.0
    assert before_sidecar_s("0", MAX_BEFORE_S + 1.0) == 0.0
    assert before_sidecar_s("", 1000.0) == 0.0
    assert before_sidecar_s("soon", 1000.0) == 0.0
