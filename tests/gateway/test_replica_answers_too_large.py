"""Health probes and metrics scrapes read a bounded answer from a replica.

Both read the whole body of a replica's answer within their timeout (2 s and 1 s); a replica
that answered with an endless body made the gateway keep all of it in memory (hundreds of MB a
second on a LAN) and, for ``/metrics``, parse it. The probe now reads at most
:data:`gateway.health.MAX_PROBE_BODY` bytes (then drops the connection) and the scrape at most
:data:`gateway.fleet.replica_metrics.MAX_METRICS_BODY` (then has no signals).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from gateway.fleet.model_settings import HealthSettings
from gateway.fleet.replica_metrics import MAX_METRICS_BODY, scrape
from gateway.fleet.settings import RoutingSettings
from gateway.health import MAX_PROBE_BODY, probe
from gateway.routing import Replica

TOTAL = 256 * 1024 * 1024  # what the replica would send: far more than either limit


class EndlessReplica:
    """Answers every GET 200 with a ``TOTAL``-byte body; counts the bytes the client took."""

    def __init__(self, body_line: bytes) -> None:
        self.line = body_line
        self.sent = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                         b"content-length: %d\r\n\r\n" % TOTAL)
            piece = self.line * (65536 // len(self.line))
            while self.sent < TOTAL:
                writer.write(piece)
                await writer.drain()
                self.sent += len(piece)
        writer.close()


def _run(body_line: bytes, check: str) -> tuple[object, int]:
    async def test() -> tuple[object, int]:
        replica_server = EndlessReplica(body_line)
        server = await asyncio.start_server(replica_server.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        replica = Replica(model="m", index=0, url=url)
        async with aiohttp.ClientSession() as session:
            if check == "probe":
                result: object = await probe(session, replica, HealthSettings(timeout_s=30))
            else:
                result = await scrape(session, replica, RoutingSettings(metrics_timeout_s=30))
        server.close()
        return result, replica_server.sent

    return asyncio.run(test())


def test_a_health_probe_reads_a_bounded_body() -> None:
    healthy, sent = _run(b"ok\n", "probe")
    assert healthy is True  # a 200 is healthy, whatever its body
    assert sent < MAX_PROBE_BODY + 16 * 1024 * 1024, f"{sent} bytes read"


def test_a_metrics_scrape_reads_a_bounded_body_and_has_no_signals() -> None:
    signals, sent = _run(b'vllm:num_requests_waiting{model_name="m"} 1\n', "scrape")
    assert signals is None
    assert sent < MAX_METRICS_BODY + 16 * 1024 * 1024, f"{sent} bytes read"
