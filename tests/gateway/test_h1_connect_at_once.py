"""A request on a new upstream connection goes out in the step that connected it.

In a burst of new streams every request needs a new upstream connection. Connecting through
``loop.sock_connect`` and then ``loop.create_connection`` took four more turns of the event
loop before the request was written; since each turn runs every other request's pending step
first, every request's upstream write waited for the whole burst's connects and set-ups. A
loopback (or same-host) connection is made inside ``connect`` itself, so
:func:`gateway.h1.resolver_dialer` returns it at once and :class:`gateway.h1.RelayClient`
writes the request on the socket before asyncio's transport is made for it. A connection that
is not made at once is still waited for, within ``connect_s``.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.h1 import ConnectFailed, ConnectTimedOut, RelayClient, resolver_dialer
from policy import denied_address_socket_factory
from tests.gateway.test_h1_client import run

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def _client(connect_s: float = 5.0) -> RelayClient:
    return RelayClient(resolver_dialer(socket_factory=denied_address_socket_factory()),
                       tls=True, limit=0, keep_alive_s=30.0, connect_s=connect_s)


def test_a_new_connection_carries_its_request_before_the_loop_turns() -> None:
    async def test() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        c = _client()
        task = asyncio.create_task(c.post(f"http://127.0.0.1:{port}", "/v1/x", {"a": "b"},
                                          b"{}", fresh=True))
        await asyncio.sleep(0)  # exactly the task's first step
        replica, _ = listener.accept()
        replica.setblocking(False)
        request = replica.recv(65536)  # no wait: already in the replica's socket
        assert request.startswith(b"POST /v1/x HTTP/1.1\r\n")
        assert request.endswith(b"content-length: 2\r\n\r\n{}")
        replica.sendall(OK)
        resp = await task
        assert resp.status == 200
        assert await resp.read() == b"ok"
        resp.release()
        replica.close()
        listener.close()
        await c.close()

    run(test)


def test_an_early_answer_is_read_as_the_response() -> None:
    """The replica may answer before the transport is made: the exchange had begun."""
    async def test() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n{}")
            writer.write(OK)
            writer.close()  # answered and closed at once, as a replica may
            await writer.wait_closed()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = _client()
        for _ in range(20):
            resp = await c.post(f"http://127.0.0.1:{port}", "/v1/x", {}, b"{}", fresh=True)
            assert (resp.status, await resp.read()) == (200, b"ok")
            resp.release()
        await c.close()
        server.close()
        await server.wait_closed()

    run(test)


def test_a_refused_connection_is_connect_failed() -> None:
    async def test() -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        c = _client()
        with pytest.raises(ConnectFailed, match="ConnectionRefusedError"):
            await c.post(f"http://127.0.0.1:{port}", "/v1/x", {}, b"{}")
        assert c.open_connections == 0
        probe.close()
        await c.close()

    run(test)


def test_a_connection_not_made_at_once_is_waited_for_within_connect_s() -> None:
    """A full accept queue drops the handshake: the connect stays in progress, is waited for
    (not returned half-made), and times out."""
    async def test() -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        queued = []
        for _ in range(4):  # fill the accept queue (never accepted)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            queued.append(s)
        await asyncio.sleep(0.05)
        c = _client(connect_s=0.3)
        with pytest.raises(ConnectTimedOut):
            await c.post(f"http://127.0.0.1:{address[1]}", "/v1/x", {}, b"{}")
        assert c.open_connections == 0
        for s in queued:
            s.close()
        listener.close()
        await c.close()

    run(test)
