"""The client-facing HTTP/1.1 server: strict request framing, header and idle timeouts, a cap.

uvicorn's h11 protocol is extended here (:class:`GuardedH11Protocol`); :func:`server_options`
gives the one set of uvicorn options that ``gateway serve`` (and the tests) run. Responses are
written through the fast paths of :mod:`gateway.http_response`; refusals are answered by
:mod:`gateway.http_refusal`.

Framing (RFC 9112 §6.1, §6.3, §5.2). Before a request reaches the application, its head is
checked on the raw header lines, and the request is refused with ``400`` in the OpenAI error
shape (``code: invalid_framing``) and the connection closed when:

* it carries both ``Content-Length`` and ``Transfer-Encoding`` (request smuggling);
* ``Transfer-Encoding`` is anything other than exactly ``chunked`` (the gateway implements no
  other coding; ``gzip, chunked`` is refused too), appears twice, or is sent with HTTP/1.0;
* ``Content-Length`` appears more than once (even with equal values), is a list (``2, 2``) or is
  not 1-18 decimal digits;
* any header line uses obsolete line folding (a line starting with SP or HTAB).

Empty lines before a request line are ignored (RFC 9112 §2.2), however they are split.

h11 alone serves both requests of a ``Content-Length`` + ``Transfer-Encoding: chunked``
smuggle, merges repeated equal lengths and unfolds obs-fold (see docs/gateway.md for the
side-by-side with httptools). Other malformed requests that h11 refuses get the same JSON shape
instead of uvicorn's plain text, naming h11's reason: 400 ``invalid_http_request``, or 431
``request_header_too_large`` for a request head over h11's size limit (16 KiB, however the head
is split across reads: h11 alone checks it only while the head is incomplete).

Slow and idle clients:

* ``limits.client_header_timeout_s``: a connection that has not completed a request head this
  long after it opened (or after the first byte of a later request head) is closed, with a
  ``408`` if part of a head arrived;
* ``limits.keep_alive_timeout_s``: an idle keep-alive connection is closed (uvicorn's timer);
* ``limits.max_client_connections``: a connection over the cap is answered ``503`` at once and
  closed, before any byte of its request is awaited.

Oversized chunked bodies: a chunk-size line announcing more than what is left of
``limits.max_body_bytes`` is answered ``413`` at once (:mod:`gateway.http_body`).

Refusals are written as complete responses, then the write side is shut (``FIN``) and anything
the client still sends is discarded for at most :data:`LINGER_S` before the socket is closed, so
the client reads the answer instead of a connection reset (the answers and their sending:
:mod:`gateway.http_refusal`). Each refusal is handed to the protocol's ``on_refused`` hook
(``gateway serve``: an ``http.refused`` audit record), since none of these requests reaches the
app and its observers.

A second layer, :func:`gateway.asgi_io.scope_framing_problem`, runs in the app on the ASGI scope
headers, so the app refuses (and closes after) ``Content-Length`` with ``Transfer-Encoding``
under any server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import ssl
from collections.abc import Callable
from typing import Any

import h11
from h11._readers import (
    ChunkedReader,
    header_field_re,
    maybe_read_from_IDLE_client,
    request_line_re,
)
from h11._receivebuffer import ReceiveBuffer
from h11._util import validate

from gateway.asgi_io import (
    BODY_CHUNK_EXTENSION,
    CHUNK_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    WHOLE_BODY_EXTENSION,
    WRITE_NOW_EXTENSION,
)
from gateway.http_body import BudgetedChunkedReader
from gateway.http_framing import framing_problem
from gateway.http_refusal import (
    LINGER_S,
    Refusal,
    RefusalHook,
    connection_cap_refusal,
    header_timeout_refusal,
    parse_refusal,
    send_and_linger,
)
from gateway.http_response import ResponseConnection, ResponseWritingProtocol
from gateway.http_short_paths import read_whole_request
from gateway.settings import LimitSettings

_log = logging.getLogger(__name__)

__all__ = [
    "LINGER_S",
    "GuardedH11Protocol",
    "RefusalHook",
    "framing_problem",
    "guarded_protocol",
    "server_options",
]

_EMPTY_LINES = re.compile(rb"(?:\r?\n)+")

# Client states whose h11 reader, given no byte, needs data (a new request head, or nothing
# after a request's end); the others (a body, a protocol switch, an error) go through h11.
_NOTHING_TO_READ = frozenset({h11.IDLE, h11.DONE, h11.MUST_CLOSE})

BodyLimit = Callable[[], int]
"""The ``limits.max_body_bytes`` in force now (it may change on a live reload), in bytes."""


class _StrictConnection(ResponseConnection):
    """h11's server connection with the request-head reader replaced by a strict one (and the
    response writing of :class:`gateway.http_response.ResponseConnection`).

    h11 picks its reader per state through ``_get_io_object``; only the reader of a new request
    head is wrapped. h11 is pinned to 0.16.x in pyproject.toml because this is its private API;
    tests/gateway/test_request_framing.py fails if the hook stops being called.

    Attributes:
        framing_error: The reason the last request head was refused, if it was.
    """

    framing_error: str | None = None
    body_limit: BodyLimit | None = None
    """The request body limit; a chunked body is refused once it is known to exceed it."""
    protocol_error: h11.RemoteProtocolError | None = None
    """What h11 refused in the last request, if it did (its status hint and reason)."""

    _ready: list[Any] | None = None
    """Events of a whole request read by :meth:`receive_data`, not yet returned."""

    def receive_data(self, data: bytes) -> None:
        """h11's ``receive_data``; a whole plain request on an idle connection is read at once
        (:func:`gateway.http_short_paths.read_whole_request`: the events h11 would return,
        without its reader and state machine), the rest goes to h11's buffer."""
        if data and self._ready is None:
            self._ready = read_whole_request(self, data)
            if self._ready is not None:
                return
        super().receive_data(data)

    def next_event(self) -> Any:
        """h11's ``next_event`` (the events of a request read whole first), keeping a refusal
        for :meth:`GuardedH11Protocol.send_400_response` (uvicorn drops the exception, and
        with it h11's status hint and reason)."""
        ready = self._ready
        if ready is not None:
            event = ready.pop(0)
            if not ready:
                self._ready = None
            return event
        if (
            not self._receive_buffer._data and not self._receive_buffer_closed
            and self._cstate.states[h11.CLIENT] in _NOTHING_TO_READ
        ):
            return h11.NEED_DATA  # what h11's reader of that state answers: no byte to read
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.protocol_error = exc
            raise

    def _get_io_object(self, role: Any, event: Any, io_dict: Any) -> Any:
        obj = super()._get_io_object(role, event, io_dict)
        if obj is maybe_read_from_IDLE_client:
            return self._read_request_head
        if type(obj) is ChunkedReader and role is h11.CLIENT and self.body_limit is not None:
            return BudgetedChunkedReader(self.body_limit())
        return obj

    def _read_request_head(self, buf: ReceiveBuffer) -> h11.Request | None:
        # h11's maybe_read_from_IDLE_client, with the framing check on the very lines h11
        # parses (before unfolding and before repeated Content-Length values are merged).
        # RFC 9112 §2.2: empty lines before a request line are ignored (a client may end a
        # body with CRLF; h11 refused the next "request" and closed, and a client that sent
        # its next request meanwhile read that refusal as its answer). One extraction however
        # many there are; a CR alone waits for its LF.
        empty = _EMPTY_LINES.match(buf._data)
        if empty is not None:
            buf._extract(empty.end())
        size = len(buf)
        lines = buf.maybe_extract_lines()
        if lines is None:
            if buf.is_next_line_obviously_invalid_request_line() and bytes(buf) != b"\r":
                raise h11.LocalProtocolError("illegal request line")
            return None
        if size - len(buf) > self._max_incomplete_event_size:
            # h11 limits a head only while it is incomplete: one that arrived in a single read
            # was taken whatever its size, the same head in two reads refused. The limit is on
            # the head, however it arrives (the short path leaves such a head to this reader).
            raise h11.LocalProtocolError("request head too large", error_status_hint=431)
        if not lines:
            raise h11.LocalProtocolError("no request line received")
        problem = framing_problem(bytes(lines[0]), lines[1:])
        if problem is not None:
            self.framing_error = problem
            raise h11.LocalProtocolError(problem)  # h11 re-raises it as a remote error
        raw: list[bytes] = lines  # type: ignore[assignment]  # h11 passes bytearrays as bytes
        matches = validate(request_line_re, raw[0], "illegal request line: {!r}", raw[0])
        # h11's _decode_header_lines, without its obs-fold pass (a folded line was refused
        # above) and without a generator and a dict per line: the same regex, the same error.
        headers: list[tuple[bytes, bytes]] = []
        match_line = header_field_re.fullmatch
        for line in raw[1:]:
            field = match_line(line)
            if field is None:
                raise h11.LocalProtocolError(f"illegal header line: {line!r}")
            headers.append((field["field_name"], field["field_value"]))
        return h11.Request(headers=headers, _parsed=True, **matches)


