"""The server's whole-body extension (gateway.h1.asgi_io.WHOLE_BODY_EXTENSION) gives what
``receive()`` gives, only when all of the body is there, and only once.

Served by the production protocol (a real uvicorn on loopback, raw sockets), plus
``read_body``'s use of it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.errors import PayloadTooLarge
from gateway.h1.asgi_io import WHOLE_BODY_EXTENSION, read_body
from tests.gateway.gateway_server import Servers, connect, read_until_closed
from tests.gateway.helpers import Sim, settings

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


_TRIED = threading.Event()
"""Set by :func:`_echo` once it has tried to take the body (the server runs in a thread)."""


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Takes the body through the extension (twice), else reads it with ``receive()``; answers
    what it saw as JSON."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    take = scope["extensions"][WHOLE_BODY_EXTENSION]
    first = take()
    second = take()
    _TRIED.set()
    body = first
    if body is None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
    answer = json.dumps({"taken": first is not None, "again": second is not None,
                         "body": body.decode()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer, "more_body": False})


def _answer(sock: socket.socket) -> dict[str, Any]:
    raw, _ = read_until_closed(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    result: dict[str, Any] = json.loads(body)
    return result


def _head(length: int | None) -> bytes:
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked")
    return (f"POST /echo HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n{framing}\r\n\r\n"
            .encode())


def test_a_body_that_arrived_whole_is_taken_once(guarded: Servers, sim: Sim) -> None:
    srv = guarded.start(settings([sim.url]), app=_echo)
    with connect(srv.port) as sock:
        sock.sendall(_head(len(BODY)) + BODY)
        assert _answer(sock) == {"taken": True, "again": False, "body": BODY.decode()}


def test_an_empty_body_is_taken(guarded: Servers, sim: Sim) -> None:
    srv = guarded.start(settings([sim.url]), app=_echo)
    with connect(srv.port) as sock:
        sock.sendall(_head(0))
        assert _answer(sock) == {"taken": True, "again": False, "body": ""}


def test_a_body_still_arriving_is_left_to_receive(guarded: Servers, sim: Sim) -> None:
    srv = guarded.start(settings([sim.url]), app=_echo)
    with connect(srv.port) as sock:
        _TRIED.clear()
        sock.sendall(_head(len(BODY)) + BODY[:10])
        assert _TRIED.wait(5)  # the app ran and found only part of the body
        sock.sendall(BODY[10:])
        assert _answer(sock) == {"taken": False, "again": False, "body": BODY.decode()}


def test_a_chunked_body_arrived_whole_is_taken_joined(guarded: Servers, sim: Sim) -> None:
    srv = guarded.start(settings([sim.url]), app=_echo)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                       for part in (BODY[:7], BODY[7:30], BODY[30:])) + b"0\r\n\r\n"
    with connect(srv.port) as sock:
        sock.sendall(_head(None) + chunked)
        assert _answer(sock) == {"taken": True, "again": False, "body": BODY.decode()}


def _no_receive() -> Any:
    raise AssertionError("receive() called although the body was taken whole")


def test_read_body_takes_a_whole_body_without_receive() -> None:
    got = asyncio.run(read_body(_no_receive, 100, len(BODY), 1.0, lambda: BODY))
    assert got == BODY


def test_read_body_refuses_a_whole_body_over_the_limit() -> None:
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_body(_no_receive, len(BODY) - 1, None, 1.0, lambda: BODY))


def test_read_body_falls_back_to_receive_when_nothing_is_taken() -> None:
    messages = [{"type": "http.request", "body": BODY[:5], "more_body": True},
                {"type": "http.request", "body": BODY[5:], "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    assert asyncio.run(read_body(receive, 100, None, 1.0, lambda: None)) == BODY
