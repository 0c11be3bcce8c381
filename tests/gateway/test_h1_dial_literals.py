"""The default dialer connects to an address literal without the resolver's thread hand-off.

``getaddrinfo`` returns a literal unchanged, yet asyncio runs it in the default executor: a
thread hand-off (~150 us of CPU) per new upstream connection, 256 of them in a burst of new
streams. With no resolver given, :func:`gateway.h1.resolver_dialer` uses a literal as it is;
names still go through the resolver, and the socket factory still checks every address (the
always-denied ones are refused before anything is sent).
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from gateway.h1 import RelayClient, resolver_dialer
from policy import EgressDenied, denied_address_socket_factory
from tests.gateway.test_h1_client import Backend, replies, run

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (where ``loop.getaddrinfo`` runs), counting its jobs."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.jobs = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


async def _get(c: RelayClient, url: str) -> bytes:
    resp = await c.post(url, "/v1/x", {}, b"{}", fresh=True)
    body = b""
    while chunk := await resp.read():
        body += chunk
    resp.release()
    return body


def test_a_literal_is_dialed_without_the_executor_and_a_name_through_it() -> None:
    async def test() -> None:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        backend = Backend(replies(OK))
        url = await backend.start()
        port = url.rsplit(":", 1)[1]
        c = RelayClient(resolver_dialer(socket_factory=denied_address_socket_factory()),
                        tls=True, limit=0, keep_alive_s=30.0, connect_s=5.0)
        assert await _get(c, url) == b"ok"
        assert await _get(c, url) == b"ok"
        assert executor.jobs == 0
        assert backend.connections == 2
        assert await _get(c, f"http://localhost:{port}") == b"ok"  # a name: resolved
        assert executor.jobs >= 1
        assert backend.connections == 3
        await c.close()
        await backend.stop()

    run(test)


@pytest.mark.parametrize("literal", ["169.254.169.254", "[fe80::1]", "224.0.0.1"])
def test_an_always_denied_literal_is_still_refused_before_the_connect(literal: str) -> None:
    async def test() -> None:
        c = RelayClient(resolver_dialer(socket_factory=denied_address_socket_factory()),
                        tls=True, limit=0, keep_alive_s=30.0, connect_s=5.0)
        with pytest.raises(EgressDenied):
            await c.post(f"http://{literal}:8000", "/v1/x", {}, b"{}")
        assert c.open_connections == 0
        await c.close()

    run(test)


def test_the_remembered_answer_refuses_a_denied_literal_every_time() -> None:
    """The factory remembers each address's answer: the second and later connections to a
    metadata address are refused as the first was, and other addresses are not affected."""
    factory = denied_address_socket_factory()
    metadata = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                ("169.254.169.254", 80))
    for _ in range(3):
        with pytest.raises(EgressDenied, match=r"169\.254\.169\.254"):
            factory(metadata)
    for _ in range(2):
        sock = factory((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                        ("127.0.0.1", 80)))
        sock.close()