class GuardedH11Protocol(ResponseWritingProtocol):
    """uvicorn's h11 protocol with strict framing, a header timeout and a connection cap.

    Configure through :func:`guarded_protocol`, which sets the class attributes.
    """

    header_timeout_s: float = 10.0
    max_connections: int = 4096
    body_limit: BodyLimit | None = None
    """The request body limit in force (``None``: chunked bodies are not counted here)."""
    on_refused: RefusalHook | None = None
    """Told of every request or connection this protocol refuses before the app sees it
    (status, error code, the message sent, client host): ``gateway serve`` records each in
    the audit log (``http.refused``). Must not raise or block."""

    connection_class = _StrictConnection
    conn: _StrictConnection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn.body_limit = self.body_limit
        self._header_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._refused = False
        # The request cycle whose disconnect is watched, and its callback (DISCONNECT_EXTENSION).
        self._disconnect_cycle: Any = None
        self._on_disconnect: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept, or answer 503 at once when the connection cap is reached."""
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.connections.discard(self)
            self._refuse(connection_cap_refusal())
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the timers, let uvicorn clean up, then call a watched request's callback."""
        self._cancel_header_timer()
        cycle, on_disconnect = self._disconnect_cycle, self._on_disconnect
        self._disconnect_cycle = self._on_disconnect = None
        super().connection_lost(exc)
        if on_disconnect is not None and cycle is self.cycle and cycle.disconnected:
            on_disconnect()

    def data_received(self, data: bytes) -> None:
        """Feed h11; time the request head from its first byte until it is complete."""
        if self._refused:
            return  # lingering: discard
        if self.conn.their_state is h11.IDLE:
            self._head_bytes += len(data)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_bytes = 0
            self._cancel_header_timer()
        elif self._head_bytes:
            # Part of a head is here and the rest is not: the clock runs from now (a head that
            # arrives whole, the common case, never arms a timer).
            self._arm_header_timer()

    def send_400_response(self, msg: str) -> None:
        """Refuse a malformed request with the OpenAI error JSON and close (not plain text).

        The answer names what was wrong: the framing problem (400 ``invalid_framing``), a
        request head over h11's size limit (431 ``request_header_too_large``, RFC 6585 §5), a
        chunked body announcing more than the body limit (413 ``request_too_large``, see
        :mod:`gateway.http_body`), or h11's reason for any other malformed request (400
        ``invalid_http_request``), without echoing the client's bytes.
        """
        conn = self.conn
        self._refuse(parse_refusal(conn.framing_error, conn.protocol_error,
                                   conn._max_incomplete_event_size, self.body_limit, msg))

    def handle_events(self) -> None:
        """uvicorn's, plus the :data:`BODY_CHUNK_EXTENSION`, :data:`WRITE_NOW_EXTENSION`,
        :data:`CHUNK_WRITER_EXTENSION`, :data:`DISCONNECT_EXTENSION` and
        :data:`WHOLE_BODY_EXTENSION` in the scope of a new request."""
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not None and self.cycle is not cycle:
            # The request's task was created but has not run yet: it sees the extensions.
            scope: Any = self.cycle.scope  # uvicorn's TypedDict types extension values
            extensions = scope.setdefault("extensions", {})
            extensions[BODY_CHUNK_EXTENSION] = self._write_body_chunk
            extensions[WRITE_NOW_EXTENSION] = self._write_body_chunk_now
            extensions[CHUNK_WRITER_EXTENSION] = self._open_chunk_writer
            extensions[DISCONNECT_EXTENSION] = self._watch_disconnect
            extensions[WHOLE_BODY_EXTENSION] = self._take_whole_body
            tls = _tls_extension(self.transport)
            if tls is not None:
                extensions["tls"] = tls

    def _take_whole_body(self) -> bytes | None:
        """The request body if it has wholly arrived and is unread, as uvicorn's ``receive``
        would return it (then marked read); ``None`` otherwise (:data:`WHOLE_BODY_EXTENSION`).

        The current cycle is the caller's: a request's body is read before its response is
        complete, and no next request starts before that.
        """
        cycle = self.cycle
        if (
            cycle is None or cycle.more_body or cycle.disconnected or cycle.response_complete
            or cycle.waiting_for_100_continue or not cycle.message_event.is_set()
        ):
            return None
        # uvicorn's receive(), past its wait: resume reading, clear the event, take the body.
        self.flow.resume_reading()
        cycle.message_event.clear()
        body = bytes(cycle.body)
        cycle.body = bytearray()
        return body

    def _watch_disconnect(self, on_disconnect: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``on_disconnect`` when the connection is lost before the current response is
        complete.

        Returns:
            The function that forgets the callback, or ``None`` when there is no response in
            progress or the client is already gone (the caller then awaits ``receive()``).
        """
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.disconnected:
            return None
        self._disconnect_cycle, self._on_disconnect = cycle, on_disconnect
        return functools.partial(self._unwatch_disconnect, cycle)

    def _unwatch_disconnect(self, cycle: Any) -> None:
        if self._disconnect_cycle is cycle:  # not a later request's watch
            self._disconnect_cycle = self._on_disconnect = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written (pipelined head waits on purpose)
        if self.conn._receive_buffer:  # part of a head (empty lines before one were dropped)
            self._refuse(header_timeout_refusal(self.header_timeout_s))
        else:
            self.transport.close()

    def _refuse(self, refusal: Refusal) -> None:
        """Write ``refusal``'s complete error response, shut the write side, discard input,
        close soon (:func:`gateway.http_refusal.send_and_linger`); then tell
        :attr:`on_refused`."""
        self._refused = True
        self._cancel_header_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app is reading this request's body (a refused chunked body): it is told the
            # client is gone, and anything it still sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self._unset_keepalive_if_required()
        send_and_linger(self.transport, self.loop, refusal)
        if self.on_refused is not None:
            status, code = refusal.status, refusal.code
            try:
                self.on_refused(status, code, refusal.message,
                                self.client[0] if self.client else None)
            except Exception:
                _log.exception("on_refused hook failed (%s %s)", status, code)


def _tls_extension(transport: Any) -> dict[str, Any] | None:
    """The ASGI TLS extension of an HTTPS connection (``client_cert_chain``: the peer's
    certificate as PEM, leaf only: Python's ``ssl`` before 3.13 exposes no verified chain;
    ``tls_version``, ``cipher_suite``), ``None`` over plain HTTP. The certificate was verified
    by the handshake against the listener's client CA bundle (``identity.mtls``)."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": None,
        "client_cert_error": None,
        "tls_version": None,
        "cipher_suite": None,
    }


