"""The hot path: a raw ASGI handler that relays OpenAI-style POST requests to a replica.

Per request: authenticate, read the bounded body, validate it, resolve and authorise the model,
ask the routing policy for candidates, run admission hooks and observers, then forward with the
pooled aiohttp client and stream the response back chunk by chunk as it arrives.

Rules (issue 2): the body goes upstream unchanged except ``model`` and forced
``stream_options.include_usage``; the client's ``Authorization``, cookies and hop-by-hop headers
never reach a backend; retries go to another replica only before the first byte went to the
client and only for connect errors, 502/503 and 429; after the first byte, a failure ends the
stream with ``data: {"error": ...}``; a client disconnect cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import aiohttp

from gateway.asgi_io import ClientGone, DisconnectWatch, Receive, Responder, Scope, Send, read_body
from gateway.auth import Principal, bearer_token
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotAllowed,
    ModelNotFound,
    NoHealthyReplica,
    ServiceUnavailable,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
    sse_error_event,
)
from gateway.records import RequestRecord
from gateway.rewrite import ParsedBody, parse_body
from gateway.routing import Pool, Replica
from gateway.sse import SSEUsageScanner, Usage, usage_from_body
from gateway.state import GatewayState
from gateway.upstream import USER_AGENT, map_exception

__all__ = ["RELAY_PATHS", "handle"]

_log = logging.getLogger(__name__)
_access = logging.getLogger("gateway.access")

RELAY_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/score",
        "/score",
        "/tokenize",
        "/detokenize",
        "/pooling",
        "/classify",
    }
)
_RETRY_STATUSES = frozenset({429, 502, 503})
_MAX_USAGE_BODY = 1 << 20
_SSE = b"text/event-stream"
_RESPONSE_HEADERS = frozenset({"content-type", "retry-after", "cache-control"})


def _outcome_for(exc: GatewayError) -> str:
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, (UpstreamError, NoHealthyReplica)):
        return "upstream_error"
    if exc.status in (401, 403, 429) or isinstance(exc, ServiceUnavailable):
        return "denied"
    if exc.status < 500:
        return "invalid"
    return "gateway_error"


def _retry_after_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: fall back to the pool cool-down


async def handle(state: GatewayState, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one request on a relay path (see module docstring)."""
    t0 = time.perf_counter()
    client = scope.get("client")
    record = RequestRecord(
        request_id=uuid.uuid4().hex,
        started_at=time.time(),
        method=scope["method"],
        path=scope["path"],
        client_addr=f"{client[0]}:{client[1]}" if client else None,
    )
    out = Responder(send, record.request_id)
    started_observers = False
    try:
        started_observers = await _serve(state, scope, receive, out, record, t0)
    except GatewayError as exc:
        record.outcome = _outcome_for(exc)  # type: ignore[assignment]
        record.error_code = exc.code
        if not out.started:
            await out.error(exc)
    except ClientGone:
        record.outcome = "client_disconnect"
    except Exception as exc:  # a gateway bug: answer 500, keep the process serving
        _log.exception("unhandled error in relay (request %s)", record.request_id)
        record.outcome = "gateway_error"
        record.error_code = "internal_error"
        err = GatewayError(f"Internal gateway error ({type(exc).__name__}).", code="internal_error")
        with contextlib.suppress(Exception):
            if not out.started:
                await out.error(err)
            else:
                await out.body(sse_error_event(err), more=False)
    finally:
        record.status = out.status
        record.bytes_out = out.bytes_out
        record.latency_ms = round((time.perf_counter() - t0) * 1000.0, 3)
        await _finish(state, record, started_observers)


