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


def test_each_request_gets_a_prompt_of_the_same_size_that_no_other_request_shares() -> None:
    # A prefix cache (vLLM's is on by default) would serve a repeated prompt's blocks from memory and
    # hide the prefill a profile measures; every request's prompt must start differently.
    import numpy as np

    from tritongen.core.prompts import prompt_of
    from tritongen.profiler.load import unique_prompt

    text = prompt_of(96, 4.0)
    inputs = {"text_input": np.array([text.encode()], dtype=np.object_), "stream": np.array([True])}
    prompts = [unique_prompt(inputs, "text_input")["text_input"][0] for _ in range(50)]
    assert len(set(prompts)) == 50
    assert all(len(p) == len(text.encode()) for p in prompts)
    assert inputs["text_input"][0] == text.encode()  # the caller's tensors are left as they were
    assert unique_prompt(inputs, None) == inputs and unique_prompt(inputs, "absent") == inputs


def test_a_salted_prompt_keeps_its_length_and_its_salt_even_when_tiny() -> None:
    from tritongen.core.prompts import prompt_of

    assert len(prompt_of(2, 1.0, salt=123456)) == 2
    assert prompt_of(40, 4.0, salt=7) != prompt_of(40, 4.0, salt=8)
    assert prompt_of(40, 4.0, salt=7).startswith("seven zero ") and len(prompt_of(40, 4.0, salt=7)) == 160
    # every salt is as many words, whatever its value: two prompts of one size hold as many words
    # (a model that counts words sees them alike), and consecutive salts part at the first word
    assert len(prompt_of(40, 4.0, salt=7).split()) == len(prompt_of(40, 4.0, salt=4_200_000_123).split())
    assert prompt_of(40, 4.0, salt=41).split()[0] != prompt_of(40, 4.0, salt=42).split()[0]


def test_a_salts_surplus_is_taken_off_the_filler() -> None:
    """The engine counted a salted prompt 6 tokens longer than an unsalted one of its bytes: the load
    generator's prompt of 96 tokens is then sized for 90, salt and all; never below its salt."""
    from tritongen.core.prompts import prompt_of

    full, trimmed = prompt_of(96, 1.5, salt=7), prompt_of(96, 1.5, salt=7, salt_surplus=6)
    assert trimmed == prompt_of(90, 1.5, salt=7) and len(trimmed) < len(full)
    assert trimmed.startswith(full[:20])  # the same salt
    assert prompt_of(96, 1.5, salt=7, salt_surplus=-4) == prompt_of(100, 1.5, salt=7)  # a salt sparser than the filler
    tiny = prompt_of(8, 1.5, salt=7)
    assert prompt_of(8, 1.5, salt=7, salt_surplus=6) == tiny  # the salt fills it: nothing to take off
    assert prompt_of(96, 1.5, salt_surplus=6) == prompt_of(96, 1.5)  # unsalted: nothing to take off


def test_the_profilers_own_requests_leave_room_for_the_salt() -> None:
    """The stream workers salt a request's text in place (`salted`, same length): a text sized by
    `to_be_salted` holds, once salted, what `prompt_of` gives a load's salted prompt."""
    from tritongen.core.prompts import prompt_of, salted, to_be_salted

    assert salted(to_be_salted(96, 1.5, 6), 7) == prompt_of(96, 1.5, salt=7, salt_surplus=6) == prompt_of(90, 1.5, salt=7)
    assert to_be_salted(8, 1.5, 6) == prompt_of(8, 1.5)  # too short to take anything off
    assert to_be_salted(96, 1.5, 0) == prompt_of(96, 1.5)
