"""A response sent before its request's body came: the connection is reused only when safe.

A refusal (401 without a key, 404) is answered from the head alone; the client may still be
sending the body. The server either keeps the connection (the rest is a known, small
``Content-Length``: read and dropped, then the next request is served on the same socket) or
says ``connection: close`` in that response's head. It never sends a head without ``close``
and then closes the connection under a client about to reuse it: the old code did, and an
SDK client sending its next request on that socket got "Server disconnected without sending a
response" (seen in CI on the MCP refusal test).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.gateway_server import Servers, connect, split_response
from tests.gateway.helpers import KEY_A, Sim, settings

MODELS = (b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + KEY_A.encode()
          + b"\r\n\r\n")


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _post_head(length: bytes, extra: bytes = b"") -> bytes:
    """A chat completion request head without a key (answered 401 from the head alone)."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + length + extra + b"\r\n")


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response (``Content-Length`` framed) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response head: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, headers, _ = split_response(head + b"\r\n\r\n")
    want = int(headers.get("content-length", "0"))
    while len(rest) < want:
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        rest += chunk
    return status, headers, rest[:want]


def _closed(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("sent_first", [0, 1, 100])
def test_the_rest_of_a_small_body_is_dropped_and_the_connection_serves_the_next_request(
        servers: Servers, sim: Sim, sent_first: int) -> None:
    srv = servers.start(settings([sim.url]))
    body = b'{"model":"m","messages":[]}' + b" " * 200
    with connect(srv.port) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_post_head(b"Content-Length: %d\r\n" % len(body)) + body[:sent_first])
        status, headers, _ = _read_response(sock)
        assert status == 401 and headers.get("connection") is None, headers
        time.sleep(0.1)
        sock.sendall(body[sent_first:])
        sock.sendall(MODELS)  # the next request on the same connection
        status, headers, answer = _read_response(sock)
        assert status == 200 and b'"object":"list"' in answer, (status, answer[:200])


def test_a_rest_that_does_not_come_closes_the_connection_after_the_linger(
        servers: Servers, sim: Sim) -> None:
    srv = servers.start(settings([sim.url]))
    with connect(srv.port) as sock:
        sock.sendall(_post_head(b"Content-Length: 1000\r\n") + b"{")
        status, headers, _ = _read_response(sock)
        assert status == 401 and headers.get("connection") is None
        sock.sendall(b"x" * 10)  # and then nothing: 989 bytes never come
        start = time.monotonic()
        assert _closed(sock, within_s=10), "still open 10 s after the answer"
        assert time.monotonic() - start < 6  # linger_s is 2 s


@pytest.mark.parametrize("framing", ["large", "chunked", "expect-continue"])
def test_a_rest_that_cannot_be_dropped_cheaply_gets_close_in_the_answer_head(
        servers: Servers, sim: Sim, framing: str) -> None:
    srv = servers.start(settings([sim.url]))
    head = {
        "large": _post_head(b"Content-Length: 10000000\r\n"),
        "chunked": _post_head(b"Transfer-Encoding: chunked\r\n"),
        "expect-continue": _post_head(b"Content-Length: 100\r\n", b"Expect: 100-continue\r\n"),
    }[framing]
    with connect(srv.port) as sock:
        sock.sendall(head)
        status, headers, _ = _read_response(sock)
        assert status == 401 and headers.get("connection") == "close", headers
        assert _closed(sock, within_s=10)


def test_an_sdk_like_client_reusing_its_connection_after_refusals_never_loses_a_request(
        servers: Servers, sim: Sim) -> None:
    """httpx (the ``openai`` SDK's transport) writes the head and the body in separate sends:
    the refusal can go out before the body arrives. Every request on the kept connections is
    answered; none meets a connection closed under it."""
    srv = servers.start(settings([sim.url]))
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        for i in range(200):
            resp = client.post("/v1/chat/completions", content=b'{"model":"m"}' * (1 + i % 50),
                               headers={"content-type": "application/json"})
            assert resp.status_code == 401
            assert client.get("/v1/nosuch").status_code in (401, 404)
        assert client.get("/v1/models",
                          headers={"authorization": f"Bearer {KEY_A}"}).status_code == 200


def test_connections_dropping_a_body_rest_make_room_under_the_connection_cap(
        servers: Servers, sim: Sim) -> None:
    """Dropping the announced rest of an answered request is no request in progress: at the
    cap, such a connection is closed to make room, as an idle one is (found by the tester:
    four keyless heads announcing 64 KiB held a gateway capped at four; keyed clients got
    503)."""
    cap = 4
    srv = servers.start(settings([sim.url], limits={"max_client_connections": cap}))
    holders = [connect(srv.port) for _ in range(cap)]
    try:
        for sock in holders:
            sock.sendall(_post_head(b"Content-Length: 65536\r\n"))  # and no body
            status, headers, _ = _read_response(sock)
            assert status == 401 and headers.get("connection") is None
        for _ in range(3):  # well within linger_s: all four still drop their rest
            resp = httpx.get(f"{srv.url}/v1/models",
                             headers={"Authorization": f"Bearer {KEY_A}"}, timeout=5)
            assert resp.status_code == 200, resp.text
    finally:
        for sock in holders:
            sock.close()


def test_a_client_reset_while_the_early_answer_lingers_is_quiet(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    """Tester's F2: a keyless request with ``Connection: close`` and a body still to come is
    answered at once and lingers (write side shut); a client that reads a byte of the answer
    and resets made ``write_eof`` raise ENOTCONN out of the app's ``send``: an ERROR and two
    chained tracebacks per request, anyone's to cause. A reset is a client gone, nothing more."""
    srv = servers.start(settings([Sim("http://127.0.0.1:9").url]))
    port, url = srv.port, srv.url
    caplog.set_level("ERROR")
    for i in range(90):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(2)
        path = (b"/v1/chat/completions", b"/nope", b"/v1/models")[i % 3]
        s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
        try:
            s.recv(1)
        except OSError:
            pass
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset
    time.sleep(0.3)
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
