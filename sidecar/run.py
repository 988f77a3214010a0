"""Running a sidecar: on its event loop, until a signal (the CLI), or in a background thread with its
own event loop (tests and embedding).

The loop is uvloop where it is installed: most of what a proxy adds to a request's latency is
event-loop work (socket reads and writes, callbacks, timers), which libuv does in a fraction of the
time of the pure-Python selector loop (bench/bench_sidecar.py; both pass the same tests).
`TRITONGEN_SIDECAR_LOOP=asyncio` forces the standard loop. `run_loop` (the `tritongen sidecar`
process) also freezes the heap imported before the loop starts (`freeze_heap` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sidecar.app import Sidecar
from sidecar.config import SidecarConfig

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's, unless it is not installed or TRITONGEN_SIDECAR_LOOP is `asyncio`."""
    if os.environ.get("TRITONGEN_SIDECAR_LOOP", "").lower() != "asyncio":
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def freeze_heap() -> int:
    """Move every object alive now out of the cyclic garbage collector's reach (`gc.freeze`);
    returns how many. Called once the imports are done, before the sidecar starts.

    The sidecar imports ~85,000 GC-tracked objects (grpc, aiohttp, pydantic, prometheus_client,
    protobuf descriptors) that live as long as the process. Unfrozen, every full (generation 2)
    collection walks them all while the event loop stands still: ~47 ms for the imported heap
    alone, 100-240 ms measured inside a loaded sidecar on a 2-CPU host, about once per 1,000-2,000
    requests at concurrency 16, added to every request in flight (P99). Frozen, what the sidecar
    allocates after start-up is ~2,000 objects and a full collection takes ~1 ms. Objects still die by
    reference counting; only reference cycles alive at the freeze are kept (a `gc.collect()` first
    frees those).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the loop `new_event_loop` makes, with the imported heap frozen first
    (`freeze_heap`)."""
    freeze_heap()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


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
