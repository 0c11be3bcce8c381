"""Response framing of the gateway's server: a held head is never lost or late, the fast paths
write what ASGI ``send`` writes (byte-level comparisons with h11 as the client-side oracle are
in tests/gateway/test_h1_differential.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.h1.asgi_io import BODY_CHUNK_EXTENSION
from tests.gateway.gateway_server import Servers, connect, read_until_closed
from tests.gateway.helpers import KEY_A, Sim, settings, sse_events

CHUNKED_REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\ncontent-length: 2\r\n\r\n{}"
HTTP10_REQUEST = b"POST /v1/chat/completions HTTP/1.0\r\nHost: gw\r\ncontent-length: 2\r\n\r\n{}"
BODIES: list[Any] = [
    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
    b"",
    bytearray(b"data: [DONE]\n\n"),
    memoryview(b"x" * 70_000),
    b"\r\n0\r\n\r\n",  # looks like a last chunk: must be framed as data, not end the body
]


# --- served by the production protocol -----------------------------------------------------


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


async def _head_then_wait(scope: Any, receive: Any, send: Any) -> None:
    """An app that starts a response and then sends no body until the client leaves."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    while (await receive())["type"] != "http.disconnect":
        pass


def _read_head(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\r\n\r\n" not in data and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    return data


def test_held_head_is_written_when_no_body_follows(guarded: Servers, sim: Sim) -> None:
    srv = guarded.start(settings([sim.url]), app=_head_then_wait)
    with connect(srv.port) as sock:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: gw\r\n\r\n")
        head = _read_head(sock, timeout_s=5.0)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\ntransfer-encoding: chunked\r\n" in head.lower()


def test_relayed_stream_and_json_through_the_production_protocol(
    guarded: Servers, sim: Sim
) -> None:
    srv = guarded.start(settings([sim.url]))
    auth = {"authorization": f"Bearer {KEY_A}"}
    chat = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=srv.url, headers=auth, timeout=10) as client:
        for _ in range(2):  # the second request on the kept-alive connection
            r = client.post("/v1/chat/completions", json={**chat, "stream": True})
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.content)
            assert events[0]["choices"][0]["delta"]["role"] == "assistant"
            assert r.content.endswith(b"data: [DONE]\n\n")
            r = client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"]
            assert int(r.headers["content-length"]) == len(r.content)


# --- the body-chunk extension of the production server --------------------------------------

CHUNK = b"data: " + b"x" * (64 * 1024) + b"\n\n"
MAX_CHUNKS = 200  # 13 MiB: far above the socket buffers and the high-water mark


class _ExtensionApp:
    """Streams ``MAX_CHUNKS`` chunks through the server's body-chunk extension."""

    def __init__(self) -> None:
        self.written = 0
        self.fallbacks = 0
        self.offered = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        write = scope.get("extensions", {}).get(BODY_CHUNK_EXTENSION)
        self.offered = write is not None
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        count = 3 if scope["path"] == "/short" else MAX_CHUNKS
        for _ in range(count):
            if not await write(CHUNK):
                self.fallbacks += 1
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            self.written += 1
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})


def _dechunk(raw: bytes) -> tuple[bytes, bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return head, body
        body += rest[:size]
        assert rest[size:size + 2] == b"\r\n"
        rest = rest[size + 2:]


def test_extension_writes_what_asgi_send_would(guarded: Servers, sim: Sim) -> None:
    app = _ExtensionApp()
    srv = guarded.start(settings([sim.url]), app=app)
    with connect(srv.port) as sock:
        sock.sendall(b"GET /short HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        raw, _ = read_until_closed(sock, timeout_s=10)
    assert app.offered and app.fallbacks == 0
    head, body = _dechunk(raw)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == CHUNK * 3 + b"data: [DONE]\n\n"


def test_extension_waits_for_a_slow_client(guarded: Servers, sim: Sim) -> None:
    # The client reads nothing at first: the writes must stop at the transport's high-water
    # mark (flow control), not buffer all 13 MiB in the server.
    app = _ExtensionApp()
    srv = guarded.start(settings([sim.url]), app=app)
    with connect(srv.port, timeout_s=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"GET /long HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        stalled_at = -1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the writer stops advancing
            seen = app.written
            time.sleep(0.3)
            if app.written == seen and seen > 0:
                stalled_at = seen
                break
        assert 0 < stalled_at < MAX_CHUNKS
        raw, closed = read_until_closed(sock, timeout_s=60)
    assert closed
    _, body = _dechunk(raw)
    assert body == CHUNK * MAX_CHUNKS + b"data: [DONE]\n\n"
