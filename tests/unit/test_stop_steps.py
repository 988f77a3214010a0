"""A shutdown step that hangs is named and left behind, so SIGTERM stops the sidecar within the
time its supervisor waits (a full suite run once saw the sidecar SIGKILLed after 10 s of stopping,
with nothing in its log to say where it hung)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.tasks import stop_step


def test_a_hung_step_is_named_and_abandoned_within_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        began = loop.time()
        await stop_step("a connection that never closes", asyncio.Event().wait(), limit_s=0.05)
        await stop_step("a quick one", asyncio.sleep(0))
        return loop.time() - began

    with caplog.at_level(logging.INFO, logger="tritongen.sidecar"):
        took = asyncio.run(main())
    assert took < 1.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "a connection that never closes did not finish" in said[0], said
