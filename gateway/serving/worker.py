"""The worker side of ``gateway serve --workers N``: what one worker process is given and runs.

The supervisor (:mod:`gateway.serving.supervisor`) starts each worker with the ``spawn`` start
method as
:func:`worker_main` with a :class:`WorkerSlot`: a fresh interpreter that runs exactly what one
``gateway serve`` process runs (:func:`gateway.serving.run.run`: the process egress guard
installed and self-tested first, the assembly, the drain) on the listening socket it inherited,
with its own audit replica id (:func:`worker_replica_id`), and reports on a pipe once it serves.

Signals in a worker: SIGINT is ignored (a Ctrl-C reaches the whole process group; the
supervisor forwards it once, as SIGTERM); SIGTERM drains as one process does; SIGHUP is held
until serving and then reloads the configuration in process. A worker whose supervisor is gone
(killed) drains on its own.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from gateway.config.settings import GatewaySettings
from gateway.errors import GatewayError
from gateway.serving.hangup import HangupLatch

__all__ = ["Adjust", "WorkerSlot", "worker_main", "worker_replica_id"]

_log = logging.getLogger(__name__)

Adjust = Callable[[GatewaySettings], GatewaySettings]
"""The command line's overrides of a loaded configuration
(see :class:`gateway.serving.run.ListenOverrides`)."""


def worker_replica_id(replica_id: str, index: int) -> str:
    """The audit replica id of worker ``index``: ``<replica_id>-w<index>`` (63 chars at most).

    Args:
        replica_id: ``audit.replica_id``.
        index: Worker index, 0-based.
    """
    suffix = f"-w{index}"
    return replica_id[: 63 - len(suffix)] + suffix


@dataclass
class WorkerSlot:
    """What a worker process is given by its supervisor (pickled to the spawned process).

    Attributes:
        index: Worker index (0..N-1); a restarted worker keeps its index.
        workers: N, the number of workers.
        listener: The listening socket (inherited).
        ready: Write end of the pipe on which the worker reports that it serves, and each
            configuration a live reload applied.
        admin_path: Unix socket for the worker's admin routes (``None`` without telemetry).
    """

    index: int
    workers: int
    listener: socket.socket
    ready: Connection
    admin_path: str | None

    def settings_for(self, settings: GatewaySettings) -> GatewaySettings:
        """``settings`` as this worker runs them: its audit replica id (see
        :func:`worker_replica_id`) and its share of the flow-control ``in_flight`` thresholds
        (see :meth:`gateway.flow.settings.FlowControlSettings.for_worker`)."""
        update: dict[str, object] = {
            "flow_control": settings.flow_control.for_worker(self.index, self.workers)}
        if settings.audit is not None:
            update["audit"] = settings.audit.model_copy(
                update={"replica_id": worker_replica_id(settings.audit.replica_id, self.index)})
        return settings.model_copy(update=update)  # keeps the file:line map

    def started(self) -> None:
        """Tell the supervisor this worker serves (called once by the server)."""
        self.ready.send(("ready", os.getpid()))

    def applied(self, settings: GatewaySettings) -> None:
        """Tell the supervisor the configuration a live reload applied in this worker.

        Args:
            settings: As loaded, before :meth:`settings_for`: the supervisor restarts a worker
                that exits with the last of these, not with the start-up configuration (which
                may grant keys removed since).
        """
        with contextlib.suppress(OSError):  # the supervisor is gone: this worker drains
            self.ready.send(("settings", settings))


def _watch_parent() -> None:
    """Drain (SIGTERM to self) when the supervisor is gone (it was killed)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        _log.warning("supervisor gone: draining")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="sg-supervisor-watch", daemon=True).start()


def worker_main(settings: GatewaySettings, base: Path | None, slot: WorkerSlot,
                config: Path | None, adjust: Adjust | None) -> None:
    """The target of a worker process: serve ``settings`` on ``slot.listener`` until stopped.

    Args:
        settings: The settings the supervisor loaded (this worker's replica id is applied).
        base: Directory of the config file (relative paths).
        slot: The worker's index, listener, ready pipe and admin socket.
        config: The config file reloaded on SIGHUP (``None``: no reload).
        adjust: The command line's overrides, applied to each reloaded configuration.

    Raises:
        SystemExit: 2 after a :class:`~gateway.errors.GatewayError` (printed as the one error
            line, naming the worker); 3 when the server did not start.
    """
    # The supervisor forwards SIGINT as SIGTERM; a SIGHUP is held until the in-process reload
    # (gateway.serving.reload) handles it once serving (the default would end the worker).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    HangupLatch.install()
    _watch_parent()
    from clishell import CliError, error_line
    from gateway.serving.run import run

    try:
        run(settings, base, worker=slot, config=config, adjust=adjust)
    except GatewayError as exc:  # one line per problem of an invalid configuration
        lines = [line for line in exc.message.splitlines() if line.strip()] or [exc.message]
        print("\n".join(error_line("gateway", exc.code, f"worker {slot.index}: {line}")
                        for line in lines), file=sys.stderr)
        sys.exit(2)
    except CliError as exc:  # startup_failed (exit 3): one line, not a traceback
        print(error_line("gateway", exc.code, f"worker {slot.index}: {exc.message}"),
              file=sys.stderr)
        sys.exit(exc.exit_code)
