"""A chunked request body announcing more than ``limits.max_body_bytes`` is refused at once.

The chunk-size line says how many bytes follow; once it says more than what is left of the
limit the answer is known, so the guarded server answers ``413 request_too_large`` then and
there, instead of waiting for the bytes (or for ``client_body_timeout_s`` when they never come).
Each case runs against the production server on loopback with a raw socket; the body timeout
is far longer than the wait for the answer, so a server that waits fails the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gateway.gateway_server import Servers, connect, read_until_closed, split_response
from tests.gateway.helpers import KEY_A, Sim, settings

LIMIT = 1000
BODY = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
        + KEY_A.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")

# name -> the bytes after the head; the client then sends nothing more and waits.
OVERSIZED: dict[str, bytes] = {
    "twenty_hex_digits": b"ffffffffffffffffffff\r\n",
    "size_line_without_crlf": b"ffffffffffffffff",
    "size_line_with_extension": b"%x;name=value\r\n" % (LIMIT + 1),
    "one_byte_over": b"%x\r\n" % (LIMIT + 1),
    "second_chunk_over_what_is_left": b"%x\r\n%s\r\n%x\r\n" % (600, b"a" * 600, 401),
    "more_digits_than_h11_reads": b"1" + b"0" * 24 + b"\r\n",
    "zero_padded_over_twenty_digits": b"0" * 21 + b"1\r\n",
}


@pytest.fixture
def gateway(sim: Sim) -> Iterator[Any]:
    servers = Servers()
    yield servers.start(settings([sim.url], limits={"max_body_bytes": LIMIT,
                                                    "client_body_timeout_s": 60}))
    servers.stop_all()


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_oversized_chunk_is_refused_with_413_at_once(gateway: Any, sim: Sim, case: str) -> None:
    before = sim.stats()
    with connect(gateway.port) as sock:
        sock.sendall(HEAD + OVERSIZED[case])
        data, closed = read_until_closed(sock, timeout_s=10)
    assert closed, f"no answer within 10 s (body timeout 60 s): {data!r}"
    assert data.count(b"HTTP/1.1 ") == 1
    status, headers, body = split_response(data)
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"] == {
        "message": f"Request body exceeds the limit of {LIMIT} bytes.",
        "type": "invalid_request_error", "param": None, "code": "request_too_large"}
    assert sim.stats() == before  # nothing reached a replica


def test_chunked_body_within_the_limit_is_served(gateway: Any) -> None:
    half = len(BODY) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half,
                                                     BODY[half:])
    with connect(gateway.port) as sock:
        sock.sendall(HEAD.replace(b"Host: gw", b"Host: gw\r\nConnection: close") + chunks)
        data, closed = read_until_closed(sock, timeout_s=10)
    assert closed
    status, _, body = split_response(data)
    assert status == 200, body
    assert json.loads(body)["choices"]


def test_body_exactly_at_the_limit_is_not_refused_by_the_server(gateway: Any) -> None:
    # LIMIT bytes in two chunks: the server passes them on; the app then answers for the JSON.
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (600, b"a" * 600, LIMIT - 600,
                                                     b"a" * (LIMIT - 600))
    with connect(gateway.port) as sock:
        sock.sendall(HEAD + chunks)
        data, _ = read_until_closed(sock, timeout_s=3)
    status, _, body = split_response(data)
    assert status == 400 and json.loads(body)["error"]["code"] != "request_too_large"
