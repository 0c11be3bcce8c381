"""The relay's upstream HTTP/1.1 client: a bounded keep-alive pool per replica origin.

Connections are opened through a :data:`~gateway.h1.dial.Dialer` (:mod:`gateway.h1.dial`:
resolved and connected by the egress policy's rules), then TLS for ``https://`` replicas with
the configured context. A connection returns to its origin's idle list only when its response
was read whole and the replica kept it open; idle connections close after ``keep_alive_s``
(below the backends' keep-alive). At most ``limit`` connections are open at once (idle ones of
other origins are closed to make room; ``0``: no limit). A request that asks for a ``fresh``
connection gets a new one that is closed after its response (the retry after a stale pooled
connection).

Errors: :class:`ConnectFailed`, :class:`ConnectTimedOut`, ``policy.EgressDenied`` (refused by
the egress policy), and from the exchange :class:`ConnectionClosed`, :class:`IncompleteBody`,
:class:`~gateway.h1.framing.ProtocolError`.

One connection (:class:`H1Connection`)
--------------------------------------

An asyncio protocol that reads responses.

The protocol parses the response head and decodes the body as bytes arrive
(:mod:`gateway.h1.framing`) and keeps the decoded body pieces in a list; :meth:`read` takes all
of them at once, joined, and awaits a future only when nothing is buffered (one future per
wait, not per piece; aiohttp's reader makes one per ``readany`` and re-enters the protocol
after every read). Backpressure: reading from the socket pauses while more than
:data:`HIGH_WATER` bytes wait for the relay and resumes once it took them.

A relayed stream need not wake its task per piece at all: :meth:`read_into` hands each decoded
piece, as it arrives, to a synchronous *sink* (the relay's writer to the client) from
``data_received`` itself, and wakes the task only when the sink declines a piece (the client's
socket is full, the end of the stream must be held) or the body ends. Per SSE event that saves a
future, a wake-up of the task and the resumption of its coroutine chain.

One exchange at a time (no pipelining): :meth:`send` writes a request, :meth:`read_head` and
:meth:`read` read its response. The connection may carry the next request only when the whole
body was read, the replica kept it open (``Connection``), and nothing followed the body
(:attr:`reusable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from gateway.h1.dial import Dialer
from gateway.h1.framing import (
    MAX_HEAD_BYTES,
    PLAIN_SIZE_LINE,
    ChunkedDecoder,
    Head,
    LengthDecoder,
    ProtocolError,
    parse_head,
)
from gateway.h1.transport import SocketTransport
from policy import EgressDenied

__all__ = [
    "HIGH_WATER",
    "AttemptObserver",
    "ConnectFailed",
    "ConnectTimedOut",
    "ConnectionClosed",
    "H1Connection",
    "IncompleteBody",
    "RelayClient",
    "Response",
    "Sink",
]


class ConnectFailed(Exception):
    """No TCP/TLS connection could be made.

    Attributes:
        certificate: The replica's TLS certificate failed verification.
    """

    def __init__(self, message: str, certificate: bool = False) -> None:
        super().__init__(message)
        self.certificate = certificate


class ConnectTimedOut(Exception):
    """The connection (TCP and TLS) was not made within ``connect_s``."""


class AttemptObserver(Protocol):
    """Told about every upstream attempt (telemetry's client spans).

    ``attempt_started`` may add headers (``traceparent``) and returns a token handed back to
    exactly one of ``attempt_answered`` (the response head arrived) or ``attempt_failed``.
    """

    def attempt_started(
        self, method: str, host: str, port: int, headers: dict[str, str]
    ) -> object: ...

    def attempt_answered(self, token: object, status: int) -> None: ...

    def attempt_failed(self, token: object, exc: BaseException) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class _Origin:
    """Where a replica URL's requests go. Compared and hashed by identity (a C hash: the pool's
    dictionaries look one up twice per request); :class:`RelayClient` makes one per distinct
    value, so equal origins share one idle list as before."""

    host: str
    port: int
    tls: bool
    prefix: str  # path prefix of the replica URL (no trailing slash)
    host_header: str

    @classmethod
    def of(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        header = shown if port == (443 if tls else 80) else f"{shown}:{port}"
        return cls(host, port, tls, parts.path.rstrip("/"), header)


class Response:
    """An upstream response whose head was read; the body is read with :meth:`read`.

    Attributes:
        status: The status code.
        headers: Lower-case name -> value.
        content_length: The declared body length, or ``None``.
        host: The replica's host (for messages; never the request content).
        port: Its port.
    """

    __slots__ = ("_client", "_conn", "_fresh", "_origin", "content_length", "headers", "host",
                 "port", "read", "read_into", "status")

    def __init__(self, client: RelayClient, conn: H1Connection, origin: _Origin, head: Head,
                 fresh: bool) -> None:
        self._client, self._conn, self._origin, self._fresh = client, conn, origin, fresh
        self.status = head.status
        self.headers = head.headers
        self.content_length = head.content_length if not head.chunked else None
        self.host, self.port = origin.host, origin.port
        self.read: Callable[[], Coroutine[Any, Any, bytes]] = conn.read
        """``await read()``: the body bytes received so far, ``b""`` at its end."""
        self.read_into: Callable[[Sink], Coroutine[Any, Any, bytes | None]] = conn.read_into
        """``await read_into(sink)``: body pieces handed to ``sink`` as they arrive
        (:meth:`~gateway.h1.client.H1Connection.read_into`)."""

    @property
    def complete(self) -> bool:
        """The whole body has been received (:meth:`read` never waits again)."""
        return self._conn.body_done

    def release(self) -> None:
        """Done with the response: the connection goes back to the pool if reusable."""
        self._client._release(self._origin, self._conn, self._fresh)

    def close(self) -> None:
        """Abandon the response: the connection is closed, never reused."""
        self._conn.finish()
        self._conn.abort()


class RelayClient:
    """The pooled upstream client of the relay (see module docstring).

    Args:
        dial: Opens TCP connections (:func:`resolver_dialer`).
        tls: ``ssl`` setting for ``https://`` replicas (``True``: system CAs, or a context).
        limit: Most connections open at once (in use and idle); ``0``: no limit.
        keep_alive_s: Idle time in seconds after which a pooled connection is closed.
        connect_s: Longest time in seconds for TCP and TLS connection set-up.
        observers: Told about every attempt (client spans).
    """

    def __init__(self, dial: Dialer, *, tls: ssl.SSLContext | bool, limit: int,
                 keep_alive_s: float, connect_s: float,
                 observers: Sequence[AttemptObserver] = ()) -> None:
        self._dial = dial
        self._tls = tls if isinstance(tls, ssl.SSLContext) else None
        self._limit = limit
        self._keep_alive_s = keep_alive_s
        self.connect_s = connect_s
        """Longest TCP and TLS set-up in seconds for the next connections (a live reload of
        ``timeouts.connect_s`` sets it)."""
        self._observers = tuple(observers)
        # Per origin, idle connections with the loop time each became idle, oldest first.
        self._idle: dict[_Origin, list[tuple[H1Connection, float]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._origins: dict[str, _Origin] = {}
        self._by_value: dict[tuple[str, int, bool, str, str], _Origin] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def open_connections(self) -> int:
        """Connections open now (in use and idle)."""
        return self._open

    def idle_connections(self) -> int:
        """Idle pooled connections now."""
        return sum(len(v) for v in self._idle.values())

    async def post(self, url: str, path: str, headers: dict[str, str], body: bytes, *,
                   fresh: bool = False,
                   on_slot: Callable[[], None] | None = None) -> Response:
        """Send ``POST url+path`` and return the response once its head arrived.

        Args:
            url: The replica's base URL (``http(s)://host[:port][/prefix]``).
            path: The request path (``/v1/...``).
            headers: Request headers (lower-case names; ``host`` and ``content-length`` are
                set here). Observers may add to it.
            body: The request body.
            fresh: Use a new connection and close it after the response.
            on_slot: Called once the request has its connection (an idle one, or room for a
                new one): until then it waits for one of the ``limit`` connections.

        Raises:
            ConnectFailed: TCP/TLS connection failed.
            ConnectTimedOut: Not connected within ``connect_s``.
            policy.EgressDenied: The egress policy refused the address.
            ConnectionClosed: The connection closed before the response head was read.
            ProtocolError: The response head is malformed.
            ValueError: A header contains CR, LF or NUL.
        """
        origin = self._origins.get(url)
        if origin is None:
            made = _Origin.of(url)
            key = (made.host, made.port, made.tls, made.prefix, made.host_header)
            origin = self._origins[url] = self._by_value.setdefault(key, made)
        observers = self._observers
        tokens = [(o, o.attempt_started("POST", origin.host, origin.port, headers))
                  for o in observers] if observers else ()  # none: no list per request
        conn: H1Connection | None = None
        try:
            request = _request_head(origin, path, headers, len(body))
            if len(body) <= _JOIN_MAX:
                request, body = request + body, b""  # one write, one send() for a small body
            # (a large body is written apart: a join would copy it)
            conn = self._idle_connection(origin, on_slot) if not fresh else None
            if conn is not None:
                conn.send(request, body)
            else:
                conn = await self._acquire(origin, fresh, on_slot, request, body)
            head = await conn.read_head()
        except BaseException as exc:
            if conn is not None:
                conn.finish()
                conn.abort()
            for observer, token in tokens:
                observer.attempt_failed(token, exc)
            raise
        for observer, token in tokens:
            observer.attempt_answered(token, head.status)
        return Response(self, conn, origin, head, fresh)

    async def close(self, wait_s: float = 1.0) -> None:
        """Close every idle connection and refuse new requests.

        Args:
            wait_s: Longest wait in seconds for the event loop to close the sockets.
        """
        self._closed = True
        closing = [conn for idle in self._idle.values() for conn, _ in idle]
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in list(self._idle.values()):
            for conn, _ in idle:
                conn.abort()
        self._idle.clear()
        if closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await asyncio.gather(*(conn.wait_closed() for conn in closing))

    # the pool -----------------------------------------------------------------------------

    def _idle_connection(self, origin: _Origin,
                         on_slot: Callable[[], None] | None) -> H1Connection | None:
        """A usable idle connection to ``origin`` (told to ``on_slot``), or ``None``; the
        unusable ones met on the way are closed. No wait: :meth:`_acquire`'s first step,
        taken without a coroutine when it finds one."""
        if self._closed:
            return None  # _acquire raises
        idle = self._idle.get(origin)
        while idle:
            conn, _ = idle.pop()  # the most recently used: least likely to be stale
            if conn.usable:
                if on_slot is not None:
                    on_slot()
                return conn
            conn.abort()  # closed, closing, or bytes arrived while idle: never reused
        return None

    async def _acquire(self, origin: _Origin, fresh: bool, on_slot: Callable[[], None] | None,
                       request: bytes, body: bytes) -> H1Connection:
        """A connection to ``origin`` (idle, or new once there is room) with ``request`` and
        ``body`` sent on it (:meth:`H1Connection.send`)."""
        while True:
            if self._closed:
                raise ConnectFailed("the upstream client is closed")
            if not fresh:
                conn = self._idle_connection(origin, on_slot)
                if conn is not None:
                    try:
                        conn.send(request, body)
                    except BaseException:
                        conn.finish()
                        conn.abort()
                        raise
                    return conn
            if self._limit <= 0 or self._open < self._limit:
                if on_slot is not None:
                    on_slot()
                return await self._connect(origin, request, body)
            closing = self._close_one_idle()
            if closing is not None:
                # Its slot is ours once it is closed (unless another request is faster): one
                # idle connection closed per request that needs room, not every idle one.
                await closing.wait_closed()
            else:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._wake_one()  # woken but leaving (cancelled): pass the slot on
                    raise
                finally:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)

    async def _connect(self, origin: _Origin, request: bytes, body: bytes) -> H1Connection:
        """A new connection to ``origin`` with ``request`` and ``body`` sent on it.

        On a plain TCP connection the request goes out on the socket as soon as it is
        connected, before asyncio's transport is made for it (which takes another turn of the
        event loop): in a burst of new streams each request then reaches the replica in the
        same step as its connect, not after every other request's connect and set-up. What the
        socket does not take at once (or an error it reports) is left to the transport.

        Raises:
            ConnectFailed, ConnectTimedOut, policy.EgressDenied: See :meth:`post`.
            ConnectionClosed: The connection closed before the request was written.
        """
        loop = asyncio.get_running_loop()
        self._open += 1
        conn = H1Connection(self._lost)
        sent = 0
        try:
            async with asyncio.timeout(self.connect_s):
                sock = await self._dial(origin.host, origin.port)
                try:
                    if not origin.tls:
                        sent = _send_at_once(sock, request)
                        conn.begin()  # the response may arrive before send() below
                        # Our own transport, made in this step (gateway.h1.transport).
                        SocketTransport(loop, sock, conn, prepared=sent >= 0).start()
                    else:
                        await loop.create_connection(
                            lambda: conn, sock=sock, ssl=self._ssl(),
                            server_hostname=origin.host.rstrip("."))
                except BaseException:
                    sock.close()
                    raise
        except EgressDenied:
            # The process guard's EgressBlocked is also an OSError (for the standard library's
            # clean-up): it stays a policy refusal (upstream_egress_denied), not ConnectFailed.
            self._not_opened(conn)
            raise
        except ssl.SSLCertVerificationError as exc:
            self._not_opened(conn)
            raise ConnectFailed(f"certificate verification failed: {exc}", True) from exc
        except TimeoutError as exc:
            self._not_opened(conn)
            raise ConnectTimedOut(f"not connected within {self.connect_s} s") from exc
        except OSError as exc:
            self._not_opened(conn)
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._not_opened(conn)
            raise
        try:
            conn.send(request[sent:] if sent > 0 else request, body, begun=not origin.tls)
        except BaseException:
            conn.finish()
            conn.abort()
            raise
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _not_opened(self, conn: H1Connection) -> None:
        conn.detach()
        conn.abort()
        self._open -= 1
        self._wake_one()

    def _lost(self, conn: H1Connection) -> None:
        self._open -= 1
        for origin, idle in self._idle.items():
            for i, (c, _) in enumerate(idle):
                if c is conn:
                    del idle[i]
                    if not idle:
                        del self._idle[origin]
                    break
            else:
                continue
            break
        self._wake_one()

    def _release(self, origin: _Origin, conn: H1Connection, fresh: bool) -> None:
        conn.finish()
        if fresh or self._closed or not conn.reusable:
            if conn.body_done:
                conn.close()
            else:
                conn.abort()
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._idle.setdefault(origin, []).append((conn, now))
        if self._sweep is None:
            self._sweep = loop.call_at(now + self._keep_alive_s, self._expire)
        self._wake_one()

    def _expire(self) -> None:
        """Close the connections idle for ``keep_alive_s``; run again when the next one is due.

        One timer for the pool instead of one per release (a timer handle made and cancelled
        per request): each connection still closes ``keep_alive_s`` after it became idle.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep = self._keep_alive_s
        due: float | None = None
        for origin, idle in list(self._idle.items()):
            while idle and idle[0][1] + keep <= now:
                conn, _ = idle.pop(0)
                conn.close()
            if idle:
                due = idle[0][1] if due is None else min(due, idle[0][1])
            else:
                del self._idle[origin]
        self._sweep = loop.call_at(due + keep, self._expire) if due is not None else None

    def _close_one_idle(self) -> H1Connection | None:
        """Close the longest idle connection of any origin (room for a new one); return it."""
        for idle in self._idle.values():
            if idle:
                conn, _ = idle.pop(0)
                conn.close()
                return conn
        return None

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


