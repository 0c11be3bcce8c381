"""Requests the HTTP server refuses before the app sees them are in the audit log too.

A smuggling attempt (``Content-Length`` with ``Transfer-Encoding``), an oversized head, a
slow head (408), a chunk announcing more than the body limit (413) and a connection over the
cap (503) never reach the relay or its observers; a real ``gateway serve`` must still write one
``http.refused`` record for each (status, code, the message sent, the client's pseudonym), and
the chain must verify.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import wait_until
from tests.gateway.audit._served_audit import audited_gateway
from tests.gateway.gateway_server import busy_request, connect, read_until_closed, split_response
from tests.gateway.helpers import KEY_A, Sim


def _refused(port: int, head: bytes) -> int:
    with connect(port) as sock:
        sock.sendall(head)
        data, closed = read_until_closed(sock)
    assert closed
    return split_response(data)[0]


def _refused_past_the_cap(port: int, head: bytes) -> int:
    """``_refused``, again while the answer is the connection cap's 503: the server may not
    have let go of the previous step's connection yet (each such 503 is audited too)."""
    got: list[int] = []

    def answered() -> bool:
        got.append(_refused(port, head))
        return got[-1] != 503

    wait_until(answered, 10, "a connection slot")
    return got[-1]


def test_server_level_refusals_are_audited(sim: Sim, tmp_path: Path) -> None:
    with audited_gateway(sim, tmp_path, {"client_header_timeout_s": 0.5,
                                         "max_client_connections": 2}, "refusals") as gw:
        port = gw.port
        smuggle = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert _refused_past_the_cap(port, smuggle) == 400
        assert _refused_past_the_cap(port, b"GET / HTTP/1.1\r\nHost: x\r\nX: "
                                     + b"a" * 1_000_000 + b"\r\n\r\n") == 431
        assert _refused_past_the_cap(port, b"GET /v1/models HTTP/1.1\r\nHo") == 408
        assert _refused_past_the_cap(port, b"POST /v1/chat/completions HTTP/1.1\r\n"
                                     b"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"ffffffffffffffffffff\r\n") == 413
        # Both slots carry requests (idle connections would make room instead).
        held = [busy_request(port, KEY_A), busy_request(port, KEY_A)]
        assert _refused(port, b"") == 503
        for sock in held:
            sock.close()
    refused = [r["data"] for r in gw.records if r["type"] == "http.refused"]
    assert [(r["status"], r["error_code"]) for r in refused if r["status"] != 503] == [
        (400, "invalid_framing"), (431, "request_header_too_large"), (408, "request_timeout"),
        (413, "request_too_large")]
    assert (refused[-1]["status"], refused[-1]["error_code"]) == (503, "too_many_connections")
    assert refused[0]["reason"] == ("Invalid HTTP request framing: both Content-Length and "
                                    "Transfer-Encoding are present.")
    assert all(r["client"].startswith("hmac-sha256:") for r in refused)
    # Counted per client and reason (gateway.audit.refusals): the first one written at once.
    assert all(r["count"] >= 1 and r["interval_ms"] == 10_000 for r in refused)
    assert b"127.0.0.1" not in gw.db.read_bytes()
