"""Every connection error names the address it tried and the option that sets it (issue 16): what
needs no port. Where the errors happen, on real ports and processes, is tested in
tests/integration/test_reach_live.py.
"""

from __future__ import annotations

import queue

from tritongen.shared.reach import stream_cause


def test_stream_cause_prefers_the_callbacks_error() -> None:
    responses: queue.Queue = queue.Queue()
    sent = RuntimeError("The stream is no longer in valid state")
    assert stream_cause(responses, sent) is sent
    assert stream_cause(responses, sent, "earlier: refused") == "earlier: refused"
    responses.put((0.0, None, None))
    responses.put((0.1, None, "UNAVAILABLE: refused"))
    assert stream_cause(responses, sent, "earlier") == "UNAVAILABLE: refused"
