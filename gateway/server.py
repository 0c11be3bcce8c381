"""Running the ASGI app under uvicorn for ``gateway serve``, with the process tuning applied.

``uvicorn.run`` is replaced by :func:`run_server` so that the start and the end of serving are
named steps: once the lifespan start-up finished (state built, pools open, audit chain opened),
the heap that lives as long as the process is frozen out of the garbage collector
(:mod:`gateway.runtime_tuning`); on SIGTERM or SIGINT the server drains (:mod:`gateway.drain`)
and :func:`run_server` returns the signal that stopped it (``gateway serve`` then exits 0 after
SIGTERM, an orchestrator's normal stop, and 130 after SIGINT, so that a Ctrl-C never reads as
success); on SIGHUP it reloads its configuration (:mod:`gateway.reload`) without closing a
connection.

A worker of ``gateway serve --workers N`` (:mod:`gateway.supervisor`) runs the same server on the
listening socket it inherited from the supervisor, tells the supervisor when it started, and
ignores SIGINT: the supervisor forwards the signals it receives (a Ctrl-C reaches the whole
process group, and a worker must count it once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from clishell import CliError
from gateway.drain import Drain
from gateway.hangup import HangupLatch
from gateway.runtime_tuning import freeze_startup_heap, tune_gc

if TYPE_CHECKING:
    from gateway.reload import Reloader

_log = logging.getLogger(__name__)

FINAL_WRITE_S = 1.0
"""Seconds after the drain deadline that a cut request has to write its final event; its
connection is then closed (a client that does not read would hold the shutdown)."""

LISTEN_BACKLOG = 2048
"""Connections the kernel queues on a listening socket before it refuses more (uvicorn's
default ``backlog``; the supervisor of ``--workers N`` binds with it too)."""

ACCEPTS_PER_WAKEUP = 1
"""Connections the event loop accepts each time a listening socket is ready (nginx's default,
``multi_accept off``). asyncio accepts up to the server's ``backlog`` per readiness, and
uvicorn passes 2048: a burst of new streams was then accepted, parsed and started phase by
phase for every connection before any of them reached its replica, so the first token of each
waited for the whole burst's CPU. One per wake-up interleaves accepting with the work of the
connections already in (burst TTFT p50 down by a quarter to a third, docs/benchmarks.md); the
listening socket stays readable, so the next loop iteration accepts the next one."""

__all__ = ["ACCEPTS_PER_WAKEUP", "FINAL_WRITE_S", "LISTEN_BACKLOG", "STARTUP_FAILURE",
           "GatewayServer", "run_server"]

STARTUP_FAILURE = 3
"""Exit status when the server did not start (same as ``uvicorn.main.STARTUP_FAILURE``)."""


class GatewayServer(uvicorn.Server):
    """uvicorn's server: freezes the start-up heap once started; drains on SIGTERM; reloads
    on SIGHUP.

    Args:
        config: The uvicorn configuration.
        drain: The drain state shared with the app (``/readyz``, the relay); ``None``: stop
            as uvicorn does.
        reloader: Reloads the configuration on SIGHUP (``None``: SIGHUP keeps its default).
        on_started: Called once serving started (a worker tells its supervisor).
        ignore_sigint: Ignore SIGINT (a worker: its supervisor forwards SIGINT as SIGTERM).
    """

    def __init__(
        self, config: uvicorn.Config, drain: Drain | None = None,
        reloader: Reloader | None = None, *,
        on_started: Callable[[], None] | None = None,
        ignore_sigint: bool = False,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.reloader = reloader
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_started = on_started
        self._ignore_sigint = ignore_sigint
        self.stopped_by: int | None = None  # the first signal that stopped the server

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, accepting :data:`ACCEPTS_PER_WAKEUP` connections per
        readiness of the listening socket with a kernel queue of :data:`LISTEN_BACKLOG`; then
        :func:`freeze_startup_heap` (only when started) and handle SIGHUP (a reload on the
        event loop)."""
        self._loop = asyncio.get_running_loop()
        # asyncio uses the server's backlog both for listen() and as the number of accepts per
        # readiness: create the servers with the accept count, then listen() again with the
        # kernel queue (Linux updates the backlog of a listening socket in place).
        self.config.backlog = ACCEPTS_PER_WAKEUP
        await super().startup(sockets=sockets)
        for server in getattr(self, "servers", []):
            for listening in server.sockets:
                _listen(listening, LISTEN_BACKLOG)
        if self.started:
            freeze_startup_heap()
            if self.reloader is not None:
                held = HangupLatch.install()  # the handler until now: read after replacing it
                self._loop.add_signal_handler(signal.SIGHUP, self.reloader.trigger, "signal")
                if held.take():  # a SIGHUP came while starting: reload now
                    self.reloader.trigger("signal")
            if self._on_started is not None:
                self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: begin the drain; a second one: stop at once.

        The signal is not re-raised after shutdown (uvicorn would, ending the process by the
        signal): a completed drain exits 0.
        """
        if sig == signal.SIGINT and self._ignore_sigint:
            return
        if self.stopped_by is None:
            self.stopped_by = sig
        drain, loop = self.drain, self._loop
        if drain is None or loop is None:  # no drain, or not started yet: stop as uvicorn does
            self.force_exit = self.should_exit
            self.should_exit = True
            return
        if drain.draining:
            _log.warning("second %s: stopping at once", signal.Signals(sig).name)
            self.force_exit = self.should_exit = True
            return
        drain.begin()
        cfg = drain.settings
        _log.info("%s: draining (readyz 503; accepting for %g s; requests end within %g s)",
                  signal.Signals(sig).name, cfg.delay_s, cfg.timeout_s)
        loop.call_soon_threadsafe(loop.call_later, cfg.delay_s, self._stop_accepting)
        loop.call_soon_threadsafe(loop.call_later, cfg.timeout_s, self._deadline)

    def _stop_accepting(self) -> None:
        self.should_exit = True  # uvicorn's main loop closes the listener and idle connections

    def _deadline(self) -> None:
        assert self.drain is not None and self._loop is not None
        cut = self.drain.cut_open()
        if cut:
            _log.warning("drain deadline: %d request(s) still running ended", cut)
        self._loop.call_later(FINAL_WRITE_S, self._abort_stuck)

    def _abort_stuck(self) -> None:
        """Close the connections still open :data:`FINAL_WRITE_S` after the drain deadline.

        A request cut at the deadline writes its final event; to a client that stopped reading,
        that write waits for ever. Closing the connection ends the write (and the request), so
        the lifespan shutdown (the audit chain sealed) runs before the orchestrator's SIGKILL.
        """
        stuck = [c for c in self.server_state.connections if c.transport is not None]
        for connection in stuck:
            connection.transport.abort()
        if stuck:
            _log.warning("drain deadline: %d connection(s) whose client did not read the end "
                         "of its response closed", len(stuck))


def _listen(listening: socket.socket, backlog: int) -> None:
    """``listen(backlog)`` on a serving socket (asyncio hands out a wrapper without
    ``listen``: a duplicate of its descriptor is the same socket)."""
    dup = socket.socket(listening.family, listening.type, listening.proto,
                        fileno=os.dup(listening.fileno()))
    try:
        dup.listen(backlog)
    finally:
        dup.close()


def run_server(
    config: uvicorn.Config, drain: Drain | None = None, reloader: Reloader | None = None, *,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
) -> int | None:
    """Serve ``config`` in the foreground until a signal stops it.

    Args:
        config: The uvicorn configuration (one process; no reload). With ``drain``, its
            ``timeout_graceful_shutdown`` is set past the drain deadline.
        drain: Drain on SIGTERM (see :mod:`gateway.drain`).
        reloader: Reload on SIGHUP (see :mod:`gateway.reload`); a SIGHUP that comes before
            the server started is held (:class:`gateway.hangup.HangupLatch`) and reloads once
            serving.
        sockets: Serve on these listening sockets (a worker: the supervisor's) instead of
            binding ``config.host:config.port``; SIGINT is then ignored (see module docstring).
        on_started: Called once serving started.

    Returns:
        The signal that stopped the server (``signal.SIGTERM``, ``signal.SIGINT``), or None
        when it stopped for another reason.

    Raises:
        CliError: ``startup_failed`` with exit status :data:`STARTUP_FAILURE` when the server
            did not start (a port in use, a lifespan start-up error such as the audit store),
            naming the reason uvicorn logged, so the CLI's last line says why.
    """
    tune_gc()
    if drain is not None:
        # uvicorn's own cut (tasks cancelled, no final event) only as a backstop after ours,
        # and early enough for the lifespan shutdown within SHUTDOWN_MARGIN_S: its wait starts
        # when the listener closes, delay_s after the signal.
        cfg = drain.settings
        config.timeout_graceful_shutdown = math.ceil(
            cfg.timeout_s - cfg.delay_s + FINAL_WRITE_S + 1.0)
    if reloader is not None:
        HangupLatch.install()  # held until startup() handles it
    server = GatewayServer(config, drain, reloader, on_started=on_started,
                           ignore_sigint=sockets is not None)
    reasons = _StartupErrors()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(reasons)
    try:
        server.run(sockets=sockets)
    except SystemExit as exc:
        if exc.code != STARTUP_FAILURE or server.started:
            raise
    finally:
        uvicorn_log.removeHandler(reasons)
    if not server.started:
        reason = reasons.reason()
        raise CliError(
            "startup_failed",
            f"the gateway did not start: {reason or 'see the log lines above'}",
            hint=startup_hint(reason), exit_code=STARTUP_FAILURE)
    return server.stopped_by


def startup_hint(reason: str | None) -> str:
    """The hint of a start-up failure: which setting a port in use is, else where to look."""
    if reason is None or "address already in use" in reason or "attempting to bind" in reason:
        return ("a port in use is listen.port or telemetry.admin.port; the log lines above "
                "have the details")
    return ("fix what it names and start again (`gateway check-config` checks the config "
            "file); the log lines above have the details")


class _StartupErrors(logging.Handler):
    """Keeps why uvicorn did not start: its error records, as one line each (the exception
    line of a logged traceback)."""

    _DONE = "Application startup failed. Exiting."

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text = f"{type(exc).__name__}: {exc}"
        else:
            lines = [line.strip() for line in record.getMessage().strip().splitlines()]
            text = lines[-1] if lines else ""
        if text and text != self._DONE:
            self.reasons.append(text)

    def reason(self) -> str | None:
        """The first reason recorded, or ``None``."""
        return self.reasons[0] if self.reasons else None
