"""The gateway's server accepts one connection per wake-up and keeps a full kernel queue.

A burst of new connections is accepted one per event-loop iteration (as nginx's default
``multi_accept off``), so the connections already in make progress between two accepts; the
kernel still queues :data:`gateway.serving.server.LISTEN_BACKLOG` connections meanwhile (asyncio
ties
the listen backlog to the accept count, the server listens again with the full queue).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.serving.server import ACCEPTS_PER_WAKEUP, GatewayServer, ServerConfig
from tests.conftest import free_port, ok_app


class _Running:
    """A :class:`GatewayServer` on loopback in a thread, with a handle on its event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        config = ServerConfig(ok_app, host="127.0.0.1", port=self.port, lifespan=False)
        self.server = GatewayServer(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve()
        asyncio.run(serve())

    def start(self) -> _Running:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def block(self) -> threading.Event:
        """Hold the server's event loop until the returned event is set (at most 20 s)."""
        release, held = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(20)

        assert self.loop is not None
        self.loop.call_soon_threadsafe(hold)
        assert held.wait(5), "the server's loop did not run the blocker"
        return release

    def connections(self) -> int:
        return len(self.server.context.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def running() -> Iterator[_Running]:
    frozen = gc.get_freeze_count()
    server = _Running().start()
    try:
        yield server
    finally:
        server.stop()
        if not frozen:  # the server froze the test process's heap once started: undo it
            gc.unfreeze()


def _connect(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, each completing its handshake within 3 s or failing the test."""
    clients: list[socket.socket] = []
    for i in range(count):
        sock = socket.socket()
        sock.settimeout(3.0)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError as exc:
            sock.close()
            for c in clients:
                c.close()
            pytest.fail(f"connection {i + 1} of {count} not queued by the kernel: {exc!r}")
        clients.append(sock)
    return clients


def test_the_kernel_queues_a_burst_while_the_loop_is_busy(running: _Running) -> None:
    release = running.block()
    try:
        clients = _connect(running.port, 300)
    finally:
        release.set()
    try:
        deadline = time.monotonic() + 10
        while running.connections() < 300:
            assert time.monotonic() < deadline, f"{running.connections()} of 300 accepted"
            time.sleep(0.01)
        for sock in clients[:3]:  # and they are served
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in clients:
            sock.close()


def test_a_burst_is_accepted_one_connection_per_loop_iteration(running: _Running) -> None:
    counts: list[int] = []
    stop = threading.Event()

    def tick() -> None:  # runs once per loop iteration (call_soon from a callback)
        counts.append(running.connections())
        if not stop.is_set():
            assert running.loop is not None
            running.loop.call_soon(tick)

    release = running.block()
    try:
        clients = _connect(running.port, 40)
        assert running.loop is not None
        running.loop.call_soon_threadsafe(tick)
    finally:
        release.set()
    try:
        deadline = time.monotonic() + 10
        while running.connections() < 40:
            assert time.monotonic() < deadline, f"{running.connections()} of 40 accepted"
            time.sleep(0.01)
        stop.set()
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert max(steps) <= ACCEPTS_PER_WAKEUP, steps
    finally:
        for sock in clients:
            sock.close()
