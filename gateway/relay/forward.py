"""Forwarding one validated request to a replica, with retries, timeouts and stream relay.

Retry rule: another replica is tried only before any byte went to the client, and only after a
connect error or timeout, a 502/503, or a 429 (whose ``Retry-After`` keeps that replica out for
that long; with no other replica a short ``Retry-After`` is waited out). After the first byte, a
failure ends an SSE stream with a final ``data: {"error": ...}`` event; a JSON body is cut off.
Stale connections: when a pooled keep-alive connection turns out closed before any response
byte (the backend's keep-alive ran out while the request was on its way), the request is sent
again once to the same replica on a new, unpooled connection, and the replica is not ejected; a
second failure counts as usual. The pool keeps idle connections for
``timeouts.upstream_keep_alive_s``, below the backends' keep-alive, so this is rare.
Timeouts: ``first_byte_s`` until the first body byte, then ``idle_s`` between chunks (the
deadline is suspended while the gateway writes to a slow client; one timer per response checks
it, see :class:`_Deadline`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.errors import (
    GatewayError,
    NoHealthyReplica,
    UpstreamConnectError,
    UpstreamConnectionsExhausted,
    UpstreamConnectTimeout,
    UpstreamStatusError,
    UpstreamTimeout,
    sse_error_event,
)
from gateway.h1 import (
    ConnectFailed,
    ConnectionClosed,
    ConnectTimedOut,
    IncompleteBody,
    ProtocolError,
    Response,
)
from gateway.h1.asgi_io import HeldEndTooLong, Responder
from gateway.pii.response import ResponseMasker
from gateway.relay.exchange import Exchange
from gateway.relay.records import RequestRecord
from gateway.relay.retry_after import parse_retry_after, relayed_retry_after
from gateway.relay.rewrite import SSEUsageScanner, Usage, usage_from_body, usage_from_body_end
from gateway.relay.upstream import USER_AGENT, map_exception
from gateway.routing import Replica
from policy import REDIRECT_STATUSES, EgressDenied, redirect_refused

__all__ = ["USAGE_PATHS", "Exchange", "forward"]

_log = logging.getLogger(__name__)

# Endpoints whose streams carry usage only when stream_options.include_usage is set.
USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_RETRY_STATUSES = frozenset({429, 502, 503})
_MAX_USAGE_BODY = 1 << 20  # a JSON body kept whole for its usage up to this many bytes;
_USAGE_TAIL = 64 * 1024  # of a longer one, the end (usage follows the choices)
_SSE = b"text/event-stream"
_UPSTREAM_ERRORS = (ConnectFailed, ConnectTimedOut, ConnectionClosed, IncompleteBody,
                    ProtocolError, OSError, ValueError, EgressDenied, HeldEndTooLong)


class _Stale:
    """Marker result: the connection closed before the response began (stale keep-alive)."""


_STALE = _Stale()
_Result = GatewayError | _Stale | None


async def forward(ex: Exchange, first: Replica) -> None:
    """Try replicas, starting with ``first``, until one answers (rules in the module docstring).

    Raises:
        GatewayError: Nothing was sent to the client and no replica could serve the request.
    """
    state, pool, record = ex.state, ex.pool, ex.record
    settings = state.settings
    force_usage = record.path in USAGE_PATHS
    body = ex.parsed.upstream_body(pool.upstream_name, force_usage=force_usage)
    base_headers = _base_headers(ex)
    tried: list[Replica] = []
    replica: Replica | None = first
    last_error: GatewayError | None = None
    attempts = 0
    while replica is not None and attempts < settings.retries.max_attempts:
        attempts += 1
        if replica not in tried:
            tried.append(replica)
        record.attempt(replica.url, replica.destination, replica.region, attempts)
        headers = dict(base_headers)
        if replica.api_key:
            headers["authorization"] = f"Bearer {replica.api_key}"
        # One attempt on the replica (inline, not a coroutine of its own: one frame fewer per
        # request); a stale pooled connection is retried once on a fresh one.
        replica.outstanding += 1
        result: _Result
        try:
            if replica.kind == "litellm":
                result = await _litellm_attempt(ex, replica)
            else:
                result = await _attempt(ex, replica, body, headers, force_usage, fresh=False)
                if result is _STALE:
                    # The pooled connection was closed under us (the backend's keep-alive ran
                    # out): not the replica's fault. Same replica, new connection; a second
                    # failure counts.
                    _log.info("request %s: pooled connection to %s was closed; retrying on a "
                              "new one", record.request_id, replica.label)
                    result = await _attempt(ex, replica, body, headers, force_usage, fresh=True)
        except (UpstreamConnectError, UpstreamConnectTimeout) as exc:
            pool.eject(replica)
            result = exc
        finally:
            replica.outstanding -= 1
            if ex.hint is not None:
                ex.hint.release()
        if result is None:
            return
        assert not isinstance(result, _Stale)
        last_error = result
        replica = await _next_replica(ex, replica, tried, result)
    raise last_error or NoHealthyReplica(f"No replica of '{pool.model.name}' is available.")


def _base_headers(ex: Exchange) -> dict[str, str]:
    headers = {
        "content-type": "application/json",
        "accept": ex.accept,
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "x-request-id": ex.record.request_id,
    }
    headers.update(ex.forwarded)
    return headers


async def _next_replica(
    ex: Exchange, previous: Replica, tried: list[Replica], error: GatewayError
) -> Replica | None:
    """The replica for the next attempt, waiting out a short ``Retry-After`` if none is left."""
    replica = ex.pool.pick(ex.candidates, exclude=tried)
    if replica is None and isinstance(error, UpstreamStatusError) and error.status == 429:
        wait_s = parse_retry_after(error.headers.get("retry-after"))  # already relayed form
        if wait_s is not None and wait_s <= ex.state.settings.retries.max_retry_after_s:
            await asyncio.sleep(wait_s)
            return previous
    return replica


async def _litellm_attempt(ex: Exchange, replica: Replica) -> GatewayError | None:
    # Imported only when a litellm replica is configured; vLLM replicas never reach it.
    from gateway.relay.litellm_backend import attempt

    return await attempt(ex, replica)


@dataclass(slots=True)
class _Relay:
    """The state of one upstream attempt while its response is relayed."""

    ex: Exchange
    replica: Replica
    deadline: _Deadline
    phase: str = "first_byte"
    scanner: SSEUsageScanner | None = None
    complete: bool = False
    has_slot: bool = False  # the request got an upstream connection (else it waited for one)

    def at_boundary(self) -> bool:
        return self.scanner.at_boundary if self.scanner is not None else True

    def got_slot(self) -> None:
        self.has_slot = True


class _Deadline:
    """The one timer of an upstream attempt: first byte, then idle between chunks.

    An :class:`asyncio.Timeout` for the first byte plus a second timer for the idle deadline
    cost two scheduled handles per attempt (and a cancelled one in the loop's heap); here one
    handle serves both, armed once per attempt in the usual case (for the shorter of the two
    periods; one re-arm only for a first byte awaited longer than ``idle_s``). Until
    :meth:`idle` it expires ``first_byte_s`` after the attempt began.
    From :meth:`idle` on, the relay loop only stores the time of its last read (:attr:`last`;
    ``None`` while it writes to the client, which suspends the deadline), and the timer checks
    it when due: it re-arms itself for ``last + idle_s`` while chunks keep coming, and expires
    once ``idle_s`` passed without one (up to one loop iteration late, as a rescheduled
    ``Timeout`` would). Expiry cancels the attempt's task; leaving the ``with`` block turns that
    cancellation into :class:`TimeoutError`, exactly as :func:`asyncio.timeout` does (public
    ``Task.cancelling``/``uncancel``), and any other cancellation passes through.

    Args:
        first_byte_s: Longest wait in seconds for the response's first byte.
        idle_s: Longest wait in seconds for the next upstream chunk (after :meth:`idle`).

    Raises:
        RuntimeError: Made outside a task.
    """

    __slots__ = ("_cancelling", "_expired", "_first_due", "_handle", "_idle", "_idle_s", "_loop",
                 "_task", "_when", "clock", "last")

    def __init__(self, first_byte_s: float, idle_s: float) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("an upstream deadline needs a task")
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._idle = False
        self._idle_s = idle_s
        self.clock = loop.time
        self.last: float | None = None
        now = loop.time()
        self._first_due = now + first_byte_s
        # Armed for the earlier of the two periods: idle() (at least that long from now) then
        # never has to move it, and a first byte due later re-arms it once when it fires.
        self._when = now + min(first_byte_s, idle_s)
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._when, self._due)

    def __enter__(self) -> _Deadline:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        self.disarm()
        if self._expired:
            self._expired = False
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def idle(self) -> _Deadline:
        """From now on, expire ``idle_s`` after the last read (:attr:`last`, set to now)."""
        now = self.clock()
        self.last = now
        self._idle = True
        due = now + self._idle_s
        if self._handle is None or self._when > due:  # (armed at most idle_s from the start)
            self.disarm()
            self._arm(due)
        return self

    def disarm(self) -> None:
        """No deadline from now on (the body ended, or the relay was left)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, when: float) -> None:
        self._when = when
        self._handle = self._loop.call_at(when, self._due)

    def _due(self) -> None:
        self._handle = None
        if self._idle:
            last, now = self.last, self.clock()
            if last is None:  # writing to the client: check again a whole idle period later
                self._arm(now + self._idle_s)
                return
            if now - last < self._idle_s:
                self._arm(last + self._idle_s)
                return
        elif self._first_due > self._when:  # fired at idle_s: the first byte is due later
            self._arm(self._first_due)
            return
        self._expired = True
        self._task.cancel()  # the awaited read ends; __exit__ makes it a TimeoutError


