"""The server's short paths past h11 (gateway.http_short_paths) give what h11 gives.

Each case runs one exchange through the gateway's h11 connection (short paths on) and through
h11's own path (requests: the same strict connection with h11 reading every request; responses:
a plain ``h11.Connection``): the events read, the bytes written and h11's state after each step
must be the same, and the common cases must actually take the short path.
"""

from __future__ import annotations

from typing import Any

import h11
import pytest

from gateway.http_guard import _StrictConnection
from gateway.http_short_paths import end_of_message, read_whole_request, response_head

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def _request(*lines: str, body: bytes = BODY, length: bool = True) -> bytes:
    head = list(lines)
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


POST = ("POST /v1/chat/completions HTTP/1.1", "Host: gw", "Content-Type: application/json",
        "Authorization: Bearer sk-x")

# (name, request bytes, whether the short path reads it)
REQUESTS: list[tuple[str, bytes, bool]] = [
    ("post", _request(*POST), True),
    ("post-close", _request(*POST, "Connection: close"), True),
    ("post-keep-alive", _request(*POST, "Connection: keep-alive"), True),
    ("empty-body", _request(*POST, body=b""), True),
    ("get-no-length", _request("GET /v1/models HTTP/1.1", "Host: gw", body=b"", length=False),
     True),
    ("head", _request("HEAD /v1/models HTTP/1.1", "Host: gw", body=b"", length=False), True),
    ("ows-and-case", _request("POST /x HTTP/1.1", "HOST:gw", "X-A:  spaced  "), True),
    ("http10", _request("POST /x HTTP/1.0", "Host: gw"), False),
    ("expect", _request(*POST, "Expect: 100-continue"), False),
    ("upgrade", _request(*POST, "Connection: upgrade", "Upgrade: h2c"), False),
    ("connect", _request("CONNECT gw:443 HTTP/1.1", "Host: gw", body=b"", length=False), False),
    ("chunked", _request(*POST, "Transfer-Encoding: chunked", body=b"3\r\nabc\r\n0\r\n\r\n",
                         length=False), False),
    ("pipelined", _request(*POST) + _request(*POST), False),
    ("partial-body", _request(*POST)[:-5], False),
    ("partial-head", _request(*POST)[:30], False),
    ("bare-lf", _request(*POST).replace(b"\r\n", b"\n"), False),
    ("no-host", _request("POST /x HTTP/1.1", "X-A: 1"), False),
    ("bad-header", _request(*POST, "Bad Header: 1"), False),
    ("bad-request-line", _request("POST  /x HTTP/1.1", "Host: gw"), False),
    ("folded", _request(*POST, "X-A: 1", " folded"), False),
    ("two-lengths", _request(*POST, "Content-Length: 5"), False),
    ("leading-crlf", b"\r\n" + _request(*POST), False),
]

# (name, status, headers, body chunks)
RESPONSES: list[tuple[str, int, list[tuple[bytes, bytes]], list[bytes]]] = [
    ("sized", 200, [(b"content-type", b"application/json"), (b"content-length", b"5"),
                    (b"x-request-id", b"r1")], [b"hello"]),
    ("sized-two-chunks", 200, [(b"Content-Length", b"10")], [b"hello", b"world"]),
    ("chunked", 200, [(b"content-type", b"text/event-stream"), (b"x-request-id", b"r1")],
     [b"data: 1\n\n", b"", b"data: [DONE]\n\n"]),
    ("te-and-length", 200, [(b"content-length", b"3"), (b"transfer-encoding", b"chunked"),
                            (b"x-a", b"1")], [b"abc"]),
    ("explicit-chunked", 201, [(b"Transfer-Encoding", b"Chunked")], [b"abc"]),
    ("no-body-status", 204, [(b"x-a", b"1")], []),
    ("not-modified", 304, [(b"content-length", b"7")], []),
    ("error", 503, [(b"content-length", b"2"), (b"retry-after", b"1")], [b"{}"]),
    ("connection-close", 200, [(b"connection", b"close"), (b"content-length", b"1")], [b"x"]),
    ("connection-close-chunked", 200, [(b"Connection", b"Close"), (b"x-a", b"1")], [b"x"]),
    ("connection-keep-alive", 200, [(b"connection", b"keep-alive"), (b"content-length", b"1")],
     [b"x"]),
    ("connection-two", 200, [(b"connection", b"close"), (b"connection", b"close"),
                             (b"x-a", b"1")], [b"x"]),
    ("connection-list", 200, [(b"connection", b"close, x-a"), (b"x-a", b"1")], [b"x"]),
    ("host-header", 200, [(b"x-a", b"1"), (b"host", b"h"), (b"content-length", b"1")], [b"x"]),
    ("too-short", 200, [(b"content-length", b"9")], [b"abc"]),
]


