"""CPU per new connection of three ways to drive a socket: asyncio's transport, the loop's
reader/writer API (what ``gateway.h1.transport`` is built on), and blocking calls.

Each way opens a loopback TCP connection, writes one small request, reads the answer until the
peer closes, and closes; a replica in another process (accept, read the request, answer, close)
keeps its CPU out of the figure. Prints the calling thread's CPU time (user + system,
``time.thread_time``) per connection in microseconds, after a warm-up, for:

* ``asyncio``: ``loop.create_connection`` and an ``asyncio.Protocol`` (asyncio's socket
  transport: waiter future, three scheduled callbacks, the transport registry);
* ``reader/writer``: a non-blocking socket, ``loop.add_writer`` for the connect,
  ``loop.add_reader`` for the answer (the floor of an asyncio-loop transport of one's own);
* ``blocking``: ``socket.create_connection``, ``sendall``, ``recv`` (no event loop at all).

What separates the first two is what ``gateway.h1.transport`` saves per new connection; read
the ratios, not the microseconds (shared 2-core machine).

Usage::

    .venv/bin/python bench/connection_floor.py [--connections 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time

_REQUEST = b"POST /v1/x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}"
_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"


def _replica(listener: socket.socket) -> None:
    """Answer each connection's one request and close it (until the process is ended)."""
    while True:
        conn, _ = listener.accept()
        with conn:
            received = b""
            while not received.endswith(b"{}"):
                data = conn.recv(65536)
                if not data:
                    break
                received += data
            conn.sendall(_ANSWER)


def _blocking(address: tuple[str, int], n: int) -> float:
    t0 = time.thread_time()
    for _ in range(n):
        with socket.create_connection(address) as sock:
            sock.sendall(_REQUEST)
            while sock.recv(65536):
                pass
    return (time.thread_time() - t0) / n


class _Exchange(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REQUEST)

    def connection_lost(self, exc: Exception | None) -> None:
        self.done.set_result(None)


async def _asyncio(address: tuple[str, int], n: int) -> float:
    loop = asyncio.get_running_loop()
    t0 = time.thread_time()
    for _ in range(n):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(lambda d=done: _Exchange(d), *address)  # type: ignore[misc]
        await done
    return (time.thread_time() - t0) / n


async def _reader_writer(address: tuple[str, int], n: int) -> float:
    loop = asyncio.get_running_loop()
    t0 = time.thread_time()
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        fd = sock.fileno()
        done: asyncio.Future[None] = loop.create_future()

        def readable(s: socket.socket = sock, f: int = fd,
                     d: asyncio.Future[None] = done) -> None:
            if not s.recv(65536):
                loop.remove_reader(f)
                s.close()
                d.set_result(None)

        def writable(s: socket.socket = sock, f: int = fd,
                     r: object = readable) -> None:
            loop.remove_writer(f)
            s.send(_REQUEST)
            loop.add_reader(f, r)  # type: ignore[arg-type]

        loop.add_writer(fd, writable)
        await done
    return (time.thread_time() - t0) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--connections", type=int, default=2000, help="connections per way")
    args = p.parse_args(argv)
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    replica = multiprocessing.get_context("fork").Process(target=_replica, args=(listener,),
                                                          daemon=True)
    replica.start()
    address = listener.getsockname()
    try:
        n = args.connections
        _blocking(address, 200)
        results = {
            "asyncio": asyncio.run(_asyncio(address, n)),
            "reader/writer": asyncio.run(_reader_writer(address, n)),
            "blocking": _blocking(address, n),
        }
    finally:
        replica.kill()
        listener.close()
    base = results["asyncio"]
    print(f"CPU per new connection, one exchange, {n} connections each:")
    for name, per in results.items():
        print(f"  {name:14} {per * 1e6:7.1f} us  ({per / base:.2f}x asyncio's transport)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
