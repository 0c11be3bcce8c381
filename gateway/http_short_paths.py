"""Short paths past h11's event processing for the common request and response on the
client-facing server: byte for byte, and state for state, what h11 does.

h11 runs every request and response through its event machinery: a reader per state, the
state machine (a copy of the state dict per event, transitions to a fixed point), header
normalisation and framing decisions. A small non-streamed request costs nine such steps
(request head, body, end of body, response head, body, end of response, next cycle), most of
the CPU the server spends on it. This module takes the common cases past that machinery and
leaves every other case to h11 unchanged:

* :func:`read_whole_request`: one ``receive_data`` that holds exactly one complete, cleanly
  framed HTTP/1.1 request (head and whole ``Content-Length`` body, nothing after it) on an idle
  connection becomes h11's three events at once, with h11's state set as its reader and state
  machine would leave it;
* :func:`response_head`: a ``Response`` to a complete HTTP/1.1 request, framed by
  ``Content-Length`` or chunked, written as h11's ``write_any_response`` writes it (after
  h11's header clean-up: ``Content-Length`` dropped for a chunked body, ``Transfer-Encoding:
  chunked`` appended, then ``Connection: close`` when the request asked to close: one stream
  per connection, as many streaming clients open them);
* :func:`end_of_message`: the ``EndOfMessage`` that completes such a response.

Each returns ``None`` whenever the case is not the common one (HTTP/1.0, ``Expect``,
``Upgrade``, ``CONNECT``, ``HEAD``, ``Transfer-Encoding`` on a request, pipelined bytes, a
request head over h11's size limit, a ``Host`` response header, a ``Connection`` response
header other than the ``close`` of a closing exchange, trailers, anything h11 would refuse):
the caller then hands the event or the bytes to h11. The functions read and set h11's private
connection state; h11 is pinned to 0.16.x in pyproject.toml, and
tests/gateway/test_http_short_paths.py compares every short path with h11's own result.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import h11
from h11._connection import _keep_alive
from h11._headers import Headers
from h11._readers import header_field_re, request_line_re
from h11._writers import ChunkedWriter, ContentLengthWriter

from gateway.http_framing import framing_problem

__all__ = ["end_of_message", "read_whole_request", "response_head"]

_CLIENT, _SERVER = h11.CLIENT, h11.SERVER
_IDLE, _DONE, _SEND_BODY = h11.IDLE, h11.DONE, h11.SEND_BODY
_SEND_RESPONSE, _MUST_CLOSE = h11.SEND_RESPONSE, h11.MUST_CLOSE
# Request headers that send a request down h11's own path (protocol switches, 100-continue,
# chunked bodies): rare, and each changes h11's state in ways the short path does not copy.
_SLOW_REQUEST_HEADERS = frozenset({b"upgrade", b"expect", b"transfer-encoding"})
_SLOW_RESPONSE_HEADERS = frozenset({b"host", b"connection"})
_CONNECTION = frozenset({b"connection"})
_CHUNKED_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
_NO_BODY_STATUSES = frozenset({204, 304})


class _Headers(Headers):
    """h11's ``Headers`` iterated without ``Sequence``'s index loop (uvicorn and h11 iterate
    every request's headers: one ``__getitem__`` call per header, and an ``IndexError``)."""

    __slots__ = ()

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return iter([(name, value) for _raw, name, value in self._full_items])


def read_whole_request(conn: Any, data: bytes) -> list[Any] | None:
    """The events h11 would return for ``data``, with h11's state advanced past them.

    Args:
        conn: An ``h11.Connection`` in the server role (its private state is read and set).
        data: The bytes of one ``receive_data`` call.

    Returns:
        ``[Request, Data, EndOfMessage]`` (no ``Data`` for an empty body) when ``data`` is
        exactly one complete HTTP/1.1 request with a ``Content-Length`` body, read on an idle
        connection with nothing buffered; h11's state is then what its reader and state
        machine leave after those three events (client ``DONE`` or ``MUST_CLOSE``, server
        ``SEND_RESPONSE``, request method and version recorded). ``None`` otherwise, with
        nothing changed: the caller feeds ``data`` to h11, which parses (or refuses) it.
    """
    cstate = conn._cstate
    states = cstate.states
    if (
        states[_CLIENT] is not _IDLE or states[_SERVER] is not _IDLE or conn._receive_buffer
        or conn._receive_buffer_closed or cstate.pending_switch_proposals
    ):
        return None
    end = data.find(b"\r\n\r\n")
    if end <= 0 or end + 4 > conn._max_incomplete_event_size:
        return None  # no head, or one over the limit (the strict reader refuses it)
    head = data[:end]
    # h11 splits lines on LF and drops one CR before it: with every LF preceded by CR (and
    # the first blank line at ``end``, found above), splitting on CRLF gives the same lines.
    if head.count(b"\n") != head.count(b"\r\n") or head[:1] == b"\n":
        return None
    lines = head.split(b"\r\n")
    if framing_problem(lines[0], lines[1:]) is not None:
        return None
    start = request_line_re.fullmatch(lines[0])
    if start is None:
        return None
    # h11's normalised form (raw name, lower-case name, value), built here: its
    # normalisation would change no value (one Content-Length of digits, no
    # Transfer-Encoding), so it is skipped.
    items: list[tuple[bytes, bytes, bytes]] = []
    length = 0
    match_line = header_field_re.fullmatch
    for line in lines[1:]:
        field = match_line(line)
        if field is None:
            return None
        name, value = field["field_name"], field["field_value"]
        lower = name.lower()
        if lower in _SLOW_REQUEST_HEADERS:
            return None
        if lower == b"content-length":
            length = int(value)  # 1-18 digits: framing_problem checked it
        items.append((name, lower, value))
    if len(data) - end - 4 != length:
        return None  # an incomplete body, or bytes of a next request: h11 buffers them
    try:
        request = h11.Request(headers=_Headers(items), _parsed=True, **start.groupdict())
    except h11.LocalProtocolError:
        return None  # h11 refuses it too (missing Host, ...), with its own reason
    if request.http_version != b"1.1" or request.method == b"CONNECT":
        return None
    old_states = dict(states)
    # Request: client IDLE -> SEND_BODY, server IDLE -> SEND_RESPONSE; the body's end: client
    # SEND_BODY -> DONE (then MUST_CLOSE without keep-alive).
    states[_CLIENT], states[_SERVER] = _DONE, _SEND_RESPONSE
    conn._request_method = request.method
    conn.their_http_version = request.http_version
    conn.client_is_waiting_for_100_continue = False
    if not _keep_alive(request):
        cstate.process_keep_alive_disabled()
    conn._respond_to_state_changes(old_states)
    events: list[Any] = [request]
    if length:
        events.append(h11.Data(data=data[end + 4 :]))
    events.append(h11.EndOfMessage())
    return events


def response_head(conn: Any, event: Any) -> bytes | None:
    """The bytes h11's ``send`` returns for the ``Response`` ``event``, with h11's state
    advanced as ``send`` advances it; ``None`` (nothing changed) when h11 must send it.

    The short path covers an HTTP/1.1 exchange whose request is complete (client ``DONE``, or
    ``MUST_CLOSE`` when the request said ``Connection: close``; server ``SEND_RESPONSE``), a
    request method other than ``HEAD`` and ``CONNECT``, a status with a body (not 204 or
    304), no ``Host`` header in the response and no ``Connection`` header but the one
    ``Connection: close`` uvicorn adds on a closing exchange. Framing as h11 chooses
    it: ``Content-Length`` without ``Transfer-Encoding`` is kept; otherwise
    ``Content-Length`` and ``Transfer-Encoding`` are dropped and ``Transfer-Encoding:
    chunked`` is appended; without keep-alive ``Connection: close`` comes last, as h11's
    ``_clean_up_response_headers_for_sending`` appends it.

    Args:
        conn: An ``h11.Connection`` in the server role.
        event: An ``h11.Response`` (headers already normalised by its constructor).
    """
    cstate = conn._cstate
    states = cstate.states
    keep_alive = cstate.keep_alive
    if (
        states[_SERVER] is not _SEND_RESPONSE
        or states[_CLIENT] is not (_DONE if keep_alive else _MUST_CLOSE)
        or cstate.pending_switch_proposals
        or conn.their_http_version != b"1.1" or event.http_version != b"1.1"
        or event.status_code in _NO_BODY_STATUSES
        or conn._request_method in (b"HEAD", b"CONNECT")
    ):
        return None
    items = event.headers._full_items
    length: int | None = None
    chunked = False
    closing = False
    for _raw, name, value in items:
        if name in _SLOW_RESPONSE_HEADERS:
            # One "Connection: close" on a closing exchange (uvicorn echoes the request's)
            # is what h11 writes anyway; any other value changes h11's keep-alive state.
            if keep_alive or name != b"connection" or closing or value.lower() != b"close":
                return None
            closing = True
        elif name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    parts = [b"HTTP/1.1 %s %s\r\n" % (str(event.status_code).encode("ascii"), event.reason)]
    if length is not None and not chunked:
        skip, framing = _CONNECTION, b""
        writer: Any = ContentLengthWriter(length)
    else:
        skip, framing = _CHUNKED_FRAMING, b"Transfer-Encoding: chunked\r\n"
        writer = ChunkedWriter()
    parts.extend([b"%s: %s\r\n" % (raw, value) for raw, name, value in items
                  if name not in skip])
    parts.append(framing)
    if not keep_alive:  # h11 moves it last (set_comma_header on "connection")
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    # Response: server SEND_RESPONSE -> SEND_BODY (no state-triggered transition follows).
    states[_SERVER] = _SEND_BODY
    conn.client_is_waiting_for_100_continue = False
    conn._writer = writer
    return b"".join(parts)


def end_of_message(conn: Any, event: Any) -> bytes | None:
    """The bytes h11's ``send`` returns for the ``EndOfMessage`` ``event`` ending a response
    whose head went through :func:`response_head` (or h11's same path), with h11's state
    advanced (server ``DONE``, or ``MUST_CLOSE`` without keep-alive); ``None`` (nothing
    changed) when h11 must send it: trailers, a ``Content-Length`` not yet reached (h11
    raises), another writer.
    """
    cstate = conn._cstate
    states = cstate.states
    keep_alive = cstate.keep_alive
    if (
        states[_SERVER] is not _SEND_BODY
        or states[_CLIENT] is not (_DONE if keep_alive else _MUST_CLOSE)
        or cstate.pending_switch_proposals or event.headers
    ):
        return None
    writer = conn._writer
    kind = type(writer)
    if kind is ContentLengthWriter and writer._length == 0:
        out = b""
    elif kind is ChunkedWriter:
        out = b"0\r\n\r\n"
    else:
        return None
    # EndOfMessage: server SEND_BODY -> DONE; (DONE, DONE) with keep-alive stays, without it
    # the server's DONE becomes MUST_CLOSE (the client's already is).
    states[_SERVER] = _DONE if keep_alive else _MUST_CLOSE
    conn._writer = None  # h11 has no writer for (SERVER, DONE)
    return out
