"""Small raw-ASGI helpers for the relay path: reading a bounded body, sending responses.

Also the app's framing check on the ASGI scope (:func:`scope_framing_problem`, the second layer
behind the server's parser check in :mod:`gateway.h1.server`) and its refusal messages.

ASGI HTTP message types: https://asgi.readthedocs.io/en/latest/specs/www.html
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from gateway.errors import GatewayError, PayloadTooLarge, RequestTimeout, error_body
from gateway.relay.rewrite import MAX_EVENT_BYTES

if TYPE_CHECKING:
    from gateway.relay.records import RequestRecord

__all__ = [
    "BODY_CHUNK_EXTENSION",
    "CHUNK_WRITER_EXTENSION",
    "DISCONNECT_EXTENSION",
    "LEFT_IN_ORDER_EXTENSION",
    "LOST_EXTENSION",
    "MAX_HELD_AFTER_END",
    "REFUSED_EXTENSION",
    "WHOLE_BODY_EXTENSION",
    "WRITE_NOW_EXTENSION",
    "WRITE_RESPONSE_EXTENSION",
    "ClientGone",
    "DisconnectWatch",
    "HeldEndTooLong",
    "Receive",
    "Responder",
    "Scope",
    "Send",
    "amend_undelivered",
    "answered_before_leaving",
    "delivered",
    "escaped_api_path",
    "framing_refusal",
    "lost_now",
    "read_body",
    "scope_framing_problem",
    "take_body",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

BODY_CHUNK_EXTENSION = "sovereign_gateway.body_chunk"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``await write(data) -> bool`` writes one non-empty chunk of a chunked response body without an
ASGI message (``False``: not possible now, use ``send``). The relay writes one per SSE event."""

DISCONNECT_EXTENSION = "sovereign_gateway.on_disconnect"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``watch(callback) -> unwatch | None`` has the server call ``callback()`` (once, from the event
loop) when the client's connection is lost before the response is complete, until
``unwatch()`` is called. ``None``: not possible now (no response in progress, or the client is
already gone): await ``receive()`` instead. It spares :class:`DisconnectWatch` a task and a
wake-up per request."""

LOST_EXTENSION = "sovereign_gateway.lost"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``lost_of() -> lost`` binds ``lost`` to the request in progress (a later pipelined request
does not answer for it); ``lost() -> int | None`` is ``None`` while its response can still
reach the client
(and when it is complete, or the server answered the request itself: :data:`REFUSED_EXTENSION`);
once the client's connection is lost before it completed, the
number of response body bytes the server had handed to the connection (what the client can
have received at most; later ``send`` calls are dropped). The relay and the MCP endpoint ask it
before they build a response's final audit record, and again after its durable wait: a
record never counts bytes that went nowhere (docs/audit.md "Durability")."""

LEFT_IN_ORDER_EXTENSION = "sovereign_gateway.left_in_order"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``left_of() -> left`` binds ``left`` to the request in progress; ``left() -> bool`` is ``True``
once the client closed its connection in order (a FIN: asyncio first flushes what the server
wrote), ``False`` while it is there or when it was lost to a reset (a client closing with bytes
of ours unread in its socket resets the connection: it did not read the whole answer).
:func:`answered_before_leaving` asks it."""

REFUSED_EXTENSION = "sovereign_gateway.refused"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``refused() -> (status, code, body bytes) | None``: the server answered the request in
progress itself before the app's response started (a chunk size over ``limits.max_body_bytes``:
413; the body timeout: 408), so ``receive()`` gave ``http.disconnect`` although the client is
still there; the app's own answer is dropped. ``None``: it did not."""

WHOLE_BODY_EXTENSION = "sovereign_gateway.whole_body"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``take() -> bytes | None`` returns the whole request body when all of it has arrived and none
of it was read yet, as ``receive()`` would return it in one ``http.request`` message (and it
is then read: a later ``receive()`` waits for the disconnect); ``None``: use ``receive()``.
It spares :func:`read_body` a wait, a timer and a message for the common small request."""


WRITE_NOW_EXTENSION = "sovereign_gateway.write_now"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``write_now(data) -> bool`` writes one chunk of the response body being sent synchronously, or
returns ``False`` with nothing changed when that is not possible now (no body in progress, the
client's socket buffer full: use :data:`BODY_CHUNK_EXTENSION` or ``send``, which wait).
``write_now(b"")`` only asks. The relay calls it from the upstream connection's callback
(:meth:`Responder.sink`), so a relayed SSE event wakes no task."""

