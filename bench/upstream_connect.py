"""CPU of the relay's upstream client per new connection: connect, one exchange, close.

Runs :class:`gateway.h1.RelayClient` with ``fresh=True`` (a new connection per request, as in
a burst of new streams) against a minimal replica on loopback that runs in a thread (accept,
read the request, answer ``200`` with two bytes, close), so the event loop's thread does only
the client's work; prints that thread's CPU time (user + system, ``time.thread_time``) per
request in microseconds, after 100 warm-up requests. Two builds side by side: run it once per
build with ``PYTHONPATH=DIR`` (another checkout's packages, ``-P`` so the working directory does
not come first), interleaved, under ``flock /work/bench.lock``.

Usage::

    PYTHONPATH=$PWD .venv/bin/python bench/upstream_connect.py --requests 2000
    PYTHONPATH=/tmp/base .venv/bin/python -P bench/upstream_connect.py
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time

from gateway.h1 import RelayClient, resolver_dialer

_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def _replica(listener: socket.socket) -> None:
    """Answer each connection's one request and close it (until the listener closes)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            received = b""
            while b"\r\n\r\n{}" not in received:
                data = conn.recv(65536)
                if not data:
                    break
                received += data
            conn.sendall(_OK)


async def _measure(requests: int) -> float:
    """Return the loop thread's CPU seconds per fresh request (after a warm-up)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    threading.Thread(target=_replica, args=(listener,), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    client = RelayClient(resolver_dialer(), tls=True, limit=0, keep_alive_s=30.0,
                         connect_s=5.0)

    async def one() -> None:
        resp = await client.post(url, "/v1/x", {}, b"{}", fresh=True)
        while await resp.read():
            pass
        resp.release()

    for _ in range(100):
        await one()
    t0 = time.thread_time()
    for _ in range(requests):
        await one()
    used = time.thread_time() - t0
    await client.close()
    listener.close()
    return used / requests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=2000, help="fresh requests measured")
    args = p.parse_args(argv)
    per = asyncio.run(_measure(args.requests))
    print(f"{per * 1e6:.1f} us of loop-thread CPU per new connection and exchange")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