async def _finish(state: GatewayState, record: RequestRecord, started: bool) -> None:
    for observer in state.observers:
        try:
            await observer.on_end(record)
        except Exception:
            _log.exception("observer on_end failed (request %s)", record.request_id)
    if state.settings.logging.access_log:
        _access.info(
            "request",
            extra={
                "access": {
                    "request_id": record.request_id,
                    "key_id": record.key_id,
                    "method": record.method,
                    "path": record.path,
                    "model": record.canonical_model or record.model,
                    "backend": record.replica_url,
                    "attempts": record.attempts,
                    "status": record.status,
                    "outcome": record.outcome,
                    "error_code": record.error_code,
                    "latency_ms": record.latency_ms,
                    "ttft_ms": record.ttft_ms,
                    "input_tokens": record.input_tokens,
                    "output_tokens": record.output_tokens,
                    "bytes_in": record.bytes_in,
                    "bytes_out": record.bytes_out,
                }
            },
        )


async def _serve(
    state: GatewayState,
    scope: Scope,
    receive: Receive,
    out: Responder,
    record: RequestRecord,
    t0: float,
) -> bool:
    """Validate and relay; return whether observers' ``on_start`` ran."""
    if scope["method"] != "POST":
        raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use POST.")
    auth: bytes | None = None
    declared: int | None = None
    forwarded: list[tuple[str, str]] = []
    accept = "application/json"
    for name, value in scope["headers"]:
        if name == b"authorization":
            auth = value
        elif name == b"content-length":
            try:
                declared = int(value)
            except ValueError as exc:
                raise InvalidRequest("Invalid Content-Length header.") from exc
        elif name == b"accept":
            accept = value.decode("latin-1")
        elif name in state.forward_headers:
            forwarded.append((name.decode("latin-1"), value.decode("latin-1")))
    principal: Principal = state.authenticator.authenticate(bearer_token(auth))
    record.key_id = principal.key_id
    record.team = principal.team
    record.data_class = principal.data_class

    raw = await read_body(receive, state.settings.limits.max_body_bytes, declared)
    record.bytes_in = len(raw)
    parsed = parse_body(raw)
    record.model = parsed.model
    record.stream = parsed.stream
    pool = state.router.resolve(parsed.model)
    if pool is None:
        raise ModelNotFound(f"The model '{parsed.model}' does not exist.", param="model")
    model = pool.model
    record.canonical_model = model.name
    record.served_model = model.upstream_name
    if not principal.may_use(model.name):
        raise ModelNotAllowed(
            f"The API key '{principal.key_id}' may not use the model '{model.name}'.",
            param="model",
        )
    decision = state.policy.decide(principal, model, pool.replicas)
    record.policy_rule = decision.rule_id
    if not decision.candidates:
        raise ModelNotAllowed(
            f"No replica of '{model.name}' is allowed for this key by the egress policy"
            + (f" (rule {decision.rule_id})." if decision.rule_id else "."),
            param="model",
        )
    first = pool.pick(decision.candidates)
    if first is None:
        raise NoHealthyReplica(f"No replica of '{model.name}' is available.")
    record.replica_url = first.url
    record.destination = first.destination

    for hook in state.admission:
        await hook.admit(record, parsed.values)
    for observer in state.observers:
        await observer.on_start(record)

    watch = DisconnectWatch(receive)
    watch.start()
    try:
        await _forward(state, pool, decision.candidates, first, parsed, accept, forwarded, out,
                       record, watch, t0)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not watch.fired or task is None:
            raise
        task.uncancel()
        record.outcome = "client_disconnect"
    finally:
        watch.finish()
    return True


