"""The idle deadline between upstream chunks: one timer per response that re-arms itself.

The relay only records the time of its last upstream read (``None`` while it writes to the
client); these tests drive that record as the relay does, on a real event loop, and check when
the request's ``asyncio.Timeout`` expires. The end-to-end cases (a stalled backend ends the
stream with an error event; a paced one is relayed whole) run through uvicorn in
``test_gw_relay_rules.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.forward import _IdleDeadline

IDLE_S = 0.1


async def _chunks_every(idle: _IdleDeadline, period_s: float, count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(period_s)
        idle.last = idle.clock()


def test_expires_idle_s_after_the_last_chunk() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as deadline:
                idle = _IdleDeadline(deadline, IDLE_S)
                await _chunks_every(idle, IDLE_S / 4, 2)
                last = idle.clock()
                idle.last = last
                await asyncio.sleep(30)  # a read that never completes
        return loop.time() - last

    waited = asyncio.run(main())
    assert IDLE_S <= waited < 10 * IDLE_S


def test_chunks_within_idle_s_keep_the_response_alive_past_idle_s() -> None:
    async def main() -> None:
        async with asyncio.timeout(None) as deadline:
            idle = _IdleDeadline(deadline, IDLE_S)
            await _chunks_every(idle, IDLE_S / 3, 12)  # 4x idle_s in all
            idle.cancel()
            await asyncio.sleep(2 * IDLE_S)  # after cancel nothing expires
        assert not deadline.expired()

    asyncio.run(main())


def test_suspended_while_writing_to_the_client() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as deadline:
                idle = _IdleDeadline(deadline, IDLE_S)
                idle.last = None  # a write blocked by a slow client
                await asyncio.sleep(4 * IDLE_S)
                idle.last = idle.clock()  # the write completed: the idle clock restarts
                resumed = idle.last
                await asyncio.sleep(30)
        return loop.time() - resumed

    waited = asyncio.run(main())
    assert IDLE_S <= waited < 10 * IDLE_S


def test_cancel_leaves_no_timer_behind() -> None:
    async def main() -> int:
        loop: asyncio.BaseEventLoop = asyncio.get_running_loop()  # type: ignore[assignment]
        async with asyncio.timeout(None) as deadline:
            idle = _IdleDeadline(deadline, IDLE_S)
            live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
            idle.cancel()
            left = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        return len(live) - len(left)

    assert asyncio.run(main()) == 1
