"""The synchronous relay of streamed bodies: upstream pieces written from ``data_received``.

``H1Connection.read_into`` hands each decoded body piece to a sink from the protocol callback
(no task wake-up per piece), ``Responder.sink`` writes them with the server's
``WRITE_NOW_EXTENSION`` writer, and the relay uses both under the gateway's own server. Tested
against real loopback servers and the production server (``gateway.h1.server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.h1.asgi_io import Message, Responder
from gateway.h1.client import H1Connection
from tests.gateway.gateway_server import Servers
from tests.gateway.helpers import KEY_A, SERVED, Recorder, settings, sse_events, start_sim
from tests.gateway.test_h1_client import OK_CHUNKED, Backend, client, run

AUTH = {"authorization": f"Bearer {KEY_A}"}
CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def paced(pieces: list[bytes], gap_s: float = 0.02, end: bool = True) -> Any:
    """An answer: the chunked head and first piece, then each piece ``gap_s`` apart."""

    async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK_CHUNKED + chunk(pieces[0]))
        await writer.drain()
        for piece in pieces[1:]:
            await asyncio.sleep(gap_s)
            writer.write(chunk(piece))
            await writer.drain()
        if end:
            await asyncio.sleep(gap_s)
            writer.write(b"0\r\n\r\n")
        return True

    return answer


PIECES = [b"data: %d\n\n" % i for i in range(6)]


def keeper(into: list[bytes]) -> Any:
    """A sink that takes every piece into ``into``."""

    def take(piece: bytes) -> bool:
        into.append(piece)
        return True

    return take


def test_read_into_hands_each_piece_to_the_sink_and_returns_at_the_end() -> None:
    async def test() -> None:
        backend = Backend(paced(PIECES))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        assert await resp.read() == PIECES[0]
        taken: list[bytes] = []
        assert await resp.read_into(keeper(taken)) == b""
        assert taken == PIECES[1:]  # one call per piece as it arrived, none buffered
        resp.release()
        assert c.idle_connections() == 1  # the exchange ended cleanly: pooled
        await c.close()
        await backend.stop()

    run(test)


def test_a_sink_that_stops_is_not_called_again_and_later_pieces_are_buffered() -> None:
    async def test() -> None:
        backend = Backend(paced(PIECES))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        body = await resp.read()
        calls: list[bytes] = []

        def sink(piece: bytes) -> bool:
            calls.append(piece)
            return len(calls) == 1  # takes the first and goes on, takes the second and stops

        assert await resp.read_into(sink) is None  # stopped, nothing buffered after it yet
        assert calls == PIECES[1:3]
        body += b"".join(calls)
        while rest := await resp.read():
            body += rest
        assert calls == PIECES[1:3]  # removed after stopping: the rest was buffered
        assert body == b"".join(PIECES)
        resp.release()
        assert c.idle_connections() == 1
        await c.close()
        await backend.stop()

    run(test)


def test_a_failing_sink_fails_the_exchange_and_the_connection_is_not_reused() -> None:
    async def test() -> None:
        backend = Backend(paced(PIECES))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        await resp.read()

        def sink(piece: bytes) -> bool:
            raise ValueError("writer broke")

        with pytest.raises(ValueError, match="writer broke"):
            await resp.read_into(sink)
        resp.release()
        assert c.idle_connections() == 0
        await c.close()
        await backend.stop()

    run(test)


def test_a_cancelled_read_into_removes_its_sink() -> None:
    async def test() -> None:
        backend = Backend(paced(PIECES, gap_s=0.05))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        await resp.read()
        calls: list[bytes] = []
        reader = asyncio.create_task(resp.read_into(keeper(calls)))
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert await resp.read() == PIECES[1]  # buffered for the reader, not given to the sink
        assert calls == []
        resp.close()
        await c.close()
        await backend.stop()

    run(test)


class _Server:
    """What a server's ``send`` and ``write_now`` were given (``writable``: the socket's room)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.written: list[bytes] = []
        self.order: list[bytes] = []  # body bytes in the order they left, by either path
        self.writable = True

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message.get("body"):
            self.order.append(message["body"])

    def write_now(self, data: bytes) -> bool:
        if not self.writable:
            return False
        if data:
            self.written.append(data)
            self.order.append(data)
        return True


SSE_HEAD = [(b"content-type", b"text/event-stream")]


@pytest.mark.parametrize("path", ["body", "sink"])
def test_a_done_marker_split_across_chunks_is_held(path: str) -> None:
    """With ``hold_end``, ``data: [DONE]`` reaches the client only on release, also when the
    upstream split the marker across two chunks (the old check looked inside one chunk)."""

    async def test() -> None:
        server = _Server()
        out = Responder(server.send, "r1", hold_end=True, write_now=server.write_now)
        await out.start(200, list(SSE_HEAD))
        first, second = b'data: {"a":1}\n\ndata: [DO', b"NE]\n\n"
        if path == "body":
            await out.body(first)
            await out.body(second)
        else:
            take = out.sink(lambda piece: piece)
            assert take is not None
            assert take(first) and take(second)
        assert server.written == [first]
        await out.body(b"", more=False)
        await out.release(True)
        assert [m.get("body") for m in server.sent[1:]] == [second, b""]

    run(test)


