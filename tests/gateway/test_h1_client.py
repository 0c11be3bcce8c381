"""The relay's own HTTP/1.1 upstream client (gateway.h1) against real loopback servers.

Framing (chunked, lengths, heads), what it refuses, keep-alive reuse and its bounds, the stale
connection signal the relay retries on, and cancellation. Each test runs a scripted asyncio
server on 127.0.0.1 that answers every request with the bytes the test gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.h1 import (
    ConnectFailed,
    ConnectionClosed,
    IncompleteBody,
    ProtocolError,
    RelayClient,
    resolver_dialer,
)
from gateway.h1.framing import MAX_HEAD_BYTES
from tests.gateway.helpers import KEY_A, settings, sse_events, start_gateway

Answer = Callable[[int, asyncio.StreamWriter], Awaitable[bool]]
"""``(request number on the connection, writer) -> keep the connection open``."""


@dataclass
class Backend:
    """A loopback server that reads whole requests and answers with ``answer``."""

    answer: Answer
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                keep = await self.answer(n, writer)
                await writer.drain()
                n += 1
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()
            self.closed.set()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def replies(*raw: bytes, keep: bool = True) -> Answer:
    """Answer each request with ``raw`` (a tuple: written piece by piece, flushed each)."""

    async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
        for piece in raw:
            writer.write(piece)
            await writer.drain()
        return keep

    return answer


def client(limit: int = 0, keep_alive_s: float = 30.0) -> RelayClient:
    return RelayClient(resolver_dialer(), tls=True, limit=limit,
                       keep_alive_s=keep_alive_s, connect_s=5.0)


async def read_all(c: RelayClient, url: str, fresh: bool = False) -> tuple[int, bytes]:
    resp = await c.post(url, "/v1/x", {"content-type": "application/json"}, b"{}", fresh=fresh)
    body = b""
    try:
        while chunk := await resp.read():
            body += chunk
    except BaseException:
        resp.close()
        raise
    resp.release()
    return resp.status, body


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


OK_CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
              b"transfer-encoding: chunked\r\n\r\n")


def test_chunked_body_split_anywhere_is_decoded_whole() -> None:
    body = b"data: one\n\n" * 3
    wire = (b"b;ext=1\r\ndata: one\n\n\r\n" + b"16\r\n" + body[11:] + b"\r\n"
            + b"0\r\nx-trailer: t\r\n\r\n")

    async def test() -> None:
        # Every byte of the chunked framing in its own write: sizes, CRLFs, trailers.
        backend = Backend(replies(OK_CHUNKED, *(wire[i:i + 1] for i in range(len(wire)))))
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, body)
        assert await read_all(c, url) == (200, body)
        assert backend.connections == 1, "a whole chunked response leaves a reusable connection"
        await c.close()
        await backend.stop()

    run(test)


@pytest.mark.parametrize("framing", [
    b"zz\r\ndata\r\n0\r\n\r\n",           # not a hex size
    b"0x4\r\ndata\r\n0\r\n\r\n",          # int(..., 16) would take it
    b"4\r\ndataXX0\r\n\r\n",              # no CRLF after the chunk data
    b"-4\r\ndata\r\n0\r\n\r\n",           # negative size
    b"4\ndata\r\n0\r\n\r\n",              # bare LF after the size
    b"1" * 2000 + b"\r\n",                # size line over the limit
], ids=["hex", "0x", "no-crlf", "negative", "bare-lf", "long-line"])
def test_malformed_chunked_framing_is_an_upstream_protocol_error(framing: bytes) -> None:
    async def test() -> None:
        backend = Backend(replies(OK_CHUNKED + framing))
        url = await backend.start()
        c = client()
        with pytest.raises(ProtocolError):
            await read_all(c, url)
        await backend.closed.wait()  # the client closed the connection: never reused
        assert c.idle_connections() == 0
        await c.close()
        await backend.stop()

    run(test)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10,
    OK_CHUNKED + b"a\r\n01234",
    OK_CHUNKED + b"5\r\n01234\r\n",  # no last chunk
], ids=["length", "mid-chunk", "no-last-chunk"])
def test_truncated_body_is_incomplete(answer: bytes) -> None:
    async def test() -> None:
        backend = Backend(replies(answer, keep=False))
        url = await backend.start()
        c = client()
        with pytest.raises(IncompleteBody):
            await read_all(c, url)
        await c.close()
        await backend.stop()

    run(test)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * MAX_HEAD_BYTES + b"\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nabcde",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nx-folded: a\r\n  b\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nbad header\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
], ids=["oversized", "two-lengths", "plus-length", "gzip", "obs-fold", "no-colon",
        "version", "101"])
def test_malformed_or_oversized_head_is_refused(head: bytes) -> None:
    async def test() -> None:
        backend = Backend(replies(head))
        url = await backend.start()
        c = client()
        with pytest.raises(ProtocolError):
            await c.post(url, "/v1/x", {}, b"{}")
        await backend.closed.wait()
        await c.close()
        await backend.stop()

    run(test)


def test_garbage_after_the_body_keeps_the_response_but_not_the_connection() -> None:
    answer = (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
              b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil")

    async def test() -> None:
        backend = Backend(replies(answer))
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, b"hello")
        assert await read_all(c, url) == (200, b"hello")
        assert backend.connections == 2, "a connection with bytes after its body was reused"
        await c.close()
        await backend.stop()

    run(test)


def test_interim_responses_are_skipped_and_keep_alive_reuses_one_connection() -> None:
    answer = (b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
              b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    async def test() -> None:
        backend = Backend(replies(answer))
        url = await backend.start()
        c = client()
        for _ in range(5):
            assert await read_all(c, url) == (200, b"{}")
        assert backend.connections == 1
        assert c.open_connections == 1 and c.idle_connections() == 1
        head = backend.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
        assert head[0] == b"POST /v1/x HTTP/1.1"
        assert f"host: 127.0.0.1:{url.rsplit(':', 1)[1]}".encode() in head
        assert b"content-length: 2" in head
        await c.close()
        await backend.stop()

    run(test)


def test_connection_close_and_close_delimited_bodies_are_not_pooled() -> None:
    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.1 200 OK\r\nconnection: close\r\n"
                                  b"content-length: 2\r\n\r\nok"))
        backend_eof = Backend(replies(b"HTTP/1.1 200 OK\r\n\r\nuntil close", keep=False))
        url, url_eof = await backend.start(), await backend_eof.start()
        c = client()
        assert await read_all(c, url) == (200, b"ok")
        assert await read_all(c, url_eof) == (200, b"until close")
        assert c.idle_connections() == 0
        assert await read_all(c, url) == (200, b"ok")
        assert backend.connections == 2
        await c.close()
        await backend.stop()
        await backend_eof.stop()

    run(test)


def test_pooled_connection_closed_by_the_replica_is_reported_before_the_response() -> None:
    """The signal of the relay's stale-connection retry (tested end to end elsewhere)."""

    async def test() -> None:
        first = True

        async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
            nonlocal first
            if first:
                first = False
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                return True
            return False  # a reused connection: closed without an answer

        backend = Backend(answer)
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, b"ok")
        with pytest.raises(ConnectionClosed) as info:
            await read_all(c, url)
        assert info.value.before_response
        await c.close()
        await backend.stop()

    run(test)


