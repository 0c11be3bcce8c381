"""``gateway serve --config FILE``: parse the command line and run the gateway in the foreground
(:func:`gateway.serving.run.run`; ``--workers N``:
:func:`gateway.serving.supervisor.serve_workers`).

Signals: before it serves (reading the config, the guard's self-test, the assembly) SIGINT and
SIGTERM stop it with 130 / 143 and the one error line (:func:`clishell.run`). While it serves
both drain (:mod:`gateway.serving.drain`); after the drain it exits 0 when SIGTERM stopped it (the
documented stop of an orchestrator) and 130 with the error line when SIGINT did, so that a
Ctrl-C never reads as success. ``--workers N``: the same, by the supervisor.
"""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from clishell import ConfigOpt, Interrupted, require_config
from gateway.config.loader import load
from gateway.serving.hangup import HangupLatch
from gateway.serving.run import ListenOverrides, run

__all__ = ["serve"]


def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Override listen.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Override listen.port.")] = None,
    workers: Annotated[int, typer.Option(
        min=1, envvar="SG_WORKERS",
        help="Worker processes serving the one port (the chart: the CPU limit). More than 1 "
             "needs shared quota state (quotas.backend: redis).")] = 1,
) -> None:
    """Run the gateway from one YAML config file (fails at start if the file is invalid).

    SIGTERM drains and exits 0; SIGINT (Ctrl-C) drains and exits 130; SIGHUP reloads the file
    live (an invalid or restart-only change is refused whole and the running configuration
    stays).

    Exit codes: 0 stopped by SIGTERM after its drain; 2 the config or a command-line value is
    invalid or unreadable; 3 the gateway could not start serving (a port in use, an audit
    store that cannot be opened: the last line says which); 130 stopped by SIGINT.
    """

    file = require_config(config)
    # Before the file is read: a SIGHUP from now on is held and reloads once serving (the
    # default disposition would end the process, ignoring it would lose the reload).
    HangupLatch.install()
    adjust = ListenOverrides(host, port)
    settings = adjust(load(file, os.environ))
    if workers > 1:
        from gateway.serving.supervisor import serve_workers

        status, stopped_by = serve_workers(settings, file.parent, workers, config=file,
                                           adjust=adjust)
        if status == 0:
            _after_drain(stopped_by)
        raise typer.Exit(status)
    _after_drain(run(settings, file.parent, config=file, adjust=adjust))


def _after_drain(stopped_by: int | None) -> None:
    """A drain that SIGINT began ends as an interrupted command (exit 130, one error line)."""
    if stopped_by == signal.SIGINT:
        raise Interrupted(signal.SIGINT, "interrupted by SIGINT; the gateway stopped (after its "
                          "drain, or at once on a second signal)",
                          hint="stop it with SIGTERM for a clean stop (exit 0)")
