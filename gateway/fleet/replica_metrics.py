"""Backend load signals: scrape each replica's vLLM ``/metrics`` and parse vLLM's metric names.

Parsed (Prometheus text format 0.0.4; samples summed over label sets, e.g. several engines):

* waiting: ``vllm:num_requests_waiting``; running: ``vllm:num_requests_running``;
* KV usage (0..1): ``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``);
* prefix-cache hits and queries (tokens): ``vllm:prefix_cache_hits_total``,
  ``vllm:prefix_cache_queries_total`` (older: ``vllm:gpu_prefix_cache_hits_total``,
  ``vllm:gpu_prefix_cache_queries_total``);
* KV capacity: labels ``num_gpu_blocks`` and ``block_size`` of ``vllm:cache_config_info``.

(Source: ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``; counters are declared without
``_total``, which ``prometheus_client`` appends on the wire.) KV usage is averaged, not summed.

:class:`MetricsScraper` follows :class:`gateway.health.HealthProber`: one background task on the
app's upstream session (so the egress policy checks every connection), one request per distinct
replica URL per round, results stored on :attr:`gateway.routing.Replica.signals`. A failed or
slow scrape only leaves the previous figures to go stale; it never touches a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import TYPE_CHECKING

import aiohttp

from gateway.fleet.replica import Replica, ReplicaSignals
from gateway.fleet.settings import RoutingSettings
from gateway.serving.periodic import Periodic

if TYPE_CHECKING:
    from gateway.fleet.view import Fleet

__all__ = ["MAX_METRICS_BODY", "MetricsScraper", "ReplicaSignals", "parse_metrics", "scrape"]

_log = logging.getLogger(__name__)

_SAMPLE = re.compile(r"^(vllm:[a-zA-Z0-9_:]+)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_NAMES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:gpu_cache_usage_perc": "kv",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:gpu_prefix_cache_hits_total": "hits",
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:gpu_prefix_cache_queries_total": "queries",
}


def parse_metrics(text: str, at: float) -> ReplicaSignals:
    """Parse a vLLM ``/metrics`` page (names in the module docstring; others are ignored).

    A sample whose value is not a number is skipped; a page without any vLLM sample gives a
    signals object whose fields are all ``None``.
    """
    sums: dict[str, float] = {}
    kv: list[float] = []
    blocks: int | None = None
    block_size: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels = m.group(1), m.group(2)
        if name == "vllm:cache_config_info" and labels:
            found = dict(_LABEL.findall(labels))
            with contextlib.suppress(KeyError, ValueError):
                blocks = (blocks or 0) + int(found["num_gpu_blocks"])
                block_size = int(found["block_size"])
            continue
        key = _NAMES.get(name)
        if key is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        if key == "kv":
            kv.append(value)
        else:
            sums[key] = sums.get(key, 0.0) + value
    return ReplicaSignals(
        at=at,
        waiting=sums.get("waiting"),
        running=sums.get("running"),
        kv_usage=sum(kv) / len(kv) if kv else None,
        prefix_hits=sums.get("hits"),
        prefix_queries=sums.get("queries"),
        num_gpu_blocks=blocks,
        block_size=block_size,
    )


MAX_METRICS_BODY = 8 * 1024 * 1024
"""Bytes of a replica's ``/metrics`` answer read at most (vLLM's is about 100 KiB); a longer one
is not read on: the round has no signals from that replica."""


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body of ``resp``, or ``None`` (connection dropped) when it is longer than ``limit``."""
    body = bytearray()
    while chunk := await resp.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            resp.close()
            return None
    return bytes(body)


async def scrape(
    session: aiohttp.ClientSession,
    replica: Replica,
    settings: RoutingSettings,
    ssl: SSLContext | bool = True,
    *,
    connect_s: float | None = None,
) -> ReplicaSignals | None:
    """Scrape one replica once; ``None`` when it does not answer 200 in time.

    ``connect_s`` is the connect timeout in seconds (``timeouts.connect_s`` as now in force;
    ``None``: the session's, fixed at start).
    """
    headers = {"accept": "text/plain"}
    if replica.api_key:
        headers["authorization"] = f"Bearer {replica.api_key}"
    # Per request: the session's timeout is fixed at start.
    timeout = session.timeout if connect_s is None else aiohttp.ClientTimeout(
        total=None, connect=connect_s, sock_connect=connect_s, sock_read=None)
    try:
        async with asyncio.timeout(settings.metrics_timeout_s):
            async with session.get(
                replica.url + settings.metrics_path, headers=headers, allow_redirects=False,
                ssl=ssl, timeout=timeout,
            ) as resp:
                body = await _read_at_most(resp, MAX_METRICS_BODY)
                if resp.status != 200 or body is None:
                    return None
                text = body.decode("utf-8", errors="replace")  # the exposition format's
    except (aiohttp.ClientError, OSError, TimeoutError, UnicodeError):
        return None
    return parse_metrics(text, time.monotonic())


