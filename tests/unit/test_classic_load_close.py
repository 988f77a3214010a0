"""Ctrl-C during a profile: the load's loop closes without asyncio printing a traceback.

A SIGINT that lands while a worker task is running (e.g. inside a socket send) ends that task with
the KeyboardInterrupt as its exception and propagates out of `run_until_complete`. If nobody
retrieves it, asyncio logs "Task exception was never retrieved" with the whole traceback when the
task is collected, after the CLI's clean "interrupted" message (seen in a CI run of
test_ctrl_c_keeps_the_partial_profile). No server is needed: the client never connects.
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
