"""The per-server flow control of MCP requests (:class:`gateway.mcp.limits.ServerGate`), on a
real event loop: slots in arrival order, a full queue refused at once, a wait bounded, a slot
of a cancelled waiter passed on, never more than ``max_concurrent`` holders."""

from __future__ import annotations

import asyncio

import pytest

from gateway.mcp.jsonrpc import McpRefusal
from gateway.mcp.limits import LIMITED, ServerGate
from gateway.mcp.settings import McpFlowSettings


def _gate(max_concurrent: int, max_queued: int, timeout_s: float = 5.0) -> ServerGate:
    return ServerGate("tools", McpFlowSettings(max_concurrent=max_concurrent,
                                               max_queued=max_queued,
                                               queue_timeout_s=timeout_s))


def test_slots_go_in_arrival_order_and_a_full_queue_is_refused_at_once() -> None:
    async def run() -> tuple[list[str], McpRefusal, int]:
        gate = _gate(1, 2)
        order: list[str] = []
        release = asyncio.Event()
        peak = 0

        async def call(name: str) -> None:
            nonlocal peak
            async with gate.slot():
                peak = max(peak, gate.in_flight)
                order.append(name)
                if name == "a":
                    await release.wait()

        first = asyncio.create_task(call("a"))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(call(n)) for n in ("b", "c")]
        await asyncio.sleep(0)
        assert (gate.in_flight, gate.queued) == (1, 2)
        with pytest.raises(McpRefusal) as refused:
            await call("d")  # 1 in flight, 2 waiting: no room
        release.set()
        await asyncio.gather(first, *queued)
        assert (gate.in_flight, gate.queued) == (0, 0)
        return order, refused.value, peak

    order, refused, peak = asyncio.run(run())
    assert order == ["a", "b", "c"] and peak == 1
    assert (refused.status, refused.rpc_code, refused.reason) == (503, LIMITED, "server_busy")
    assert (b"retry-after", b"1") in refused.headers


def test_the_wait_for_a_slot_is_bounded() -> None:
    async def run() -> McpRefusal:
        gate = _gate(1, 1, timeout_s=0.05)
        async with gate.slot():
            with pytest.raises(McpRefusal) as refused:
                async with gate.slot():
                    raise AssertionError("got a slot while the only one is held")
            assert gate.queued == 0  # the timed-out waiter left the queue
        async with gate.slot():  # the slot came back
            assert gate.in_flight == 1
        return refused.value

    refused = asyncio.run(run())
    assert refused.reason == "server_busy" and "no slot within 0.05 s" in refused.message


def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    async def run() -> list[str]:
        gate = _gate(1, 2)
        got: list[str] = []

        async def call(name: str) -> None:
            async with gate.slot():
                got.append(name)

        held = gate.slot()
        await held.__aenter__()  # this task holds the only slot
        b = asyncio.create_task(call("b"))
        c = asyncio.create_task(call("c"))
        await asyncio.sleep(0)
        assert gate.queued == 2
        await held.__aexit__(None, None, None)  # the slot is handed to b ...
        b.cancel()  # ... which is cancelled before it runs: c must get it
        await asyncio.gather(b, c, return_exceptions=True)
        assert b.cancelled() and (gate.in_flight, gate.queued) == (0, 0)
        return got

    assert asyncio.run(run()) == ["c"]