async def _attempt(
    ex: Exchange,
    replica: Replica,
    body: bytes,
    headers: dict[str, str],
    drop_usage: bool,
    fresh: bool,
) -> _Result:
    """One upstream request and the relay of its response.

    Args:
        fresh: Use a new connection (the retry after a stale pooled one).

    Returns:
        ``None`` when done, the retryable error, or :data:`_STALE` when a pooled connection
        closed before the response began (only when ``fresh`` is false).

    Raises:
        UpstreamConnectError: Connection failed (the caller retries).
        UpstreamConnectTimeout: Connection not made in time (the caller retries).
        GatewayError: Any failure before the response started (sent as a status by the caller).
    """
    timeouts = ex.state.settings.timeouts
    resp: Response | None = None
    relay: _Relay | None = None
    try:
        with _Deadline(timeouts.first_byte_s, timeouts.idle_s) as deadline:
            relay = _Relay(ex, replica, deadline)
            try:
                resp = await ex.state.upstream.post(
                    replica.url, ex.record.path, headers, body, fresh=fresh,
                    on_slot=relay.got_slot)
                if ex.state.refuse_redirects and resp.status in REDIRECT_STATUSES:
                    raise redirect_refused(resp.host, resp.port, resp.status,
                                           resp.headers.get("location", ""))
                retry = _retryable_status(ex, replica, resp)
                if retry is not None:
                    relay.complete = True  # nothing more to read: the connection may be reused
                    return retry
                await _relay_response(relay, resp, drop_usage)
                return None
            except _UPSTREAM_ERRORS as exc:
                if resp is None and not fresh and _closed_before_response(exc):
                    return _STALE
                await _upstream_failed(relay, exc)
                return None
    except TimeoutError as exc:
        assert relay is not None
        await _timed_out(relay, exc)
        return None
    finally:
        if relay is not None:
            _account_stream(ex.record, relay.scanner)
        if resp is not None:
            if relay is not None and relay.complete:
                resp.release()
            else:
                resp.close()


