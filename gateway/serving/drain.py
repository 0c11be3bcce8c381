"""Graceful drain on SIGTERM: the ``drain:`` settings and the state shared by server and app.

Sequence (``gateway serve``, see :class:`gateway.serving.server.GatewayServer`):

1. First SIGTERM or SIGINT: :meth:`Drain.begin`. ``/readyz`` answers 503 ``draining`` at once;
   the listener keeps accepting for ``delay_s`` so that load balancers and Kubernetes endpoints
   see the change before connections are refused.
2. After ``delay_s``: the listener closes; idle keep-alive connections are closed; requests in
   flight, streams included, run to completion.
3. At ``timeout_s`` after the signal: :meth:`Drain.cut_open` cancels the requests still running;
   a stream ends with a final SSE ``data: {"error": ...}`` event (code
   ``gateway_shutting_down``), a request not yet answered gets a 503, and both are audited with
   that error code; a connection still open a second later (its client does not read that
   final event) is closed (:data:`gateway.serving.server.FINAL_WRITE_S`). Then the lifespan shuts
   down (the audit chain is sealed with a final signed checkpoint) and the process exits 0.
4. A second SIGTERM or SIGINT during the drain stops at once.

The chart sets ``terminationGracePeriodSeconds`` to ``timeout_s`` plus a margin
(:data:`SHUTDOWN_MARGIN_S`) so that the kubelet's SIGKILL never comes first.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.errors import ServiceUnavailable

__all__ = ["SHUTDOWN_MARGIN_S", "Drain", "DrainSettings", "ShuttingDown"]

SHUTDOWN_MARGIN_S = 5.0
"""Seconds after ``timeout_s`` for the final events, the lifespan shutdown and the checkpoint."""


class DrainSettings(BaseModel):
    """The ``drain:`` section.

    Attributes:
        delay_s: Seconds the listener keeps accepting after SIGTERM while ``/readyz`` is 503.
        timeout_s: Seconds after SIGTERM until requests still running are ended (long
            generations: up to 600).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    delay_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    timeout_s: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)

    @model_validator(mode="after")
    def _delay_within_timeout(self) -> DrainSettings:
        if self.delay_s > self.timeout_s:
            raise ValueError(
                f"delay_s ({self.delay_s:g}) must not exceed timeout_s ({self.timeout_s:g})"
            )
        return self


class ShuttingDown(ServiceUnavailable):
    """The gateway is shutting down: the request was ended at the drain deadline."""

    code = "gateway_shutting_down"


class Drain:
    """Whether the process is draining, and the relay requests still running.

    Args:
        settings: The ``drain:`` section.
    """

    def __init__(self, settings: DrainSettings) -> None:
        self.settings = settings
        self.draining = False
        self._running: set[asyncio.Task[object]] = set()
        self._cut: set[asyncio.Task[object]] = set()
        self._track = _Track(self._running)

    def begin(self) -> None:
        """Start draining (``/readyz`` turns 503)."""
        self.draining = True

    @property
    def running(self) -> int:
        """Relay requests in flight."""
        return len(self._running)

    def track(self) -> _Track:
        """Register the current task as a relay request in flight for a ``with`` block."""
        return self._track

    def cut_open(self) -> int:
        """Cancel every relay request still running (the drain deadline).

        Returns:
            How many were cancelled.
        """
        tasks = [t for t in self._running if not t.done()]
        for task in tasks:
            self._cut.add(task)
            task.cancel(msg="gateway shutting down")
        return len(tasks)

    def was_cut(self, task: asyncio.Task[object] | None) -> bool:
        """Whether ``task`` was cancelled by :meth:`cut_open`."""
        return task is not None and task in self._cut


class _Track:
    """The context manager of :meth:`Drain.track`: one per drain, shared by all requests (each
    block adds and removes its own task, the current one on entry and on exit)."""

    __slots__ = ("_running",)

    def __init__(self, running: set[asyncio.Task[object]]) -> None:
        self._running = running

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.discard(task)  # ``_cut`` keeps it: the caller asks was_cut() next
