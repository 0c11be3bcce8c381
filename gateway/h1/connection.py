"""One HTTP/1.1 client connection to a replica: an asyncio protocol that reads responses.

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
import select
from collections.abc import Callable

from gateway.h1.framing import (
    MAX_HEAD_BYTES,
    PLAIN_SIZE_LINE,
    ChunkedDecoder,
    Head,
    LengthDecoder,
    ProtocolError,
    parse_head,
)

__all__ = ["HIGH_WATER", "ConnectionClosed", "H1Connection", "IncompleteBody", "Sink"]

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

    def send(self, request: bytes, body: bytes = b"") -> None:
        """Start an exchange: write ``request`` (the head, or head and body), then ``body``.

        A large body is written as given, not joined to the head (a join would copy it);
        what the socket does not take at once the transport buffers (asyncio copies that
        remainder).

        Raises:
            ConnectionClosed: The connection was already closed (``before_response``).
        """
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionClosed(True, "found closed")
        self._active = True
        self._received = False
        self._head_buf = b""
        self._head = None
        self._decoder = None
        self._chunks = []
        self._buffered = 0
        self._exc = self._sink_error = None
        self.body_done = False
        transport.write(request)
        if body:
            transport.write(body)

    async def read_head(self) -> Head:
        """Wait for the response head (1xx interim responses skipped).

        Raises:
            ConnectionClosed: Closed before the head was complete.
            ProtocolError: The head is malformed or too large.
        """
        while self._head is None or self._decoder is None:
            if self._exc is not None:
                raise self._exc
            await self._wait()
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
        sock = transport.get_extra_info("socket")
        if sock is None:
            return True
        poller = select.poll()
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

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