def test_fresh_connection_is_new_and_closed_after_its_response() -> None:
    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"))
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, b"ok")
        assert await read_all(c, url, fresh=True) == (200, b"ok")
        assert backend.connections == 2 and c.idle_connections() == 1
        await c.close()
        await backend.stop()

    run(test)


def test_the_pool_is_bounded_and_idle_connections_expire() -> None:
    release = asyncio.Event

    async def test() -> None:
        gate = release()

        async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
            await gate.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return True

        backend = Backend(answer)
        url = await backend.start()
        c = client(limit=2, keep_alive_s=0.2)
        tasks = [asyncio.create_task(read_all(c, url)) for _ in range(5)]
        while len(backend.requests) < 2:  # two requests in flight, three wait for a slot
            await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*tasks) == [(200, b"ok")] * 5
        assert backend.most_open == 2 and backend.connections == 2
        await backend.closed.wait()  # idle past keep_alive_s: the client closed it
        assert c.idle_connections() <= 1
        await c.close()
        await backend.stop()

    run(test)


def test_each_idle_connection_expires_keep_alive_after_its_own_release() -> None:
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def test() -> None:
        loop = asyncio.get_running_loop()
        first, second = Backend(replies(ok)), Backend(replies(ok))
        url1, url2 = await first.start(), await second.start()
        c = client(keep_alive_s=0.5)
        assert await read_all(c, url1) == (200, b"ok")
        await asyncio.sleep(0.25)
        assert await read_all(c, url2) == (200, b"ok")
        released2 = loop.time()
        assert c.idle_connections() == 2
        await asyncio.wait_for(first.closed.wait(), 5)
        # The pool's one timer closed the first; the second is idle for its own 0.5 s.
        assert not second.closed.is_set() and c.idle_connections() == 1
        await asyncio.wait_for(second.closed.wait(), 5)
        assert loop.time() - released2 >= 0.5 - 0.01
        assert c.idle_connections() == 0
        await c.close()
        await first.stop()
        await second.stop()

    run(test)


