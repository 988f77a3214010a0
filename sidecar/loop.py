"""The sidecar's event loop: uvloop where it is installed, asyncio's own loop otherwise.

The sidecar is a proxy: most of what it adds to a request's latency is event-loop work (socket
reads and writes, callbacks, timers), which uvloop (libuv) does in a fraction of the time of the
pure-Python selector loop. Measured in bench/bench_sidecar.py; both loops pass the same tests.
`TRITONGEN_SIDECAR_LOOP=asyncio` forces the standard loop (for comparison or if uvloop misbehaves).
"""

from __future__ import annotations

import asyncio
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


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the loop `new_event_loop` makes."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
