"""Every state of a client connection has a bound, tried as an attacker would.

Each test drives the server ``gateway serve`` builds over loopback sockets and fails on the
uvicorn/h11-based server this replaced: a response sent before the request body was read left
the connection open for as long as the client kept sending (40 such sockets held a gateway
capped at 40 connections), a client that stopped reading held its connection for ever, chunk
extensions with control characters were accepted, and ``/v1/mode%6cs`` was served.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.gateway_server import Servers, connect, read_until_closed, split_response
from tests.gateway.helpers import KEY_A, Sim, settings

BIG_POST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n")


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _closed_while_sending(sock: socket.socket, within_s: float) -> bool:
    """Keep sending body bytes; ``True`` once the server closed the connection."""
    sock.setblocking(False)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            sock.send(b"x" * 1024)
        except BlockingIOError:
            pass
        except OSError:
            return True
        try:
            if sock.recv(65536) == b"":
                return True
        except BlockingIOError:
            pass
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_an_early_answer_closes_the_connection_however_long_the_client_sends(
    servers: Servers, sim: Sim
) -> None:
    srv = servers.start(settings([sim.url]))
    with connect(srv.port) as sock:
        sock.sendall(BIG_POST + b"{" * 1000)  # no key: 401 before the body is read
        sock.settimeout(5)
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 401 "), head[:100]
        # The linger is 2 s; the client sending all along must not extend it.
        assert _closed_while_sending(sock, within_s=10), "connection still open after 10 s"


def test_sockets_sending_bodies_cannot_hold_a_capped_gateway(servers: Servers, sim: Sim) -> None:
    cap = 40
    cfg = settings([sim.url], limits={"max_client_connections": cap})
    srv = servers.start(cfg)
    holders = [connect(srv.port) for _ in range(cap)]
    for sock in holders:
        sock.sendall(BIG_POST)
        sock.setblocking(False)
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            for sock in holders:
                try:
                    sock.send(b"x" * 512)
                except OSError:
                    pass
            time.sleep(0.05)

    sender = threading.Thread(target=keep_sending, daemon=True)
    sender.start()
    try:
        served = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                served = httpx.get(f"{srv.url}/v1/models",
                                   headers={"Authorization": f"Bearer {KEY_A}"}, timeout=5)
            except httpx.TransportError:
                served = None
            if served is not None and served.status_code == 200:
                break
            time.sleep(0.2)
        assert served is not None and served.status_code == 200, (
            served.status_code if served is not None else "no answer")
    finally:
        stop.set()
        sender.join(5)
        for sock in holders:
            sock.close()


@pytest.mark.parametrize("ext", [b";a=\x00b", b";a\rb", b";a=\x7f", b";a\nb"],
                         ids=["nul", "cr", "del", "lf"])
def test_chunk_extensions_with_control_characters_are_refused(
    servers: Servers, sim: Sim, ext: bytes
) -> None:
    srv = servers.start(settings([sim.url]))
    body = b'{"model":"m","messages":[]}'
    with connect(srv.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"Authorization: Bearer " + KEY_A.encode() + b"\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n"
                     + b"%x" % len(body) + ext + b"\r\n" + body + b"\r\n0\r\n\r\n")
        data, closed = read_until_closed(sock)
    assert closed
    status, _, answer = split_response(data)
    assert (status, json.loads(answer)["error"]["code"]) == (400, "invalid_http_request")


@pytest.mark.parametrize("path", [b"/v1/mode%6cs", b"/v1%2Fmodels", b"/v1/models%2Fm",
                                  b"/v1%2Fchat/completions"])
def test_escaped_api_paths_are_not_found(servers: Servers, sim: Sim, path: bytes) -> None:
    srv = servers.start(settings([sim.url]))
    method = b"POST" if b"chat" in path else b"GET"
    with connect(srv.port) as sock:
        sock.sendall(method + b" " + path + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + KEY_A.encode() + b"\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
        data, _ = read_until_closed(sock)
    status, _, answer = split_response(data)
    assert (status, json.loads(answer)["error"]["code"]) == (404, "not_found")


def test_an_escaped_model_id_is_still_found(servers: Servers, sim: Sim) -> None:
    """The rule is on the route, not the id: the OpenAI SDK escapes a model id's slash."""
    from tests.gateway.helpers import SERVED

    srv = servers.start(settings([sim.url]))
    escaped = SERVED.replace("/", "%2F")
    got = httpx.get(f"{srv.url}/v1/models/{escaped}",
                    headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10)
    assert got.status_code == 200, got.text


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(
    servers: Servers, sim: Sim
) -> None:
    ended = threading.Event()

    async def flood(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        try:
            for _ in range(100_000):  # ~6.5 GB: only a reading client gets to the end
                await send({"type": "http.response.body", "body": b"x" * 65536,
                            "more_body": True})
        finally:
            ended.set()

    cfg = settings([sim.url], limits={"client_send_timeout_s": 1.0})
    srv = servers.start(cfg, flood)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    try:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: gw\r\n\r\n")
        # Never read: the server's writes fill both socket buffers, then the send timer runs.
        assert ended.wait(20), "the response to a client that does not read never ended"
    finally:
        sock.close()


def test_refusals_are_counted_per_client_and_reason() -> None:
    from gateway.audit.refusals import RefusalCounter  # here: the file also runs on old trees

    records: list[dict[str, Any]] = []

    async def run() -> None:
        counter = RefusalCounter(records.append, interval_s=0.2)
        for _ in range(1000):
            counter.add(400, "invalid_framing", "bad", "client-a")
        counter.add(408, "request_timeout", "slow", "client-a")
        counter.add(400, "invalid_framing", "bad", "client-b")
        assert len(records) == 3  # the first of each key at once
        await asyncio.sleep(0.5)  # the interval ends: one record with the rest's count
        counter.flush()

    asyncio.run(run())
    got = [(r["client"], r["status"], r["count"]) for r in records]
    assert got == [("client-a", 400, 1), ("client-a", 408, 1), ("client-b", 400, 1),
                   ("client-a", 400, 999)]

