"""The streaming load driver's parts that need no server: what a worker's requests carried."""

from __future__ import annotations

import queue
import threading

from tritongen.profiler.load import StreamRecord, StreamWorker, first_error


class ServerError(Exception):
    """An error as tritonclient hands a stream's callback one (its text is the server's)."""


def idle_worker() -> StreamWorker:
    """A worker that is never started: its records are filled by hand or by `_collect`."""
    return StreamWorker("localhost:1", "llm", {}, "text_output", threading.Event())


def test_a_failed_request_keeps_the_servers_error_whole_beside_the_short_one() -> None:
    message = "Traceback (most recent call last):\n  File \"model.py\", line 9\nValueError: " + "x" * 400
    responses: queue.Queue = queue.Queue()
    responses.put((1.5, None, ServerError(message)))
    record = StreamRecord(start=1.0)
    idle_worker()._collect(record, responses, "llm-0")
    assert record.error_text == message and record.end == 1.5
    assert record.error is not None and len(record.error) == 300 and "\n" not in record.error


def test_first_error_is_the_first_failed_request_whole_and_not_a_stopped_one() -> None:
    worker = idle_worker()
    assert first_error(worker) is None
    worker.records = [
        StreamRecord(start=0.0, token_times=[0.5], end=1.0),
        StreamRecord(start=1.0, error="stopped"),
        StreamRecord(start=2.0, end=3.0, error="the model's own words line 2", error_text="the model's own words\nline 2"),
        StreamRecord(start=3.0, end=4.0, error="a later error"),
    ]
    assert first_error(worker) == "the model's own words\nline 2"
    worker.records = [StreamRecord(start=0.0, error="stopped"), StreamRecord(start=1.0, error="no final response after 60 s")]
    assert first_error(worker) == "no final response after 60 s"  # an error the worker wrote itself
