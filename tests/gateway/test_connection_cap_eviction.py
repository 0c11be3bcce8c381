"""Connections that have proven nothing must not starve those that carry requests.

A tester held a gateway capped at 50 client connections with 50 sockets that sent nothing: a
client with a valid key got 503 ``too_many_connections`` until the header timeout closed them,
and the attacker simply reconnected. Each test drives the server ``gateway serve`` builds on
loopback: raw sockets for the idle attackers, the official ``openai`` SDK for the keyed client,
keyed requests whose body is half sent (after ``100 Continue``) for connections that carry a
request. The idle-attacker and per-address tests fail on the server before
:mod:`gateway.h1.conntable` (503 for the keyed client; the per-address key unknown).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import wait_until
from tests.gateway.gateway_server import (
    CHAT_BODY,
    GuardedServer,
    Servers,
    busy_request,
    connect,
    read_until_closed,
    split_response,
)
from tests.gateway.helpers import KEY_A, Sim, settings

# Long timeouts: no idle socket may be closed by its own timer during a test.
SLOW = {"client_header_timeout_s": 60, "keep_alive_timeout_s": 60}
PARTIAL_HEAD = b"GET /v1/models HTTP/1.1\r\nHo"


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _open_connections(srv: GuardedServer) -> int:
    return len(srv.server.context.connections)


def _idle_socket(port: int, state: str, source: str | None = None) -> socket.socket:
    """A connection in ``state``: ``no_request`` (nothing sent), ``partial_head``, or
    ``keep_alive`` (one request answered, idle since)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5,
                                    source_address=(source, 0) if source else None)
    if state == "partial_head":
        sock.sendall(PARTIAL_HEAD)
    elif state == "keep_alive":
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    return sock


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) != b""  # bytes: open (and talking); b"": closed
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def _assert_evicted_with_503(data: bytes) -> None:
    status, headers, body = split_response(data)
    assert (status, headers["connection"]) == (503, "close")
    assert json.loads(body)["error"]["code"] == "too_many_connections"


def _chat(url: str, source: str | None = None) -> Any:
    """One chat completion through the official SDK (no retries), from ``source``."""
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(transport=transport, timeout=10) as http, openai.OpenAI(
            base_url=url + "/v1", api_key=KEY_A, max_retries=0, http_client=http) as client:
        return client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hello"}])


