"""Running the ASGI app under uvicorn for ``gateway serve``, with the process tuning applied.

``uvicorn.run`` is replaced by :func:`run_server` so that the start of serving is a named step:
once the lifespan start-up finished (state built, pools open, audit chain opened), the heap that
lives as long as the process is frozen out of the garbage collector
(:mod:`gateway.runtime_tuning`).
"""

from __future__ import annotations

import socket
import sys

import uvicorn

from gateway.runtime_tuning import freeze_startup_heap, tune_gc

__all__ = ["STARTUP_FAILURE", "GatewayServer", "run_server"]

STARTUP_FAILURE = 3
"""Exit status when the server did not start (same as ``uvicorn.main.STARTUP_FAILURE``)."""


class GatewayServer(uvicorn.Server):
    """uvicorn's server, freezing the start-up heap once start-up succeeded."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then :func:`freeze_startup_heap` (only when started)."""
        await super().startup(sockets=sockets)
        if self.started:
            freeze_startup_heap()


def run_server(config: uvicorn.Config) -> None:
    """Serve ``config`` in the foreground until a signal stops it.

    Args:
        config: The uvicorn configuration (one process; no reload).

    Raises:
        SystemExit: With :data:`STARTUP_FAILURE` when the server did not start (as
            ``uvicorn.run`` does).
    """
    tune_gc()
    server = GatewayServer(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
