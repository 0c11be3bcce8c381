"""Active health checking: periodic ``GET /health`` on every replica (vLLM answers 200 when ready).

Passive health (ejection on failures) lives in :mod:`gateway.routing`; this module only runs the
probe loop and reports into :meth:`gateway.routing.Replica.mark_probe`.
"""

from __future__ import annotations

import asyncio
import logging
from ssl import SSLContext

import aiohttp

from gateway.fleet.model_settings import HealthSettings
from gateway.relay.upstream import USER_AGENT
from gateway.routing import Replica, Router
from gateway.serving.periodic import Periodic

__all__ = ["MAX_PROBE_BODY", "HealthProber", "connect_timeout", "probe"]

_log = logging.getLogger(__name__)

MAX_PROBE_BODY = 64 * 1024
"""Bytes of a probe's answer read at most (the body is not used; a longer one is not read on,
the connection is dropped)."""


def connect_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """A request's aiohttp timeout that limits only the connect, to ``connect_s`` seconds.

    Given per request (the session's own timeout is fixed at start), so that a live reload of
    ``timeouts.connect_s`` reaches the probes and scrapes made on the app's session.
    """
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s,
                                 sock_read=None)


async def probe(
    session: aiohttp.ClientSession,
    replica: Replica,
    settings: HealthSettings,
    ssl: SSLContext | bool = True,
    *,
    connect_s: float | None = None,
) -> bool:
    """Probe one replica once.

    Args:
        session: The app's upstream session.
        replica: The replica to probe.
        settings: ``health`` settings (``path``, ``timeout_s``).
        ssl: ``ssl`` argument for ``https://`` replicas.
        connect_s: Connect timeout, seconds (``timeouts.connect_s`` as now in force); ``None``:
            the session's.

    Returns:
        True when ``GET {url}{path}`` answered 200 within ``settings.timeout_s`` seconds.
    """
    headers = {"user-agent": USER_AGENT}
    if replica.api_key:
        headers["authorization"] = f"Bearer {replica.api_key}"
    timeout = session.timeout if connect_s is None else connect_timeout(connect_s)
    try:
        async with asyncio.timeout(settings.timeout_s):
            async with session.get(
                replica.url + settings.path, headers=headers, allow_redirects=False, ssl=ssl,
                timeout=timeout,
            ) as resp:
                left = MAX_PROBE_BODY
                while left > 0 and (chunk := await resp.content.read(left)):
                    left -= len(chunk)
                if left <= 0 and not resp.content.at_eof():
                    resp.close()  # an endless answer: not kept in memory, nor the connection
                return resp.status == 200
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


class HealthProber(Periodic):
    """Runs :func:`probe` for every replica every ``interval_s`` seconds.

    Args:
        router: Pools whose replicas are probed.
        session: The app's upstream session.
        settings: ``health`` settings.
        ssl: ``ssl`` argument for ``https://`` replicas.
        connect_s: Connect timeout of each probe, seconds (``timeouts.connect_s``); ``None``:
            the session's.
    """

    def __init__(
        self,
        router: Router,
        session: aiohttp.ClientSession,
        settings: HealthSettings,
        ssl: SSLContext | bool = True,
        *,
        connect_s: float | None = None,
    ) -> None:
        self._ssl = ssl
        self._router = router
        self._session = session
        self._settings = settings
        self.connect_s = connect_s
        self.interval_s = settings.interval_s
        self.round_name = "health probe round"

    def rebind(self, router: Router, connect_s: float | None = None) -> None:
        """Probe the replicas of ``router`` from the next round on (live reload), with the
        reloaded ``timeouts.connect_s`` when given."""
        self._router = router
        if connect_s is not None:
            self.connect_s = connect_s

    async def run_once(self) -> None:
        """Probe every replica concurrently and record the results."""
        replicas = [r for pool in self._router.pools.values() for r in pool.replicas]
        results = await asyncio.gather(
            *(probe(self._session, r, self._settings, self._ssl, connect_s=self.connect_s)
              for r in replicas)
        )
        for replica, ok in zip(replicas, results, strict=True):
            if ok != replica.probe_ok:
                _log.warning(
                    "replica %s of %s is now %s",
                    replica.url, replica.model, "healthy" if ok else "failing its health check",
                )
            replica.mark_probe(ok)