def _finish(sock: socket.socket) -> int:
    """Send the rest of a :func:`busy_request` body; the status of its answer."""
    sock.sendall(CHAT_BODY[len(CHAT_BODY) // 2:])
    sock.settimeout(10)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    return split_response(answer)[0]


@pytest.mark.parametrize("state", ["no_request", "partial_head", "keep_alive"])
def test_idle_sockets_at_the_cap_make_room_for_a_keyed_request(
    servers: Servers, sim: Sim, state: str
) -> None:
    cap = 50
    srv = servers.start(settings([sim.url], limits={**SLOW, "max_client_connections": cap}))
    idle = [_idle_socket(srv.port, state) for _ in range(cap)]
    try:
        wait_until(lambda: _open_connections(srv) == cap, 10, f"{cap} connections accepted")
        answer = _chat(srv.url)
        assert answer.choices[0].message.content
        # The connection idle the longest made room; the others stay open.
        data, closed = read_until_closed(idle[0], timeout_s=5)
        assert closed
        if state != "keep_alive":  # never answered: told why, in the OpenAI error shape
            _assert_evicted_with_503(data)
        else:
            assert data == b""
        assert all(_still_open(sock) for sock in idle[2:])
    finally:
        for sock in idle:
            sock.close()


def test_an_idle_connection_makes_room_before_busy_ones(servers: Servers, sim: Sim) -> None:
    cap = 4
    srv = servers.start(settings([sim.url], limits={**SLOW, "max_client_connections": cap}))
    idle = _idle_socket(srv.port, "no_request")  # the oldest connection of all
    busy = [busy_request(srv.port, KEY_A) for _ in range(cap - 1)]
    try:
        wait_until(lambda: _open_connections(srv) == cap, 10, f"{cap} connections accepted")
        assert _chat(srv.url).choices[0].message.content
        data, closed = read_until_closed(idle, timeout_s=5)
        assert closed
        _assert_evicted_with_503(data)
        assert [_finish(sock) for sock in busy] == [200] * (cap - 1)
    finally:
        idle.close()
        for sock in busy:
            sock.close()


def test_silent_sockets_make_room_before_a_client_s_keep_alive_connection(
    servers: Servers, sim: Sim
) -> None:
    cap = 4
    srv = servers.start(settings([sim.url], limits={**SLOW, "max_client_connections": cap}))
    kept = _idle_socket(srv.port, "keep_alive")  # idle the longest, but it sent a request
    silent = [_idle_socket(srv.port, "no_request") for _ in range(cap - 1)]
    try:
        wait_until(lambda: _open_connections(srv) == cap, 10, f"{cap} connections accepted")
        assert _chat(srv.url).choices[0].message.content
        data, closed = read_until_closed(silent[0], timeout_s=5)
        assert closed
        _assert_evicted_with_503(data)
        assert _still_open(kept)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        kept.close()
        for sock in silent:
            sock.close()


def test_a_newcomer_is_refused_when_every_connection_carries_a_request(
    servers: Servers, sim: Sim
) -> None:
    cap = 4
    srv = servers.start(settings([sim.url], limits={**SLOW, "max_client_connections": cap}))
    busy = [busy_request(srv.port, KEY_A) for _ in range(cap)]
    try:
        with connect(srv.port) as extra:
            data, closed = read_until_closed(extra, timeout_s=3)
        assert closed
        status, headers, body = split_response(data)
        assert (status, headers["connection"]) == (503, "close")
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        with pytest.raises(openai.InternalServerError) as info:
            _chat(srv.url)
        assert info.value.status_code == 503 and info.value.code == "too_many_connections"
        # None of the requests in progress was sacrificed.
        assert [_finish(sock) for sock in busy] == [200] * cap
    finally:
        for sock in busy:
            sock.close()


def test_one_address_is_capped_and_others_are_not(servers: Servers, sim: Sim) -> None:
    limits = {**SLOW, "max_client_connections": 50, "max_client_connections_per_address": 2}
    srv = servers.start(settings([sim.url], limits=limits))
    busy = [busy_request(srv.port, KEY_A) for _ in range(2)]  # from 127.0.0.1
    try:
        with connect(srv.port) as extra:
            data, closed = read_until_closed(extra, timeout_s=3)
        assert closed
        status, _, body = split_response(data)
        assert (status, json.loads(body)["error"]["code"]) == (
            429, "too_many_connections_from_address")
        with pytest.raises(openai.RateLimitError) as info:
            _chat(srv.url)
        assert info.value.code == "too_many_connections_from_address"
        # Another address is not affected, and the refused address's requests go on.
        assert _chat(srv.url, source="127.0.0.2").choices[0].message.content
        assert [_finish(sock) for sock in busy] == [200, 200]
    finally:
        for sock in busy:
            sock.close()


def test_an_address_over_its_cap_replaces_its_own_idle_connection(
    servers: Servers, sim: Sim
) -> None:
    limits = {**SLOW, "max_client_connections": 50, "max_client_connections_per_address": 2}
    srv = servers.start(settings([sim.url], limits=limits))
    other = _idle_socket(srv.port, "no_request", source="127.0.0.2")  # idle the longest
    mine = [_idle_socket(srv.port, "no_request") for _ in range(2)]
    try:
        wait_until(lambda: _open_connections(srv) == 3, 10, "3 connections accepted")
        assert _chat(srv.url).choices[0].message.content
        data, closed = read_until_closed(mine[0], timeout_s=5)
        assert closed
        _assert_evicted_with_503(data)
        assert _still_open(mine[1]) and _still_open(other)
    finally:
        for sock in (other, *mine):
            sock.close()


def _response_head(sock: socket.socket) -> bytes:
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {answer!r}"
        answer += chunk
    return answer


def test_answered_connections_make_room_before_a_new_one_waiting_for_its_head(
    servers: Servers, sim: Sim
) -> None:
    """A tester's keyless requests with a 1 GB ``Content-Length``, answered 401 at once and
    lingering, pushed out the new connections of a keyed client (closed before their head
    was read: a reset, not an answer). The answered ones must make room first."""
    cap = 4
    srv = servers.start(settings([sim.url], limits={**SLOW, "max_client_connections": cap}))
    answered = []
    for _ in range(cap):  # each lingers linger_s (2 s) after its 401: all of this is faster
        sock = connect(srv.port)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Length: 1000000000\r\n\r\n")
        assert _response_head(sock).startswith(b"HTTP/1.1 401 ")
        answered.append(sock)
    keyed = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %b\r\n\r\n" % (
        KEY_A.encode())
    first = connect(srv.port)  # a client's new connection, its head on its way
    second = connect(srv.port)
    try:
        second.sendall(keyed)  # answered: the server has admitted both by now
        assert _response_head(second).startswith(b"HTTP/1.1 200 ")
        first.sendall(keyed)
        assert _response_head(first).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in (first, second, *answered):
            sock.close()
