"""The synchronous relay of streamed bodies: upstream pieces written from ``data_received``.

``H1Connection.read_into`` hands each decoded body piece to a sink from the protocol callback
(no task wake-up per piece), ``Responder.sink`` writes them with the server's
``WRITE_NOW_EXTENSION`` writer, and the relay uses both under the gateway's own server. Tested
against real loopback servers and the production uvicorn protocol (``gateway.http_guard``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.asgi_io import Message, Responder
from gateway.h1.connection import H1Connection
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


def test_a_declined_piece_stays_buffered_and_the_sink_is_not_called_again() -> None:
    async def test() -> None:
        backend = Backend(paced(PIECES))
        url = await backend.start()
        c = client()
        resp = await c.post(url, "/v1/x", {}, b"{}")
        body = await resp.read()
        calls: list[bytes] = []

        def sink(piece: bytes) -> bool:
            calls.append(piece)
            return len(calls) == 1  # takes the first, declines the second

        declined = await resp.read_into(sink)
        assert calls == PIECES[1:3]
        assert declined == PIECES[2]  # the declined piece, untouched
        body += PIECES[1] + declined
        while rest := await resp.read():
            body += rest
        assert calls == PIECES[1:3]  # removed after declining
        assert body == b"".join(PIECES)
        resp.release()
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
        self.writable = True

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def write_now(self, data: bytes) -> bool:
        if not self.writable:
            return False
        if data:
            self.written.append(data)
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


def test_the_sink_declines_untouched_while_the_client_socket_is_full() -> None:
    async def test() -> None:
        server = _Server()
        out = Responder(server.send, "r1", write_now=server.write_now)
        await out.start(200, list(SSE_HEAD))
        fed: list[bytes] = []

        def feed(piece: bytes) -> bytes:
            fed.append(piece)
            return piece

        take = out.sink(feed)
        assert take is not None
        server.writable = False
        assert take(b"data: 1\n\n") is False
        assert fed == [] and out.bytes_out == 0  # nothing scanned, nothing counted
        server.writable = True
        assert take(b"data: 1\n\n") is True
        assert server.written == [b"data: 1\n\n"] and out.bytes_out == 9

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
