"""A connection closed to make room gives its file descriptor back at once.

A tester found that an idle keep-alive connection evicted while its answer was still waiting
in the server's write buffer (its client not reading) was closed the polite way: the transport
kept its socket to flush, beyond the connection cap, until the send timeout (30 s) aborted it,
so a client that reads nothing held descriptors the cap meant to bound. Through the server
``gateway serve`` builds on loopback, with the process's own descriptors counted in
``/proc/self/fd`` (the server runs in this process).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.gateway.gateway_server import Servers
from tests.gateway.helpers import settings

BIG = 8 * 1024 * 1024  # far more than the loopback socket buffers hold


async def _big_answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """One 8 MiB body in one message: the app is done while most of it is still buffered."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(BIG).encode())]})
    await send({"type": "http.response.body", "body": b"x" * BIG})


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_an_evicted_connection_still_flushing_is_aborted(servers: Servers) -> None:
    limits = {"client_header_timeout_s": 60, "keep_alive_timeout_s": 60,
              "client_send_timeout_s": 60, "max_client_connections": 1}
    srv = servers.start(settings(["http://127.0.0.1:9"], limits=limits), app=_big_answer)
    table = srv.server.context.table
    slow = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    newcomer: socket.socket | None = None
    try:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")  # then never reads
        wait_until(lambda: len(table.resting) == 1, 5, "the answered connection to rest")
        before = _fds()
        newcomer = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        wait_until(lambda: len(table.fresh) == 1, 5, "the newcomer admitted")
        # The newcomer's two ends are in; the evicted connection's server end must be out.
        wait_until(lambda: _fds() <= before + 1, 5,
                   "the evicted connection's descriptor to be closed")
        assert len(table.open) == 1 and not table.resting
    finally:
        slow.close()
        if newcomer is not None:
            newcomer.close()
