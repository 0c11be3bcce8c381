"""A replica's unsolicited response is never taken as the answer to another request.

A replica that sends a second, unsolicited response after a correctly framed answer leaves bytes
on a connection that answers no request. If the pool hands that connection to the next request
before the event loop has read those bytes (a busy loop releases and re-takes a connection in
one pass), the stray response would be read as the next request's answer: that client would get
another request's (or no request's) 200, its real answer would be lost, and its audit record
would be wrong. A pooled connection with any unread byte (or the replica's close) is never
reused; the request goes out on a new connection.

What no HTTP/1.1 client can tell apart: stray bytes that the replica sends only after the next
request was written on the connection look exactly like that request's answer (HTTP/1.1 has no
request ids). The check closes every window up to the write; after it, the real answer arrives
as bytes after a whole response, and the connection is dropped (``garbage``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.h1 import RelayClient, resolver_dialer


def _response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


REAL_BODY = b'{"id": "real", "object": "chat.completion", "choices": []}'
REAL = _response(REAL_BODY)
FAKE = _response(b'{"id": "fake", "object": "chat.completion", "choices": []}')


class StrayResponder:
    """A thread-run loopback replica: each request gets REAL, then FAKE as a separate send.

    Runs in its own threads (not on the test's event loop), so the stray bytes arrive in the
    client's socket while the client's loop is busy.
    """

    def __init__(self, gap_s: float = 0.0) -> None:
        self.gap_s = gap_s
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stray_sent = threading.Event()
        self._stop = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(rest) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    rest += data
                buf = rest[length:]
                try:
                    conn.sendall(REAL)
                    if self.gap_s:
                        time.sleep(self.gap_s)
                    conn.sendall(FAKE)
                except OSError:
                    return
                self.stray_sent.set()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def stray() -> Iterator[StrayResponder]:
    backend = StrayResponder(gap_s=0.05)
    yield backend
    backend.close()


async def _body(c: RelayClient, url: str) -> bytes:
    resp = await c.post(url, "/v1/x", {"content-type": "application/json"}, b"{}")
    body = b""
    while chunk := await resp.read():
        body += chunk
    resp.release()
    return body


def test_bytes_unread_on_an_idle_connection_keep_it_out_of_the_pool(
    stray: StrayResponder,
) -> None:
    async def test() -> None:
        c = RelayClient(resolver_dialer(), tls=True, limit=0, keep_alive_s=30.0, connect_s=5.0)
        try:
            assert await _body(c, stray.url) == REAL_BODY
            assert c.idle_connections() == 1  # released whole and kept open: pooled
            # The loop is busy (blocked here) while the replica's stray response arrives: the
            # bytes wait in the socket, unread, and the next request takes the connection in
            # the same pass of the loop.
            assert stray.stray_sent.wait(5)
            time.sleep(0.05)
            assert await _body(c, stray.url) == REAL_BODY
            assert stray.connections == 2  # the poisoned connection was not reused
        finally:
            await c.close()

    asyncio.run(test())
