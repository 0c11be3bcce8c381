"""The upstream attempt's one deadline: first byte, then idle between chunks, one timer.

The relay only records the time of its last upstream read (``None`` while it writes to the
client); these tests drive that record as the relay does, on a real event loop, and check when
the deadline expires (a :class:`TimeoutError` out of its ``with`` block, as
:func:`asyncio.timeout` raises). The end-to-end cases (a stalled backend ends the stream with
an error event; a paced one is relayed whole) run through uvicorn in ``test_gw_relay_rules.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.forward import _Deadline

IDLE_S = 0.1
LONG_S = 60.0


async def _chunks_every(idle: _Deadline, period_s: float, count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(period_s)
        idle.last = idle.clock()


def _no_first_byte(first_byte_s: float, idle_s: float) -> float:
    """Seconds from the attempt's start until its deadline raised, with no byte ever read."""
    async def main() -> float:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(TimeoutError), _Deadline(first_byte_s, idle_s):
            await asyncio.sleep(30)  # a first byte that never comes
        return loop.time() - began

    return asyncio.run(main())


def test_expires_first_byte_s_after_the_attempt_began() -> None:
    assert IDLE_S <= _no_first_byte(IDLE_S, LONG_S) < 10 * IDLE_S


def test_a_first_byte_deadline_longer_than_idle_s_is_kept() -> None:
    # the timer fires at idle_s, then waits for the rest
    assert 3 * IDLE_S <= _no_first_byte(3 * IDLE_S, IDLE_S) < 10 * IDLE_S


def test_expires_idle_s_after_the_last_chunk() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError), _Deadline(LONG_S, IDLE_S) as deadline:
            idle = deadline.idle()
            await _chunks_every(idle, IDLE_S / 4, 2)
            last = idle.clock()
            idle.last = last
            await asyncio.sleep(30)  # a read that never completes
        return loop.time() - last

    waited = asyncio.run(main())
    assert IDLE_S <= waited < 10 * IDLE_S


def test_the_idle_deadline_also_applies_when_longer_than_the_first_byte_one() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError), _Deadline(IDLE_S / 2, IDLE_S) as deadline:
            idle = deadline.idle()
            idle.last = last = idle.clock()  # as the relay does after each read
            await asyncio.sleep(30)
        return loop.time() - last

    waited = asyncio.run(main())
    assert IDLE_S <= waited < 10 * IDLE_S


def test_chunks_within_idle_s_keep_the_response_alive_past_idle_s() -> None:
    async def main() -> None:
        with _Deadline(LONG_S, IDLE_S) as deadline:
            idle = deadline.idle()
            await _chunks_every(idle, IDLE_S / 3, 12)  # 4x idle_s in all
            idle.disarm()
            await asyncio.sleep(2 * IDLE_S)  # after disarm nothing expires

    asyncio.run(main())


def test_suspended_while_writing_to_the_client() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError), _Deadline(LONG_S, IDLE_S) as deadline:
            idle = deadline.idle()
            idle.last = None  # a write blocked by a slow client
            await asyncio.sleep(4 * IDLE_S)
            idle.last = idle.clock()  # the write completed: the idle clock restarts
            resumed = idle.last
            await asyncio.sleep(30)
        return loop.time() - resumed

    waited = asyncio.run(main())
    assert IDLE_S <= waited < 10 * IDLE_S


def test_another_cancellation_stays_a_cancellation() -> None:
    async def attempt() -> None:
        with _Deadline(LONG_S, IDLE_S):
            await asyncio.sleep(30)

    async def main() -> None:
        task = asyncio.ensure_future(attempt())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_disarm_leaves_no_timer_behind() -> None:
    async def main() -> int:
        loop: asyncio.BaseEventLoop = asyncio.get_running_loop()  # type: ignore[assignment]
        before = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        with _Deadline(LONG_S, IDLE_S) as deadline:
            deadline.idle()
            live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
            deadline.disarm()
            left = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        return (len(live) - len(before)) * 10 + len(live) - len(left)

    assert asyncio.run(main()) == 11  # one timer for both deadlines, gone after disarm


def test_one_timer_handle_per_attempt_when_chunks_come_within_idle_s() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        scheduled = 0
        call_at = loop.call_at

        def counting_call_at(*args: object, **kwargs: object) -> asyncio.TimerHandle:
            nonlocal scheduled
            scheduled += 1
            return call_at(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        with _Deadline(LONG_S, 2 * LONG_S / 3) as deadline:
            deadline.idle()
            deadline.last = deadline.clock()
            deadline.disarm()
        loop.call_at = call_at  # type: ignore[method-assign]
        return scheduled

    assert asyncio.run(main()) == 1
