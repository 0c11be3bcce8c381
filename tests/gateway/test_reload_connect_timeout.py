"""A live reload of ``timeouts.connect_s`` reaches every upstream connection: the relay's, the
health probes' and the metrics scrapes'.

The key is reloadable (:data:`gateway.serving.reload.RELOADABLE`); the relay's client, and later the
session the prober and scraper share, read it once at start, so a reload was reported as applied
while connections kept the old limit.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.gateway.helpers import KEY_A, config, start_sim
from tests.gateway.test_live_reload import Served


@pytest.fixture
def unanswered_listener() -> Iterator[str]:
    """A loopback port whose accept queue is full: a connect to it hangs (SYNs dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port), timeout=5)  # fills the queue
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        queued.close()
        listener.close()


def test_a_reloaded_connect_timeout_applies_to_health_probes(
    tmp_path: Path, serve_asgi: Callable[..., Any], unanswered_listener: str,
) -> None:
    """After a reload to a 1 s connect limit, a replica that does not answer connects is found
    failing within that limit (plus a probe interval), not the start-up 30 s (the probe's own
    limit is 30 s too).

    The same reload brings that replica in, in place of one that answers, so its accept queue
    is full before the gateway ever connects to it. Silencing (filling the queue of) a replica
    the gateway was probing failed about 1 run in 3: the two probes of a round (two models)
    connect at once, the second's SYN was dropped on the queue of one and sent again a second
    later, after the silence; that probe, of a round started with the start-up 30 s, held every
    later round for 30 s. (A probe queued just before the silence would wait 30 s for its answer.)
    """
    sim = start_sim(serve_asgi)
    cfg = config([sim.url], timeouts={"connect_s": 30, "first_byte_s": 60, "idle_s": 60},
                 health={"active": True, "interval_s": 0.2, "timeout_s": 30})
    gw = Served(tmp_path, cfg)
    try:
        models = [{**m, "replicas": [{**r, "url": unanswered_listener} for r in m["replicas"]]}
                  for m in gw.cfg["models"]]
        gw.write({**gw.cfg, "models": models,
                  "timeouts": {**gw.cfg["timeouts"], "connect_s": 1}})
        started = time.monotonic()
        gw.hup_and_wait("config.reloaded")
        while gw.ready():
            took = time.monotonic() - started
            assert took < 10, f"{took:.1f} s: the probes kept the old 30 s connect limit"
            time.sleep(0.1)
    finally:
        gw.stop()


def test_a_reloaded_connect_timeout_applies_to_new_connections(
    tmp_path: Path, unanswered_listener: str,
) -> None:
    cfg = config([unanswered_listener], timeouts={"connect_s": 30, "first_byte_s": 60,
                                                  "idle_s": 60})
    gw = Served(tmp_path, cfg)
    try:
        gw.write({**gw.cfg, "timeouts": {**gw.cfg["timeouts"], "connect_s": 1}})
        gw.hup_and_wait("config.reloaded")
        started = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=15,
                       headers={"authorization": f"Bearer {KEY_A}"},
                       json={"model": "llama-3.1-8b",
                             "messages": [{"role": "user", "content": "hi"}]})
        took = time.monotonic() - started
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "upstream_connect_timeout"
        assert took < 10, f"{took:.1f} s: the old 30 s connect limit still applied"
    finally:
        gw.stop()


def test_probe_and_scrape_use_the_connect_timeout_they_are_given(
    unanswered_listener: str,
) -> None:
    """Both take ``timeouts.connect_s`` per request, over the session's start-up timeout (here
    30 s; their own round limits are 30 s too)."""
    from gateway.fleet.model_settings import HealthSettings
    from gateway.fleet.replica_metrics import MetricsScraper, scrape
    from gateway.fleet.settings import RoutingSettings
    from gateway.health import HealthProber, probe
    from gateway.routing import Replica

    replica = Replica(model="m", index=0, url=unanswered_listener)
    health = HealthSettings(timeout_s=30)
    routing = RoutingSettings(metrics_timeout_s=30)

    async def run() -> tuple[float, float]:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(connect=30, sock_connect=30)) as session:
            started = time.monotonic()
            assert await probe(session, replica, health, connect_s=0.5) is False
            probed = time.monotonic() - started
            started = time.monotonic()
            assert await scrape(session, replica, routing, connect_s=0.5) is None
            return probed, time.monotonic() - started

    probed, scraped = asyncio.run(run())
    assert probed < 5 and scraped < 5, (probed, scraped)
    prober = HealthProber(None, None, health, connect_s=30)  # type: ignore[arg-type]
    scraper = MetricsScraper(None, None, routing, connect_s=30)  # type: ignore[arg-type]
    prober.rebind(None, 0.5)  # type: ignore[arg-type]
    scraper.rebind(None, 0.5)  # type: ignore[arg-type]
    assert prober.connect_s == scraper.connect_s == 0.5