def test_what_the_client_socket_cannot_take_now_is_kept_for_flush_in_order() -> None:
    async def test() -> None:
        server = _Server()
        out = Responder(server.send, "r1", write_now=server.write_now)
        await out.start(200, list(SSE_HEAD))
        take = out.sink(lambda piece: piece)
        assert take is not None
        assert take(b"data: 1\n\n") is True
        server.writable = False
        assert take(b"data: 2\n\n") is False  # kept: the caller stops and flushes
        assert out.pending and out.bytes_out == 18
        server.writable = True
        await out.body(b"data: 3\n\n")  # anything sent later goes after the kept bytes
        assert server.order == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
        assert [m["body"] for m in server.sent[1:]] == [b"data: 2\n\n"]  # waited for room
        assert not out.pending

    run(test)


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


def test_a_relayed_stream_is_written_from_the_upstream_callback(
    serve_asgi: Any, guarded: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the gateway's own server, the relay task is not woken per SSE event: the events
    go to the client from the upstream connection's callback, byte for byte, audited."""
    woken: list[int] = []
    read = H1Connection.read

    async def counted_read(self: H1Connection) -> bytes:
        woken.append(1)
        return await read(self)

    monkeypatch.setattr(H1Connection, "read", counted_read)
    sim = start_sim(serve_asgi, itl_s=0.005, tokens_per_response=60)
    recorder = Recorder()
    s = settings([sim.url])
    gw = guarded.start(s, create_app(s, observers=[recorder])).url
    direct = httpx.post(sim.url + "/v1/chat/completions", json={**CHAT, "model": SERVED},
                        timeout=30)
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    expected = sse_events(direct.content)
    assert len(events) == len(expected) == 62  # role, 60 tokens, [DONE] (usage event removed)
    assert [e["choices"][0]["delta"] for e in events[:-1]] == [
        e["choices"][0]["delta"] for e in expected[:-1]]
    record = recorder.wait(1)[0]
    assert record.outcome == "ok" and record.output_tokens == 60
    # 60 token events: the task reads the first event, the end and what a full client socket
    # or a coalesced read left over; everything else went through the sink.
    assert len(woken) < 10, f"the relay task was woken {len(woken)} times for 60 events"


class _FastStream:
    """A replica streaming ``events`` SSE events of ``size`` bytes as fast as its socket takes
    them (raw socket, own thread); :attr:`sent` counts the events handed to the kernel."""

    def __init__(self, events: int, size: int) -> None:
        self.events, self.size, self.sent = events, size, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def content(self, i: int) -> bytes:
        return b"%06d" % i * (self.size // 6)

    def event(self, i: int) -> bytes:
        return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % self.content(i)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(OK_CHUNKED)
                for i in range(self.events):
                    conn.sendall(chunk(self.event(i)))
                    self.sent += 1
                conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def stop(self) -> None:
        self.sock.close()


def test_a_slow_client_gets_every_event_in_order_and_nothing_piles_up_in_the_gateway(
    guarded: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client reads nothing for a while: the relay stops writing at the client socket's
    high-water mark (the sink keeps the event it could not write and the task waits for room;
    the replica's bytes wait in the kernel, not in the gateway), then relays every byte in
    order."""
    flushed: list[int] = []
    flush = Responder.flush

    async def counted_flush(self: Responder) -> None:
        flushed.append(len(self._pending))
        await flush(self)

    monkeypatch.setattr(Responder, "flush", counted_flush)
    backend = _FastStream(events=3000, size=3000)  # about 9 MB
    try:
        s = settings([backend.url])
        srv = guarded.start(s, create_app(s))
        request = json.dumps(CHAT).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                         b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (KEY_A.encode(), len(request), request))
            time.sleep(1.0)  # not reading
            raw = b""
            while piece := sock.recv(1 << 20):
                raw += piece
        assert flushed and max(flushed) == 1  # the sink stopped at the first event kept
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        events = sse_events(_dechunked(body))
        assert events[-1] == "[DONE]"
        contents = [e["choices"][0]["delta"]["content"] for e in events[:-1]]
        assert contents == [backend.content(i).decode() for i in range(backend.events)]
    finally:
        backend.stop()


def _dechunked(body: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        eol = body.index(b"\r\n", pos)
        size = int(body[pos:eol], 16)
        if size == 0:
            return out
        out += body[eol + 2:eol + 2 + size]
        pos = eol + 2 + size + 2


def test_bytes_kept_for_flush_survive_a_cancelled_flush() -> None:
    """The sink kept bytes for a full client socket; the flush waiting for room is cancelled
    (the drain deadline cuts the request): the kept bytes still go out, in order, before the
    final event (they were dropped before they were written)."""

    async def test() -> None:
        room = asyncio.Event()
        order: list[bytes] = []

        async def send(message: Message) -> None:
            await room.wait()  # uvicorn's send waits for room before it writes
            if message.get("body"):
                order.append(message["body"])

        writable = [True]

        def write_now(data: bytes) -> bool:
            if not writable[0]:
                return False
            order.append(data)
            return True

        out = Responder(send, "r1", write_now=write_now)
        room.set()
        await out.start(200, list(SSE_HEAD))
        room.clear()
        take = out.sink(lambda piece: piece)
        assert take is not None
        assert take(b"data: 1\n\n")
        writable[0] = False
        assert not take(b"data: 2\n\n")
        flushing = asyncio.create_task(out.flush())
        await asyncio.sleep(0)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        room.set()
        await out.body(b"data: end\n\n", more=False)
        assert order == [b"data: 1\n\n", b"data: 2\n\n", b"data: end\n\n"]

    asyncio.run(test())
