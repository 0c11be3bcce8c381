"""A closed client connection is freed by reference counting, without the cycle collector.

The server protocol kept its scope extensions (bound methods of itself) in a dict of its own:
a reference cycle per connection, about twenty objects that only ``gc`` could free, so a
gateway taking many short connections grew until the next full collection. Tested on the
server ``gateway serve`` builds, over loopback, with the collector off.
"""

from __future__ import annotations

import gc
import json
import time
import weakref
from collections.abc import Iterator

import pytest

from tests.gateway.gateway_server import Servers, connect, read_until_closed
from tests.gateway.helpers import KEY_A, Sim, settings


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _wait(condition: object, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _request(path: str, close: bool) -> bytes:
    """One request to ``path`` (GET /healthz, or a chat completion), its head saying
    ``connection: close`` with ``close``."""
    head = (b"%s %s HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
            % (b"GET" if path == "/healthz" else b"POST", path.encode(), KEY_A.encode()))
    if close:
        head += b"Connection: close\r\n"
    if path == "/healthz":
        return head + b"\r\n"
    body = json.dumps({"model": "default", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)


@pytest.mark.parametrize(("path", "close"), [("/healthz", False), ("/healthz", True),
                                            ("/v1/chat/completions", False)],
                         ids=["kept-alive", "connection-close", "relayed"])
def test_a_closed_connection_is_freed_without_the_cycle_collector(
    servers: Servers, sim: Sim, path: str, close: bool
) -> None:
    """Closed by the client after a kept-alive answer, or by the server after an answer
    whose head said ``connection: close`` (the protocol kept that request until then)."""
    srv = servers.start(settings([sim.url]))
    connections = srv.server.context.connections
    gc.collect()
    gc.disable()
    try:
        with connect(srv.port) as sock:
            assert _wait(lambda: len(connections) == 1)
            proto = weakref.ref(next(iter(connections)))
            sock.sendall(_request(path, close))
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
            if close:
                read_until_closed(sock)
        assert _wait(lambda: not connections), "the connection was not closed"
        assert _wait(lambda: proto() is None, 2.0), (
            "the closed connection's protocol is still alive; referrers: "
            f"{[type(r).__name__ for r in gc.get_referrers(proto())]}")
    finally:
        gc.enable()
