"""The process guard's events: counted, and recorded as ``egress.denied`` audit records.

:class:`EgressEvents` is the guard's ``on_event`` callback (:func:`policy.start_guard`), made by
:func:`gateway.egress.start_egress`; the telemetry reads its counts (``sg.egress.blocked``) and
the routing policy (:class:`gateway.egress.PolicyRoutes`) starts and stops its forwarding to the
audit log with the app. It runs when the guard sees a denied (or, in monitor mode, would-be
denied) connection or lookup, not per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from policy import EgressEvent

__all__ = ["AuditSink", "EgressEvents"]

_log = logging.getLogger(__name__)

AuditSink = Callable[[Mapping[str, Any]], Awaitable[Any]]
"""Appends one audit event (the audit log's ``record_event``)."""


class EgressEvents:
    """Counts guard events and forwards them to the audit log (thread-safe intake).

    The guard calls :meth:`__call__` from inside an audit hook, possibly on a resolver thread:
    it only counts and queues. :meth:`startup` (in the app's lifespan) drains the queue into the
    audit sink as ``egress.denied`` records; events from before start-up are kept (up to
    ``max_buffer``).

    Args:
        max_buffer: Events kept while no loop drains them.
    """

    def __init__(self, max_buffer: int = 1000) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._buffer: deque[EgressEvent] = deque(maxlen=max_buffer)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[EgressEvent] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sink: AuditSink | None = None

    def __call__(self, event: EgressEvent) -> None:
        """Guard callback: count and queue one event (never raises, no I/O)."""
        key = (event.decision, event.destination_id or "")
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            loop, queue = self._loop, self._queue
            if loop is None or queue is None:
                self._buffer.append(event)
                return
        with contextlib.suppress(RuntimeError):  # loop closed at shutdown
            loop.call_soon_threadsafe(queue.put_nowait, event)

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of the counts by ``(decision, destination id)``."""
        with self._lock:
            return dict(self.counts)

    def total(self) -> int:
        """Events seen since start (denied and, in monitor mode, would-be-denied)."""
        with self._lock:
            return sum(self.counts.values())

    async def startup(self) -> None:
        """Start draining into ``sink`` on the running loop."""
        queue: asyncio.Queue[EgressEvent] = asyncio.Queue()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._queue = queue
            while self._buffer:
                queue.put_nowait(self._buffer.popleft())
        self._task = asyncio.get_running_loop().create_task(self._drain(queue))

    async def shutdown(self) -> None:
        """Record what is queued, then stop draining."""
        with self._lock:
            queue, self._loop, self._queue = self._queue, None, None
        if queue is not None:
            while not queue.empty():
                await self._record(queue.get_nowait())
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _drain(self, queue: asyncio.Queue[EgressEvent]) -> None:
        while True:
            await self._record(await queue.get())

    async def _record(self, ev: EgressEvent) -> None:
        _log.warning(
            "egress %s: %s:%s (%s) from %s: %s",
            "blocked" if ev.decision == "deny" else "would be blocked (monitor)",
            ev.host, ev.port, ev.event, ev.caller, ev.reason,
        )
        if self.sink is None:
            return
        try:
            await self.sink({
                "type": "egress.denied",
                "time_us": int(ev.time * 1_000_000),
                "host": ev.host,
                "port": ev.port,
                "address": ev.address,
                "decision": ev.decision,
                "destination": ev.destination_id,
                "caller": ev.caller,
                "reason": ev.reason,
                "event": ev.event,
            })
        except Exception:
            _log.exception("could not record an egress event in the audit log")