def guarded_protocol(
    limits: LimitSettings, on_refused: RefusalHook | None = None,
    body_limit: BodyLimit | None = None,
) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass configured from ``limits`` (and the hook told of
    each refusal; ``body_limit``: the ``max_body_bytes`` in force, by default
    ``limits.max_body_bytes``)."""
    max_body_bytes = limits.max_body_bytes
    return type(
        "GatewayH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout_s": limits.client_header_timeout_s,
            "max_connections": limits.max_client_connections,
            "on_refused": staticmethod(on_refused) if on_refused is not None else None,
            "body_limit": staticmethod(body_limit or (lambda: max_body_bytes)),
        },
    )


def server_options(
    limits: LimitSettings, on_refused: RefusalHook | None = None,
    body_limit: BodyLimit | None = None, **options: Any
) -> dict[str, Any]:
    """The uvicorn options the gateway is served with (``uvicorn.run(app, **options)``).

    Args:
        limits: ``client_header_timeout_s``, ``keep_alive_timeout_s`` and
            ``max_client_connections`` are applied.
        on_refused: Called with ``(status, code, message, client_host)`` for every request or
            connection refused before it reaches the app (``gateway serve``: the audit log's
            ``http.refused`` records).
        body_limit: The ``limits.max_body_bytes`` in force now (``gateway serve``: the running
            configuration's, which a live reload may change); default ``limits``'s.
        **options: Further :class:`uvicorn.Config` arguments (host, port, TLS files, ...).

    Returns:
        Keyword arguments for :func:`uvicorn.run` / :class:`uvicorn.Config`: standard asyncio
        loop (never uvloop: the egress guard relies on audit hooks), the guarded h11 protocol,
        no WebSocket upgrades, no access log, no server header.
    """
    out: dict[str, Any] = {
        "loop": "asyncio",
        "http": guarded_protocol(limits, on_refused, body_limit),
        "ws": "none",  # no WebSocket routes: an Upgrade request stays plain HTTP
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "lifespan": "on",
        "access_log": False,
        "log_config": None,
        "proxy_headers": False,
        "server_header": False,
        "timeout_graceful_shutdown": 10,
    }
    out.update(options)
    return out