def _closed_before_response(exc: BaseException) -> bool:
    """The connection was closed or reset before any response byte (typical of a stale one)."""
    return isinstance(exc, ConnectionClosed) and exc.before_response


def _retryable_status(
    ex: Exchange, replica: Replica, resp: Response
) -> UpstreamStatusError | None:
    """Eject the replica on 429/5xx; return the error for 429/502/503 (tried elsewhere)."""
    status = resp.status
    if status in _RETRY_STATUSES:
        retry_after = relayed_retry_after(resp.headers.get("retry-after"),
                                          ex.state.settings.retries.retry_after_cap_s)
        cool = float(retry_after) if status == 429 and retry_after is not None else None
        ex.pool.eject(replica, cool)
        relayed = {"retry-after": retry_after} if retry_after is not None else {}
        return UpstreamStatusError(
            f"The model backend answered {status}.", status=status, headers=relayed
        )
    if status >= 500:
        ex.pool.eject(replica)
    return None


def _client_headers(resp: Response, is_sse: bool, retry_after_cap_s: float
                    ) -> list[tuple[bytes, bytes]]:
    ctype = resp.headers.get("content-type", "")
    out_headers = [(b"content-type", ctype.encode("latin-1"))]
    raw_retry_after = resp.headers.get("retry-after")
    if raw_retry_after is not None:  # (a rare header: the usual response calls nothing here)
        retry_after = relayed_retry_after(raw_retry_after, retry_after_cap_s)
        if retry_after is not None:
            out_headers.append((b"retry-after", retry_after.encode()))
    for name in ("cache-control", "content-encoding"):
        value = resp.headers.get(name)
        if value is not None:
            out_headers.append((name.encode(), value.encode("latin-1")))
    if not is_sse and resp.content_length is not None:
        out_headers.append((b"content-length", str(resp.content_length).encode()))
    return out_headers


