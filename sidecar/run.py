"""Running a sidecar: until a signal (the CLI), or in a background thread with its own event loop
(tests and embedding)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

from sidecar.app import Sidecar
from sidecar.config import SidecarConfig
from sidecar.loop import new_event_loop


async def serve(config: SidecarConfig, **kwargs: Any) -> None:
    """Run until SIGINT or SIGTERM (the CLI's entry point)."""
    sidecar = Sidecar(config, **kwargs)
    await sidecar.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, sidecar.request_stop)
    try:
        await sidecar.wait_stopped()
    finally:
        await sidecar.stop()


class SidecarThread:
    """A sidecar on its own event loop in a background thread (tests and embedding).

        with SidecarThread(SidecarConfig(...)) as sc:
            url = f"http://127.0.0.1:{sc.sidecar.http_port}"
    """

    def __init__(self, config: SidecarConfig, **kwargs: Any) -> None:
        config.install_signal_handlers = False
        self.sidecar = Sidecar(config, **kwargs)
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sidecar", daemon=True)
        self._started = False

    def start(self) -> SidecarThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.sidecar.start(), self.loop).result(timeout=30)
        self._started = True
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run a plain function on the sidecar's loop (state is single-threaded) and return its result."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def stop(self) -> None:
        if self._started:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self.loop).result(timeout=30)
            self._started = False
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_closed() and not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> SidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
