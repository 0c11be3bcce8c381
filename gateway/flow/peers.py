"""Flow control shared across gateway pods through Redis (``flow_control.shared``).

Each gateway process publishes, every ``interval_s``, its flow-controlled requests in flight
per replica and class (``Replica.flow_in_flight``) under its own key,
``<prefix><process id>`` with a time to live of ``ttl_s`` (a process that dies stops counting
within it), and reads every other process's key. The sum of the others' counts lands in
``Replica.peer_in_flight``, which :func:`gateway.flow.saturation.has_room` adds to the
process's own count, so an ``in_flight`` threshold holds for the whole fleet of gateways, not per
pod, and is not split over pods or workers (:meth:`FlowControlSettings.limits`).

The counts are eventually consistent: between two rounds each process sees the others' counts
as of their last publication, so the fleet may briefly pass a threshold by what the other
processes sent in one interval. Nothing is read or written on a request's path; a Redis
failure leaves the last known counts in place until they expire (``ttl_s``), then each process
counts only its own.

With ``fair_share`` (the default) the same document also carries, under ``"#flows"`` (never a
replica URL, so a process of the previous version skips it), this process's recently dispatched
cost and waiting requests per model, class and key (:meth:`FleetShares.rows`); the others' rows
are summed into :class:`gateway.flow.fleetshare.FleetShares`, which the queues consult before a
process hands a slot to its own waiter.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis.asyncio as redis_async
from redis.exceptions import RedisError

from gateway.flow.fleetshare import FleetShares
from gateway.flow.settings import SharedFlowSettings
from gateway.serving.periodic import Periodic

if TYPE_CHECKING:
    from gateway.routing import Router

__all__ = ["FlowPeers"]

_log = logging.getLogger(__name__)

_FLOWS = "#flows"  # the document's entry for the per-key rows (not a replica URL)


class FlowPeers(Periodic):
    """Publishes this process's in-flight counts and reads the other processes'.

    Args:
        router: The pools whose replicas are counted.
        settings: ``flow_control.shared``.
        client: An existing ``redis.asyncio.Redis`` (tests); else one from ``redis_url``.
        on_round: Called after each read (flow control dispatches on the new counts).
        shares: Per-key figures to publish and merge (``fair_share``), or ``None``.
        clock: Monotonic clock, seconds (the flow gate's).
    """

    round_name = "flow-control peer sync"

    def __init__(self, router: Router, settings: SharedFlowSettings,
                 client: redis_async.Redis | None = None,
                 on_round: Callable[[], None] | None = None,
                 shares: FleetShares | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._router = router
        self._shares = shares
        self._clock = clock
        if shares is not None:
            shares.on_yield = self.wake  # publish the free slot now, not at the next round
        self._on_round = on_round
        self._settings = settings
        self.interval_s = settings.interval_s
        self._redis: redis_async.Redis = client or redis_async.Redis.from_url(
            settings.redis_url, socket_timeout=settings.interval_s * 5)
        self._own = client is None
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._key = settings.key_prefix + self.process_id
        self.rounds = 0
        self.errors = 0

    def rebind(self, router: Router) -> None:
        """Count the replicas of ``router`` from the next round on (live reload)."""
        self._router = router

    def _counts(self) -> dict[str, object]:
        """Own flow-controlled in-flight counts per replica URL (summed over pools), and the
        per-key rows under ``"#flows"`` with ``fair_share``."""
        counts: dict[str, list[int]] = {}
        for pool in self._router.pools.values():
            for r in pool.replicas:
                if not r.flow_in_flight:
                    continue
                mine = counts.setdefault(r.url, [0] * len(r.flow_in_flight))
                for i, n in enumerate(r.flow_in_flight):
                    if i < len(mine):
                        mine[i] += n
        out: dict[str, object] = dict(counts)
        if self._shares is not None:
            out[_FLOWS] = self._shares.rows(self._clock())
        return out

    async def run_once(self) -> None:
        """Publish own counts; read the others' into ``Replica.peer_in_flight``."""
        s = self._settings
        try:
            await self._redis.set(self._key, json.dumps(self._counts()),
                                  px=int(s.ttl_s * 1000))
            keys = [k async for k in self._redis.scan_iter(match=s.key_prefix + "*", count=500)]
            others = [k for k in keys if (k.decode() if isinstance(k, bytes) else k) != self._key]
            values = await self._redis.mget(others) if others else []
        except RedisError as exc:
            self.errors += 1
            _log.warning("flow-control peer sync: %s", exc)
            return
        totals: dict[str, list[int]] = {}
        rows: list[object] = []
        for raw in values:
            if raw is None:
                continue  # expired between SCAN and MGET
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            flows = doc.pop(_FLOWS, None)
            if isinstance(flows, list):
                rows.extend(flows)
            for url, counts in doc.items():
                if not isinstance(counts, list):
                    continue
                acc = totals.setdefault(url, [])
                for i, n in enumerate(counts):
                    if isinstance(n, int):
                        if i >= len(acc):
                            acc.extend([0] * (i + 1 - len(acc)))
                        acc[i] += n
        for pool in self._router.pools.values():
            for r in pool.replicas:
                r.peer_in_flight = totals.get(r.url, [])
        if self._shares is not None:
            self._shares.merge(rows, self._clock())
        self.rounds += 1
        if self._on_round is not None:
            self._on_round()

    async def stop(self) -> None:
        """Stop, withdraw this process's counts, close the client it opened."""
        await super().stop()
        try:
            await self._redis.delete(self._key)
        except RedisError:
            pass
        if self._own:
            await self._redis.aclose()