class _H11Reads(_StrictConnection):
    """The gateway's strict connection with every request read by h11 (no short path)."""

    receive_data = h11.Connection.receive_data


def _event(event: Any) -> Any:
    if isinstance(event, h11.Request):
        return ("Request", event.method, event.target, event.http_version,
                list(event.headers), event.headers.raw_items())
    if isinstance(event, h11.Data):
        return ("Data", bytes(event.data))
    if isinstance(event, h11.EndOfMessage):
        return ("EndOfMessage", list(event.headers))
    return event


def _read(conn: h11.Connection, data: bytes) -> list[Any]:
    """Feed ``data`` and read events until h11 needs more (or refuses: the error's type)."""
    conn.receive_data(data)
    out: list[Any] = []
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            out.append(("refused", type(exc).__name__))
            return out
        out.append(_event(event))
        if event in (h11.NEED_DATA, h11.PAUSED):
            return out


def _reader_name(conn: Any) -> str:
    reader = conn._reader
    return getattr(reader, "__name__", type(reader).__name__)


def _compare_state(ours: Any, theirs: h11.Connection) -> None:
    assert dict(ours._cstate.states) == dict(theirs._cstate.states)
    assert ours._cstate.keep_alive == theirs._cstate.keep_alive
    assert ours._cstate.pending_switch_proposals == theirs._cstate.pending_switch_proposals
    assert ours.their_http_version == theirs.their_http_version
    assert ours._request_method == theirs._request_method
    assert ours.client_is_waiting_for_100_continue == theirs.client_is_waiting_for_100_continue
    assert type(ours._writer) is type(theirs._writer)
    assert getattr(ours._writer, "_length", None) == getattr(theirs._writer, "_length", None)
    theirs_reader = _reader_name(theirs)
    ours_reader = _reader_name(ours)
    if theirs_reader == "maybe_read_from_IDLE_client":
        ours_reader = "maybe_read_from_IDLE_client" if ours_reader == "_read_request_head" else ""
    assert ours_reader == theirs_reader


@pytest.mark.parametrize(("name", "data", "short"), REQUESTS, ids=[r[0] for r in REQUESTS])
def test_a_request_reads_as_h11_reads_it(name: str, data: bytes, short: bool) -> None:
    probe = _StrictConnection(h11.SERVER)
    assert (read_whole_request(probe, data) is not None) is short
    ours, theirs = _StrictConnection(h11.SERVER), _H11Reads(h11.SERVER)
    assert _read(ours, data) == _read(theirs, data)
    if dict(theirs._cstate.states)[h11.CLIENT] is not h11.ERROR:
        _compare_state(ours, theirs)


@pytest.mark.parametrize(("rname", "status", "headers", "chunks"), RESPONSES,
                         ids=[r[0] for r in RESPONSES])
@pytest.mark.parametrize(("qname", "data"), [(r[0], r[1]) for r in REQUESTS if r[2]]
                         + [("http10", _request("POST /x HTTP/1.0", "Host: gw"))],
                         ids=[r[0] for r in REQUESTS if r[2]] + ["http10"])
def test_a_response_is_written_as_h11_writes_it(
    qname: str, data: bytes, rname: str, status: int, headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
) -> None:
    ours, theirs = _StrictConnection(h11.SERVER), h11.Connection(h11.SERVER)
    _read(ours, data)
    _read(theirs, data)
    written: list[list[Any]] = [[], []]
    events: list[Any] = [h11.Response(status_code=status, headers=headers, reason=b"OK")]
    events += [h11.Data(data=chunk) for chunk in chunks] + [h11.EndOfMessage()]
    for event in events:
        for out, conn in zip(written, (ours, theirs), strict=True):
            try:
                sent = conn.send(event)
                out.append(b"" if sent is None else sent)
            except h11.LocalProtocolError as exc:
                out.append(("refused", str(exc)))
        if isinstance(written[1][-1], tuple):
            break  # h11 refused: ours must have too, and both are failed
        _compare_state(ours, theirs)
    ours_bytes = b"".join(b for b in written[0] if isinstance(b, bytes)) + ours.take_head()
    theirs_bytes = b"".join(b for b in written[1] if isinstance(b, bytes))
    assert ours_bytes == theirs_bytes
    assert [w for w in written[0] if isinstance(w, tuple)] == \
        [w for w in written[1] if isinstance(w, tuple)]
    if theirs.our_state is h11.DONE and theirs.their_state is h11.DONE:
        ours.start_next_cycle()
        theirs.start_next_cycle()
        assert _read(ours, data) == _read(theirs, data)
        _compare_state(ours, theirs)


