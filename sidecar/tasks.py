"""One background coroutine owned by an object: started once, cancelled and awaited on stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


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
