"""The sidecar's event loop: uvloop where it is installed, asyncio's own loop otherwise.

The sidecar is a proxy: most of what it adds to a request's latency is event-loop work (socket
reads and writes, callbacks, timers), which uvloop (libuv) does in a fraction of the time of the
pure-Python selector loop. Measured in bench/bench_sidecar.py; both loops pass the same tests.
`TRITONGEN_SIDECAR_LOOP=asyncio` forces the standard loop (for comparison or if uvloop misbehaves).
`run` (the `tritongen sidecar` process) also freezes the heap imported before the loop starts, so
the garbage collector's full passes do not stall the loop (see `freeze_heap`).
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    """`uvloop` or `asyncio`: the loop `new_event_loop` makes here."""
    if os.environ.get("TRITONGEN_SIDECAR_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    if loop_name() == "uvloop":
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
    allocates after start-up is ~2,000 objects and a full collection takes ~1 ms. Objects still die by reference counting as before;
    only reference cycles that exist at the moment of the freeze are kept (a `gc.collect()` first
    frees those).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the loop `new_event_loop` makes, with the imported heap frozen first
    (`freeze_heap`)."""
    freeze_heap()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