_JOIN_MAX = 64 * 1024
"""Largest body joined to the head for one write (bytes); a larger one is written apart."""


def _send_at_once(sock: socket.socket, data: bytes) -> int:
    """Write what a newly connected non-blocking socket takes of ``data`` now, with
    ``TCP_NODELAY`` set first (as asyncio's transport sets it); return its length in bytes, or
    -1 on any error (the transport then sets it up, writes it all and reports the error as it
    would have)."""
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock.send(data)
    except BlockingIOError:
        return 0  # set up; the socket takes nothing yet
    except OSError:
        return -1


def _request_head(origin: _Origin, path: str, headers: dict[str, str], length: int) -> bytes:
    """The request line and header section (``ValueError`` on CR/LF/NUL in a header)."""
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    # One search of the joined fields instead of five per header: each field adds exactly one
    # CR and one LF, so more means a name or value holds one (or a NUL), found by name below.
    if (fields.count("\r") != len(headers) or fields.count("\n") != len(headers)
            or "\0" in fields):
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\0" in value or "\r" in name or "\n" in name:
                raise ValueError(f"invalid character in header {name!r}")
    return (f"POST {origin.prefix}{path} HTTP/1.1\r\nhost: {origin.host_header}\r\n"
            f"{fields}content-length: {length}\r\n\r\n").encode("latin-1")


