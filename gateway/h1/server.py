"""The client-facing HTTP/1.1 server protocol: requests in, ASGI to the app, responses out.

The twin of the upstream client (:mod:`gateway.h1.client`): one :class:`ServerProtocol` per
client connection, on asyncio's public ``Protocol`` API, reading requests with the strict
sans-IO :class:`gateway.h1.framing.RequestReader` and writing responses itself (RFC 9112 §6,
§7.1). It speaks ASGI 3 to the app (HTTP spec 2.3, https://asgi.readthedocs.io/en/latest/specs/
www.html), with the gateway's fast paths as its own methods, offered as scope extensions
(:mod:`gateway.h1.asgi_io`: whole body, write now, chunk writer, body chunk, disconnect watch) and
the ASGI TLS extension (``scope["extensions"]["tls"]``, https://asgi.readthedocs.io/en/latest/
specs/tls.html) on HTTPS connections.

Every state of a connection has a timer and a bound (:class:`ServerLimits`):

* waiting for the first request head, or idle between requests: ``header_timeout_s`` /
  ``keep_alive_timeout_s``, then closed;
* part of a head received: ``header_timeout_s`` from its first byte (reads do not extend it),
  then 408 and closed;
* a request body being received: ``body_timeout_s`` without a byte of it (while the server
  reads), and a whole-body deadline that bytes extend only at ``body_min_rate_bytes_s``: it
  starts ``body_timeout_s`` after the head and moves one second later per
  ``body_min_rate_bytes_s`` bytes received (Apache httpd's mod_reqtimeout ``body=...,MinRate=``
  rule), so a client trickling a byte now and then cannot hold the connection for ever; either
  way 408 (or closed if the response started);
* a response sent before the request's body was wholly received (401, 404, 413 ...): when the
  rest of the body is a known ``Content-Length`` of at most 64 KiB, the connection stays open
  (the head does not say ``close``) and the rest is read and discarded; if it is not all there
  within ``linger_s``, the connection is closed. A larger or chunked rest (or a client waiting
  for ``100 Continue``) gets ``connection: close`` in the response head; then the write side is
  shut and what the client still sends is discarded for at most ``linger_s``, then the
  connection is closed, however much the client keeps sending (nginx's discarded request body
  and lingering close, https://nginx.org/en/docs/http/ngx_http_core_module.html#lingering_close).
  A response head never promises a kept-alive connection that is then closed under a client
  about to reuse it;
* writing to a client whose socket buffer stays full (a client that stopped reading):
  ``send_timeout_s``, then the connection is aborted and the app sees the disconnect (the relay
  then frees its upstream connection);
* over ``max_connections`` open connections (or ``max_connections_per_address`` of one
  client address): an idle connection is closed to make room (:mod:`gateway.h1.conntable`):
  one already answered first, then one with no complete head yet (answered 503), then one
  idle between requests, the one idle the longest of each; only when every connection
  carries a request is the newcomer answered 503 (429 for the per-address cap) and closed
  after the linger.

A request refused before the app sees it (:class:`gateway.h1.framing.RequestRefused`, a header
timeout, the connection cap) is answered with the OpenAI error JSON and told to the
``on_refused`` hook (:data:`gateway.h1.refusal.RefusalHook`).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from gateway.h1.asgi_io import (
    BODY_CHUNK_EXTENSION,
    CHUNK_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    LEFT_IN_ORDER_EXTENSION,
    LOST_EXTENSION,
    REFUSED_EXTENSION,
    WHOLE_BODY_EXTENSION,
    WRITE_NOW_EXTENSION,
    WRITE_RESPONSE_EXTENSION,
    Message,
)
from gateway.h1.conntable import Admission, ConnectionTable, EvictionCause
from gateway.h1.framing import MAX_REQUEST_HEAD_BYTES, RequestHead, RequestReader, RequestRefused
from gateway.h1.refusal import (
    EvictionHook,
    Refusal,
    RefusalHook,
    address_cap_refusal,
    connection_cap_refusal,
    eviction_refusal,
    header_timeout_refusal,
)
from gateway.h1.tls_scope import tls_extension

__all__ = ["ServerContext", "ServerLimits", "ServerProtocol"]

_ABSENT: Any = object()  # a dict.pop default no connection address can equal

_log = logging.getLogger(__name__)

_READ_HIGH_WATER = 64 * 1024  # request bytes buffered for the app before reading pauses
_DISCARD_MAX = 64 * 1024  # a body rest read and dropped after an early answer, keeping alive
_NO_BODY_STATUSES = frozenset({204, 304})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_REASONS: dict[int, bytes] = {}


def _reason(status: int) -> bytes:
    reason = _REASONS.get(status)
    if reason is None:
        from http import HTTPStatus

        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        _REASONS[status] = reason
    return reason


class _DateHeader:
    """The ``date`` response header line (RFC 9110 §6.6.1), formatted once per second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"date: %s\r\n" % email.utils.formatdate(now, usegmt=True).encode()
        return self._line


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The bounds of every connection state (seconds, counts, bytes).

    Attributes:
        header_timeout_s: The first request head (or the rest of a started head) must arrive
            within this many seconds (``limits.client_header_timeout_s``).
        keep_alive_timeout_s: An idle connection between requests is closed after this
            (``limits.keep_alive_timeout_s``).
        body_timeout_s: Longest wait for the next byte of a request body the server is
            reading (``limits.client_body_timeout_s``), and the whole body's first allowance.
        body_min_rate_bytes_s: Bytes per second that extend the whole body's deadline by one
            second each (``limits.client_body_min_rate_bytes_s``); ``0``: no whole-body
            deadline, only ``body_timeout_s`` of silence.
        send_timeout_s: Longest time the client's socket buffer may stay full while a response
            is written (``limits.client_send_timeout_s``).
        linger_s: How long a connection whose response went out before its request body was
            read discards what the client still sends before it is closed.
        max_connections: Open client connections; one more closes the connection idle the
            longest, or is answered 503 and closed when every connection carries a request.
        max_connections_per_address: Open connections of one client address; one more closes
            that address's connection idle the longest, or is answered 429 and closed when
            all of them carry requests. ``None``: no per-address cap.
        max_head_bytes: Longest request head (431 beyond).
    """

    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    body_timeout_s: float = 30.0
    body_min_rate_bytes_s: float = 500.0
    send_timeout_s: float = 30.0
    linger_s: float = 2.0
    max_connections: int = 4096
    max_connections_per_address: int | None = None
    max_head_bytes: int = MAX_REQUEST_HEAD_BYTES


@dataclass(slots=True)
class ServerContext:
    """What every connection of one server shares.

    Attributes:
        app: The ASGI application.
        limits: The connection bounds.
        body_limit: ``limits.max_body_bytes`` in force now (a live reload may change it).
        on_refused: Told of each request or connection refused before the app saw it.
        on_evicted: Told of each idle connection closed to make room for a new one.
        state: The lifespan state (``scope["state"]``: a shallow copy per request).
        routes: Request paths served by their own ASGI callable instead of ``app`` (exact
            match on ``scope["path"]``); the app still runs the lifespan.
        connections: The open connections (drain and shutdown walk it).
        table: The connections counted against the caps, and which idle one makes room
            (built from ``limits``).
    """

    app: Any
    limits: ServerLimits = field(default_factory=ServerLimits)
    body_limit: Callable[[], int] = lambda: 16 * 1024 * 1024
    on_refused: RefusalHook | None = None
    state: dict[str, Any] = field(default_factory=dict)
    routes: Mapping[str, Any] = field(default_factory=dict)
    connections: set[ServerProtocol] = field(default_factory=set)
    date: _DateHeader = field(default_factory=_DateHeader)
    on_evicted: EvictionHook | None = None
    table: ConnectionTable[ServerProtocol] = field(init=False)

    def __post_init__(self) -> None:
        self.table = ConnectionTable(self.limits.max_connections,
                                     self.limits.max_connections_per_address)


def _not_lost() -> None:
    """:meth:`_Cycle.lost` when no request is in progress: nothing to lose."""
    return None


def _not_left() -> bool:
    """:meth:`_Cycle.left_in_order` when no request is in progress."""
    return False


class _Cycle:
    """One request and its response."""

    __slots__ = ("body", "body_deadline", "body_size", "chunked", "closing", "continue_due",
                 "disconnected", "head_only", "held", "keep_alive", "left", "more_body",
                 "refused", "reset", "response_complete", "response_started", "running",
                 "scope", "sent", "taken", "waiter", "watch")

    def __init__(self, scope: dict[str, Any], head: RequestHead) -> None:
        self.scope = scope
        self.body: list[bytes] = []
        self.body_size = 0
        self.body_deadline = 0.0  # loop time by which the whole body must be in (rate rule)
        self.more_body = head.content_length != 0
        self.continue_due = head.expect_continue
        self.keep_alive = head.keep_alive
        self.head_only = head.method == b"HEAD"
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.taken = False  # the whole body was handed out (WHOLE_BODY_EXTENSION)
        self.chunked = False
        self.closing = False  # the response is delimited by the close of the connection
        self.left = 0  # Content-Length bytes still to send
        self.held = b""  # the response head, waiting for the first body bytes
        self.sent = 0  # response body bytes handed to the connection (the app's, not framing)
        self.reset = False  # the connection was lost to an error (a reset), not closed in order
        self.refused: Refusal | None = None  # the server's own answer (the app's is dropped)
        self.waiter: asyncio.Future[None] | None = None
        self.watch: Callable[[], None] | None = None
        self.running = True  # the app's task has not returned yet

    def lost(self) -> int | None:
        """``None`` while this response can still reach the client (and once it is complete);
        else the body bytes of it handed to the connection before the connection was lost. A
        refusal of the server's own (``_refuse``) is no loss: the server answered."""
        if not self.disconnected or self.response_complete or self.refused is not None:
            return None
        return self.sent

    def left_in_order(self) -> bool:
        """Whether the client closed its connection in order (a FIN after reading what it
        wanted; asyncio flushes what the server wrote before it reports such a close) rather
        than losing it to an error: a reset, as a client closing with bytes of ours unread in
        its socket sends, or an abort. ``False`` while the connection is there."""
        return self.disconnected and not self.reset and self.refused is None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