async def _forward(
    state: GatewayState,
    pool: Pool,
    candidates: tuple[Replica, ...],
    first: Replica,
    parsed: ParsedBody,
    accept: str,
    forwarded: list[tuple[str, str]],
    out: Responder,
    record: RequestRecord,
    watch: DisconnectWatch,
    t0: float,
) -> None:
    """Try replicas until one answers (retry rules in the module docstring)."""
    settings = state.settings
    body = parsed.upstream_body(pool.model.upstream_name, force_usage=True)
    base_headers = {
        "content-type": "application/json",
        "accept": accept,
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "x-request-id": record.request_id,
    }
    base_headers.update(forwarded)
    tried: list[Replica] = []
    replica: Replica | None = first
    last_error: GatewayError | None = None
    attempts = 0
    while replica is not None and attempts < settings.retries.max_attempts:
        attempts += 1
        if replica not in tried:
            tried.append(replica)
        record.attempts = attempts
        record.replica_url = replica.url
        record.destination = replica.destination
        headers = dict(base_headers)
        if replica.api_key:
            headers["authorization"] = f"Bearer {replica.api_key}"
        replica.outstanding += 1
        try:
            result = await _attempt(state, pool, replica, body, headers, parsed, out, record,
                                    watch, t0)
        except (UpstreamConnectError, UpstreamConnectTimeout) as exc:
            pool.eject(replica)
            result = exc
        finally:
            replica.outstanding -= 1
        if result is None:
            return
        last_error = result
        previous = replica
        replica = pool.pick(candidates, exclude=tried)
        if replica is None and isinstance(result, UpstreamStatusError) and result.status == 429:
            # Honour Retry-After: wait it out on the same replica if it is short.
            wait_s = _retry_after_s(result.headers.get("retry-after"))
            if wait_s is not None and wait_s <= settings.retries.max_retry_after_s:
                await asyncio.sleep(wait_s)
                replica = previous
    raise last_error or NoHealthyReplica(f"No replica of '{pool.model.name}' is available.")


async def _attempt(
    state: GatewayState,
    pool: Pool,
    replica: Replica,
    body: bytes,
    headers: dict[str, str],
    parsed: ParsedBody,
    out: Responder,
    record: RequestRecord,
    watch: DisconnectWatch,
    t0: float,
) -> GatewayError | None:
    """One upstream attempt. Returns ``None`` when done, or the retryable error.

    Raises:
        UpstreamConnectError: Connection failed (the caller retries).
        UpstreamConnectTimeout: Connection not made in time (the caller retries).
        GatewayError: Any failure before the response started (sent as a status by the caller).
    """
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
                                                allow_redirects=False)
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
                record.ttft_ms = round((time.perf_counter() - t0) * 1000.0, 3)
                ctype = resp.headers.get("content-type", "")
                is_sse = ctype.encode("latin-1").startswith(_SSE)
                out_headers = [(b"content-type", ctype.encode("latin-1"))]
                for name in ("retry-after", "cache-control"):
                    value = resp.headers.get(name)
                    if value is not None:
                        out_headers.append((name.encode(), value.encode("latin-1")))
                if not is_sse and resp.content_length is not None:
                    out_headers.append((b"content-length", str(resp.content_length).encode()))
                if is_sse:
                    phase = "stream"
                    scanner = SSEUsageScanner(
                        drop_usage_only=parsed.stream and not parsed.client_wants_usage
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
                    watch.finish()
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
                    watch.finish()
                    await out.body(b"", more=False)
                record.outcome = "ok" if status < 400 else ("invalid" if status < 500
                                                             else "upstream_error")
                return None
            except (aiohttp.ClientError, OSError) as exc:
                err = map_exception(exc, replica.url)
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
            f"The model backend ({replica.url}) did not {what} within the "
            f"{timeouts.first_byte_s if phase == 'first_byte' else timeouts.idle_s} s limit."
        )
        if not out.started:
            raise err from exc
        await _end_broken(out, err, phase, record, scanner.at_boundary if scanner else True)
        return None
    finally:
        if resp is not None:
            if complete:
                resp.release()
            else:
                resp.close()


async def _end_broken(
    out: Responder, err: GatewayError, phase: str, record: RequestRecord, at_boundary: bool
) -> None:
    """End a response that already started after an upstream failure."""
    record.outcome = "timeout" if isinstance(err, UpstreamTimeout) else "upstream_error"
    record.error_code = err.code
    if phase == "stream":
        prefix = b"" if at_boundary else b"\n\n"
        await out.body(prefix + sse_error_event(err), more=False)
    # A JSON body cannot carry an error: return without completing the response, so the
    # server closes the connection and the client sees a truncated (failed) response.


def _set_usage(record: RequestRecord, usage: Usage | None) -> None:
    if usage is not None:
        record.input_tokens = usage.input_tokens
        record.output_tokens = usage.output_tokens
