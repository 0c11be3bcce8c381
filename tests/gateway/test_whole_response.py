"""A response the relay has whole goes out in one write, with no head left to flush later.

``Responder.respond`` hands status, headers and body to the server's
``WRITE_RESPONSE_EXTENSION`` writer (one write, nothing scheduled for the next loop iteration),
and falls back to the ASGI messages when the server offers no such writer, when the end is
held for an observer (``hold_end``), or when the writer declines (the client is gone).
Tested on the production server protocol (``gateway.h1.server``) over a real loopback socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.h1.asgi_io import WRITE_RESPONSE_EXTENSION, Message, Responder
from gateway.h1.server import ServerContext, ServerProtocol


class _CountingLoop:
    """The running loop, counting what the protocol schedules with ``call_soon``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.soon = 0

    def call_soon(self, *args: Any) -> asyncio.Handle:
        self.soon += 1
        return self._loop.call_soon(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


async def _serve_one(app: Any) -> tuple[bytes, int, list[bytes]]:
    """Serve one request with ``app``; return what the client read, the protocol's
    ``call_soon`` count while the app ran, and the writes the transport saw."""
    loop = asyncio.get_running_loop()
    counting = _CountingLoop(loop)
    writes: list[bytes] = []
    done = loop.create_future()

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        done.set_result(counting.soon)

    def factory() -> ServerProtocol:
        proto = ServerProtocol(ServerContext(wrapped))
        proto.loop = counting  # type: ignore[assignment]
        original = proto.connection_made

        def made(transport: Any) -> None:
            original(transport)
            write = transport.write

            def recording(data: bytes) -> None:
                writes.append(bytes(data))
                write(data)

            transport.write = recording

        proto.connection_made = made  # type: ignore[method-assign]
        return proto

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
        soon = await asyncio.wait_for(done, 5)
        data = await asyncio.wait_for(reader.readuntil(b"hello"), 5)
        writer.close()
        return data, soon, writes
    finally:
        server.close()


def test_a_whole_response_is_one_write_with_nothing_left_to_flush() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        out = Responder(send, "rid", write_response=scope["extensions"][WRITE_RESPONSE_EXTENSION])
        await out.respond(200, [(b"content-type", b"text/plain"),
                                (b"content-length", b"5")], b"hello")
        assert out.started and out.status == 200 and out.bytes_out == 5

    data, soon, writes = asyncio.run(_serve_one(app))
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\nhello")
    assert b"x-request-id: rid\r\n" in data and b"content-length: 5\r\n" in data
    assert writes == [data]  # head and body in one write
    assert soon == 0  # no held head to flush at the next loop iteration


def test_start_then_body_still_holds_the_head_for_the_body() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        out = Responder(send, "rid")  # no writer offered: the ASGI messages
        await out.respond(200, [(b"content-length", b"5")], b"hello")

    data, soon, writes = asyncio.run(_serve_one(app))
    assert writes == [data] and data.endswith(b"\r\n\r\nhello")
    assert soon == 1  # the head's flush, in case no body had followed


def _messages() -> tuple[list[Message], Any]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    return sent, send


def test_a_held_end_or_a_declining_server_falls_back_to_the_messages() -> None:
    async def run() -> None:
        calls: list[Any] = []

        def write(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
            calls.append((status, body))
            return False  # e.g. the client is gone

        sent, send = _messages()
        seen: list[Any] = []
        out = Responder(send, "r1", write_response=write, on_start=seen.append)
        await out.respond(201, [(b"content-type", b"a/b")], b"xyz")
        assert calls == [(201, b"xyz")]
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert sent[1]["body"] == b"xyz" and sent[1]["more_body"] is False
        assert (b"x-request-id", b"r1") in sent[0]["headers"] and len(seen) == 1

        calls.clear()
        sent, send = _messages()
        held = Responder(send, "r2", hold_end=True, write_response=write)
        await held.respond(200, [], b"body")
        assert calls == []  # the end is held for release(): never written at once
        assert [m["type"] for m in sent] == ["http.response.start"]
        await held.release(True)
        assert sent[-1]["body"] == b"body" and sent[-1]["more_body"] is False

    asyncio.run(run())


def test_the_server_declines_once_the_response_started() -> None:
    async def run() -> None:
        results: list[bool] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            write = scope["extensions"][WRITE_RESPONSE_EXTENSION]
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"5")]})
            results.append(write(200, [], b"hello"))  # started already: declined
            await send({"type": "http.response.body", "body": b"hello"})

        await _serve_one(app)
        assert results == [False]

    asyncio.run(run())
