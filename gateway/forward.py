"""Forwarding one validated request to a replica, with retries, timeouts and stream relay.

Retry rule: another replica is tried only before any byte went to the client, and only after a
connect error or timeout, a 502/503, or a 429 (whose ``Retry-After`` keeps that replica out for
that long; with no other replica a short ``Retry-After`` is waited out). After the first byte, a
failure ends an SSE stream with a final ``data: {"error": ...}`` event; a JSON body is cut off.
Timeouts: ``first_byte_s`` until the first body byte, then ``idle_s`` between chunks (the
deadline is suspended while the gateway writes to a slow client).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from gateway.asgi_io import DisconnectWatch, Responder
from gateway.errors import (
    GatewayError,
    NoHealthyReplica,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamStatusError,
    UpstreamTimeout,
    sse_error_event,
)
from gateway.records import RequestRecord
from gateway.rewrite import ParsedBody
from gateway.routing import Pool, Replica
from gateway.sse import SSEUsageScanner, Usage, usage_from_body
from gateway.state import GatewayState
from gateway.upstream import USER_AGENT, map_exception
from policy import EgressDenied

__all__ = ["USAGE_PATHS", "Exchange", "forward"]

# Endpoints whose streams carry usage only when stream_options.include_usage is set.
USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_RETRY_STATUSES = frozenset({429, 502, 503})
_MAX_USAGE_BODY = 1 << 20
_SSE = b"text/event-stream"


@dataclass(slots=True)
class Exchange:
    """One request being relayed: what to send, and where to write the answer."""

    state: GatewayState
    pool: Pool
    candidates: tuple[Replica, ...]
    parsed: ParsedBody
    accept: str
    forwarded: list[tuple[str, str]]
    out: Responder
    record: RequestRecord
    watch: DisconnectWatch
    t0: float


def _retry_after_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: fall back to the pool cool-down


async def forward(ex: Exchange, first: Replica) -> None:
    """Try replicas, starting with ``first``, until one answers (rules in the module docstring).

    Raises:
        GatewayError: Nothing was sent to the client and no replica could serve the request.
    """
    state, pool, parsed, record = ex.state, ex.pool, ex.parsed, ex.record
    settings = state.settings
    force_usage = record.path in USAGE_PATHS
    body = parsed.upstream_body(pool.model.upstream_name, force_usage=force_usage)
    base_headers = {
        "content-type": "application/json",
        "accept": ex.accept,
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "x-request-id": record.request_id,
    }
    base_headers.update(ex.forwarded)
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
        replica.outstanding += 1
        try:
            if replica.kind == "litellm":
                result = await _litellm_attempt(ex, replica)
            else:
                result = await _attempt(ex, replica, body, headers, drop_usage=force_usage)
        except (UpstreamConnectError, UpstreamConnectTimeout) as exc:
            pool.eject(replica)
            result = exc
        finally:
            replica.outstanding -= 1
        if result is None:
            return
        last_error = result
        previous = replica
        replica = pool.pick(ex.candidates, exclude=tried)
        if replica is None and isinstance(result, UpstreamStatusError) and result.status == 429:
            # Honour Retry-After: wait it out on the same replica if it is short.
            wait_s = _retry_after_s(result.headers.get("retry-after"))
            if wait_s is not None and wait_s <= settings.retries.max_retry_after_s:
                await asyncio.sleep(wait_s)
                replica = previous
    raise last_error or NoHealthyReplica(f"No replica of '{pool.model.name}' is available.")


async def _litellm_attempt(ex: Exchange, replica: Replica) -> GatewayError | None:
    # Imported only when a litellm replica is configured; vLLM replicas never reach it.
    from gateway.litellm_backend import attempt

    return await attempt(ex, replica)


async def _attempt(
    ex: Exchange, replica: Replica, body: bytes, headers: dict[str, str], drop_usage: bool
) -> GatewayError | None:
    """One upstream attempt. Returns ``None`` when done, or the retryable error.

    Raises:
        UpstreamConnectError: Connection failed (the caller retries).
        UpstreamConnectTimeout: Connection not made in time (the caller retries).
        GatewayError: Any failure before the response started (sent as a status by the caller).
    """
    state, pool, parsed, out, record = ex.state, ex.pool, ex.parsed, ex.out, ex.record
    timeouts = state.settings.timeouts
    loop = asyncio.get_running_loop()
    url = replica.url + record.path
    phase = "first_byte"
    resp: aiohttp.ClientResponse | None = None
    scanner: SSEUsageScanner | None = None
    complete = False
    try:
        async with asyncio.timeout(timeouts.first_byte_s) as deadline:
            try:
                resp = await state.session.post(url, data=body, headers=headers,
                                                allow_redirects=False, ssl=state.upstream_ssl)
                status = resp.status
                if status in _RETRY_STATUSES:
                    retry_after = resp.headers.get("retry-after")
                    resp.release()
                    cool = _retry_after_s(retry_after) if status == 429 else None
                    pool.eject(replica, cool)
                    relayed = {"retry-after": retry_after} if retry_after else {}
                    return UpstreamStatusError(
                        f"The model backend answered {status}.", status=status, headers=relayed
                    )
                if status >= 500:
                    pool.eject(replica)
                chunk = await resp.content.readany()
                record.first_byte(round((time.perf_counter() - ex.t0) * 1000.0, 3))
                ctype = resp.headers.get("content-type", "")
                is_sse = ctype.encode("latin-1").startswith(_SSE)
                out_headers = [(b"content-type", ctype.encode("latin-1"))]
                for name in ("retry-after", "cache-control", "content-encoding"):
                    value = resp.headers.get(name)
                    if value is not None:
                        out_headers.append((name.encode(), value.encode("latin-1")))
                if not is_sse and resp.content_length is not None:
                    out_headers.append((b"content-length", str(resp.content_length).encode()))
                if is_sse:
                    phase = "stream"
                    scanner = SSEUsageScanner(
                        drop_usage_only=(drop_usage and parsed.stream
                                         and not parsed.client_wants_usage)
                    )
                    await out.start(status, out_headers)
                    while chunk:
                        data = scanner.feed(chunk)
                        deadline.reschedule(None)
                        if data:
                            await out.body(data)
                        deadline.reschedule(loop.time() + timeouts.idle_s)
                        chunk = await resp.content.readany()
                    deadline.reschedule(None)
                    complete = True
                    tail = scanner.finish()
                    _set_usage(record, scanner.usage)
                    ex.watch.finish()
                    await out.body(tail, more=False)
                else:
                    phase = "body"
                    keep = bytearray()
                    await out.start(status, out_headers)
                    while chunk:
                        if len(keep) + len(chunk) <= _MAX_USAGE_BODY:
                            keep += chunk
                        deadline.reschedule(None)
                        await out.body(chunk)
                        deadline.reschedule(loop.time() + timeouts.idle_s)
                        chunk = await resp.content.readany()
                    deadline.reschedule(None)
                    complete = True
                    if status == 200:
                        _set_usage(record, usage_from_body(bytes(keep)))
                    ex.watch.finish()
                    await out.body(b"", more=False)
                record.ended("ok" if status < 400 else ("invalid" if status < 500
                                                        else "upstream_error"))
                return None
            except (aiohttp.ClientError, OSError, EgressDenied) as exc:
                err = map_exception(exc, replica.label)
                if isinstance(err, (UpstreamConnectError, UpstreamConnectTimeout)):
                    raise err from exc
                pool.eject(replica)
                if not out.started:
                    raise err from exc
                await _end_broken(out, err, phase, record, scanner.at_boundary if scanner else True)
                return None
    except TimeoutError as exc:
        pool.eject(replica)
        what = {"first_byte": "send its first byte", "stream": "send the next event",
                "body": "send the rest of the response"}[phase]
        err = UpstreamTimeout(
            f"The model backend ({replica.label}) did not {what} within the "
            f"{timeouts.first_byte_s if phase == 'first_byte' else timeouts.idle_s} s limit."
        )
        if not out.started:
            raise err from exc
        await _end_broken(out, err, phase, record, scanner.at_boundary if scanner else True)
        return None
    finally:
        if scanner is not None:
            # Also on cancellation: a client that closes right after ``[DONE]`` cancels the
            # wait for the end of the upstream body, after the usage event was already seen.
            if scanner.usage is not None:
                _set_usage(record, scanner.usage)
            else:
                _estimate_usage(record, scanner)
        if resp is not None:
            if complete:
                resp.release()
            else:
                resp.close()


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
