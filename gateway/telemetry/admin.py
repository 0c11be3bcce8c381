"""The admin HTTP server: Prometheus ``/metrics`` on its own port (never the client port).

Runs on the gateway's event loop (aiohttp's server), started and stopped with the app's
lifespan. ``GET /metrics`` answers the Prometheus text format (0.0.4); ``GET /healthz`` 200.
``GET /status`` answers the JSON of the status source given with :meth:`AdminServer.set_status`
(the facts ``gateway preflight`` checks: revisions, guard, audit store; see
:mod:`gateway.preflight.status`) plus ``loop``, the class of the event loop serving it, and
``pid``; 404 without a source.

A worker of ``gateway serve --workers N`` serves the same routes on a Unix socket only its
supervisor reads (:meth:`AdminServer.listen_unix`); the supervisor serves the configured port
for the whole pod (:mod:`gateway.telemetry.pod`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["AdminServer", "StatusSource"]

#: Returns the JSON-serialisable status of the gateway (called per ``GET /status``).
StatusSource = Callable[[], Awaitable[Mapping[str, Any]]]

_log = logging.getLogger(__name__)


class AdminServer:
    """Serves ``registry`` on ``host:port`` (port 0: any free port, see :attr:`port`).

    Args:
        host: Listen address.
        port: Listen port.
        registry: What ``/metrics`` renders.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.host = host
        self.port = port
        self._registry = registry
        self._runner: web.AppRunner | None = None
        self._status: StatusSource | None = None
        self.unix_path: str | None = None

    def listen_unix(self, path: str) -> None:
        """Listen on the Unix socket ``path`` instead of ``host:port`` (call before
        :meth:`start`)."""
        self.unix_path = path

    def set_status(self, source: StatusSource) -> None:
        """Serve ``source()`` on ``GET /status`` (replaces an earlier source)."""
        self._status = source

    async def _status_json(self, _: web.Request) -> web.Response:
        if self._status is None:
            return web.json_response({"error": "no status source"}, status=404)
        loop = type(asyncio.get_running_loop())
        body = {**(await self._status()), "loop": f"{loop.__module__}.{loop.__qualname__}",
                "pid": os.getpid()}
        return web.json_response(body)

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def start(self) -> None:
        """Listen (idempotent).

        Raises:
            OSError: The port is taken (the gateway then refuses to start).
        """
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status_json)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site: web.BaseSite
        if self.unix_path is not None:
            site = web.UnixSite(runner, self.unix_path)
        else:
            site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.unix_path is not None:
            _log.debug("worker admin server on %s", self.unix_path)
            return
        addresses = runner.addresses  # the bound port when configured as 0
        if addresses:
            self.port = int(addresses[0][1])
        _log.info("admin server (/metrics) on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening (idempotent)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