# --- One connection: the asyncio protocol that reads responses. ---------------------------

HIGH_WATER = 256 * 1024
"""Bytes buffered for the relay above which reading from the socket pauses."""


Sink = Callable[[bytes], bool]
"""``sink(piece) -> more``: called from ``data_received`` with each decoded body piece (bytes,
never empty), which it always consumes. ``True``: call again with the next piece; ``False``:
stop (the sink is removed and the reader woken; later pieces are buffered for it). An exception
raised by the sink fails the exchange (it is raised to the reader)."""


class ConnectionClosed(Exception):
    """The replica closed (or reset) the connection before the response head was read.

    Attributes:
        before_response: No byte of the response arrived (the typical stale keep-alive
            connection: the request may be sent again on a new connection).
    """

    def __init__(self, before_response: bool, detail: str = "") -> None:
        where = "before the response" if before_response else "inside the response head"
        super().__init__(f"connection closed {where}" + (f": {detail}" if detail else ""))
        self.before_response = before_response


class IncompleteBody(Exception):
    """The connection closed before the declared end of the body (length or last chunk)."""


class H1Connection(asyncio.Protocol):
    """The protocol of one upstream connection (see module docstring).

    Args:
        on_lost: Called once when the connection is lost (the pool's bookkeeping).
    """

    def __init__(self, on_lost: Callable[[H1Connection], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._on_lost = on_lost
        self._loop = asyncio.get_running_loop()
        self._active = False  # an exchange is in progress
        self._received = False  # a byte of the current response arrived
        self._head_buf: bytes | bytearray = b""  # a partial head (bytearray: grown in place)
        self._head_scan = 0  # where in _head_buf the search for its end resumes
        self._head: Head | None = None
        self._decoder: LengthDecoder | ChunkedDecoder | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._sink_error: Exception | None = None
        self._exc: BaseException | None = None
        self.body_done = False
        self.garbage = False
        self._poller: select.poll | None = None  # the socket, registered once (usable)
        self._lost: asyncio.Future[None] | None = None

    # asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        decoder = self._decoder
        sink = self._sink
        if (sink is not None and type(decoder) is ChunkedDecoder and not decoder._state
                and not decoder._buf):
            # The usual read of a relayed stream: exactly one whole chunk with a plain size
            # line. Decoded here, without the decoder's call and the piece list (the decoder
            # stays at the start of a size line, as its feed would leave it); the sink is set
            # only while nothing is buffered, so the piece goes to it at once.
            line = PLAIN_SIZE_LINE.match(data)
            if line is not None:
                start = line.end()
                stop = start + int(line[1], 16)
                if start < stop and stop + 2 == len(data) and data.endswith(b"\r\n"):
                    try:
                        if sink(data[start:stop]):
                            return  # consumed: the reader sleeps on
                    except Exception as exc:  # the relay's writer failed: the reader raises it
                        self._exc = self._sink_error = exc
                    self._sink = None
                    self._wake()
                    return
        if decoder is None:
            if not self._active:  # bytes while idle in the pool: not ours to read
                self.garbage = True
                self.abort()
                return
            self._received = True
            try:
                data = self._parse_head(data)
            except ProtocolError as exc:
                self._fail(exc)
                return
            decoder = self._decoder
            if decoder is None:  # head not complete yet
                return
            if not data:
                self._wake()
                return
        try:
            decoder.feed(data, self._chunks)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if decoder.done:
            self.body_done = True
            if decoder.extra:
                self.garbage = True  # a response is whole; bytes after it poison the connection
        sink = self._sink
        if sink is not None and not self.body_done:
            chunks = self._chunks
            if not chunks:
                return  # nothing decoded yet: the reader sleeps on
            piece = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            try:
                if sink(piece):
                    return  # consumed: the reader sleeps on
            except Exception as exc:  # the relay's writer failed: the reader raises it
                self._exc = self._sink_error = exc
            self._sink = None
            self._wake()
            return
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._active and not self.body_done and self._exc is None:
            if self._head is None:
                self._exc = ConnectionClosed(not self._received, str(exc or ""))
            elif isinstance(self._decoder, LengthDecoder) and self._decoder.remaining is None:
                self.body_done = True  # the close delimits the body
            else:
                self._exc = IncompleteBody("connection closed before the end of the body")
        self._wake()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._on_lost is not None:
            on_lost, self._on_lost = self._on_lost, None
            on_lost(self)

    # the exchange -------------------------------------------------------------------------

    def send(self, request: bytes, body: bytes = b"", *, begun: bool = False) -> None:
        """Start an exchange: write ``request`` (the head, or head and body), then ``body``.

        A large body is written as given, not joined to the head (a join would copy it);
        what the socket does not take at once the transport buffers (asyncio copies that
        remainder).

        Args:
            request: The request head (or head and body), or what is left of it to write.
            body: The body, written after ``request``.
            begun: :meth:`begin` was called already (part of the request went out before the
                transport was made); only the rest is written.

        Raises:
            ConnectionClosed: The connection was already closed (``before_response``).
        """
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionClosed(True, "found closed")
        if not begun:
            self.begin()
        if request:
            transport.write(request)
        if body:
            transport.write(body)

    def begin(self) -> None:
        """Start an exchange without writing: what arrives from now on is its response."""
        self._active = True
        self._received = False
        self._head_buf = b""
        self._head = None
        self._decoder = None
        self._chunks = []
        self._buffered = 0
        self._exc = self._sink_error = None
        self.body_done = False

    async def read_head(self) -> Head:
        """Wait for the response head (1xx interim responses skipped).

        Raises:
            ConnectionClosed: Closed before the head was complete.
            ProtocolError: The head is malformed or too large.
        """
        while self._head is None or self._decoder is None:
            if self._exc is not None:
                raise self._exc
            waiter = self._waiter = self._loop.create_future()  # inline: no coroutine per wait
            try:
                await waiter
            finally:
                self._waiter = None
        return self._head

    async def read(self) -> bytes:
        """Return every body byte received and not yet read; ``b""`` at the end of the body.

        Raises:
            IncompleteBody: The connection closed before the end of the body.
            ProtocolError: Malformed chunked framing.
        """
        while True:
            chunks = self._chunks
            if chunks:
                self._chunks = []
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self.body_done:
                return b""
            if self._exc is not None:
                raise self._exc
            waiter = self._waiter = self._loop.create_future()  # inline: no coroutine per wait
            try:
                await waiter
            finally:
                self._waiter = None

    async def read_into(self, sink: Sink) -> bytes | None:
        """Hand body pieces to ``sink`` as they arrive, until it stops or the body ends.

        Bytes already buffered are returned at once, without the sink. Otherwise the sink is
        called synchronously from ``data_received`` with each decoded piece (see :data:`Sink`)
        while this coroutine sleeps; the sink is removed again when it returns, however it
        returns (cancelled included).

        Returns:
            The body bytes buffered since the sink stopped, ``None`` when the sink stopped and
            nothing followed yet, or ``b""`` at the end of the body (also when the sink took
            the last piece).

        Raises:
            IncompleteBody: The connection closed before the end of the body.
            ProtocolError: Malformed chunked framing.
            Exception: What the sink raised.
        """
        if self._sink_error is None and not self._chunks and not self.body_done:
            if self._exc is not None:
                raise self._exc
            self._sink = sink
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
                stopped = self._sink is None
                self._sink = None
            if stopped and not self._chunks and not self.body_done and self._exc is None:
                return None
        if self._sink_error is not None:
            raise self._sink_error
        return await self.read()

    @property
    def reusable(self) -> bool:
        """The exchange ended cleanly and the connection may carry another request."""
        head = self._head
        return (head is not None and head.keep_alive and self.body_done and not self.garbage
                and not self.closed and not self._chunks and self._exc is None)

    @property
    def usable(self) -> bool:
        """Open, not closing and silent: an idle connection that may carry the next request.

        Silent means no byte (nor the replica's close) waits unread in the socket: an idle
        connection answers no request, so anything the replica sent since the last response
        (an unsolicited second response, a stray byte) would otherwise be read as the answer to
        the next request. ``data_received`` drops such a connection when the event loop gets to
        the bytes; this check covers the bytes that arrived but were not yet read (a busy loop
        releases and re-takes a connection in one pass). One ``poll(2)`` without waiting.
        """
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return False
        poller = self._poller
        if poller is None:
            sock = transport.get_extra_info("socket")
            if sock is None:
                return True
            poller = self._poller = select.poll()  # kept: the socket's lifetime is ours
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        if poller.poll(0):
            self.garbage = True
            return False
        return True

    def detach(self) -> None:
        """Forget the ``on_lost`` callback (a connection the pool never counted as open)."""
        self._on_lost = None

    def finish(self) -> None:
        """End the exchange (the connection goes idle, or is closed by the caller)."""
        self._active = False
        # Any byte from now on answers no request of ours: with no decoder, data_received
        # takes it for what it is (garbage on an idle connection) and drops the connection.
        self._decoder = None

    def close(self) -> None:
        """Close the connection gracefully (a finished exchange, an idle connection)."""
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Close the connection at once, unread data and all (cancelled or broken exchange)."""
        if self.transport is not None and not self.closed:
            self.transport.abort()

    async def wait_closed(self) -> None:
        """Return once the connection is lost (its socket closed by the event loop)."""
        if self.closed or self.transport is None:
            return
        if self._lost is None:
            self._lost = self._loop.create_future()
        await asyncio.shield(self._lost)

    # internals ----------------------------------------------------------------------------

    def _parse_head(self, data: bytes) -> bytes:
        """Consume head bytes; return the bytes after the head (body), once it is parsed.

        Linear in the bytes received however they are split: a partial head is extended in
        place and searched only where the terminator can newly be (a head sent one byte per
        segment must not be copied and rescanned whole for each byte), and interim responses
        are passed over by offset.
        """
        buf: bytes | bytearray = self._head_buf
        if buf:
            buf += data  # the bytearray kept below, in place
            scan = self._head_scan
        else:
            buf, scan = data, 0
        pos = 0
        while True:
            end = buf.find(b"\r\n\r\n", scan, pos + MAX_HEAD_BYTES)
            if end < 0:
                if len(buf) - pos >= MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                rest = buf if pos == 0 and isinstance(buf, bytearray) else bytearray(buf[pos:])
                self._head_buf = rest
                self._head_scan = max(0, len(rest) - 3)
                return b""
            head = parse_head(bytes(buf[pos:end + 4]))
            pos = scan = end + 4
            if head.status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols")
            if head.status >= 200:
                break  # 1xx: an interim response, the final one follows
        self._head_buf = b""
        body = bytes(buf[pos:]) if isinstance(buf, bytearray) else buf[pos:]
        self._head = head
        if head.chunked:
            self._decoder = ChunkedDecoder()
        else:
            self._decoder = LengthDecoder(head.content_length)
        if self._decoder.done:
            self.body_done = True
        return body

    def _fail(self, exc: BaseException) -> None:
        self._exc = exc
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
