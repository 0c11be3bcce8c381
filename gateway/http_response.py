"""Writing responses on the client-facing HTTP/1.1 server: the per-chunk fast paths.

uvicorn's h11 protocol hands every response event to h11, which runs its event processing for
each body chunk and returns the response head as bytes of its own. Relayed SSE streams send one
body chunk per token, so this module writes responses with fewer steps, byte for byte what h11
writes:

* the response head is held and leaves in one write with the first body bytes (one ``send``
  system call and one wake-up of the client instead of two), or on the next loop iteration
  should no body bytes follow in this one;
* a body chunk is framed without h11's state machine (RFC 9112 §7.1 chunked framing, or the
  data counted against ``Content-Length``), both through ASGI ``send`` and through the
  :data:`gateway.asgi_io.BODY_CHUNK_EXTENSION` callable, which also skips uvicorn's message
  handling, and synchronously through the :data:`gateway.asgi_io.WRITE_NOW_EXTENSION` callable,
  which the relay calls from the upstream connection's ``data_received`` (no task wake-up per
  relayed event).

:class:`ResponseConnection` is the h11 connection and :class:`ResponseWritingProtocol` the
uvicorn protocol that write this way; :class:`gateway.http_guard.GuardedH11Protocol` (the server
``gateway serve`` runs) extends both. Everything a response touches per body chunk is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h11
from h11._writers import ChunkedWriter, ContentLengthWriter
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.http_short_paths import end_of_message, response_head

__all__ = ["ResponseConnection", "ResponseWritingProtocol"]


class ResponseConnection(h11.Connection):
    """h11's server connection with the response head held for the first body bytes and a
    short path for one body chunk (h11's private writer state: h11 is pinned in pyproject.toml).
    """

    held_head: bytes = b""
    """The response head not written yet: it goes out with the first body bytes."""
    on_hold: Callable[[], None] | None = None
    """Called when a response head is held (the protocol schedules :meth:`take_head`'s
    write for the next loop iteration, in case no body bytes follow in this one)."""

    def send(self, event: Any) -> bytes | None:  # type: ignore[override]
        """h11's ``send``, with the response head held for the first body bytes, and a short
        path for one body chunk of a response.

        Head: the status line and headers are returned together with the bytes of the next
        event (the first body chunk, or the end of the message), so the head and the start of
        the body leave in one write (one ``send`` system call and one wake-up of the client
        instead of two). For ``Response`` itself an empty result is returned (uvicorn's write
        of it is then a no-op) and :attr:`on_hold` is called.

        Body chunk: a ``Data`` event while the response body is being sent changes no state of
        h11's machine (``SEND_BODY`` -> ``SEND_BODY``); h11 would still run its event
        processing (five calls) to find that out. Relayed SSE streams send one such event per
        token, so the chunk is framed here (:meth:`chunk`), byte for byte what h11's writer
        writes.

        Head and end of a plain response (keep-alive, ``Content-Length`` or chunked): written
        by :func:`gateway.http_short_paths.response_head` and
        :func:`~gateway.http_short_paths.end_of_message`, byte for byte and state for state
        what h11 does; every other event goes through h11.
        """
        kind = type(event)
        if kind is h11.Data:
            out = self.chunk(event.data)
        elif kind is h11.Response:
            out = response_head(self, event)
            if out is not None:
                return self._hold(out)
        elif kind is h11.EndOfMessage:
            out = end_of_message(self, event)
            if out is not None and self.held_head:
                out, self.held_head = self.held_head + out, b""
        else:
            out = None
        if out is None:
            sent = super().send(event)
            if sent is None:  # ConnectionClosed: a held head has nowhere to go
                self.held_head = b""
                return None
            if kind is h11.Response:
                return self._hold(sent)
            out = sent
            if self.held_head:
                out, self.held_head = self.held_head + out, b""
        return out

    def _hold(self, head: bytes) -> bytes:
        self.held_head = head
        if self.on_hold is not None:
            self.on_hold()
        return b""

    def chunk(self, data: bytes) -> bytes | None:
        """The bytes of one body chunk of the response now being sent (a held head in front).

        The same bytes :meth:`send` returns for ``Data(data)``, without h11's event processing:
        for a chunked response RFC 9112 §7.1 framing (size in hex, CRLF, data, CRLF; nothing
        for empty data), as h11's ``ChunkedWriter``; for a ``Content-Length`` response the
        data itself, counted against the length left, as h11's ``ContentLengthWriter``.
        ``None`` when the event must go through h11: no response body being sent (not
        started, ended, HTTP/1.0 close-delimited), or more data than the length left (h11
        then raises and marks the connection failed).
        """
        if self._cstate.states[self.our_role] is not h11.SEND_BODY:
            return None
        writer = self._writer
        kind = type(writer)
        if kind is ChunkedWriter:
            out: bytes = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        elif kind is ContentLengthWriter and len(data) <= writer._length:  # type: ignore[union-attr]
            writer._length -= len(data)  # type: ignore[union-attr]
            out = data
        else:
            return None
        if self.held_head:
            out, self.held_head = self.held_head + out, b""
        return out

    def take_head(self) -> bytes:
        """The held response head (empty when it went out with body bytes), now released."""
        head, self.held_head = self.held_head, b""
        return head


class ResponseWritingProtocol(H11Protocol):
    """uvicorn's h11 protocol writing responses through a :class:`ResponseConnection`.

    Attributes:
        connection_class: The h11 connection class made per client connection (a subclass
            may read requests its own way too).
    """

    connection_class: type[ResponseConnection] = ResponseConnection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn: ResponseConnection = self.connection_class(
            h11.SERVER, self.conn._max_incomplete_event_size
        )
        self.conn.on_hold = self._schedule_head_write

    async def _write_body_chunk(self, data: bytes) -> bool:
        """Write one non-empty chunk of the response body being sent, as uvicorn's ``send``
        would for ``{"type": "http.response.body", "body": data, "more_body": True}`` (the
        :data:`gateway.asgi_io.BODY_CHUNK_EXTENSION` callable).

        Returns:
            ``False`` when the chunk cannot be written here (no response body in progress,
            a ``HEAD`` request, more data than the ``Content-Length`` left; the caller then
            uses ASGI ``send``); ``True`` when written, or dropped because the client is gone
            (as uvicorn drops it).
        """
        cycle = self._sending_body()
        if cycle is None:
            return False
        if self.flow.write_paused and not cycle.disconnected:
            await self.flow.drain()
        return self._write_body_chunk_now(data)

    def _sending_body(self) -> Any:
        """The request cycle whose response body is being sent (started, not complete, not a
        ``HEAD`` request), or ``None``."""
        cycle = self.cycle
        if (
            cycle is None or cycle.response_complete or not cycle.response_started
            or cycle.scope["method"] == "HEAD"
        ):
            return None
        return cycle

    def _write_body_chunk_now(self, data: bytes) -> bool:
        """Write one chunk of the response body being sent, synchronously, if that is possible
        now (the :data:`gateway.asgi_io.WRITE_NOW_EXTENSION` callable; the relay calls it from
        the upstream connection's ``data_received``, see :mod:`gateway.h1.connection`).

        Args:
            data: The chunk; ``b""`` only asks whether a write would be taken now.

        Returns:
            ``True`` when written (or dropped because the client is gone, as uvicorn drops
            it; nothing is written for ``b""``); ``False``, with nothing changed, when it cannot
            be written now: no response body in progress, a ``HEAD`` request, the client's
            socket buffer over its high-water mark (the caller awaits the asynchronous path,
            which waits for the drain), more data than the ``Content-Length`` left.
        """
        cycle = self._sending_body()
        if cycle is None:
            return False
        if cycle.disconnected:
            return True
        if self.flow.write_paused:
            return False
        if not data:
            return True
        out = self.conn.chunk(data)
        if out is None:
            return False
        self.transport.write(out)
        return True

    def _open_chunk_writer(self) -> Callable[[bytes], bool] | None:
        """A writer of the chunked response body being sent, bound to it (the
        :data:`gateway.asgi_io.CHUNK_WRITER_EXTENSION` callable).

        The returned ``write(data) -> bool`` is :meth:`_write_body_chunk_now` for this
        response, with what holds for the whole response (a body in progress, not ``HEAD``,
        the chunked transfer coding) checked here once; per call it reads the three states
        that change while a response is sent (the client gone or its socket over the
        high-water mark, the head still held) and the end of the response, and hands any of
        these cases and ``b""`` to :meth:`_write_body_chunk_now`. Otherwise it frames the
        chunk as :meth:`ResponseConnection.chunk` does (RFC 9112 §7.1) and writes it to the
        transport: a relayed SSE event costs one call here instead of four.

        Returns:
            ``write``, or ``None`` when no chunked body is being sent now (no response body in
            progress, a ``HEAD`` request, a ``Content-Length`` or HTTP/1.0 response).
        """
        cycle = self._sending_body()
        if cycle is None or type(self.conn._writer) is not ChunkedWriter:
            return None
        conn, flow = self.conn, self.flow
        transport_write = self.transport.write
        general = self._write_body_chunk_now

        def write(data: bytes) -> bool:
            if (cycle.disconnected or flow.write_paused or conn.held_head or not data
                    or cycle.response_complete):
                return general(data)
            transport_write(b"%x\r\n%b\r\n" % (len(data), data))
            return True

        return write

    def _schedule_head_write(self) -> None:
        # A response head waits for the body bytes sent in the same loop iteration (the relay
        # sends both in one step); should none come, it is written on the next iteration.
        self.loop.call_soon(self._write_held_head)

    def _write_held_head(self) -> None:
        head = self.conn.take_head()
        if head and not self.transport.is_closing():
            self.transport.write(head)
