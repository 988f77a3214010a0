"""Is Triton there? A readiness probe, told at once by the proxies when a connection fails.

While Triton is down every request gets a 503 (gRPC UNAVAILABLE) at once instead of a connection
error; the probe runs fast until Triton is ready again, then the proxies reconnect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from sidecar.tasks import BackgroundTask

log = logging.getLogger("tritongen.sidecar.upstream")

T = TypeVar("T")


class UpstreamHealth:
    def __init__(
        self,
        probe: Callable[[], Awaitable[bool]],
        interval_s: float = 1.0,
        down_interval_s: float = 0.2,
    ) -> None:
        self._probe = probe
        self.interval_s = interval_s
        self.down_interval_s = down_interval_s
        self.up = False
        self.reason: str | None = "not probed yet"
        self._listeners: list[Callable[[bool], Awaitable[None] | None]] = []
        self._kick = asyncio.Event()
        self._background = BackgroundTask(self._run, "sidecar-upstream-probe")

    def on_change(self, listener: Callable[[bool], Awaitable[None] | None]) -> None:
        self._listeners.append(listener)

    async def check(self) -> bool:
        try:
            ok = await self._probe()
            reason = None if ok else "Triton is not ready (GET /v2/health/ready)"
        except asyncio.CancelledError:
            raise
        except Exception as err:
            ok, reason = False, f"{type(err).__name__}: {err}"
        await self._set(ok, reason)
        return ok

    def mark_down(self, reason: str) -> None:
        """A proxy saw the connection fail: stop sending until the probe says otherwise."""
        if self.up:
            self.up, self.reason = False, reason
            for pending in self._tell(False):
                asyncio.ensure_future(pending)
        self._kick.set()

    async def _set(self, ok: bool, reason: str | None) -> None:
        changed = ok != self.up
        self.up, self.reason = ok, reason
        if changed:
            for pending in self._tell(ok):
                await pending

    def _tell(self, ok: bool) -> list[Awaitable[None]]:
        """Log the change and tell the listeners; the coroutines they returned, for the caller to run."""
        if ok:
            log.warning("upstream ready")
        else:
            log.warning("upstream down: %s", self.reason)
        results = [listener(ok) for listener in self._listeners]
        return [r for r in results if asyncio.iscoroutine(r)]

    def start(self) -> None:
        self._background.start()

    async def stop(self) -> None:
        await self._background.stop()

    async def _run(self) -> None:
        while True:
            await self.check()
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), self.interval_s if self.up else self.down_interval_s)
            except asyncio.TimeoutError:
                pass


class Reconnecting(Generic[T]):
    """A proxy's connection object to Triton (an aiohttp session, a gRPC channel), made anew when
    Triton comes back after being down: its pooled connections lead to the dead process. The one it
    replaces is closed only at the next renewal (or at `close`), so requests still on it finish."""

    def __init__(
        self,
        make: Callable[[], T],
        close: Callable[[T], Awaitable[None]],
        health: UpstreamHealth,
    ) -> None:
        self._make = make
        self._close = close
        self.current: T | None = None
        self._retired: list[T] = []
        self._lost = False
        health.on_change(self._changed)

    def open(self) -> None:
        self.current = self._make()

    async def close(self) -> None:
        for item in (*self._retired, self.current):
            if item is not None:
                await self._close(item)
        self._retired.clear()
        self.current = None

    async def _changed(self, up: bool) -> None:
        if not up:
            self._lost = True
        elif self._lost and self.current is not None:
            self._lost = False
            self._retired.append(self.current)
            self.current = self._make()
            while len(self._retired) > 1:
                await self._close(self._retired.pop(0))
