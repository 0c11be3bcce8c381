"""``gateway.h1.transport`` where the other side, or our own protocol, misbehaves.

A protocol callback that raises (a bug of ours reached by some input a client or a replica
chose) must not leave the connection open: asyncio's socket transport closes it as a fatal
error (``connection_lost`` with the exception, the socket closed, the exception handler told),
and :class:`SocketTransport` keeps that contract. Before, the exception escaped from the
reader's callback: the loop logged it and the connection stayed open and read on, a client
connection until some timer (if any) closed it, an upstream one possibly handed on to the next
request. Each case runs with asyncio's transport (``loop.connect_accepted_socket``) as the
oracle and with ours, over a real loopback connection. A ``connection_made`` that raises ends
the connection too (the listener's socket was leaked).

Then the gateway served on :class:`SocketTransport` against hostile clients (cases that held
when tried, kept for what the other tests do not check): no descriptor left behind by silent,
half-sent, reset, garbage-sending and churning clients; and a process out of descriptors
(``RLIMIT_NOFILE``) that neither spins nor stops serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from gateway.h1.transport import SocketTransport, listen_plain
from tests.conftest import ok_app, wait_until
from tests.gateway.gateway_server import Servers, read_until_closed
from tests.gateway.helpers import settings


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


# --- the gateway served on SocketTransport, against hostile clients -------------------------------

_SHORT = {"client_header_timeout_s": 0.5, "keep_alive_timeout_s": 0.5,
          "client_body_timeout_s": 0.5, "client_send_timeout_s": 0.5}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_hostile_clients_leave_no_descriptor_behind() -> None:
    """Silent, half a head, a head without its body, a reset at once or mid-head, 1 MiB of
    garbage, and churn: each ends by its timer or its error, and the server process (this one)
    holds no more descriptors than before (each open connection's server end is one)."""
    servers = Servers()
    clients: list[socket.socket] = []
    try:
        srv = servers.start(settings(["http://127.0.0.1:9"], limits=_SHORT), app=ok_app)
        table = srv.server.context.table
        addr = ("127.0.0.1", srv.port)
        before = _fds()
        clients += [socket.create_connection(addr) for _ in range(6)]
        silent, half, headless, reset_at_once, reset_mid_head, garbage = clients
        half.sendall(b"GET / HTTP/1.1\r\nHo")
        headless.sendall(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{")
        reset_mid_head.sendall(b"GET / HTTP/1.1\r\n")
        _reset(reset_at_once)
        _reset(reset_mid_head)
        with contextlib.suppress(OSError):
            garbage.sendall(os.urandom(1 << 20))
        for i in range(300):  # churn: half send a request and leave, half leave at once
            with socket.create_connection(addr) as churn:
                if i % 2:
                    churn.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert read_until_closed(silent, 3.0) == (b"", True)  # closed without a word
        answer, closed = read_until_closed(half, 3.0)  # the header timer's 408, then closed
        assert closed and answer.startswith(b"HTTP/1.1 408 "), answer[:60]
        answer, closed = read_until_closed(headless, 3.0)  # answered early (200) or 408
        assert closed, "the client that sent no body was not closed"
        answer, closed = read_until_closed(garbage, 3.0)
        assert closed, "the garbage sender was not closed"
        for sock in clients:
            sock.close()
        wait_until(lambda: not table.open, 3, "every connection closed")
        wait_until(lambda: _fds() <= before, 3, f"descriptors back to {before} (now {_fds()})")
    finally:
        for sock in clients:
            sock.close()
        servers.stop_all()


_OUT_OF_FDS = """
import asyncio, os, resource, socket, threading, time
import gateway.h1.transport
from gateway.serving.server import GatewayServer, ServerConfig
from tests.conftest import ok_app
gateway.h1.transport._RETRY_ACCEPT_S = 0.2  # the pause after EMFILE (1 s), shorter for the test
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
server = GatewayServer(ServerConfig(ok_app, port=port, lifespan=False))
threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True).start()
while not server.started:
    time.sleep(0.01)
spare = len(os.listdir("/proc/self/fd")) + 8
resource.setrlimit(resource.RLIMIT_NOFILE, (spare, spare))
print(port, flush=True)
time.sleep(30)
"""


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_gateway_out_of_descriptors_does_not_spin_and_serves_again() -> None:
    """A gateway process (RLIMIT_NOFILE a few above its start-up need) given more connections
    than it has descriptors: the listener pauses (no busy loop on a readable socket whose
    accept fails with EMFILE), and once the connections go, a new one is answered."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    child = subprocess.Popen([sys.executable, "-c", _OUT_OF_FDS], cwd=root, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients: list[socket.socket] = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        time.sleep(0.3)
        cpu = _cpu_s(child.pid)
        time.sleep(1.0)
        assert _cpu_s(child.pid) - cpu < 0.3, "the out-of-descriptors gateway spins"
        for sock in clients:
            sock.close()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as fresh:
            fresh.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert fresh.recv(100).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in clients:
            sock.close()
        child.kill()
        _, err = child.communicate(timeout=10)
    assert "Too many open files" in err, err[-2000:]
