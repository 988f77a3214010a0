"""Ctrl-C during a profile: the load's loop closes without asyncio printing a traceback.

A SIGINT that lands while a worker task is running (e.g. inside a socket send) ends that task with
the KeyboardInterrupt as its exception and propagates out of `run_until_complete`. If nobody
retrieves it, asyncio logs "Task exception was never retrieved" with the whole traceback when the
task is collected, after the CLI's clean "interrupted" message (seen in CI runs of
test_ctrl_c_keeps_the_partial_profile: once in a worker, once in aiohttp's own body-writing task,
which the load does not own). No server is needed: the client never connects.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import numpy as np
import pytest

from tritongen.profiler.classic_load import ClassicLoad


def _close_after_a_task_ends_with(exc_type: type[BaseException], tracked: bool) -> None:
    """A task on the load's loop ends with `exc_type` while a level runs; then the load closes.

    `tracked`: the task is one of the load's workers; else it is one the load does not own (like
    aiohttp's body writer). The task is left for the caller's garbage collection: while this frame
    runs, the exception's traceback keeps it alive, so asyncio's report comes only once the frame is
    gone. The exception is made inside the task so that no caller holds it (and with it the task).
    """
    load = ClassicLoad("127.0.0.1:9", "m", {"X": np.zeros((1, 1), np.float32)}, ["Y"])
    load.__enter__()

    async def ending() -> None:
        await asyncio.sleep(0)
        raise exc_type("boom")

    async def level() -> None:
        await asyncio.sleep(0.05)

    task = load.loop.create_task(ending())
    if tracked:
        load._tasks = [task]
    load._level_task = load.loop.create_task(level())
    interrupted = False
    try:
        load.loop.run_until_complete(load._level_task)
    except KeyboardInterrupt:
        interrupted = True
    assert interrupted == (exc_type is KeyboardInterrupt)  # a Ctrl-C leaves the level pending
    assert task.done() and not task.cancelled()
    load.close()
    assert load.loop is None


def _asyncio_log_after(exc_type: type[BaseException], caplog, tracked: bool = False) -> str:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _close_after_a_task_ends_with(exc_type, tracked)
        gc.collect()
    return caplog.text


@pytest.mark.parametrize("tracked", [True, False], ids=["worker", "library-task"])
def test_a_ctrl_c_inside_a_task_prints_no_traceback(caplog, tracked: bool) -> None:
    assert "never retrieved" not in _asyncio_log_after(KeyboardInterrupt, caplog, tracked)


def test_a_real_error_in_a_library_task_is_still_reported(caplog) -> None:
    text = _asyncio_log_after(ValueError, caplog)
    assert "never retrieved" in text and "boom" in text


def test_ctrl_c_during_a_level_cancels_the_level_instead_of_raising_inside_it() -> None:
    """The Ctrl-C a CI run lost: the KeyboardInterrupt landed in library code that turned it into a
    failed request, and the profile ran to its end with exit code 0. While a level runs, SIGINT
    now cancels the level task (no KeyboardInterrupt is ever raised inside the load's or a
    library's code) and the caller raises KeyboardInterrupt once the loop has stopped."""
    import signal

    from tritongen.profiler.classic_load import _sigint_cancels

    loop = asyncio.new_event_loop()
    seen: list[str] = []

    async def level() -> None:
        for _ in range(200):  # ~10 s unless cancelled
            try:
                await asyncio.sleep(0.05)
            except (OSError, ValueError) as err:  # what a library does with a failure: note it and go on
                seen.append(type(err).__name__)

    task = loop.create_task(level())
    loop.call_later(0.2, signal.raise_signal, signal.SIGINT)
    # as in the CLI: Python's own handler (a test run before this one may have left another)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _sigint_cancels(loop, task) as interrupted:
            with pytest.raises(asyncio.CancelledError):
                loop.run_until_complete(task)
            assert interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back afterwards
    finally:
        loop.close()
        signal.signal(signal.SIGINT, before)
    assert task.cancelled() and seen == []
