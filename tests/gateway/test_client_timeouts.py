"""Slow and idle clients: header timeout, keep-alive timeout and the client connection cap
(connections that carry requests; idle ones make room: test_connection_cap_eviction.py)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.config.errors import InvalidConfig
from tests.gateway.gateway_server import (
    CHAT_BODY,
    Servers,
    busy_request,
    connect,
    read_until_closed,
    split_response,
)
from tests.gateway.helpers import KEY_A, Sim, settings

LIMITS = {"client_header_timeout_s": 1.0, "keep_alive_timeout_s": 1.0}


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


@pytest.fixture
def gateway(guarded: Servers, sim: Sim) -> Any:
    return guarded.start(settings([sim.url], limits=LIMITS))


def _drip_until_answered(sock: socket.socket, head: bytes) -> tuple[bytes, bool]:
    """Send ``head`` one byte every 0.1 s until the server answers or closes."""
    closed = False
    data = b""
    for byte in head:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        time.sleep(0.1)  # the drip itself (the attack), not a wait for a condition
        sock.setblocking(False)
        try:
            data += sock.recv(65536)
        except BlockingIOError:
            pass
        except ConnectionResetError:
            closed = True
        finally:
            sock.setblocking(True)
        if data or closed:
            break
    if not closed:
        more, closed = read_until_closed(sock, timeout_s=5)
        data += more
    return data, closed


@pytest.mark.parametrize("first_request", [False, True], ids=["new-connection", "kept-alive"])
def test_header_drip_is_timed_out(gateway: Any, first_request: bool) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Slow: " + b"a" * 40
    with connect(gateway.port) as sock:
        if first_request:  # a kept-alive connection: the drip starts the second request
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):
                chunk = sock.recv(65536)
                assert chunk
                answer += chunk
        t0 = time.monotonic()
        data, closed = _drip_until_answered(sock, head)
    elapsed = time.monotonic() - t0
    assert closed and elapsed < 3.5, (elapsed, data)
    status, _, body = split_response(data)
    assert status == 408
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_silent_connection_is_closed_after_header_timeout(gateway: Any) -> None:
    t0 = time.monotonic()
    with connect(gateway.port) as sock:
        data, closed = read_until_closed(sock, timeout_s=5)
    assert closed and data == b""
    assert 0.8 < time.monotonic() - t0 < 3.0


def test_idle_keep_alive_connection_is_closed(gateway: Any) -> None:
    with connect(gateway.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        t0 = time.monotonic()
        rest, closed = read_until_closed(sock, timeout_s=5)
    assert closed and rest == b""
    assert time.monotonic() - t0 < 3.0


def test_over_cap_connection_is_answered_at_once(
    guarded: Servers, sim: Sim
) -> None:
    # Long timeouts: the held connections must stay open for the whole test.
    cap = 4
    limits = {"client_header_timeout_s": 30, "keep_alive_timeout_s": 30,
              "max_client_connections": cap}
    gateway = guarded.start(settings([sim.url], limits=limits))
    # Each held connection carries a request (an idle one would make room for the newcomer,
    # tests/gateway/test_connection_cap_eviction.py): keyed, its body half sent.
    held = [busy_request(gateway.port, KEY_A) for _ in range(cap)]
    try:
        t0 = time.monotonic()
        with connect(gateway.port) as extra:
            data, closed = read_until_closed(extra, timeout_s=3)
        elapsed = time.monotonic() - t0
        assert closed and elapsed < 0.5, (elapsed, data)
        status, headers, body = split_response(data)
        assert status == 503 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        # The official SDK sees an ordinary, retryable 503 in the OpenAI error shape.
        with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY_A, max_retries=0,
                           timeout=5) as client, pytest.raises(openai.InternalServerError) as info:
            client.models.list()
        assert info.value.status_code == 503 and info.value.code == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    # Capacity comes back once the held connections are gone.
    deadline = time.monotonic() + 5
    while True:
        with connect(gateway.port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            data, _ = read_until_closed(sock)
        if data.startswith(b"HTTP/1.1 200"):
            break
        assert time.monotonic() < deadline, data
        time.sleep(0.05)


def test_many_idle_sockets_do_not_pile_up(gateway: Any) -> None:
    socks: list[socket.socket] = []
    try:
        for _ in range(500):
            socks.append(connect(gateway.port))
        deadline = time.monotonic() + 10
        for sock in socks:
            _, closed = read_until_closed(sock, timeout_s=max(0.1, deadline - time.monotonic()))
            assert closed
    finally:
        for sock in socks:
            sock.close()


def test_keep_alive_timeout_runs_from_the_answer_not_from_an_earlier_timer(gateway: Any) -> None:
    # The connection's one timer handle is kept when re-armed for a later deadline: the
    # header timer armed at connect (due at 1 s) fires first and must wait for the rest of
    # the keep-alive timeout that the answer started, not close the connection early.
    with connect(gateway.port) as sock:
        time.sleep(0.6)  # the client's idle time before its request (the scenario, not a wait)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        t0 = time.monotonic()
        rest, closed = read_until_closed(sock, timeout_s=5)
    assert closed and rest == b""
    assert 0.8 < time.monotonic() - t0 < 3.0


BODY_LIMITS = {"client_body_timeout_s": 1.0, "client_body_min_rate_bytes_s": 100.0}


def _keyed_head(length: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {KEY_A}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_body_drip_below_the_minimum_rate_is_timed_out(guarded: Servers, sim: Sim) -> None:
    # A byte every 0.1 s never leaves the connection silent for client_body_timeout_s (1 s),
    # but at 10 bytes/s it is far below the minimum rate (100 bytes/s): the whole body's
    # deadline (1 s + 1 s per 100 bytes received) passes after about 1.1 s, long before the
    # 72-byte body would be complete (7 s), and the client gets 408, not a held connection.
    gateway = guarded.start(settings([sim.url], limits={**LIMITS, **BODY_LIMITS}))
    before = sim.stats()
    with connect(gateway.port) as sock:
        sock.sendall(_keyed_head(len(CHAT_BODY)))
        t0 = time.monotonic()
        data, closed = _drip_until_answered(sock, CHAT_BODY)
    elapsed = time.monotonic() - t0
    assert closed and elapsed < 4.0, (elapsed, data)
    status, _, body = split_response(data)
    assert status == 408, data
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert "slower than 100 bytes/s" in error["message"], error
    assert sim.stats() == before  # nothing of it reached a replica


def test_body_at_a_fair_rate_is_served_past_the_first_allowance(
    guarded: Servers, sim: Sim
) -> None:
    # 16 bytes every 0.05 s (~320 bytes/s, above the 100 bytes/s minimum) over more than the
    # first allowance of 1 s: the bytes received move the deadline on, the request is served.
    gateway = guarded.start(settings([sim.url], limits={**LIMITS, **BODY_LIMITS}))
    body = CHAT_BODY[:-1] + b"," + b'"user":"' + b"u" * 400 + b'"}'
    with connect(gateway.port, timeout_s=30) as sock:
        sock.sendall(_keyed_head(len(body)))
        t0 = time.monotonic()
        for i in range(0, len(body), 16):
            sock.sendall(body[i : i + 16])
            time.sleep(0.05)  # the client's pace (the scenario), not a wait for a condition
        assert time.monotonic() - t0 > 1.0  # the rate rule, not the first allowance, applied
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 "), data[:300]


def test_body_rate_setting_is_checked() -> None:
    with pytest.raises(InvalidConfig, match=r"limits\.client_body_min_rate_bytes_s: Input should "
                                            r"be greater than or equal to 0"):
        settings(["http://127.0.0.1:1"], limits={"client_body_min_rate_bytes_s": -1})
