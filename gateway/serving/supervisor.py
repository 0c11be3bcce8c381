"""``gateway serve --workers N``: N worker processes serving one listening socket.

The supervisor (the process started, PID 1 in the container) binds ``listen.host:port`` once
and starts N workers with the ``spawn`` start method: each worker is a fresh interpreter that
runs exactly what one ``gateway serve`` process runs (the process egress guard installed and
self-tested first, the assembly, the drain) on the socket it inherited (the worker's side:
:mod:`gateway.serving.worker`). The kernel hands each new connection to one worker's ``accept``. The
supervisor serves no client request.

Per worker:

* **audit**: its own hash chain; its replica id is ``<audit.replica_id>-w<index>``, so a
  restarted worker's chain names the previous chain of the same worker
  (``gateway audit verify`` checks every chain and link as for separate gateways);
* **state shared by the pod**: managed keys and revocations are read from the key store
  (SQLite/PostgreSQL, polled every ``keystore.refresh_s`` by each worker), quotas must live in
  Redis: :func:`check_workers` refuses to start ``quotas.backend: memory`` (each worker would
  admit the whole limit) and a ``sqlite:///:memory:`` store, naming the setting;
* **per worker, by design**: replica health and in-flight counts, the prefix index of
  ``prefix_affinity`` (as with several pods), ``limits.max_client_connections`` and
  ``limits.max_upstream_connections`` (the pod allows N times as many);
* **flow control**: each worker keeps its own queues and in-flight counts and enforces its share
  of every ``in_flight`` threshold (``T // N``, one more for the first ``T % N`` workers: the
  shares add up to ``T``); :func:`check_workers` refuses a threshold below N (a worker's share
  would be 0). See :meth:`gateway.flow.settings.FlowControlSettings.limits`;
* **metrics**: each worker serves its admin routes on a Unix socket in a private directory;
  the supervisor serves ``telemetry.admin`` and merges every worker's ``/metrics`` per scrape
  (:mod:`gateway.telemetry.pod`).

Signals: the first SIGTERM or SIGINT is forwarded as SIGTERM to every worker (each drains as
one process does: ``/readyz`` 503, accepting for ``drain.delay_s``, streams end by
``drain.timeout_s``, audit chain sealed); the supervisor closes its copy of the listener,
waits for every worker and exits 0 when each drained cleanly (``gateway serve`` then exits 130
if it was SIGINT: a Ctrl-C never reads as success). A second SIGTERM or SIGINT is
forwarded again: the workers stop at once. SIGHUP is forwarded to every worker (each reloads
in process). Workers ignore SIGINT (a Ctrl-C reaches the whole process group; the supervisor's
forwarded SIGTERM counts once) and begin draining if the supervisor dies.

A worker that exits while the pod serves is restarted with the same index, with one warning
line naming its pid and exit status (``sg_gateway_worker_restarts_total`` counts them), from
the configuration the last applied live reload loaded (each worker reports it on its pipe), so
a key a reload removed stays removed on it. The configuration is checked as a worker checks it
before anything is bound (:func:`check_assembly`, :func:`check_workers`, in
:mod:`gateway.serving.workers_check`): an invalid one is
refused with its ``file:line: key: problem`` as by one process, no port bound. A worker that
exits before it started serving (at start or after a restart: guard self-test, store
unreachable, a file the configuration names that changed, port trouble) stops the pod: the
other workers drain and the supervisor exits with status 3, so the orchestrator's restart
back-off applies instead of a restart loop inside the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clishell import CliError
from gateway.config.settings import GatewaySettings
from gateway.logs import configure_logging
from gateway.serving.drain import SHUTDOWN_MARGIN_S
from gateway.serving.hangup import HangupLatch
from gateway.serving.server import LISTEN_BACKLOG
from gateway.serving.worker import Adjust, WorkerSlot, worker_main
from gateway.serving.workers_check import check_assembly, check_workers

__all__ = ["STARTUP_FAILURE", "Supervisor", "serve_workers"]

_log = logging.getLogger(__name__)

STARTUP_FAILURE = 3
"""Exit status when a worker did not start (as one process: ``uvicorn.main.STARTUP_FAILURE``)."""



def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass
class _Worker:
    index: int
    process: Any  # multiprocessing.context.SpawnProcess
    conn: Connection
    ready: bool = False
    pid: int = 0
    hup_owed: bool = False  # a SIGHUP came before the worker served: sent once it serves
    exitcode: int | None = field(default=None)


class Supervisor:
    """Starts, watches and stops the workers (see module docstring).

    Args:
        settings: The validated settings (checked by :func:`check_workers`).
        base: Directory of the config file.
        workers: Number of worker processes (>= 2).
        config: The config file each worker reloads live on SIGHUP (``None``: no reload).
        adjust: The command line's overrides applied to each reloaded configuration
            (picklable, e.g. :class:`gateway.serving.run.ListenOverrides`).
    """

    def __init__(
        self, settings: GatewaySettings, base: Path | None, workers: int, *,
        config: Path | None = None, adjust: Adjust | None = None,
    ) -> None:
        self.settings = settings
        self.base = base
        self.config = config
        self.adjust = adjust
        self.count = workers
        self.restarts = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._listener: socket.socket | None = None
        self._dir = ""
        self._draining = False
        self._failed: str | None = None  # why a worker did not start: the pod stops
        self.stopped_by: int | None = None  # the first signal that stopped the pod
        self._all_ready = False
        self._done: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- processes ---------------------------------------------------------------------

    def _admin_path(self, index: int) -> str | None:
        return os.path.join(self._dir, f"worker-{index}.sock") if self._admin_on else None

    @property
    def _admin_on(self) -> bool:
        t = self.settings.telemetry
        return t is not None and t.enabled

    def _spawn(self, index: int) -> None:
        assert self._listener is not None and self._loop is not None
        parent_end, child_end = self._ctx.Pipe(duplex=False)
        slot = WorkerSlot(index, self.count, self._listener, child_end,
                          self._admin_path(index))
        proc = self._ctx.Process(target=worker_main, args=(self.settings, self.base, slot,
                                                                self.config, self.adjust),
                                 name=f"gateway-worker-{index}")
        proc.start()
        child_end.close()
        w = _Worker(index, proc, parent_end, pid=proc.pid or 0)
        self._workers[index] = w
        self._loop.add_reader(parent_end.fileno(), self._on_message, w)
        self._loop.add_reader(proc.sentinel, self._on_exit, w)
        _log.info("worker %d started (pid %d)", index, w.pid)

    def _on_message(self, w: _Worker) -> None:
        assert self._loop is not None
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._loop.remove_reader(w.conn.fileno())
            return
        self._handle(w, msg)

    def _handle(self, w: _Worker, msg: object) -> None:
        if not isinstance(msg, tuple) or not msg:
            return
        if msg[0] == "settings" and isinstance(msg[1], GatewaySettings):
            self.settings = msg[1]  # a live reload applied: what a restarted worker starts from
        elif msg[0] == "ready":
            w.ready = True
            if w.hup_owed:  # it loaded the config before that SIGHUP: reload it now
                w.hup_owed = False
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGHUP)
            if not self._all_ready and all(x.ready for x in self._workers.values()):
                self._all_ready = True
                _log.info("%d workers serving on %s:%s", self.count,
                          self.settings.listen.host, self.settings.listen.port)

    def _on_exit(self, w: _Worker) -> None:
        assert self._loop is not None and self._done is not None
        self._loop.remove_reader(w.process.sentinel)
        if not w.conn.closed:
            with contextlib.suppress(EOFError, OSError):
                while w.conn.poll():  # messages not read yet ("ready", "settings")
                    self._handle(w, w.conn.recv())
            self._loop.remove_reader(w.conn.fileno())
            w.conn.close()
        w.process.join()
        w.exitcode = w.process.exitcode
        status = _describe(w.exitcode)
        if self._draining or self._failed:
            _log.info("worker %d (pid %d) exited: %s", w.index, w.pid, status)
        elif not w.ready:
            self._failed = f"worker {w.index} (pid {w.pid}) exited before it served ({status})"
            _log.error("%s: stopping the pod", self._failed)
            self._begin_stop(None)
        else:
            self.restarts += 1
            _log.warning("worker %d (pid %d) exited unexpectedly (%s): restarting it",
                         w.index, w.pid, status)
            del self._workers[w.index]
            self._spawn(w.index)
            # It starts from the settings of the last reload a worker applied (or start-up's);
            # the file may have changed since, so it reloads once it serves (a no-change
            # reload when not).
            self._workers[w.index].hup_owed = self.config is not None
            return
        if all(x.exitcode is not None for x in self._workers.values()):
            self._done.set()

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers.values() if w.exitcode is None]

    def _signal_all(self, sig: int) -> None:
        for w in self._live():
            try:
                os.kill(w.pid, sig)
            except ProcessLookupError:
                pass

    # --- signals -----------------------------------------------------------------------

    def _begin_stop(self, sig: int | None) -> None:
        assert self._loop is not None
        if self.stopped_by is None and sig is not None:
            self.stopped_by = sig
        if self._draining:
            _log.warning("second %s: stopping the workers at once",
                         signal.Signals(sig).name if sig else "stop")
            self._signal_all(signal.SIGTERM)
            return
        self._draining = True
        if sig is not None:
            _log.info("%s: draining %d worker(s)", signal.Signals(sig).name, len(self._live()))
        if self._listener is not None:  # the workers hold their own copies until they close
            self._listener.close()
            self._listener = None
        self._signal_all(signal.SIGTERM)
        backstop = self.settings.drain.timeout_s + 3 * SHUTDOWN_MARGIN_S
        self._loop.call_later(backstop, self._kill_remaining)

    def _kill_remaining(self) -> None:
        for w in self._live():
            _log.error("worker %d (pid %d) still running after the drain: killed", w.index,
                       w.pid)
            os.kill(w.pid, signal.SIGKILL)

    def _forward_hup(self) -> None:
        """SIGHUP to every serving worker; a worker still starting gets it once it serves
        (before, it would end it or be lost: it may have read the config file already)."""
        live = self._live()
        for w in live:
            if w.ready:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGHUP)
            else:
                w.hup_owed = True
        _log.info("SIGHUP: forwarded to %d worker(s)", len(live))

    # --- run ---------------------------------------------------------------------------

    async def _main(self) -> int:
        from gateway.telemetry.pod import PodAdminServer, WorkerEndpoint

        self._loop = loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._begin_stop, sig)
        held = HangupLatch.install()  # `gateway serve` held SIGHUP since it started
        loop.add_signal_handler(signal.SIGHUP, self._forward_hup)
        listen = self.settings.listen
        self._listener = _bind(listen.host, listen.port)
        self._dir = tempfile.mkdtemp(prefix="sg-workers-")
        admin: PodAdminServer | None = None
        if self._admin_on:
            assert self.settings.telemetry is not None
            a = self.settings.telemetry.admin

            def endpoints() -> list[WorkerEndpoint]:
                return [WorkerEndpoint(w.index, w.pid, p) for w in self._live()
                        if w.ready and (p := self._admin_path(w.index)) is not None]

            admin = PodAdminServer(a.host, a.port, endpoints, lambda: self.restarts)
        try:
            if admin is not None:
                await admin.start()
            for index in range(self.count):
                self._spawn(index)
            if held.take():  # the workers load the file now: their reload is owed all the same
                self._forward_hup()
            await self._done.wait()
        finally:
            if admin is not None:
                await admin.stop()
            if self._listener is not None:
                self._listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
        if self._failed:
            return STARTUP_FAILURE
        # A worker still starting when the drain began ends by the SIGTERM: not a failure.
        bad = [w for w in self._workers.values() if w.exitcode != 0
               and not (not w.ready and w.exitcode == -signal.SIGTERM)]
        for w in bad:
            _log.error("worker %d (pid %d) did not drain cleanly: %s", w.index, w.pid,
                       _describe(w.exitcode))
        return 1 if bad else 0

    def run(self) -> int:
        """Serve until stopped.

        Returns:
            The exit status: 0 after a clean drain of every worker, 3 when a worker did not
            start, 1 when a worker did not drain cleanly.
        """
        return asyncio.run(self._main())


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def serve_workers(
    settings: GatewaySettings, base: Path | None, workers: int, *,
    config: Path | None = None, adjust: Adjust | None = None,
) -> tuple[int, int | None]:
    """Run ``workers`` worker processes on ``settings.listen`` until stopped.

    Args:
        settings: The validated settings.
        base: Directory of the config file (relative paths).
        workers: Number of worker processes (>= 2).
        config: The config file each worker reloads live on SIGHUP (``None``: no reload).
        adjust: The overrides applied to each reloaded configuration (picklable).

    Returns:
        The exit status (see :meth:`Supervisor.run`) and the signal that stopped the pod
        (``signal.SIGTERM``, ``signal.SIGINT`` or None).

    Raises:
        InvalidConfig: The configuration is one a worker would refuse (:func:`check_assembly`)
            or a setting keeps pod-wide state in one process (:func:`check_workers`); raised
            before the listen or admin port is bound or a worker started.
        CliError: ``startup_failed`` (exit status :data:`STARTUP_FAILURE`) when the pod did
            not start: the listen or admin port could not be bound, or a worker exited before
            it served; the message names which, as ``gateway serve`` without workers does.
    """
    # Every check a worker makes of the file, before the port is bound: a refused start never
    # accepts a connection, and a port in use does not hide the config's problem.
    check_assembly(settings, base)
    check_workers(settings, workers)
    configure_logging(settings.logging)
    supervisor = Supervisor(settings, base, workers, config=config, adjust=adjust)
    try:
        status = supervisor.run()
    except OSError as exc:  # the listen or admin port
        reason: str | None = str(exc)
    else:
        reason = supervisor._failed if status == STARTUP_FAILURE else None
    if reason is None:
        return status, supervisor.stopped_by
    hint = ("the worker's error line above says why" if supervisor._failed else
            "a port in use is listen.port or telemetry.admin.port; the log lines above have "
            "the details")
    raise CliError("startup_failed", f"the gateway did not start: {reason}", hint=hint,
                   exit_code=STARTUP_FAILURE)
