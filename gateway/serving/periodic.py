"""A background round run every few seconds inside the event loop (health probes, metrics scrapes).

One implementation of the loop, its start and its stop, so every periodic component of the gateway
fails the same way: a round that raises is logged and the next round still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

__all__ = ["Periodic"]

_log = logging.getLogger(__name__)


class Periodic:
    """Base class: calls :meth:`run_once` every :attr:`interval_s` seconds once started.

    Subclasses implement :meth:`run_once` and set :attr:`interval_s` (seconds between the end of
    one round and the start of the next) and :attr:`round_name` (used in the log line when a
    round fails).
    """

    interval_s: float = 1.0
    round_name: str = "periodic round"

    _task: asyncio.Task[None] | None = None
    _woken: asyncio.Event | None = None

    async def run_once(self) -> None:
        """One round; overridden by subclasses."""
        raise NotImplementedError

    async def _loop(self) -> None:
        woken = self._woken = asyncio.Event()
        while True:
            try:
                await self.run_once()
            except Exception:
                _log.exception("%s failed", self.round_name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), self.interval_s)
            woken.clear()

    def wake(self) -> None:
        """Start the next round now instead of after ``interval_s`` (nothing when stopped)."""
        if self._woken is not None:
            self._woken.set()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._task is not None

    def start(self) -> None:
        """Start the background loop (inside the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the loop and wait for it (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
