"""A client that stops sending its body does not hold a connection forever."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from tests.gateway.helpers import KEY_A, Sim, settings, start_gateway

BODY = json.dumps({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]})


def _gateway(serve_asgi: Callable[..., Any], sim: Sim, timeout_s: float) -> tuple[str, int]:
    url = start_gateway(
        serve_asgi, settings([sim.url], limits={"client_body_timeout_s": timeout_s})
    )
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_partial_body_gets_408_and_the_connection_closes(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    addr = _gateway(serve_asgi, sim, 0.5)
    before = sim.stats()
    with socket.create_connection(addr, timeout=30) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY[:10].encode()
        )
        raw = _read_all(sock)  # socket timeout 30 s: fails the test if the gateway never answers
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert json.loads(payload)["error"] == {
        "message": "The request body was not received in time (no data for 0.5 s).",
        "type": "invalid_request_error", "param": None, "code": "request_timeout",
    }
    assert sim.stats() == before


def test_chunked_trickle_within_the_gap_is_served(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    addr = _gateway(serve_asgi, sim, 5)
    with socket.create_connection(addr, timeout=30) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        for i in range(0, len(BODY), 16):
            part = BODY[i : i + 16].encode()
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            time.sleep(0.05)
        sock.sendall(b"0\r\n\r\n")
        raw = _read_all(sock)
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