async def _relay_response(relay: _Relay, resp: Response, drop_usage: bool) -> None:
    """Relay status, headers and body to the client as they arrive."""
    ex = relay.ex
    record, parsed = ex.record, ex.parsed
    chunk = await resp.read()
    record.first_byte(round((time.perf_counter() - ex.t0) * 1000.0, 3))
    if ex.hint is not None:
        ex.hint.release()  # the replica's prefill of this prompt is over
    is_sse = resp.headers.get("content-type", "").encode("latin-1").startswith(_SSE)
    out_headers = _client_headers(resp, is_sse, ex.state.settings.retries.retry_after_cap_s)
    status = resp.status
    if is_sse:
        relay.phase = "stream"
        relay.scanner = SSEUsageScanner(
            drop_usage_only=drop_usage and parsed.stream and not parsed.client_wants_usage
        )
        await ex.out.start(status, out_headers)
        await _relay_sse(relay, resp, chunk, relay.scanner)
    elif ex.masker is not None:
        relay.phase = "body"
        await _relay_masked_body(relay, resp, chunk, status, out_headers, ex.masker)
    else:
        relay.phase = "body"
        await _relay_body(relay, resp, chunk, status, out_headers)
    record.ended("ok" if status < 400 else ("invalid" if status < 500 else "upstream_error"))


async def _relay_sse(
    relay: _Relay, resp: Response, chunk: bytes, scanner: SSEUsageScanner
) -> None:
    ex = relay.ex
    out = ex.out
    idle = relay.deadline.idle()
    clock = idle.clock
    feed: Callable[[bytes], bytes] = scanner.feed
    masked = ex.masker.stream() if ex.masker is not None else None
    if masked is not None:  # pii.responses: mask (gateway.pii.response): after the scanner
        feed = _then(scanner.feed, masked.feed)
    read = _sink_reader(resp, out, feed, idle)
    try:
        while chunk:
            data = feed(chunk)
            if data:
                idle.last = None  # no upstream deadline while writing to a slow client
                await out.body(data)
            idle.last = clock()
            chunk = await read()
    finally:
        idle.disarm()
    relay.complete = True
    tail = scanner.finish()
    if masked is not None:
        tail = masked.feed(tail) + masked.finish()
    _set_usage(ex.record, scanner.usage)
    ex.watch.finish()
    await out.body(tail, more=False)