class ServerProtocol(asyncio.Protocol):
    """One client connection (see the module docstring).

    Args:
        context: The server's shared context.
    """

    def __init__(self, context: ServerContext) -> None:
        self.ctx = context
        self.limits = context.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader(context.limits.max_head_bytes, context.body_limit())
        self.cycle: _Cycle | None = None
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.scheme = "http"
        self._tls: dict[str, Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # loop time at which _on_deadline is due
        self._on_deadline: Callable[[], None] | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._head_timed = False  # the header timer runs for a started head
        self._served = False  # a request was served on this connection (keep-alive timer)
        self._min_rate = context.limits.body_min_rate_bytes_s
        self._paused_at = 0.0  # loop time reading was paused for a body the app is behind on
        self._closed = False
        self._lingering = False
        self._read_paused = False
        self._write_paused = False
        self._drain: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._extensions: dict[str, Any] | None = None  # scope["extensions"] (read only)

    # --- connection lifecycle ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Accept (closing an idle connection when a cap is reached), or answer 503 (429 for
        the per-address cap) when every connection carries a request; start the head timer."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.server = (str(sock[0]), int(sock[1])) if isinstance(sock, tuple) else None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.scheme = "https"
            self._tls = tls_extension(ssl_object)
        table, address = self.ctx.table, self.client[0] if self.client else None
        if len(table.open) < table.max_connections and table.max_per_address is None:
            # ConnectionTable.admit below the caps, inline (no call on every connection).
            table.open[self] = address
            table.fresh[self] = next(table.turns)
            admission = Admission.ADMITTED
        else:
            admission = table.admit(self, address)
        if admission is not Admission.ADMITTED:
            self._refuse(connection_cap_refusal() if admission is Admission.FULL
                         else address_cap_refusal())
            return
        self.ctx.connections.add(self)
        self._arm(self.limits.header_timeout_s, self._idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        """Tell the request in progress (its receive, its disconnect watch), drop timers, and
        let go of the scope extensions (bound methods of this protocol) and of a request whose
        app has returned: no reference cycle is left, so the connection is freed by reference
        counting when the transport lets go of it, not by the next ``gc`` collection (the app
        of a request in progress holds them until it returns, see :meth:`_run`)."""
        self._closed = True
        self._extensions = None
        self.ctx.connections.discard(self)
        table = self.ctx.table
        if table.max_per_address is None:  # ConnectionTable.remove, inline
            if table.open.pop(self, _ABSENT) is not _ABSENT and \
                    table.resting.pop(self, None) is None and \
                    table.fresh.pop(self, None) is None:
                table.answered.pop(self, None)
        else:
            table.remove(self)
        self._cancel_timers()
        for waiter in self._drain:
            if not waiter.done():
                waiter.set_result(None)
        self._drain.clear()
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True
            cycle.reset = exc is not None
            cycle.wake()
            watch, cycle.watch = cycle.watch, None
            if watch is not None and not cycle.response_complete:
                watch()
            if not cycle.running:
                self.cycle = None

    def pause_writing(self) -> None:
        """The client's socket buffer is full: the send timer runs until it drains."""
        self._write_paused = True
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s,
                                                    self._send_timeout)

    def resume_writing(self) -> None:
        """The client reads again: writers waiting for room go on."""
        self._write_paused = False
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        for waiter in self._drain:
            if not waiter.done():
                waiter.set_result(None)
        self._drain.clear()

    def shutdown(self) -> None:
        """The server stops: close now when idle, else after the response in progress."""
        self._shutting_down = True
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._close()
        else:
            cycle.keep_alive = False

    def abort(self) -> None:
        """Close the connection at once, unsent bytes dropped."""
        if self.transport is not None:
            self.transport.abort()

    def evict(self, cause: EvictionCause) -> None:
        """Close this idle connection to make room for a new one (:class:`ConnectionTable`
        chose it), and tell the ``on_evicted`` hook.

        One that was answered (lingering) or is idle between requests is closed at once (aborted,
        unsent bytes dropped, when its answer still waits in the write buffer: its client is not
        reading, and a close would keep the descriptor until the send timeout); one
        that never got an answer (nothing or part of a head received: its head may be on its
        way, or unread in the socket) is answered 503 and lingers as a refusal does, so its
        client reads the 503 instead of a connection reset (nginx closes such connections
        unread; an OpenAI SDK retries a 503, not a reset of a request it sent)."""
        cycle = self.cycle
        if self._lingering or (cycle is not None and cycle.response_complete):
            state = "lingering"  # answered; the rest of its body was being dropped, if any
        elif self.reader.buffered:
            state = "partial_head"
        else:
            state = "keep_alive" if self._served else "no_request"
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size() and (
                transport.is_closing() or state not in ("partial_head", "no_request")):
            # Its client is not reading what it was answered: flushing (a close already under
            # way too) would keep the socket, uncounted, beyond the cap until the send
            # timeout. Dropped now.
            self._lingering = True
            self._disarm()
            transport.abort()
        elif transport is not None and not transport.is_closing():
            if state in ("partial_head", "no_request"):
                transport.write(eviction_refusal().response())
                self._linger()  # not counted any more (the table forgot it); closes in linger_s
            else:
                self._lingering = True  # what still comes is discarded
                self._close()
        hook = self.ctx.on_evicted
        if hook is not None:
            try:
                hook(state, cause.value, self.client[0] if self.client else None)
            except Exception:
                _log.exception("on_evicted hook failed (%s %s)", state, cause.value)

    # --- timers -----------------------------------------------------------------------------

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` in ``delay_s`` seconds unless re-armed or disarmed before.

        The connection's one timer handle is kept across re-arming: a handle due no later
        than the new deadline stays and, when it fires early, schedules itself again for the
        rest (:meth:`_deadline_reached`). A kept-alive connection so re-arms its header and
        idle timers per request without creating or cancelling a timer handle each time.
        """
        when = self.loop.time() + delay_s
        self._deadline = when
        self._on_deadline = callback
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return  # it fires first, then waits for the rest
            timer.cancel()
        self._timer = self.loop.call_at(when, self._deadline_reached)

    def _disarm(self) -> None:
        self._on_deadline = None  # the handle, if any, fires and finds nothing to do

    def _deadline_reached(self) -> None:
        self._timer = None
        callback = self._on_deadline
        if callback is None:
            return
        if self._deadline > self.loop.time():  # re-armed for later since it was scheduled
            self._timer = self.loop.call_at(self._deadline, self._deadline_reached)
            return
        self._on_deadline = None
        callback()

    def _cancel_timers(self) -> None:
        self._on_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _idle_timeout(self) -> None:
        self._timer = None
        if self.cycle is None and not self.reader.buffered:
            self._close()  # nothing of a request came: closed without an answer
        elif self.cycle is None:
            self._refuse(header_timeout_refusal(self.limits.header_timeout_s))

    def _arm_body(self, cycle: _Cycle) -> None:
        """Arm the body timer: ``body_timeout_s`` of silence, or the whole-body deadline."""
        delay_s = self.limits.body_timeout_s
        if self._min_rate:
            delay_s = min(delay_s, cycle.body_deadline - self.loop.time())
        self._arm(max(delay_s, 0.0), self._body_timeout)

    def _body_timeout(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body:
            return
        if cycle.response_complete:
            # The rest of an answered request's body did not come within linger_s.
            self._lingering = True
            self.abort()
            return
        if cycle.response_started:
            self.abort()
            return
        if self._min_rate and cycle.body_deadline <= self.loop.time():
            why = (f"it arrived slower than {self._min_rate:g} bytes/s after the first "
                   f"{self.limits.body_timeout_s:g} s; {cycle.body_size} bytes received")
        else:
            why = f"no data for {self.limits.body_timeout_s:g} s"
        self._refuse(Refusal(408, "Request Timeout",
                             f"The request body was not received in time ({why}).",
                             "request_timeout"))

    def _send_timeout(self) -> None:
        self._send_timer = None
        if self._write_paused:
            _log.info("client %s did not read for %g s: connection closed",
                      self.client[0] if self.client else "?", self.limits.send_timeout_s)
            self.abort()

    # --- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Parse what the client sent; start a request, or hand body bytes to it."""
        if self._lingering:
            return  # a refused or answered-early connection: discarded until closed
        reader = self.reader
        reader.feed(data)
        if self.cycle is None and not self._head_timed:
            # Part of a head is here: the clock runs from its first byte, once.
            self._head_timed = True
            self._arm(self.limits.header_timeout_s, self._idle_timeout)
        self._parse()

    def _parse(self) -> None:
        reader = self.reader
        cycle = self.cycle
        try:
            while True:
                event = reader.next_event()
                if event is None:
                    break
                if type(event) is bytes:
                    assert cycle is not None
                    if cycle.response_complete:
                        continue  # the rest of an answered request's body: discarded
                    cycle.body.append(event)
                    cycle.body_size += len(event)
                    if self._min_rate:
                        cycle.body_deadline += len(event) / self._min_rate
                else:
                    assert isinstance(event, RequestHead)
                    cycle = self._start(event)
        except RequestRefused as exc:
            self._refuse(Refusal(exc.status, _status_phrase(exc.status), exc.reason, exc.code))
            return
        if cycle is None:
            return
        if cycle.response_complete:
            if cycle.more_body and reader.complete:
                cycle.more_body = False  # the discarded rest is in: the next request may come
                self._next_request()
            return
        if cycle.more_body:
            if reader.complete:
                cycle.more_body = False
                self._disarm()
            elif not self._read_paused:
                self._arm_body(cycle)
            cycle.wake()
        if cycle.body_size > _READ_HIGH_WATER or (reader.complete and reader.buffered):
            self._pause_reading()  # the app reads it first; pipelined bytes wait

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()
            cycle = self.cycle
            if cycle is not None and cycle.more_body:
                self._disarm()  # the app is behind, not the client
                self._paused_at = self.loop.time()

    def _resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self._lingering:
            self._read_paused = False
            self.transport.resume_reading()
            cycle = self.cycle
            if cycle is not None and cycle.more_body and not cycle.response_complete:
                # The time the app was behind is not the client's: the deadline moves by it.
                cycle.body_deadline += self.loop.time() - self._paused_at
                self._arm_body(cycle)

    def _start(self, head: RequestHead) -> _Cycle:
        self._disarm()
        table = self.ctx.table  # ConnectionTable.busy, inline: it carries a request now
        if table.resting.pop(self, None) is None:
            table.fresh.pop(self, None)
        self._head_timed = False
        target = head.target
        raw_path, _, query = target.partition(b"?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1" if head.version == b"1.1" else "1.0",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": head.method.decode("ascii"),
            "root_path": "",
            # unquote returns a path without "%" (37) as it is: no call for the usual one.
            "path": (unquote(raw_path.decode("latin-1")) if 37 in raw_path
                     else raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": head.headers,
            "state": self.ctx.state.copy(),
        }
        extensions = self._extensions
        if extensions is None:  # the same for every request of the connection: made once
            extensions = self._extensions = {
                BODY_CHUNK_EXTENSION: self._write_body_chunk,
                WRITE_NOW_EXTENSION: self.write_now,
                WRITE_RESPONSE_EXTENSION: self._write_response,
                CHUNK_WRITER_EXTENSION: self._open_chunk_writer,
                DISCONNECT_EXTENSION: self._watch_disconnect,
                LOST_EXTENSION: self._lost_of,
                LEFT_IN_ORDER_EXTENSION: self._left_in_order_of,
                REFUSED_EXTENSION: self._refused,
                WHOLE_BODY_EXTENSION: self._take_whole_body,
            }
            if self._tls is not None:
                extensions["tls"] = self._tls
        scope["extensions"] = extensions
        if self._shutting_down:
            head.keep_alive = False
        cycle = self.cycle = _Cycle(scope, head)
        if cycle.more_body:
            cycle.body_deadline = self.loop.time() + self.limits.body_timeout_s
        self._served = True
        self.loop.create_task(self._run(cycle))
        return cycle

    # --- the ASGI application ------------------------------------------------------------------

    async def _run(self, cycle: _Cycle) -> None:
        async def receive() -> Message:
            return await self._receive(cycle)

        async def send(message: Message) -> None:
            await self._send(cycle, message)

        try:
            scope = cycle.scope
            await self.ctx.routes.get(scope["path"], self.ctx.app)(scope, receive, send)
        except BaseException as exc:
            self._returned(cycle)
            if not cycle.disconnected:
                _log.error("Exception in ASGI application", exc_info=exc)
            if not cycle.response_started and not cycle.disconnected:
                self._internal_error(cycle)
            elif not cycle.response_complete:
                self.abort()
            if not isinstance(exc, Exception):
                raise
            return
        self._returned(cycle)
        if not cycle.response_complete and not cycle.disconnected:
            if not cycle.response_started:
                _log.error("ASGI callable returned without starting response.")
                self._internal_error(cycle)
            else:
                _log.error("ASGI callable returned without completing response.")
                self.abort()

    def _returned(self, cycle: _Cycle) -> None:
        """The app of ``cycle`` returned: on a closed connection the protocol lets go of it
        (its scope's extensions are bound methods of the protocol: a cycle otherwise)."""
        cycle.running = False
        if self._closed and self.cycle is cycle:
            self.cycle = None

    def _internal_error(self, cycle: _Cycle) -> None:
        body = b"Internal Server Error"
        cycle.keep_alive = False
        self._write_head(cycle, 500, [(b"content-type", b"text/plain; charset=utf-8"),
                                      (b"content-length", b"%d" % len(body))])
        self._write_body(cycle, body, False)

    async def _receive(self, cycle: _Cycle) -> Message:
        if cycle.continue_due and not cycle.body and cycle.more_body and not cycle.disconnected:
            cycle.continue_due = False
            if not cycle.response_started and self.transport is not None:
                self.transport.write(_CONTINUE)
        while not cycle.disconnected and not cycle.response_complete:
            if cycle.body or (not cycle.more_body and not cycle.taken):
                body = cycle.body[0] if len(cycle.body) == 1 else b"".join(cycle.body)
                cycle.body.clear()
                cycle.body_size = 0
                if not cycle.more_body:
                    cycle.taken = True
                elif self.cycle is cycle:
                    self._resume_reading()
                return {"type": "http.request", "body": body, "more_body": cycle.more_body}
            if self.cycle is cycle:
                self._resume_reading()
            waiter = cycle.waiter = self.loop.create_future()
            await waiter
        return {"type": "http.disconnect"}

    async def _send(self, cycle: _Cycle, message: Message) -> None:
        kind = message["type"]
        if cycle.disconnected:
            return  # the client is gone: dropped, as the app learns from receive()
        if kind == "http.response.start":
            if cycle.response_started:
                raise RuntimeError("Unexpected ASGI message 'http.response.start' sent, after "
                                   "response already started.")
            self._write_head(cycle, int(message["status"]), list(message.get("headers", ())))
        elif kind == "http.response.body":
            if not cycle.response_started or cycle.response_complete:
                raise RuntimeError(f"Unexpected ASGI message '{kind}' sent.")
            if self._write_paused:
                await self._wait_for_room()
                if cycle.disconnected:
                    return
            self._write_body(cycle, bytes(message.get("body", b"")),
                             bool(message.get("more_body", False)))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent.")

    async def _wait_for_room(self) -> None:
        waiter = self.loop.create_future()
        self._drain.append(waiter)
        await waiter

    # --- writing --------------------------------------------------------------------------------

    def _write_head(self, cycle: _Cycle, status: int, headers: list[Any],
                    flush: bool = True) -> None:
        """Make the response head; it is held for the first body bytes (one write for both)
        and, with ``flush``, written at the next loop iteration if none came by then."""
        cycle.response_started = True
        if cycle.more_body:
            # Answered before the whole body came: the connection is kept only when the rest
            # is small and announced (it is then read and dropped, see _complete); else the
            # head says close, so that no client reuses a connection that is about to close.
            left = self.reader.body_left
            if cycle.continue_due or left is None or left > _DISCARD_MAX:
                cycle.keep_alive = False
        if cycle.continue_due:
            cycle.continue_due = False  # answered without reading the body: no 100
        length: int | None = None
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status))]
        for name, value in headers:
            if type(name) is not bytes:  # ASGI allows any bytes-like
                name = bytes(name)
            if type(value) is not bytes:
                value = bytes(value)
            lower = name.lower()
            if not _valid_field(lower, value):
                raise RuntimeError(f"invalid response header {name[:40]!r}")
            if lower == b"content-length":
                length = int(value)
                continue  # written once, below
            if lower == b"transfer-encoding":
                continue  # the framing is chosen here
            if lower == b"connection":
                if b"close" in value.lower():
                    cycle.keep_alive = False
                continue
            parts += (name, b": ", value, b"\r\n")
        bodyless = status < 200 or status in _NO_BODY_STATUSES
        if length is not None and not bodyless:
            parts.append(b"content-length: %d\r\n" % length)
            cycle.left = length
        elif bodyless:
            cycle.left = 0
        elif cycle.scope["http_version"] == "1.1":
            parts.append(b"transfer-encoding: chunked\r\n")
            cycle.chunked = True
        else:
            cycle.closing = True
            cycle.keep_alive = False
        if cycle.head_only or bodyless:
            cycle.chunked = cycle.closing = False
            cycle.left = 0
        parts.append(self.ctx.date.line())
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        cycle.held = b"".join(parts)
        if flush:
            self.loop.call_soon(self._write_held, cycle)

    def _write_held(self, cycle: _Cycle) -> None:
        held, cycle.held = cycle.held, b""
        if held and self.transport is not None and not self.transport.is_closing():
            self.transport.write(held)

    def _write_body(self, cycle: _Cycle, data: bytes, more: bool) -> None:
        if cycle.head_only:
            out = b""
        elif cycle.chunked:
            out = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
            if not more:
                out += b"0\r\n\r\n"
        elif cycle.closing:
            out = data
        else:
            if len(data) > cycle.left:
                raise RuntimeError("Response content longer than Content-Length")
            cycle.left -= len(data)
            out = data
            if not more and cycle.left:
                cycle.keep_alive = False  # shorter than announced: the close tells the client
        if cycle.held:
            out, cycle.held = cycle.held + out, b""
        transport = self.transport
        if out and transport is not None:
            transport.write(out)
            if not cycle.head_only:
                cycle.sent += len(data)
        if not more:
            self._complete(cycle)

    def _complete(self, cycle: _Cycle) -> None:
        cycle.response_complete = True
        cycle.watch = None
        cycle.wake()
        if self.cycle is not cycle:
            return
        if not self.reader.complete:
            # Answered before the request body was wholly received (401, 404, 413 ...).
            if cycle.keep_alive and not self._shutting_down:
                # The head kept the connection: the announced rest is read and dropped
                # (_parse), for at most linger_s.
                cycle.body.clear()
                cycle.body_size = 0
                self._mark_answered()  # answered: the first to make room for a new one
                self._arm(self.limits.linger_s, self._body_timeout)
                if self._read_paused and self.transport is not None:
                    self._read_paused = False
                    self.transport.resume_reading()
            else:
                # The head said close: what the client still sends is discarded for a
                # bounded time (closing at once could reset the answer in flight).
                self._linger()
            return
        if not cycle.keep_alive or self._shutting_down:
            self._close()
            return
        self._next_request()

    def _next_request(self) -> None:
        """The connection waits for the next request (the response and request are done)."""
        self.cycle = None
        self._mark_idle()
        self.reader.next_request()
        self.reader.body_limit = self.ctx.body_limit()  # a live reload may have changed it
        self._arm(self.limits.keep_alive_timeout_s, self._idle_timeout)
        self._resume_reading()
        if self.reader.buffered:
            self.loop.call_soon(self._parse_next)

    def _mark_idle(self) -> None:
        """:meth:`ConnectionTable.idle`, inline: the newest idle connection, unless idle
        already (it keeps its place) or not counted (refused on connect)."""
        table = self.ctx.table
        if self in table.open and self not in table.fresh:
            if table.answered:  # the discarded rest of an answered body came
                table.answered.pop(self, None)
            table.resting.setdefault(self, next(table.turns))

    def _mark_answered(self) -> None:
        """:meth:`ConnectionTable.answered_early`: answered, it only waits to close (or for
        the rest of its body); the first to make room."""
        self.ctx.table.answered_early(self)

    def _parse_next(self) -> None:
        if self.cycle is None and not self._closed and not self._lingering:
            self._head_timed = True
            self._arm(self.limits.header_timeout_s, self._idle_timeout)
            self._parse()

    def _close(self) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            cycle = self.cycle
            if cycle is not None and cycle.held:
                self._write_held(cycle)
            self.transport.close()

    def _linger(self) -> None:
        """Shut the write side, discard input, close after ``linger_s`` (not extended)."""
        transport = self.transport
        self._lingering = True
        self._disarm()
        self._mark_answered()  # answered: the first to make room for a new connection
        if transport is None or transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and cycle.held:
            self._write_held(cycle)
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client reset the connection (ENOTCONN): it is gone
                transport.abort()
                return
            self._arm(self.limits.linger_s, transport.abort)
        else:
            transport.close()

    def _refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` (the app never sees this request), linger, then tell the hook."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app reading this body learns that it will not get the rest, and its answer
            # is dropped (receive: http.disconnect); REFUSED_EXTENSION tells it why.
            cycle.disconnected = True
            if not cycle.response_started:
                cycle.refused = refusal
            cycle.wake()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if cycle is None or not cycle.response_started:
                transport.write(refusal.response())
            self._linger()
        hook = self.ctx.on_refused
        if hook is not None:
            try:
                hook(refusal.status, refusal.code, refusal.message,
                     self.client[0] if self.client else None)
            except Exception:
                _log.exception("on_refused hook failed (%s %s)", refusal.status, refusal.code)

    # --- the fast paths (scope extensions) ------------------------------------------------

    def _sending(self) -> _Cycle | None:
        cycle = self.cycle
        if (cycle is None or not cycle.response_started or cycle.response_complete
                or cycle.head_only):
            return None
        return cycle

    def write_now(self, data: bytes) -> bool:
        """Write one chunk of the response body being sent, now, if possible
        (:data:`gateway.h1.asgi_io.WRITE_NOW_EXTENSION`).

        Returns:
            ``True`` when written (or dropped: the client is gone; nothing for ``b""``);
            ``False``, nothing changed, when not possible now (no body in progress, ``HEAD``,
            the client's socket buffer full, more than the ``Content-Length`` left).
        """
        cycle = self._sending()
        if cycle is None:
            return False
        if cycle.disconnected:
            return True
        if self._write_paused:
            return False
        if not data:
            return True
        if not cycle.chunked and not cycle.closing and len(data) > cycle.left:
            return False
        self._write_body(cycle, data, True)
        return True

    async def _write_body_chunk(self, data: bytes) -> bool:
        cycle = self._sending()
        if cycle is None:
            return False
        if self._write_paused and not cycle.disconnected:
            await self._wait_for_room()
        return self.write_now(data)

    def _open_chunk_writer(self) -> Callable[[bytes], bool] | None:
        cycle = self._sending()
        if cycle is None or not cycle.chunked or self.transport is None:
            return None
        transport_write = self.transport.write
        general = self.write_now

        def write(data: bytes) -> bool:
            if (cycle.disconnected or self._write_paused or cycle.held or not data
                    or cycle.response_complete):
                return general(data)
            transport_write(b"%x\r\n%b\r\n" % (len(data), data))
            cycle.sent += len(data)
            return True

        return write

    def _write_response(self, status: int, headers: list[Any], body: bytes) -> bool:
        """Send a whole response at once (:data:`gateway.h1.asgi_io.WRITE_RESPONSE_EXTENSION`):
        head and body in one write, no held head left to flush later.

        Returns:
            ``False``, nothing sent, when the response already started or the client is gone.

        Raises:
            RuntimeError: An invalid header, or a body longer than its ``Content-Length`` (as
                from ``send``).
        """
        cycle = self.cycle
        if cycle is None or cycle.response_started or cycle.disconnected:
            return False
        self._write_head(cycle, status, headers, flush=False)
        self._write_body(cycle, body, False)
        return True

    def _take_whole_body(self) -> bytes | None:
        cycle = self.cycle
        if (cycle is None or cycle.more_body or cycle.taken or cycle.disconnected
                or cycle.response_complete):
            return None
        cycle.taken = True
        body = cycle.body[0] if len(cycle.body) == 1 else b"".join(cycle.body)
        cycle.body.clear()
        cycle.body_size = 0
        return body

    def _lost_of(self) -> Callable[[], int | None]:
        """:data:`gateway.h1.asgi_io.LOST_EXTENSION`: :meth:`_Cycle.lost` of the request in
        progress (bound to it: a later pipelined request does not answer for it)."""
        cycle = self.cycle
        return cycle.lost if cycle is not None else _not_lost

    def _left_in_order_of(self) -> Callable[[], bool]:
        """:data:`gateway.h1.asgi_io.LEFT_IN_ORDER_EXTENSION`: :meth:`_Cycle.left_in_order` of
        the request in progress (bound to it, as :meth:`_lost_of`)."""
        cycle = self.cycle
        return cycle.left_in_order if cycle is not None else _not_left

    def _refused(self) -> tuple[int, str, int] | None:
        """:data:`gateway.h1.asgi_io.REFUSED_EXTENSION`: the server's own answer to the
        request in progress, ``(status, error code, body bytes)``, or ``None``."""
        cycle = self.cycle
        refusal = cycle.refused if cycle is not None else None
        if refusal is None:
            return None
        return refusal.status, refusal.code, len(refusal.body())

    def _watch_disconnect(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.disconnected:
            return None
        cycle.watch = callback

        def unwatch() -> None:
            cycle.watch = None

        return unwatch


_CR, _LF, _NUL, _COLON, _SP = 13, 10, 0, 58, 32


def _valid_field(name: bytes, value: bytes) -> bool:
    """A response header that cannot break the head: a non-empty name without CR, LF, colon or
    space, a value without CR, LF or NUL. Byte values (``int in bytes``) rather than one-byte
    strings: several times faster per test (no buffer set-up for the argument)."""
    return (bool(name) and _CR not in value and _LF not in value and _NUL not in value
            and _COLON not in name and _SP not in name and _CR not in name
            and _LF not in name)


def _status_phrase(status: int) -> str:
    return _reason(status).decode()

