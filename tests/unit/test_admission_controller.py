"""The asyncio owner of admission (sidecar/controller.py): capacity as a context manager never leaks,
whether the request succeeds, fails, is cancelled, queued, timed out or refused, tenants included.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sidecar.admission import AdmissionState
from sidecar.admission_types import EXCEEDS_BUDGET, QUEUE_TIMEOUT, TENANT_CLASS_NOT_ALLOWED, Cost
from tests.sidecar_rigs import FakeClock, admission_request, admission_state, policy_doc, tenant_usage
from tritongen.core.sidecar_policy.schema import parse_policy


# ------------------------------------------------------------------------------------------------
# the asyncio owner: capacity as a context manager never leaks


def controller(**over: Any) -> tuple[Any, AdmissionState, FakeClock]:
    from sidecar.controller import AdmissionController
    from sidecar.metrics import SidecarMetrics

    state, clock = admission_state(**over)
    return AdmissionController(state, SidecarMetrics(), clock), state, clock


def test_context_manager_releases_on_success_error_and_cancel() -> None:
    from sidecar.controller import Rejected, refusal

    async def main() -> None:
        ctl, state, _ = controller()
        async with ctl.admit("llm", "normal", Cost(kv_bytes=300)) as ticket:
            assert state.reserved_bytes == 300 and ticket.waited_s == 0
        assert state.reserved_bytes == 0 and state.inflight == 0

        with pytest.raises(RuntimeError):
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300)):
                raise RuntimeError("upstream exploded")
        assert state.reserved_bytes == 0

        # cancelled after it was sent upstream: the bytes linger for the model's grace, the slot frees
        async def in_flight() -> None:
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300)) as ticket:
                ticket.started()
                await asyncio.sleep(10)

        task = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert state.inflight == 0 and state.reserved_bytes == 300 and state.lingering == 1

        with pytest.raises(Rejected) as err:
            async with ctl.admit("llm", "interactive", Cost(kv_bytes=5000)):
                pass
        status, body = refusal(err.value.decision, "llm", "interactive")
        assert status == 413 and body["reason"] == EXCEEDS_BUDGET and body["limit"] == "model_memory_quota:llm"

    asyncio.run(main())


def test_queued_request_is_granted_or_leaves_cleanly() -> None:
    async def main() -> None:
        ctl, state, clock = controller()
        order: list[str] = []

        async def user(name: str, klass: str, kv: int, hold: float) -> None:
            async with ctl.admit("llm", klass, Cost(kv_bytes=kv)):
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.ensure_future(user("first", "interactive", 1000, 0.05))
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(user("queued", "normal", 100, 0))
        gave_up = asyncio.ensure_future(user("gave-up", "batch", 100, 0))
        await asyncio.sleep(0)
        assert state.waiting == 2
        gave_up.cancel()  # the client went away while waiting
        await asyncio.gather(first, queued)
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        assert order == ["first", "queued"]
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

        # granted in the same instant the waiter is cancelled: the grant is given back
        holder = asyncio.ensure_future(user("holder", "interactive", 1000, 10))
        await asyncio.sleep(0)
        racer = asyncio.ensure_future(user("racer", "interactive", 100, 0))
        await asyncio.sleep(0)
        holder.cancel()
        racer.cancel()
        await asyncio.gather(holder, racer, return_exceptions=True)
        clock.advance(1)
        state.tick()
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

    asyncio.run(main())


def test_queue_timeout_becomes_a_rejection() -> None:
    from sidecar.controller import Rejected

    async def main() -> None:
        ctl, state, clock = controller()
        held = state.submit(admission_request(kv=1000, klass="interactive"))

        async def waiter() -> None:
            async with ctl.admit("llm", "interactive", Cost(kv_bytes=10)):
                pass

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        clock.advance(0.2)
        state.tick()
        ctl.dispatch()
        with pytest.raises(Rejected) as err:
            await task
        assert err.value.decision.reason == QUEUE_TIMEOUT and err.value.decision.retry_after_s == 1.0
        state.release(held.request_id)
        assert (state.waiting, state.inflight, state.reserved_bytes) == (0, 0, 0)

    asyncio.run(main())


def test_tenant_accounting_is_released_on_every_way_out() -> None:
    from sidecar.controller import Rejected, refusal

    async def main() -> None:
        ctl, state, clock = controller(tenants=[{"name": "acme", "max_inflight": 1, "classes": ["interactive", "normal"]}])
        async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme") as ticket:
            assert ticket.tenant == "acme" and tenant_usage(state, "acme") == (1, 300)
        assert tenant_usage(state, "acme") == (0, 0)

        with pytest.raises(RuntimeError):
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme"):
                raise RuntimeError("upstream exploded")
        assert tenant_usage(state, "acme") == (0, 0)

        async def in_flight() -> None:  # sent upstream, then cancelled: the bytes linger, the slot frees
            async with ctl.admit("llm", "normal", Cost(kv_bytes=300), "acme") as ticket:
                ticket.started()
                await asyncio.sleep(10)

        task = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        assert tenant_usage(state, "acme") == (1, 300)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tenant_usage(state, "acme") == (0, 300)
        clock.advance(0.3)  # llm's release grace
        state.tick()
        assert tenant_usage(state, "acme") == (0, 0)

        # waiting for acme's quota and cancelled while waiting: leaves the queue, holds nothing
        holder = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(in_flight())
        await asyncio.sleep(0)
        assert state.waiting == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert state.waiting == 0 and tenant_usage(state, "acme") == (1, 300)
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        clock.advance(0.3)
        state.tick()
        assert tenant_usage(state, "acme") == (0, 0)

        with pytest.raises(Rejected) as err:
            async with ctl.admit("llm", "batch", Cost(kv_bytes=1), "acme"):
                pass
        status, body = refusal(err.value.decision, "llm", "batch", err.value.tenant)
        assert status == 403 and body["reason"] == TENANT_CLASS_NOT_ALLOWED and body["tenant"] == "acme"

        async with ctl.admit("llm", "normal", Cost(kv_bytes=1), "someone-else"):
            ctl.publish()
            text = ctl.metrics.exposition().decode()
            assert 'sidecar_tenant_inflight_requests{tenant="other"} 1.0' in text
            assert 'sidecar_tenant_inflight_requests{tenant="acme"} 0.0' in text
        text = ctl.metrics.exposition().decode()
        assert 'sidecar_tenant_requests_admitted_total{tenant="acme"} 4.0' in text
        assert 'sidecar_tenant_requests_admitted_total{tenant="other"} 1.0' in text
        assert 'sidecar_tenant_requests_rejected_total{reason="tenant_class_not_allowed",tenant="acme"} 1.0' in text
        assert "someone-else" not in text  # label cardinality stays bounded

        ctl.state.apply_policy(parse_policy(policy_doc()))  # acme removed: its series go
        ctl.publish()
        text = ctl.metrics.exposition().decode()
        assert 'sidecar_tenant_inflight_requests{tenant="acme"}' not in text
        assert (state.inflight, state.reserved_bytes, state.waiting) == (0, 0, 0)

    asyncio.run(main())


def test_the_exposition_gives_only_the_series_named() -> None:
    """`GET /metrics?name[]=...`: a watcher that samples one gauge gets that gauge and nothing the
    sidecar would have to format besides."""
    from sidecar.metrics import SidecarMetrics

    metrics = SidecarMetrics()
    metrics.limit.set(7)
    metrics.latency.labels("normal", "m").observe(0.1)
    text = metrics.exposition(["sidecar_concurrency_limit"]).decode()
    assert "sidecar_concurrency_limit 7.0" in text
    assert "sidecar_request_duration_seconds" not in text
    assert "sidecar_request_duration_seconds_count" in metrics.exposition().decode()