def test_the_common_exchange_takes_the_short_paths() -> None:
    conn = _StrictConnection(h11.SERVER)
    conn.receive_data(_request(*POST))
    # Read whole: h11's buffer untouched, the request already complete before next_event.
    assert not conn._receive_buffer and conn.their_state is h11.DONE
    events = [conn.next_event() for _ in range(4)]
    assert [type(e) for e in events[:3]] == [h11.Request, h11.Data, h11.EndOfMessage]
    assert events[3] is h11.NEED_DATA
    head = response_head(conn, h11.Response(status_code=200, reason=b"OK",
                                            headers=[(b"content-length", b"2")]))
    assert head == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    assert conn.chunk(b"{}") == b"{}"
    assert end_of_message(conn, h11.EndOfMessage()) == b""
    conn.start_next_cycle()
    assert dict(conn.states) == {h11.CLIENT: h11.IDLE, h11.SERVER: h11.IDLE}
    assert read_whole_request(conn, _request(*POST)) is not None


@pytest.mark.parametrize("taken", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("then", [_request(*POST), b""], ids=["pipelined", "eof"])
def test_bytes_after_a_request_read_whole_are_read_as_h11_reads_them(
    taken: int, then: bytes
) -> None:
    results = []
    for conn in (_StrictConnection(h11.SERVER), _H11Reads(h11.SERVER)):
        conn.receive_data(_request(*POST))
        events = [_event(conn.next_event()) for _ in range(taken)]
        conn.receive_data(then)
        for _ in range(6):
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                events.append(("refused", str(exc)))
                break
            events.append(_event(event))
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                break
        results.append((events, dict(conn.states)))
    assert results[0] == results[1]


@pytest.mark.parametrize("feed", [[], [b""], [b"POST /x HT"], [b"\r\n"], [b" "]],
                         ids=["nothing", "eof", "part-of-a-head", "blank-line", "space"])
def test_an_idle_connection_reads_as_h11_reads_it(feed: list[bytes]) -> None:
    results = []
    for conn in (_StrictConnection(h11.SERVER), _H11Reads(h11.SERVER)):
        events: list[Any] = []
        for data in feed:
            conn.receive_data(data)
        for _ in range(2):
            try:
                events.append(_event(conn.next_event()))
            except h11.RemoteProtocolError as exc:
                events.append(("refused", str(exc)))
                break
        results.append((events, dict(conn.states)))
    assert results[0] == results[1]


@pytest.mark.parametrize(
    ("headers", "chunks", "expect_head", "expect_end"),
    [
        ([(b"content-type", b"text/event-stream")], [b"data: 1\n\n"],
         b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", b"0\r\n\r\n"),
        ([(b"content-length", b"2")], [b"{}"],
         b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nConnection: close\r\n\r\n", b""),
    ],
    ids=["stream", "sized"],
)
def test_a_one_stream_connection_takes_the_short_paths(
    headers: list[tuple[bytes, bytes]], chunks: list[bytes], expect_head: bytes,
    expect_end: bytes,
) -> None:
    """A client that opens one connection per stream (``Connection: close``) gets its response
    head and end past h11's event processing too, and the connection ends as h11 ends it."""
    conn = _StrictConnection(h11.SERVER)
    conn.receive_data(_request(*POST, "Connection: close"))
    assert [type(conn.next_event()) for _ in range(3)] == [h11.Request, h11.Data,
                                                            h11.EndOfMessage]
    assert conn.their_state is h11.MUST_CLOSE
    # uvicorn echoes the request's "Connection: close" in the response headers.
    head = response_head(conn, h11.Response(status_code=200, reason=b"OK",
                                            headers=[*headers, (b"connection", b"close")]))
    assert head == expect_head
    for chunk in chunks:
        assert conn.chunk(chunk) is not None
    assert end_of_message(conn, h11.EndOfMessage()) == expect_end
    assert dict(conn.states) == {h11.CLIENT: h11.MUST_CLOSE, h11.SERVER: h11.MUST_CLOSE}
    assert conn.send(h11.ConnectionClosed()) is None
    assert conn.our_state is h11.CLOSED
