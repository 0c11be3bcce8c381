"""The scan pool: worker threads for long scans, bounded, fair between keys, stopped in time.

A text longer than ``inline_max_chars`` is scanned off the event loop. Python cannot kill a
thread, and a scan left running after its caller gave up (``asyncio.to_thread`` under a
timeout) keeps burning CPU and keeps a thread of a shared executor busy: a caller who pads
its requests buys the gateway's CPU and delays everyone else's scans. This pool bounds that:

* ``threads`` workers (started on demand, gone after 30 s idle); one key runs on at most
  ``threads - 1`` of them at once (all of them when there is one), so another key's scan
  always finds a thread within one scan's time;
* at most ``queue`` scans wait, and one key at most a quarter of them (at least one); a scan
  beyond that is refused at once (:class:`ScanRejected`), costing nothing;
* the next scan is taken from the keys in turn (round robin), not first come, first served:
  a key with many waiting scans does not delay another key's one;
* every scan has a deadline: one still waiting at its deadline is never started, and a running
  one is stopped there (the scan function gets a ``stop()`` to poll, see
  :meth:`policy.pii.engine.Detector.scan`, and raises :class:`~policy.pii.engine.ScanStopped`);
  the caller's own timeout stops it too (:meth:`ScanPool.run`).

Errors of :meth:`ScanPool.run`: :class:`ScanRejected` (refused at submission) and
``TimeoutError`` (past the deadline, whether the caller or the worker saw it first) mean "not
scanned"; whatever else the scan function raises is re-raised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .engine import ScanStopped

__all__ = ["ScanPool", "ScanRejected"]

#: Seconds a worker waits for work before it ends (a replaced policy's pool then holds none).
_IDLE_S = 30.0


class ScanRejected(Exception):
    """The pool refused the scan without running it (its queue, or the key's share, is full)."""


@dataclass(eq=False, slots=True)
class _Job:
    key: str
    fn: Callable[[Callable[[], bool]], Any]
    deadline: float  # time.monotonic() seconds
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    cancelled: bool = False

    def stop(self) -> bool:
        """Whether the scan should stop now (cancelled, or past its deadline)."""
        return self.cancelled or time.monotonic() >= self.deadline


class ScanPool:
    """Worker threads running scans (see the module docstring). Thread-safe; usable from any
    event loop.

    Args:
        threads: worker threads (>= 1).
        queue: scans that may wait for a thread (>= 0); a key may hold a quarter of them.
    """

    def __init__(self, threads: int, queue: int) -> None:
        if threads < 1 or queue < 0:
            raise ValueError("a scan pool needs threads >= 1 and queue >= 0")
        self.threads = threads
        self.queue = queue
        self.key_running = max(1, threads - 1)
        self.key_waiting = max(1, queue // 4)
        self._cond = threading.Condition()
        self._waiting: dict[str, deque[_Job]] = {}  # insertion order = the turn order
        self._running: Counter[str] = Counter()
        self._queued = 0
        self._workers = 0  # threads alive
        self._idle = 0  # of them, waiting for a job

    def submit(self, key: str, fn: Callable[[Callable[[], bool]], Any],
               timeout_s: float) -> _Job:
        """Queue ``fn(stop)`` for ``key``, to finish within ``timeout_s`` seconds.

        Raises:
            ScanRejected: the queue, or ``key``'s share of it, is full.
        """
        job = _Job(key, fn, time.monotonic() + timeout_s)
        with self._cond:
            waiting = self._waiting.get(key)
            free = self.threads - sum(self._running.values())
            if self._queued >= self.queue + free:
                raise ScanRejected("the PII scan queue is full")
            if waiting is not None and len(waiting) >= self.key_waiting:
                raise ScanRejected("too many PII scans waiting for this key")
            self._waiting.setdefault(key, deque()).append(job)
            self._queued += 1
            if self._idle == 0 and self._workers < self.threads:
                self._workers += 1
                threading.Thread(target=self._work, name="pii-scan", daemon=True).start()
            self._cond.notify()
        return job

    async def run(self, key: str, fn: Callable[[Callable[[], bool]], Any],
                  timeout_s: float) -> Any:
        """``fn(stop)``'s result, run in the pool for ``key`` within ``timeout_s`` seconds.

        Raises:
            ScanRejected: refused at once (see :meth:`submit`).
            TimeoutError: not done within ``timeout_s`` (the scan is stopped or never starts;
                also when the worker saw the deadline first and ``fn`` raised
                :class:`~policy.pii.engine.ScanStopped`).
            Exception: whatever else ``fn`` raised.
        """
        job = self.submit(key, fn, timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(job.future)
        except ScanStopped as exc:
            raise TimeoutError("the scan passed its deadline") from exc
        finally:
            job.cancelled = True  # done: no effect; timed out or cancelled: the scan stops
            job.future.cancel()  # still waiting: never started

    def _take(self) -> _Job | None:
        """The next job by turn among keys under their running share (lock held)."""
        for key, waiting in self._waiting.items():
            if self._running[key] >= self.key_running:
                continue
            job = waiting.popleft()
            del self._waiting[key]
            if waiting:
                self._waiting[key] = waiting  # to the back of the turn order
            self._queued -= 1
            self._running[key] += 1
            return job
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._take()
                while job is None:
                    self._idle += 1
                    woke = self._cond.wait(_IDLE_S)
                    self._idle -= 1
                    job = self._take()
                    if job is None and not woke:
                        self._workers -= 1
                        return
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running[job.key] -= 1
                    if self._running[job.key] <= 0:
                        del self._running[job.key]
                    self._cond.notify()

    @staticmethod
    def _run(job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return  # the caller gave up while it waited
        if job.stop():
            job.future.set_exception(ScanStopped("the scan's deadline passed before it began"))
            return
        try:
            job.future.set_result(job.fn(job.stop))
        except BaseException as exc:  # handed to the caller, whatever it is
            job.future.set_exception(exc)