WRITE_RESPONSE_EXTENSION = "sovereign_gateway.write_response"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``write(status, headers, body) -> bool`` sends a whole response (what ``http.response.start``
and one final ``http.response.body`` would send, checked the same way) at once, head and body
in one write, without holding the head back for a body that may come later; ``False``: not
possible now (the response started, the client is gone): send the messages.
:meth:`Responder.respond` uses it for a body the relay has whole."""

CHUNK_WRITER_EXTENSION = "sovereign_gateway.chunk_writer"
"""ASGI scope extension set by the gateway's own server (``gateway.h1.server``):
``open() -> write | None`` returns a writer bound to the response body being sent, whose
``write(data) -> bool`` does what the :data:`WRITE_NOW_EXTENSION` writer does (same arguments,
same result) with the checks that hold for the whole response (a body in progress, not
``HEAD``, chunked) done once by ``open`` rather than per call; ``None``: no such body now (use
the :data:`WRITE_NOW_EXTENSION` writer). :meth:`Responder.sink` writes with it."""
_OWS = b" \t"
_DONE = b"[DONE]"
_EVENT = b"event:"
# The event that ends an OpenAI stream: a ``data`` field line whose value starts with
# ``[DONE]`` (WHATWG SSE: one optional space after the colon; the OpenAI SDKs stop on
# ``data.startswith("[DONE]")``), or for the Responses API (``/v1/responses``, no ``[DONE]``) the
# ``event`` line of its last event (``response.completed``, ``.failed`` or ``.incomplete``, with
# the whole response and its usage). It starts a line (after CR or LF, or at the start of the
# body, see ``Responder._tail``): the same text inside a JSON payload (generated text) never
# does, since JSON escapes its line breaks.
_END_LINE = re.compile(
    rb"[\r\n](?:data: ?\[DONE\]|event: ?response\.(?:completed|failed|incomplete)[\r\n])")
_END_TAIL = len(b"\nevent: response.incomplete\n") - 1  # bytes kept: a line split across chunks
# The bytes a stream's body ends with once its ``data: [DONE]`` event went out whole (the
# blank line that dispatches it included): where the openai SDKs close the response.
_DONE_EVENT_END = re.compile(rb"[\r\n]data: ?\[DONE\][^\r\n]*(?:\r\n|\r|\n)(?:\r\n|\r|\n)\Z")
_DONE_EVENT_TAIL = 40  # bytes enough for that end (``\ndata: [DONE]\r\n\r\n`` is 18)


class Stamped(Protocol):
    """Anything with a settable ``last`` time (seconds on the event loop's clock, or None)."""

    last: float | None


MAX_HELD_AFTER_END = MAX_EVENT_BYTES + 64 * 1024
"""Most body bytes (in bytes) a held SSE stream may bring after the piece holding its end line:
the rest of the end event (a Responses API ``response.completed`` event carries the whole
answer: up to :data:`gateway.relay.rewrite.MAX_EVENT_BYTES`, the longest event the relay
inspects) and 64 KiB, not a second stream."""


def _loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time`` as the cheapest callable: :func:`time.monotonic` itself when the loop's
    ``time`` is asyncio's own (which returns it), saving a Python call per use."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class ClientGone(Exception):
    """The client disconnected before the request was complete."""


class HeldEndTooLong(Exception):
    """A held SSE stream went on past :data:`MAX_HELD_AFTER_END` bytes after its end line
    (a broken or hostile replica: held, it would grow without bound)."""


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")


def take_body(limit: int, declared: int | None,
              take_whole: Callable[[], bytes | None] | None) -> bytes | None:
    """The request body without waiting, when it has wholly arrived: :func:`read_body`'s
    first step (the same arguments and refusals).

    Returns:
        The body, or ``None`` when it must be read with :func:`read_body`.

    Raises:
        PayloadTooLarge: ``declared`` or the body exceed ``limit`` bytes.
    """
    if declared is not None and declared > limit:
        raise _too_large(limit)
    whole = take_whole() if take_whole is not None else None
    if whole is not None and len(whole) > limit:
        raise _too_large(limit)
    return whole


async def read_body(
    receive: Receive, limit: int, declared: int | None, idle_timeout_s: float | None = None,
    take_whole: Callable[[], bytes | None] | None = None,
) -> bytes:
    """Read the request body, refusing it as soon as it is known to exceed ``limit`` bytes.

    Args:
        receive: ASGI receive callable.
        limit: Maximum body size in bytes.
        declared: The ``content-length`` value, if the client sent one.
        idle_timeout_s: Longest wait in seconds for the next part of the body (``None``: none).
        take_whole: The server's :data:`WHOLE_BODY_EXTENSION`, if it offers one: a body that
            has wholly arrived is taken from it, without ``receive()``.

    Raises:
        PayloadTooLarge: ``declared`` or the bytes received so far exceed ``limit``.
        RequestTimeout: No part of the body arrived for ``idle_timeout_s``.
        ClientGone: The client disconnected.
    """
    whole = take_body(limit, declared, take_whole)
    if whole is not None:
        return whole
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            async with asyncio.timeout(idle_timeout_s):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(
                f"The request body was not received in time (no data for {idle_timeout_s:g} s)."
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body: bytes = message.get("body", b"")
        if body:
            total += len(body)
            if total > limit:
                raise _too_large(limit)
            chunks.append(body)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Responder:
    """Sends the response to the client and tracks what was sent.

    Args:
        send: ASGI send callable.
        request_id: Sent back as ``x-request-id``.
        on_start: Called with the header list just before the status line is sent (observer
            ``on_response_start`` hooks; may append headers).
        hold_end: Hold back the end of the response until :meth:`release`: the last chunk of
            a sized body, and for an SSE stream the event that ends it (``data: [DONE]``, or
            the Responses API's ``event: response.completed``) and all that follows (earlier
            events flow at once; an end line split across chunks is found too; more than
            :data:`MAX_HELD_AFTER_END` bytes after it raise :class:`HeldEndTooLong` from
            :meth:`body` or the sink). Used when an observer must record the request's
            completion before the client may see it complete.
        write_chunk: The server's body-chunk writer, if it offers one (the gateway's own
            server: :data:`BODY_CHUNK_EXTENSION`): body chunks that do not end
            the response go through it instead of an ASGI message.
        write_now: The server's synchronous body-chunk writer, if it offers one
            (:data:`WRITE_NOW_EXTENSION`): tried first for such chunks, and what
            :meth:`sink` writes with unless ``open_writer`` gives it a writer.
        open_writer: The server's :data:`CHUNK_WRITER_EXTENSION`, if it offers one: what
            :meth:`sink` writes with when it opens a writer (with ``write_now`` only).
        write_response: The server's :data:`WRITE_RESPONSE_EXTENSION`, if it offers one: what
            :meth:`respond` sends a whole response with.
    """

    __slots__ = (
        "_after_end", "_held", "_holding", "_last", "_named", "_on_start", "_open_writer",
        "_pending", "_prev", "_send", "_sse", "_tail", "_write_chunk", "_write_now",
        "_write_response", "bytes_out", "request_id", "started", "status", "tap",
    )

    def __init__(
        self,
        send: Send,
        request_id: str,
        *,
        on_start: Callable[[list[tuple[bytes, bytes]]], None] | None = None,
        hold_end: bool = False,
        write_chunk: Callable[[bytes], Awaitable[bool]] | None = None,
        write_now: Callable[[bytes], bool] | None = None,
        open_writer: Callable[[], Callable[[bytes], bool] | None] | None = None,
        write_response: Callable[[int, list[tuple[bytes, bytes]], bytes], bool] | None = None,
    ) -> None:
        self._send = send
        self._write_response = write_response
        self._write_chunk = write_chunk
        self._write_now = write_now
        self._open_writer = open_writer
        self.request_id = request_id.encode()
        self.started = False
        self.status = 0
        self.bytes_out = 0
        self.tap: Callable[[bytes], None] | None = None
        """Called with every body chunk before it is sent (content HMAC opt-in only)."""
        self._on_start = on_start
        self._held: list[Message] | None = [] if hold_end else None
        self._holding = False
        self._after_end = 0  # bytes held after the piece that started the hold
        self._sse = False
        # The last bytes of the SSE body so far (an end line split across chunks);
        # the body starts at a line start.
        self._tail = b"\n"
        self._named: bool | None = None  # the stream's events have event lines (first bytes)
        self._pending: list[bytes] = []  # what the sink could not write (see flush)
        # The last two body chunks given to send (see stream_ended): a line split across them.
        self._prev = self._last = b"\n"

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers (``x-request-id`` is added)."""
        self.started = True
        self.status = status
        headers.append((b"x-request-id", self.request_id))
        if self._on_start is not None:
            self._on_start(headers)
        if self._held is not None:
            self._sse = any(
                name == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in headers
            )
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Send a whole response: :meth:`start`, then ``body`` ending it, in one write when the
        server offers :data:`WRITE_RESPONSE_EXTENSION` and nothing is held (``hold_end``)."""
        write = self._write_response
        if write is None or self._held is not None or self._pending:
            await self.start(status, headers)
            await self.body(body, more=False)
            return
        self.started = True
        self.status = status
        headers.append((b"x-request-id", self.request_id))
        if self._on_start is not None:
            self._on_start(headers)
        self.bytes_out += len(body)
        if self.tap is not None and body:
            self.tap(body)
        if not write(status, headers, body):  # the client is gone: dropped as send() drops it
            await self._send({"type": "http.response.start", "status": status,
                              "headers": headers})
            await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _ends_stream(self, data: bytes) -> bool:
        """Whether ``data``, the next bytes of a held SSE body, completes the line that ends
        the stream (``data: [DONE]``, or a Responses API ``event: response.completed``; also
        when it is split across chunks); the same text elsewhere (inside an event's JSON:
        generated content) does not."""
        probe = self._tail + data
        self._tail = probe[-_END_TAIL:]
        named = self._named
        if named is None and len(probe) > len(_EVENT):
            # A stream of named events (the Responses API) says so from its first event; a
            # chat stream has no event lines, and its events are not searched for one.
            named = self._named = probe.find(_EVENT) >= 0
        # The substring tests first: a fifth of the regex's cost on the usual chat event (find,
        # not ``in``: see gateway.relay.rewrite's feed).
        return ((probe.find(_DONE) >= 0 or (named is True and probe.find(_EVENT) >= 0))
                and _END_LINE.search(probe) is not None)

    async def body(self, data: bytes, more: bool = True) -> None:
        """Send body bytes (``more=False`` ends the response)."""
        if self._pending:
            await self.flush()
        if self._holding and more:
            self._hold_more(len(data))
        self.bytes_out += len(data)
        if data:
            self._prev, self._last = self._last, data
            if self.tap is not None:
                self.tap(data)
        held = self._held
        ending = held is not None and self._sse and self._ends_stream(data)
        if more and data and (held is None or (self._sse and not self._holding and not ending)):
            write_now = self._write_now
            if write_now is not None and write_now(data):
                return
            if self._write_chunk is not None and await self._write_chunk(data):
                return
        message = {"type": "http.response.body", "body": data, "more_body": more}
        if held is not None:
            if self._holding or not more or ending:
                self._holding = True
                held.append(message)
                return
            if not self._sse:
                # A sized body: keep its newest chunk back, so the last bytes of the
                # Content-Length go out only on release.
                if held:
                    await self._send(held.pop())
                held.append(message)
                return
        await self._send(message)

    def sink(
        self, feed: Callable[[bytes], bytes], stamp: Stamped | None = None
    ) -> Callable[[bytes], bool] | None:
        """A synchronous writer of a streamed SSE body (:data:`gateway.h1.client.Sink`).

        The returned ``take(piece) -> more`` runs ``feed(piece)`` (the relay's SSE scanner:
        upstream bytes in, client bytes out), sets ``stamp.last`` to the event loop's clock,
        and writes the result with the server's :data:`WRITE_NOW_EXTENSION` writer as
        :meth:`body` would, held end included (a held ``[DONE]`` is kept for :meth:`release`);
        with the writer :data:`CHUNK_WRITER_EXTENSION` opens for this response when it offers
        one (the same result, the per-response checks done once, here).
        When the server cannot take the write now (the client's socket buffer is full), the
        bytes are kept for :meth:`flush` and ``take`` returns ``False``: the caller stops
        calling it and awaits :meth:`flush`, which waits for room.

        Args:
            feed: Upstream piece -> the bytes to send (possibly empty).
            stamp: Gets ``last = loop.time()`` after each piece (the relay's idle deadline).

        Returns:
            ``take``, or ``None`` when the server offers no synchronous writer, the response
            has not started, or it is a held body that is not an SSE stream.
        """
        write_now = self._write_now
        if write_now is None or not self.started or (self._held is not None and not self._sse):
            return None
        if self._open_writer is not None:
            write_now = self._open_writer() or write_now
        clock = _loop_clock(asyncio.get_running_loop())
        pending = self._pending

        def take(piece: bytes) -> bool:
            data = feed(piece)
            if stamp is not None:
                stamp.last = clock()
            if not data:
                return True
            if self._holding:
                self._hold_more(len(data))
            self.bytes_out += len(data)
            self._prev, self._last = self._last, data
            if self.tap is not None:
                self.tap(data)
            held = self._held
            if held is not None and (self._holding or self._ends_stream(data)):
                self._holding = True
                held.append({"type": "http.response.body", "body": data, "more_body": True})
                return True
            if not pending and write_now(data):
                return True
            pending.append(data)
            return False

        return take

    def _hold_more(self, size: int) -> None:
        """Count ``size`` more body bytes to hold for :meth:`release`, before they are counted
        as sent (the piece that started the hold is not counted: the reader bounds it, and it
        carries the events before the end).

        Raises:
            HeldEndTooLong: More than :data:`MAX_HELD_AFTER_END` bytes after that piece (the
                bytes are not held; the caller ends the response).
        """
        self._after_end += size
        if self._after_end > MAX_HELD_AFTER_END:
            raise HeldEndTooLong(
                f"more than {MAX_HELD_AFTER_END} bytes after the end of the stream")

    def stream_ended(self) -> bool:
        """Whether the body given to send so far ends with a whole ``data: [DONE]`` event (its
        dispatching blank line included) and nothing of it waits here (held for
        :meth:`release`, or kept by the sink for :meth:`flush`): all of an OpenAI-style stream
        a client waits for. The openai SDKs close the response at that event, before the
        chunked body's last chunk (openai-python 3.x ``Stream.__stream__``)."""
        if self._holding or self._pending:
            return False
        return _DONE_EVENT_END.search(
            (self._prev[-_DONE_EVENT_TAIL:] + self._last)[-_DONE_EVENT_TAIL:]) is not None

    @property
    def pending(self) -> bool:
        """Whether the sink kept bytes that :meth:`flush` must send."""
        return bool(self._pending)

    async def flush(self) -> None:
        """Send the bytes the sink could not write (waiting for room in the client's socket),
        in order, before anything else is sent.

        Bytes are dropped from the pending list only once written: a flush cancelled while it
        waits for room (the drain deadline) leaves them for the next send, in front of the
        final event (both writers wait before they write, never after).
        """
        pending = self._pending
        while pending:
            data = pending[0]
            if self._write_chunk is None or not await self._write_chunk(data):
                await self._send({"type": "http.response.body", "body": data, "more_body": True})
            del pending[0]

    async def release(self, send_end: bool) -> None:
        """Send what ``hold_end`` held back, or (``send_end=False``) drop it for good.

        Without the end, the server closes the connection and the client sees an incomplete
        response.
        """
        held, self._held = self._held, None
        if held and send_end:
            for message in held:
                await self._send(message)

    async def error(self, exc: GatewayError) -> None:
        """Send ``exc`` as a complete OpenAI-style JSON error response."""
        payload = error_body(exc)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        headers.extend((k.encode(), v.encode()) for k, v in exc.headers.items())
        await self.start(exc.status, headers)
        await self.body(payload, more=False)


class DisconnectWatch:
    """Cancels the handler task when the client disconnects (streaming or not).

    uvicorn's ``send`` silently drops data for a gone client, so disconnects are only seen by
    ``receive()``, or by the server itself. Under the gateway's own server the watch asks the
    server to call it back when the connection is lost (:data:`DISCONNECT_EXTENSION`: no task,
    no wake-up per request); otherwise it awaits ``receive()`` in a side task once the body has
    been read. Either way it cancels the handler, which closes the upstream connection (vLLM
    then aborts the request).

    Usage: ``watch.start()`` after reading the body; ``watch.finish()`` before the last send;
    after catching ``CancelledError`` check ``watch.fired`` (and the handler calls
    ``uncancel``).

    Args:
        receive: The request's ASGI receive callable.
        on_disconnect: The server's :data:`DISCONNECT_EXTENSION`, when it offers one.
    """

    __slots__ = ("_done", "_on_disconnect", "_receive", "_task", "_unwatch", "_watcher", "fired")

    def __init__(
        self,
        receive: Receive,
        on_disconnect: Callable[[Callable[[], None]], Callable[[], None] | None] | None = None,
    ) -> None:
        self._receive = receive
        self._on_disconnect = on_disconnect
        self._unwatch: Callable[[], None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._done = False
        self.fired = False

    def start(self) -> None:
        """Begin watching (call from the handler task)."""
        self._task = asyncio.current_task()
        on_disconnect, self._on_disconnect = self._on_disconnect, None
        if on_disconnect is not None:
            self._unwatch = on_disconnect(self._fire)
            if self._unwatch is not None:
                return
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        self._fire()

    def _fire(self) -> None:
        if not self._done and self._task is not None:
            self.fired = True
            self._task.cancel()

    def finish(self) -> None:
        """Stop watching: the response is complete (or about to be)."""
        self._done = True
        watcher, self._watcher, self._task = self._watcher, None, None
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()  # the server drops its reference to this watch
        # Dropping both references matters: the cancelled watcher keeps its CancelledError, whose
        # traceback holds the ``_watch`` frame and so this object; a reference back to the task
        # would make a cycle per request that only a (stop-the-world) GC collection frees.
        if watcher is not None and not watcher.done():
            watcher.cancel()


def scope_framing_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The framing check on ASGI scope headers (second layer, for any ASGI server).

    Servers merge or unfold some cases before the application sees them, so this catches less
    than :func:`framing_problem` on the raw head; it does catch ``Content-Length`` together with
    ``Transfer-Encoding`` under plain uvicorn h11, which serves a smuggled request otherwise.

    Args:
        headers: ASGI ``scope["headers"]`` (lower-case names).
    """
    lengths = encodings = 0
    for name, value in headers:
        if name == b"content-length":
            lengths += 1
        elif name == b"transfer-encoding":
            encodings += 1
            if value.strip(_OWS).lower() != b"chunked":
                return "Transfer-Encoding other than a single 'chunked' is not supported"
    if lengths and encodings:
        return "both Content-Length and Transfer-Encoding are present"
    if lengths > 1 or encodings > 1:
        return "repeated Content-Length or Transfer-Encoding header"
    return None


API_PREFIX = "/v1/"
_MODEL_ITEM_PREFIX = b"/v1/models/"


def escaped_api_path(scope: Scope) -> bool:
    """Whether an API request (its decoded path under ``/v1/``) spelled its route with
    percent-escapes: ``/v1/mode%6cs``, ``/v1%2Fmodels``, ``/v1%2Fchat/completions``. The one
    rule for every API route (the relay paths and ``/v1/models``): the route is spelled
    literally, else the request is not found (404); only a model id after a literal
    ``/v1/models/`` may carry escapes (the OpenAI SDKs send ``meta-llama%2FLlama-3.1-8B``).
    A proxy in front that matches the literal path would otherwise be bypassed, since the
    server decodes the path."""
    raw = scope.get("raw_path") or b""
    # 37 is b"%": a byte value tests faster than a one-byte string (no buffer for it).
    return (37 in raw and scope["path"].startswith(API_PREFIX)
            and not raw.startswith(_MODEL_ITEM_PREFIX))


def framing_refusal(problem: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """ASGI messages of the 400 ``invalid_framing`` answer (``Connection: close``)."""
    body = json.dumps(
        {"error": {"message": f"Invalid HTTP request framing: {problem}.",
                   "type": "invalid_request_error", "param": None, "code": "invalid_framing"}},
        separators=(",", ":"),
    ).encode()
    start = {
        "type": "http.response.start",
        "status": 400,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


# What a response's final audit record may say the client got (docs/audit.md "What the client
# got"), asked of this server's LOST_EXTENSION and REFUSED_EXTENSION: ``delivered`` just before
# the final record is built, ``amend_undelivered`` after that record's durable wait and the
# release of the response's end, when the client may have left in between. Under another ASGI
# server neither extension exists and the responder's count stands. (Here, not in a module of
# their own: they run on every request, and the request path is bounded in modules.)

_log = logging.getLogger(__name__)


def lost_now(extensions: Mapping[str, Any]) -> int | None:
    """The server's ``LOST_EXTENSION`` asked now, for the request in progress: ``None`` when
    its response can still reach the client (or the server offers no such extension), else
    the body bytes handed to the client's connection before it was lost."""
    lost_of = extensions.get(LOST_EXTENSION)
    return lost_of()() if lost_of is not None else None


def answered_before_leaving(out: Responder, extensions: Mapping[str, Any]) -> bool:
    """Whether a client that left mid-forward had the whole answer: the body handed to its
    connection (all of it, under a server offering ``LOST_EXTENSION``; under another ASGI
    server what ``out`` sent) ends its SSE stream (:meth:`Responder.stream_ended`), and (under
    such a server) the client closed in order (``LEFT_IN_ORDER_EXTENSION``), not with a reset,
    which a client closing with the answer unread sends. The openai SDKs close the connection
    at ``[DONE]``, before the replica's end of the body reaches the gateway.
    """
    if not out.stream_ended():
        return False
    gone = lost_now(extensions)
    if gone is None:
        return True
    left_of = extensions.get(LEFT_IN_ORDER_EXTENSION)
    return gone >= out.bytes_out and left_of is not None and left_of()()


def delivered(record: RequestRecord, out: Responder,
              extensions: Mapping[str, Any]) -> tuple[int, int]:
    """The status and the body bytes the final record states.

    Args:
        record: The request; its outcome becomes ``client_disconnect`` when the client is
            gone and it was ``ok`` (or still ``pending``), unless the whole body reached its
            connection and ended the stream (:func:`answered_before_leaving`); another
            failure is kept.
        out: The responder (its status and the bytes it sent or holds for the end).
        extensions: The request's ``scope["extensions"]``.

    Returns:
        ``(status, bytes)``: the server's own answer when it refused the request; the body
        bytes handed to the client's connection when that is lost; else what ``out`` sent
        and holds (the held end goes out right after the record is durable).
    """
    refused_of = extensions.get(REFUSED_EXTENSION)
    refused = refused_of() if refused_of is not None else None
    if refused is not None:
        return refused[0], refused[2]
    gone = lost_now(extensions)
    if gone is None or answered_before_leaving(out, extensions):
        return out.status, out.bytes_out  # reachable, or all of it reached the client
    if record.outcome in ("ok", "pending"):
        record.ended("client_disconnect")
    return out.status, min(gone, out.bytes_out)


async def amend_undelivered(
    hooks: tuple[Callable[[RequestRecord, int], Awaitable[None]], ...], record: RequestRecord,
    extensions: Mapping[str, Any],
) -> None:
    """After the final record's durable wait and the release of the end: when the client left
    in between (``LOST_EXTENSION`` now reports fewer bytes than ``record.bytes_out``), tell
    every ``on_undelivered`` hook the bytes it did get (the audit log appends
    ``request.undelivered``: the chain is append-only). A hook that raises is logged.

    Args:
        hooks: The observers' ``on_undelivered`` hooks.
        record: The request as its final record stated it.
        extensions: The request's ``scope["extensions"]``.
    """
    gone = lost_now(extensions)
    if gone is None or gone >= record.bytes_out:
        return
    for hook in hooks:
        try:
            await hook(record, gone)
        except Exception:
            _log.exception("observer on_undelivered failed (request %s)", record.request_id)
