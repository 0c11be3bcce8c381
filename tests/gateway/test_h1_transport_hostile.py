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
import socket
import time

import pytest

from gateway.h1.transport import SocketTransport


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