class MetricsScraper(Periodic):
    """Scrapes the replicas of ``prefix_affinity`` and flow-controlled pools periodically.

    One round every ``metrics_interval_s`` seconds.

    Args:
        router: Pools whose replicas are scraped (only pools whose strategy needs signals).
        session: The app's upstream session (policy-checked connector and middlewares).
        settings: The ``routing`` section.
        ssl: ``ssl`` argument for ``https://`` replicas.
        on_round: Called after each round (flow control dispatches on the new figures).
        connect_s: Connect timeout of each scrape, seconds (``timeouts.connect_s``); ``None``:
            the session's.
    """

    def __init__(
        self,
        router: Fleet,
        session: aiohttp.ClientSession,
        settings: RoutingSettings,
        ssl: SSLContext | bool = True,
        on_round: Callable[[], None] | None = None,
        *,
        connect_s: float | None = None,
    ) -> None:
        self.connect_s = connect_s
        self._on_round = on_round
        self._router = router
        self._session = session
        self._settings = settings
        self._ssl = ssl
        self.interval_s = settings.metrics_interval_s
        self.round_name = "replica metrics round"
        self.rounds = 0

    def rebind(self, router: Fleet, connect_s: float | None = None) -> None:
        """Scrape the replicas of ``router`` from the next round on (live reload), with the
        reloaded ``timeouts.connect_s`` when given."""
        self._router = router
        if connect_s is not None:
            self.connect_s = connect_s

    def replicas(self) -> list[Replica]:
        """The vLLM replicas whose pool uses a strategy that reads signals.

        ``litellm`` replicas are never scraped: their URL is a provider's API, which has no
        vLLM metrics and must not be contacted for anything but requests.
        """
        return [
            r
            for pool in self._router.pools.values()
            if pool.wants_signals
            for r in pool.replicas
            if r.kind == "vllm"
        ]

    @property
    def needed(self) -> bool:
        """True when scraping is on and some pool uses the signals."""
        return self._settings.metrics and bool(self.replicas())

    async def run_once(self) -> None:
        """Scrape every distinct replica URL once, concurrently, and store the signals."""
        by_url: dict[str, list[Replica]] = {}
        for r in self.replicas():
            by_url.setdefault(r.url, []).append(r)
        firsts = [group[0] for group in by_url.values()]
        results = await asyncio.gather(
            *(scrape(self._session, r, self._settings, self._ssl, connect_s=self.connect_s)
              for r in firsts)
        )
        for group, signals in zip(by_url.values(), results, strict=True):
            if signals is None:
                continue
            for r in group:
                r.observe(signals)
        self.rounds += 1
        if self._on_round is not None:
            self._on_round()


SIGNAL_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("waiting", "{request}", "Requests in the replica's waiting queue (last vLLM scrape)"),
    ("running", "{request}", "Requests in the replica's running batch (last vLLM scrape)"),
    ("kv_usage", "1", "KV-cache usage of the replica, 0..1 (last vLLM scrape)"),
    ("signals_age", "s", "Age of the replica's last successful metrics scrape"),
    ("index_blocks", "{block}", "Prefix-index blocks held for the replica"),
    ("prefill_tokens", "{token}",
     "Estimated uncached prompt tokens sent to the replica whose response has not started"),
    ("cache_exact", "{state}",
     "1 when the replica is scored from its KV-cache events (exact), 0 from the estimate"),
    ("exact_blocks", "{block}", "Blocks the replica holds according to its KV-cache events"),
)
"""Per-replica signals exported on the admin port (field, unit, description)."""


def signal_rows(router: Fleet, now: float) -> list[tuple[Replica, dict[str, float | None]]]:
    """The current signals of every replica of a ``prefix_affinity`` pool (admin view).

    Returns:
        ``(replica, {field: value or None})`` with the fields of :data:`SIGNAL_FIELDS`.
    """
    rows: list[tuple[Replica, dict[str, float | None]]] = []
    for pool in router.pools.values():
        affinity = pool.affinity
        if affinity is None:
            continue
        for r in pool.replicas:
            sig = r.signals
            rows.append((r, {
                "waiting": sig.waiting if sig else None,
                "running": sig.running if sig else None,
                "kv_usage": sig.kv_usage if sig else None,
                "signals_age": now - sig.at if sig else None,
                "index_blocks": float(affinity.index.size(r.index)),
                "prefill_tokens": r.prefill_tokens,
                "cache_exact": 1.0 if affinity.cache_state(r.index) == "exact" else 0.0,
                "exact_blocks": float(affinity.exact.size(r.index)),
            }))
    return rows