def test_cancelled_exchange_closes_the_connection() -> None:
    async def test() -> None:
        backend = Backend(replies(OK_CHUNKED + b"5\r\nfirst\r\n"))  # then never ends
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        assert await resp.read() == b"first"
        reader = asyncio.create_task(resp.read())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        resp.close()
        await backend.closed.wait()
        assert c.idle_connections() == 0
        await c.close()
        await backend.stop()

    run(test)


def test_backpressure_pauses_reading_until_the_relay_takes_the_bytes() -> None:
    size = 4 * 1024 * 1024

    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size,
                                  b"x" * size))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        got, largest = 0, 0
        while chunk := await resp.read():
            got += len(chunk)
            largest = max(largest, len(chunk))
            await asyncio.sleep(0.001)  # a slow relay
        resp.release()
        assert got == size
        assert largest < size // 4, "the whole body was buffered: reading never paused"
        await c.close()
        await backend.stop()

    run(test)


def test_connect_refused_is_a_connect_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def test() -> None:
        c = client()
        with pytest.raises(ConnectFailed):
            await c.post(f"http://127.0.0.1:{port}", "/v1/x", {}, b"{}")
        assert c.open_connections == 0
        await c.close()

    run(test)


@pytest.mark.parametrize("headers", [
    {"x-a": "1\r\nx-b: 2"},
    {"x-a": "1", "x-b": "2\r"},  # a lone CR, in a later header
    {"x-a": "1\n", "x-b": "2"},  # a lone LF
    {"x-a": "1", "x-b": "2\0"},  # NUL in a value
    {"x-a\r": "1"},  # CR in a name
    {"x-a": "1", "x\nb": "2"},  # LF in a name
])
def test_header_injection_is_refused(headers: dict[str, str]) -> None:
    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"))
        url = await backend.start()
        c = client()
        with pytest.raises(ValueError, match="invalid character in header"):
            await c.post(url, "/v1/x", headers, b"{}")
        assert backend.requests == []
        await c.close()
        await backend.stop()

    run(test)


class RawBackend:
    """A raw-bytes backend in its own thread (the gateway under test serves in another)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    conn.sendall(self.answer)
                    conn.shutdown(socket.SHUT_WR)
                    while conn.recv(65536):
                        pass

    def stop(self) -> None:
        self.sock.close()


def test_malformed_upstream_framing_ends_the_stream_with_an_error_event(
    serve_asgi: Callable[..., Any],
) -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    backend = RawBackend(OK_CHUNKED + b"%x\r\n%s\r\n" % (len(event), event) + b"zz\r\n")
    try:
        url = start_gateway(serve_asgi, settings([backend.url]))
        r = httpx.post(url + "/v1/chat/completions", timeout=10,
                       headers={"authorization": f"Bearer {KEY_A}"},
                       json={"model": "llama-3.1-8b", "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        events = sse_events(r.content)
        assert events[0]["choices"][0]["delta"]["content"] == "hi"
        assert events[-1]["error"]["code"] == "upstream_error"
        assert "malformed HTTP response" in events[-1]["error"]["message"]
    finally:
        backend.stop()
