"""Response framing: the guarded h11 connection writes exactly the bytes h11 itself writes.

The relay frames each body chunk of a chunked response itself (a short path around h11's event
processing, one per relayed SSE event); every case here runs the same request and response
events through a plain ``h11.Connection`` and through the gateway's connection and compares the
bytes and the final states, so a framing difference fails.
"""

from __future__ import annotations

from typing import Any

import h11
import pytest

from gateway.http_guard import _StrictConnection

CHUNKED_REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\ncontent-length: 2\r\n\r\n{}"
HTTP10_REQUEST = b"POST /v1/chat/completions HTTP/1.0\r\nHost: gw\r\ncontent-length: 2\r\n\r\n{}"
BODIES: list[Any] = [
    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
    b"",
    bytearray(b"data: [DONE]\n\n"),
    memoryview(b"x" * 70_000),
    b"\r\n0\r\n\r\n",  # looks like a last chunk: must be framed as data, not end the body
]


def _strict_connection() -> h11.Connection:
    return _StrictConnection(h11.SERVER)


def _run(conn: h11.Connection, request: bytes, response_headers: list[tuple[bytes, bytes]],
         bodies: list[Any]) -> list[bytes | None]:
    conn.receive_data(request)
    while conn.next_event() not in (h11.NEED_DATA, h11.PAUSED):
        pass
    out: list[bytes | None] = [
        conn.send(h11.Response(status_code=200, headers=response_headers))
    ]
    out.extend(conn.send(h11.Data(data=body)) for body in bodies)
    out.append(conn.send(h11.EndOfMessage()))
    return out


@pytest.mark.parametrize("request_bytes", [CHUNKED_REQUEST, HTTP10_REQUEST],
                         ids=["http11-chunked", "http10-close"])
def test_body_chunks_are_framed_byte_for_byte_as_h11_frames_them(request_bytes: bytes) -> None:
    headers = [(b"content-type", b"text/event-stream")]
    plain, strict = h11.Connection(h11.SERVER), _strict_connection()
    expected = _run(plain, request_bytes, headers, BODIES)
    got = _run(strict, request_bytes, headers, BODIES)
    assert got == expected
    assert strict.states == plain.states
    if request_bytes is CHUNKED_REQUEST:
        assert expected[1] == b"%x\r\n%s\r\n" % (len(BODIES[0]), BODIES[0])
        assert expected[2] == b""  # an empty chunk would end the body: nothing is written
        assert expected[-1] == b"0\r\n\r\n"


def test_sized_body_keeps_h11_length_checks() -> None:
    strict = _strict_connection()
    strict.receive_data(CHUNKED_REQUEST)
    while strict.next_event() not in (h11.NEED_DATA, h11.PAUSED):
        pass
    strict.send(h11.Response(status_code=200, headers=[(b"content-length", b"3")]))
    assert strict.send(h11.Data(data=b"ab")) == b"ab"
    with pytest.raises(h11.LocalProtocolError, match="Too much data"):
        strict.send(h11.Data(data=b"cd"))
    assert strict.our_state is h11.ERROR


def test_data_before_the_response_is_refused_as_by_h11() -> None:
    strict = _strict_connection()
    strict.receive_data(CHUNKED_REQUEST)
    while strict.next_event() not in (h11.NEED_DATA, h11.PAUSED):
        pass
    with pytest.raises(h11.LocalProtocolError):
        strict.send(h11.Data(data=b"data: x\n\n"))