def _then(first: Callable[[bytes], bytes],
          second: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """``second(first(piece))``."""
    def both(piece: bytes) -> bytes:
        return second(first(piece))
    return both


def _sink_reader(
    resp: Response, out: Responder, feed: Callable[[bytes], bytes], idle: _Deadline
) -> Callable[[], Awaitable[bytes]]:
    """The SSE relay's ``read``: with a synchronous writer to the client, each upstream piece
    is scanned and written from the upstream connection's callback (no task wake-up per
    event, :meth:`gateway.h1.client.H1Connection.read_into`); the call returns only the
    bytes that arrived while the client's socket was full (after sending what was held back
    for it), or ``b""`` at the end. Otherwise plain ``resp.read``."""
    take = out.sink(feed, idle)
    if take is None:
        return resp.read
    read_into, clock = resp.read_into, idle.clock

    async def flush() -> None:
        idle.last = None  # no upstream deadline while waiting for the client
        await out.flush()
        idle.last = clock()

    async def read() -> bytes:
        while True:
            try:
                data = await read_into(take)
            except Exception:
                if out.pending:  # what came before the failure, then its error event
                    await flush()
                raise
            if out.pending:
                await flush()
            if data is not None:
                return data

    return read


async def _relay_body(
    relay: _Relay, resp: Response, chunk: bytes, status: int,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Start the response and relay a (non-SSE) body, reading its usage."""
    ex = relay.ex
    out = ex.out
    read = resp.read
    if resp.complete:
        # The whole body came with the head (a small answer): no read will wait, so no idle
        # timer; the first-byte deadline is lifted (writing to the client is not bounded).
        relay.deadline.disarm()
        # ``chunk`` is then the whole body (the read before took every decoded byte): the
        # response is sent whole, head and body in one write (one pass through the responder
        # and the server instead of a start, a body chunk and an empty last one).
        relay.complete = True
        if status == 200:
            _set_usage(ex.record, usage_from_body(chunk) if len(chunk) <= _MAX_USAGE_BODY
                       else usage_from_body_end(chunk[-_USAGE_TAIL:]))
        ex.watch.finish()
        await out.respond(status, headers, chunk)
        return
    await out.start(status, headers)
    idle = relay.deadline.idle()
    keep = bytearray()  # the body up to _MAX_USAGE_BODY, then only its last _USAGE_TAIL bytes
    whole = True
    try:
        while chunk:
            keep += chunk
            if len(keep) > _MAX_USAGE_BODY:
                del keep[:len(keep) - _USAGE_TAIL]
                whole = False
            idle.last = None  # no upstream deadline while writing to a slow client
            await out.body(chunk)
            idle.last = idle.clock()
            chunk = await read()
    finally:
        idle.disarm()
    relay.complete = True
    if status == 200:
        body = bytes(keep)
        _set_usage(ex.record, usage_from_body(body) if whole else usage_from_body_end(body))
    ex.watch.finish()
    await out.body(b"", more=False)


async def _relay_masked_body(
    relay: _Relay, resp: Response, chunk: bytes, status: int,
    headers: list[tuple[bytes, bytes]], masker: ResponseMasker,
) -> None:
    """A non-streamed answer under ``pii.responses: mask``: read whole, masked, then sent
    with the masked body's ``Content-Length`` (the status line waits for the whole body)."""
    ex = relay.ex
    idle = None if resp.complete else relay.deadline.idle()
    parts = []
    try:
        while chunk:
            parts.append(chunk)
            if idle is not None:
                idle.last = idle.clock()
            chunk = await resp.read()
    finally:
        if idle is not None:
            idle.disarm()
    relay.deadline.disarm()
    relay.complete = True
    body = b"".join(parts)
    if status == 200:
        _set_usage(ex.record, usage_from_body(body))
        body = await masker.body(body)
    headers = [(k, v) for k, v in headers if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await ex.out.start(status, headers)
    ex.watch.finish()
    await ex.out.body(body, more=False)


async def _upstream_failed(relay: _Relay, exc: BaseException) -> None:
    """A client/OS/egress error: raise it before the response started, else end the response.

    Raises:
        GatewayError: The mapped error, when nothing was sent to the client yet.
    """
    ex, replica = relay.ex, relay.replica
    err = map_exception(exc, replica.label)
    if isinstance(err, (UpstreamConnectError, UpstreamConnectTimeout)):
        raise err from exc
    ex.pool.eject(replica)
    if not ex.out.started:
        raise err from exc
    await _end_broken(ex.out, err, relay.phase, ex.record, relay.at_boundary())


async def _timed_out(relay: _Relay, exc: TimeoutError) -> None:
    """The first-byte or idle deadline passed (raises before the response started).

    Raises:
        UpstreamConnectionsExhausted: The request was still waiting for an upstream
            connection (the replica is not ejected: it was not asked).
        UpstreamTimeout: The replica did not answer in time (it is ejected).
    """
    ex, replica, phase = relay.ex, relay.replica, relay.phase
    timeouts = ex.state.settings.timeouts
    if not relay.has_slot:
        # Still waiting for one of the gateway's upstream connections: no replica was asked.
        raise UpstreamConnectionsExhausted(
            f"Every upstream connection of the gateway (limits.max_upstream_connections = "
            f"{ex.state.settings.limits.max_upstream_connections}) stayed busy for the "
            f"{timeouts.first_byte_s} s first-byte limit; try again later.") from exc
    ex.pool.eject(replica)
    what = {"first_byte": "send its first byte", "stream": "send the next event",
            "body": "send the rest of the response"}[phase]
    err = UpstreamTimeout(
        f"The model backend ({replica.label}) did not {what} within the "
        f"{timeouts.first_byte_s if phase == 'first_byte' else timeouts.idle_s} s limit."
    )
    if not ex.out.started:
        raise err from exc
    await _end_broken(ex.out, err, phase, ex.record, relay.at_boundary())


def _account_stream(record: RequestRecord, scanner: SSEUsageScanner | None) -> None:
    # Also on cancellation: a client that closes right after ``[DONE]`` cancels the wait for
    # the end of the upstream body, after the usage event was already seen.
    if scanner is None:
        return
    if scanner.usage is not None:
        _set_usage(record, scanner.usage)
    else:
        _estimate_usage(record, scanner)


async def _end_broken(
    out: Responder, err: GatewayError, phase: str, record: RequestRecord, at_boundary: bool
) -> None:
    """End a response that already started after an upstream failure."""
    record.failed("timeout" if isinstance(err, UpstreamTimeout) else "upstream_error", err.code)
    if phase == "stream":
        prefix = b"" if at_boundary else b"\n\n"
        await out.body(prefix + sse_error_event(err), more=False)
    # A JSON body cannot carry an error: return without completing the response, so the
    # server closes the connection and the client sees a truncated (failed) response.


def _estimate_usage(record: RequestRecord, scanner: SSEUsageScanner) -> None:
    """A stream that relayed content but carried no usage: estimate its completion tokens.

    Runs also when the attempt is cancelled (client disconnect), so quotas and the audit log
    charge what was generated instead of nothing.
    """
    estimate = scanner.estimated_output_tokens
    if estimate > 0 and record.output_tokens is None:
        record.used(None, estimate, estimated=True)


def _set_usage(record: RequestRecord, usage: Usage | None) -> None:
    if usage is not None:
        record.used(usage.input_tokens, usage.output_tokens)
