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

from tritongen.profiler.load import ClassicLoad


def test_a_ctrl_c_inside_a_worker_is_retrieved_when_the_load_closes(caplog) -> None:
    load = ClassicLoad("127.0.0.1:9", "m", {"X": np.zeros((1, 1), np.float32)}, ["Y"])
    load.__enter__()

    async def interrupted() -> None:
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    async def waiting() -> None:
        await asyncio.sleep(3600)

    worker = load.loop.create_task(interrupted())
    load._tasks = [worker]
    load._level_task = load.loop.create_task(waiting())
    with pytest.raises(KeyboardInterrupt):
        load.loop.run_until_complete(load._level_task)
    assert worker.done() and not worker.cancelled()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        load.close()
        del worker
        load._tasks = []
        gc.collect()
    assert "never retrieved" not in caplog.text
    assert load.loop is None


def _interrupt_with_an_untracked_task_ending_with(exc_type: type[BaseException]) -> None:
    """A task the load does not own (like aiohttp's body writer) ends with `exc_type`; the load closes.

    The task is left for the caller's garbage collection: while this frame runs, the exception's
    traceback keeps it alive, so asyncio's report comes only once the frame is gone. The exception
    is made inside the task so that no caller holds it (and with it the task).
    """
    load = ClassicLoad("127.0.0.1:9", "m", {"X": np.zeros((1, 1), np.float32)}, ["Y"])
    load.__enter__()

    async def library_write() -> None:
        await asyncio.sleep(0)
        raise exc_type("boom")

    async def waiting() -> None:
        await asyncio.sleep(0.05)

    library = load.loop.create_task(library_write())
    load._level_task = load.loop.create_task(waiting())
    try:
        load.loop.run_until_complete(load._level_task)
    except KeyboardInterrupt:
        pass
    assert library.done() and not library.cancelled()
    load.close()


def _asyncio_log_after(exc_type: type[BaseException], caplog) -> str:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _interrupt_with_an_untracked_task_ending_with(exc_type)
        gc.collect()
    return caplog.text


def test_a_ctrl_c_inside_a_library_task_prints_no_traceback(caplog) -> None:
    assert "never retrieved" not in _asyncio_log_after(KeyboardInterrupt, caplog)


def test_a_real_error_in_a_library_task_is_still_reported(caplog) -> None:
    text = _asyncio_log_after(ValueError, caplog)
    assert "never retrieved" in text and "boom" in text
