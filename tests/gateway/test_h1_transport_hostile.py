"""``gateway.h1.transport`` where the other side, or our own protocol, misbehaves.

A protocol callback that raises (a bug of ours reached by some input a client or a replica
chose) must not leave the connection open: asyncio's socket transport closes it as a fatal
error (``connection_lost`` with the exception, the socket closed, the exception handler told),
and :class:`SocketTransport` keeps that contract. Before, the exception escaped from the
reader's callback: the loop logged it and the connection stayed open and read on, a client
connection until some timer (if any) closed it, an upstream one possibly handed on to the next
request. Each case runs with asyncio's transport (``loop.connect_accepted_socket``) as the
oracle and with ours, over a real loopback connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from gateway.h1.transport import SocketTransport, listen_plain


class _Failing(asyncio.Protocol):
    """Raises ``ValueError`` from ``data_received`` or ``eof_received`` (``fail_in``)."""

    def __init__(self, fail_in: str) -> None:
        self.fail_in = fail_in
        self.calls: list[str] = []
        self.lost: list[str | None] = []

    def data_received(self, data: bytes) -> None:
        self.calls.append("data")
        if self.fail_in == "data_received":
            raise ValueError("a bug reached by hostile bytes")

    def eof_received(self) -> bool:
        self.calls.append("eof")
        if self.fail_in == "eof_received":
            raise ValueError("a bug reached by an end of stream")
        return True  # keep open: only the failure may close it

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(None if exc is None else type(exc).__name__)


async def _run(kind: str, fail_in: str) -> tuple[list[str], list[str | None], bool, list[str]]:
    """(calls, connection_lost arguments, socket closed, exception-handler messages)."""
    loop = asyncio.get_running_loop()
    handled: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: handled.append(str(ctx.get("exception"))))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        peer = socket.create_connection(listening.getsockname())
        accepted, _ = listening.accept()
    proto = _Failing(fail_in)
    try:
        if kind == "asyncio":
            await loop.connect_accepted_socket(lambda: proto, accepted)
        else:
            SocketTransport(loop, accepted, proto).start()
        peer.sendall(b"GET / HTTP/1.1\r\n")
        if fail_in == "eof_received":
            peer.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 3
        while not proto.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
    finally:
        peer.close()
    return proto.calls, proto.lost, accepted.fileno() == -1, handled


@pytest.mark.parametrize("fail_in", ["data_received", "eof_received"])
@pytest.mark.parametrize("kind", ["asyncio", "ours"])
def test_a_raising_protocol_callback_closes_the_connection(kind: str, fail_in: str) -> None:
    calls, lost, closed, handled = asyncio.run(_run(kind, fail_in))
    assert calls[-1] == fail_in.split("_")[0]  # "data" or "eof": the failing call was the last
    assert lost == ["ValueError"], "connection_lost once, with the protocol's exception"
    assert closed, "the socket is closed (its descriptor freed)"
    assert len(handled) == 1 and "a bug reached" in handled[0], handled



class _FailingOnce(asyncio.Protocol):
    """``connection_made`` raises for the first connection of ``made`` (a shared list)."""

    def __init__(self, made: list[_FailingOnce]) -> None:
        self.made = made
        self.lost: list[str | None] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.made.append(self)
        if len(self.made) == 1:
            raise ValueError("a bug reached at connection set-up")

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(None if exc is None else type(exc).__name__)


def test_a_raising_connection_made_frees_the_socket_and_the_listener_serves_on() -> None:
    """The listener's connection whose ``connection_made`` raised was never read and never
    closed: its descriptor leaked (with the cycle collector frozen, for good), and the error
    escaped from the accept callback. Now it ends as a fatal error (the handler told,
    ``connection_lost`` with the exception, the socket closed), and the next connection is
    served. (asyncio's transport keeps such a connection open and reading; closing it is the
    safer choice for a protocol that could not set itself up.)"""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        handled: list[str] = []
        loop.set_exception_handler(lambda _loop, ctx: handled.append(str(ctx.get("exception"))))
        made: list[_FailingOnce] = []
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        listener = listen_plain(loop, sock, lambda: _FailingOnce(made), 1)
        first = socket.create_connection(sock.getsockname())
        second = socket.create_connection(sock.getsockname())
        second.setblocking(False)
        try:
            deadline = time.monotonic() + 3
            while (len(made) < 2 or not made[0].lost) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            assert len(made) == 2 and made[0].lost == ["ValueError"], made[0].lost
            transport = made[0].transport
            assert transport is not None and transport.is_closing()
            assert transport.get_extra_info("socket").fileno() == -1, "the socket leaked"
            assert handled == ["a bug reached at connection set-up"], handled
            second.sendall(b"echo")
            echoed = b""
            while echoed != b"echo" and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
                with contextlib.suppress(BlockingIOError):
                    echoed += second.recv(10)
            assert echoed == b"echo"
        finally:
            listener.close()
            first.close()
            second.close()

    asyncio.run(main())
