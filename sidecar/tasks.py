"""Background coroutines owned by an object (started once, cancelled and awaited on stop), and the
bounded steps a shutdown is made of."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("tritongen.sidecar")

# A shutdown step that takes longer than this is stuck (a task that will not unwind, a connection
# that will not close): the sidecar logs which one and goes on, so that SIGTERM stops it within the
# time its supervisors wait (tritongen's own launcher 10 s, Kubernetes 30 s) instead of ending in
# their SIGKILL with nothing said. None of the steps waits on the network for longer than the gRPC
# listener's grace (1 s) when all is well.
STOP_STEP_S = 3.0


async def stop_step(name: str, step: Awaitable[Any], limit_s: float = STOP_STEP_S) -> None:
    """Await one step of a shutdown for at most `limit_s`; a slow one is named in the log."""
    began = time.monotonic()
    try:
        await asyncio.wait_for(step, limit_s)
    except asyncio.TimeoutError:
        log.error("stopping: %s did not finish within %.0f s; stopping without it", name, limit_s)
        return
    took = time.monotonic() - began
    if took > 1.0:
        log.warning("stopping: %s took %.1f s", name, took)


class BackgroundTask:
    """`start()` is idempotent; `stop()` cancels, waits for the coroutine to unwind, and allows a restart."""

    def __init__(self, factory: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._factory = factory
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._factory(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
