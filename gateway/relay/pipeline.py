"""The hot path: a raw ASGI handler that relays OpenAI-style POST requests to a replica.

Per request: authenticate, read the bounded body, validate it, resolve and authorise the model,
ask the routing policy for candidates, run admission hooks and observers, then forward with the
relay's pooled HTTP/1.1 client (:mod:`gateway.h1`) and stream the response back chunk by chunk
as it arrives.

Rules: the body goes upstream unchanged except ``model`` and forced
``stream_options.include_usage``; the client's ``Authorization``, cookies and hop-by-hop headers
never reach a backend; retries go to another replica only before the first byte went to the
client and only for connect errors, 502/503 and 429 (a stale pooled connection is retried once
on the same replica); after the first byte, a failure ends the stream with
``data: {"error": ...}``; a client disconnect cancels the upstream request. A ``model`` may be
a configured name, an alias, or the backend's served name (:meth:`Router.resolve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.auth import Principal, ambiguous_credentials, bearer_token, repeated_header
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotAllowed,
    ModelNotFound,
    NoHealthyReplica,
    PathNotFound,
    PolicyDenied,
    ServiceUnavailable,
    UpstreamError,
    UpstreamTimeout,
    error_body,
    sse_error_event,
)
from gateway.h1.asgi_io import (
    BODY_CHUNK_EXTENSION,
    CHUNK_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    REFUSED_EXTENSION,
    WHOLE_BODY_EXTENSION,
    WRITE_NOW_EXTENSION,
    WRITE_RESPONSE_EXTENSION,
    ClientGone,
    DisconnectWatch,
    Message,
    Receive,
    Responder,
    Scope,
    Send,
    amend_undelivered,
    answered_before_leaving,
    delivered,
    escaped_api_path,
    framing_refusal,
    lost_now,
    read_body,
    scope_framing_problem,
    take_body,
)
from gateway.relay.forward import Exchange, forward
from gateway.relay.records import ContentTap, Headers, Outcome, RequestRecord
from gateway.relay.rewrite import parse_body
from gateway.routing import Pool, Replica, RouteDecision
from gateway.serving.drain import ShuttingDown
from gateway.state import STATE_KEY, GatewayState, gateway_state

if TYPE_CHECKING:
    from gateway.fleet.scoring import RouteHint
    from gateway.flow.lane import Lane
    from gateway.pii.request import ResponseScan
    from gateway.pii.response import ResponseMasker
    from gateway.relay.rewrite import ParsedBody

__all__ = ["RELAY_PATHS", "STAGES", "Flight", "Stage", "handle", "serve"]

_log = logging.getLogger(__name__)

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


def _outcome_for(exc: GatewayError) -> Outcome:
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, (UpstreamError, NoHealthyReplica)):
        return "upstream_error"
    if exc.status in (401, 403, 429) or isinstance(exc, ServiceUnavailable):
        return "denied"
    if exc.status < 500:
        return "invalid"
    return "gateway_error"


def serve(scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
    """The relay's ASGI entry for one HTTP request on a path of :data:`RELAY_PATHS`.

    A plain function returning the request's awaitable (:func:`handle`'s coroutine, or the
    refusal's): awaited like an ``async def``, one coroutine frame fewer on every request.

    The app (:func:`gateway.app.create_app`) calls it for those paths, and the gateway's own
    server calls it directly (``ServerConfig.routes``, :func:`gateway.app.direct_routes`):
    the same checks either way. A request with ambiguous framing is refused with 400
    ``invalid_framing`` and ``Connection: close`` (second layer behind the parser check of
    :mod:`gateway.h1.framing`, for any ASGI server); an escaped path (``%2F`` ...) with 404
    (the one rule for every ``/v1/`` path, :func:`gateway.h1.asgi_io.escaped_api_path`).
    The gateway state is read from the lifespan state in the scope.

    Raises:
        RuntimeError: The scope has no gateway state (the app's lifespan did not run).
    """
    problem = scope_framing_problem(scope["headers"])
    if problem is not None:
        return _send_all(send, framing_refusal(problem))
    if escaped_api_path(scope):
        body = error_body(PathNotFound("Not Found"))
        return _send_all(send, [
            {"type": "http.response.start", "status": 404,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", b"%d" % len(body))]},
            {"type": "http.response.body", "body": body}])
    try:  # gateway_state's lookup, without a call per request
        state = scope["state"][STATE_KEY].current
    except (KeyError, TypeError, AttributeError):
        state = gateway_state(scope)  # raises the explanation
    return handle(state, scope, receive, send)


async def _send_all(send: Send, messages: Iterable[Message]) -> None:
    for message in messages:
        await send(message)


async def handle(state: GatewayState, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one request on a relay path (see module docstring)."""
    t0 = time.perf_counter()
    record = RequestRecord.for_scope(scope)
    hooks = state.hooks
    extensions = scope.get("extensions") or {}
    for on_request in hooks.on_request:
        on_request(record, scope["headers"])
    out = Responder(
        send,
        record.request_id,
        on_start=_response_start(hooks.on_response_start, record),
        hold_end=bool(hooks.end_recorded),
        write_chunk=extensions.get(BODY_CHUNK_EXTENSION),
        write_now=extensions.get(WRITE_NOW_EXTENSION),
        open_writer=extensions.get(CHUNK_WRITER_EXTENSION),
        write_response=extensions.get(WRITE_RESPONSE_EXTENSION),
    )
    flight = Flight(state, scope, receive, out, record, t0)
    drain = state.drain
    try:
        with drain.track() if drain is not None else contextlib.nullcontext():
            try:  # the stages in order (no coroutine of its own: one frame fewer)
                for run in _IN_ORDER:
                    step = run(flight)
                    if step is not None:
                        await step
            finally:  # a lane and a routing hint are released whatever happens
                if flight.lane is not None:
                    flight.lane.done()
                if flight.hint is not None:  # refused before forwarding: no prefill queued
                    flight.hint.release()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if drain is None or task is None or not drain.was_cut(task):
            raise
        task.uncancel()  # the drain deadline (gateway.serving.drain): end the request, audited
        await _end_at_drain_deadline(out, record)
    except GatewayError as exc:
        record.failed(_outcome_for(exc), exc.code, exc.reason)
        if not out.started:
            await out.error(exc)
    except ClientGone:
        refused = extensions.get(REFUSED_EXTENSION)
        _gone_or_refused(record, refused() if refused is not None else None)
    except Exception as exc:  # a gateway bug: answer 500, keep the process serving
        _log.exception("unhandled error in relay (request %s)", record.request_id)
        record.failed("gateway_error", "internal_error")
        err = GatewayError(f"Internal gateway error ({type(exc).__name__}).", code="internal_error")
        with contextlib.suppress(Exception):
            if not out.started:
                await out.error(err)
            else:
                await out.body(sse_error_event(err), more=False)
    finally:
        status, sent = delivered(record, out, extensions)
        record.sent(status, sent, round((time.perf_counter() - t0) * 1000.0, 3))
        for run in _AT_END:
            step = run(flight)
            if step is not None:
                await step
        if hooks.end_recorded:
            recorded = all([gate(record) for gate in hooks.end_recorded])  # ask every gate
            if not recorded:
                _log.error("withholding the end of response %s: its completion was not recorded",
                           record.request_id)
            await out.release(recorded)
            if recorded and hooks.undelivered:
                await amend_undelivered(hooks.undelivered, record, extensions)


def _gone_or_refused(record: RequestRecord, refused: tuple[int, str, int] | None) -> None:
    """The request body ended without the rest: the client left, or (``refused``: the
    server's :data:`REFUSED_EXTENSION`) the server answered it itself (413, 408)."""
    if refused is None:
        record.ended("client_disconnect")
    else:  # a 4xx of the client's making (its status reaches the record through delivered())
        record.failed("invalid", refused[1])


def _response_start(
    hooks: tuple[Callable[[RequestRecord, Headers], None], ...], record: RequestRecord
) -> Callable[[Headers], None] | None:
    """The responder's ``on_start``: every observer's ``on_response_start`` for ``record``."""
    if not hooks:
        return None

    def on_start(headers: Headers) -> None:
        for hook in hooks:
            hook(record, headers)

    return on_start


async def _end_at_drain_deadline(out: Responder, record: RequestRecord) -> None:
    """A request still running at the drain deadline: a 503, or a final SSE error event."""
    err = ShuttingDown("The gateway is shutting down: the request was ended at the drain deadline.")
    record.failed("gateway_error", err.code)
    with contextlib.suppress(Exception):
        if not out.started:
            await out.error(err)
        else:
            # A blank line first: ends a partly relayed event, and is no event on its own.
            await out.body(b"\n\n" + sse_error_event(err), more=False)


def _tap_content(state: GatewayState, record: RequestRecord, raw: bytes, out: Responder) -> None:
    """Policy opt-in: hand the request body to content observers and tap the response."""
    record.content_opt_in()
    taps: list[ContentTap] = []
    for content_tap in state.hooks.content_tap:
        tap = content_tap(record, raw)
        if tap is not None:
            taps.append(tap)
    if len(taps) == 1:
        out.tap = taps[0]
    elif taps:

        def fan_out(chunk: bytes) -> None:
            for tap in taps:
                tap(chunk)

        out.tap = fan_out


def _also(
    tap: Callable[[bytes], None] | None, more: Callable[[bytes], None]
) -> Callable[[bytes], None]:
    """A content tap that calls ``tap`` (when set) and then ``more``."""
    if tap is None:
        return more

    def both(chunk: bytes) -> None:
        tap(chunk)
        more(chunk)

    return both


@dataclass(slots=True)
class _Head:
    """What the relay reads from the request headers (one pass over them)."""

    auth: bytes | None = None
    declared: int | None = None
    accept: str = "application/json"
    class_value: str | None = None
    forwarded: list[tuple[str, str]] = field(default_factory=list)


_NO_HEAD = _Head()  # before ``authenticate`` reads the headers (never changed)


class Flight:
    """One relay request on its way through :data:`STAGES`: what each stage reads and sets.

    Attributes:
        state, scope, receive, out, record, t0: The request as :func:`handle` got it (``t0``:
            ``time.perf_counter()`` at its start, seconds).
        head: What the headers say (``authenticate``).
        principal: The caller (``authenticate``; ``classify`` and ``inspect`` may change its
            data class).
        raw: The request body as received, bytes (``read``).
        parsed: The parsed body (``read``; ``inspect`` may mask it).
        response_scan, masker: The response's sensitive-data scan and masking (``inspect``).
        pool, decision, hint: The model's pool, the egress policy's decision and the
            routing hint (``route``).
        lane: The flow-control lane (``admit``; ended by :func:`handle` whatever happens).
        first: The replica the request goes to first (``admit``).
    """

    __slots__ = (
        "decision",
        "first",
        "head",
        "hint",
        "lane",
        "masker",
        "out",
        "parsed",
        "pool",
        "principal",
        "raw",
        "receive",
        "record",
        "response_scan",
        "scope",
        "state",
        "t0",
    )

    def __init__(self, state: GatewayState, scope: Scope, receive: Receive, out: Responder,
                 record: RequestRecord, t0: float) -> None:
        self.state = state
        self.scope = scope
        self.receive = receive
        self.out = out
        self.record = record
        self.t0 = t0
        self.head = _NO_HEAD
        self.principal: Principal | None = None
        self.raw = b""
        self.parsed: ParsedBody | None = None
        self.response_scan: ResponseScan | None = None
        self.masker: ResponseMasker | None = None
        self.pool: Pool | None = None
        self.decision: RouteDecision | None = None
        self.hint: RouteHint | None = None
        self.lane: Lane | None = None
        self.first: Replica | None = None


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of a relay request.

    Attributes:
        name: The stage's name (audit and docs use it; :meth:`gateway.assembly.Gateway.stages`
            names the components behind each).
        run: The step; raises :class:`~gateway.errors.GatewayError` to refuse the request.
            It returns ``None`` when it is done, or an awaitable that finishes it (a step
            that need not wait, the usual case for most, costs no coroutine).
        always: Run once the request ends, whatever happened (after the others).
    """

    name: str
    run: Callable[[Flight], Awaitable[None] | None]
    always: bool = False


def _authenticate(f: Flight) -> None:
    """Only POST on a plain relay path; the API key or token -> the caller (401)."""
    _check_target(f.scope)
    f.head = _read_head(f.state, f.scope)
    f.principal = _caller(f.state, f.head, f.record, f.scope)


def _classify(f: Flight) -> None:
    """The classification header may change the caller's data class, by grant only (403)."""
    state, head = f.state, f.head
    if state.classify is not None and head.class_value is not None:
        assert f.principal is not None
        principal = f.principal = state.classify(f.principal, head.class_value)
        f.record.identify(principal.key_id, principal.team, principal.data_class)


def _read(f: Flight) -> Awaitable[None] | None:
    """The bounded body (413, 408), parsed and validated (400)."""
    limits = f.state.settings.limits
    take_whole = (f.scope.get("extensions") or {}).get(WHOLE_BODY_EXTENSION)
    raw = take_body(limits.max_body_bytes, f.head.declared, take_whole)
    if raw is None:
        return _read_waiting(f)
    _parse(f, raw)
    return None


async def _read_waiting(f: Flight) -> None:
    """:func:`_read` for a body that has not wholly arrived yet."""
    limits = f.state.settings.limits
    _parse(f, await read_body(f.receive, limits.max_body_bytes, f.head.declared,
                              limits.client_body_timeout_s))


def _parse(f: Flight, raw: bytes) -> None:
    f.raw = raw
    f.record.received(len(raw))
    parsed = f.parsed = parse_body(raw)
    f.record.describe(parsed.model, parsed.stream)


def _inspect(f: Flight) -> Awaitable[None] | None:
    """Sensitive data in the body (``gateway.pii.request``) may raise the class or mask it,
    before routing; the response's scan and masking are set up."""
    return _inspect_pii(f) if f.state.pii is not None else None


async def _inspect_pii(f: Flight) -> None:
    pii = f.state.pii
    assert pii is not None
    assert f.principal is not None and f.parsed is not None
    restore: dict[str, str] = {}  # reversible masking: this request's values, never logged
    path = f.scope["path"]
    f.principal, f.parsed = await pii.inspect(path, f.principal, f.parsed, f.record, restore)
    f.response_scan = pii.response_scan(path)
    f.masker = pii.response_masker(path, restore)


def _route_stage(f: Flight) -> Awaitable[None] | None:
    """Model -> pool -> the replicas the egress policy allows (404, 403); the routing hint."""
    state, principal, parsed = f.state, f.principal, f.parsed
    assert principal is not None and parsed is not None
    pool = f.pool = _authorised_pool(state, principal, parsed.model, f.record)
    decision = f.decision = _route(state, principal, pool, f.record)
    hint = f.hint = pool.route_hint(parsed.values, f.scope["headers"])  # gateway.fleet
    if hint is not None and pool.affinity is not None and pool.affinity.settings.tokenize != "none":
        # routing.tokenize: replica: a chat prompt's exact token ids (gateway.fleet.tokenize)
        return pool.affinity.fill_token_ids(hint, parsed.values, decision.candidates,
                                            pool.upstream_name, state.session,
                                            state.upstream_ssl)
    return None


def _admit(f: Flight) -> Awaitable[None] | None:
    """Admission hooks (quotas: 429), then flow control (a replica with room, or a wait in
    the class's queue: 429, 503) or, without it, the pool's pick (503)."""
    state = f.state
    if state.flow is not None or state.hooks.admit:
        return _admit_waiting(f)
    _pick_first(f)
    return None


def _pick_first(f: Flight) -> None:
    """Without flow control: the pool's pick is the first replica (503 when none)."""
    pool, decision, record, hint = f.pool, f.decision, f.record, f.hint
    assert pool is not None and decision is not None
    first = pool.pick(decision.candidates, hint=hint)
    if first is None:
        raise NoHealthyReplica(f"No replica of '{pool.model.name}' is available.")
    f.first = first
    record.attempt(first.url, first.destination, first.region)
    record.route = hint.explain if hint is not None else None


async def _admit_waiting(f: Flight) -> None:
    """:func:`_admit` with admission hooks or flow control (both may wait)."""
    state, pool, decision, record, hint = f.state, f.pool, f.decision, f.record, f.hint
    assert pool is not None and decision is not None and f.principal is not None
    assert f.parsed is not None
    flow = state.flow
    lane = f.lane = (flow.lane(f.principal, pool, f.scope["headers"], f.parsed, record)
                     if flow is not None else None)
    if lane is None:
        _pick_first(f)
    for admit in state.hooks.admit:
        await admit(record, f.parsed.values)
    if lane is not None:
        # After the admission hooks: a request the quotas refuse never queues.
        first = f.first = lane.admit(decision.candidates, hint) or await lane.wait(f.receive)
        record.attempt(first.url, first.destination, first.region)
        record.route = hint.explain if hint is not None else None


def _audit(f: Flight) -> Awaitable[None] | None:
    """Content taps (policy opt-in), then the observers' ``on_start``: the audit log makes
    ``request.started`` durable before a byte goes upstream (503 when it cannot)."""
    assert f.decision is not None
    if f.decision.content_hmac:
        _tap_content(f.state, f.record, f.raw, f.out)
    if f.response_scan is not None:
        f.out.tap = _also(f.out.tap, f.response_scan.tap)
    return _started(f) if f.state.hooks.on_start else None


async def _started(f: Flight) -> None:
    for on_start in f.state.hooks.on_start:
        await on_start(f.record)


async def _forward_stage(f: Flight) -> None:
    """To the first replica, with retries (:mod:`gateway.relay.forward`); a client disconnect
    cancels the upstream request; the response's scans end after its last byte."""
    assert f.pool is not None and f.decision is not None and f.parsed is not None
    assert f.first is not None
    extensions = f.scope.get("extensions") or {}
    if lost_now(extensions) is not None:
        # The client left while request.started waited for the store: nothing goes upstream.
        raise ClientGone()
    watch = DisconnectWatch(f.receive, extensions.get(DISCONNECT_EXTENSION))
    exchange = Exchange(f.state, f.pool, f.decision.candidates, f.parsed, f.head.accept,
                        f.head.forwarded, f.out, f.record, watch, f.t0, f.hint, f.masker)
    if f.lane is not None:
        f.lane.go()  # forward counts the request in flight from here
    # Forward while watching for a client disconnect (which cancels the upstream request).
    watch.start()
    try:
        await forward(exchange, f.first)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not watch.fired or task is None:
            raise
        task.uncancel()
        # An SDK that closes at [DONE] leaves before the replica's end of the body: answered.
        exchange.record.ended("ok" if answered_before_leaving(f.out, extensions)
                              else "client_disconnect")
    finally:
        watch.finish()
    if f.response_scan is not None:
        await f.response_scan.finish(f.record)  # after the last byte: no cost to TTFT
    if f.masker is not None:
        f.masker.finish(f.record)


def _account(f: Flight) -> Awaitable[None] | None:
    """The observers' ``on_end`` (completion record, quota settlement, spans and metrics) and
    the access line."""
    if f.state.hooks.on_end:
        return _account_ended(f)
    if f.state.settings.logging.access_log:
        f.state.access.request(f.record)
    return None


async def _account_ended(f: Flight) -> None:
    await f.state.hooks.ended(f.record)
    if f.state.settings.logging.access_log:
        f.state.access.request(f.record)


STAGES: tuple[Stage, ...] = (
    Stage("authenticate", _authenticate),
    Stage("classify", _classify),
    Stage("read", _read),
    Stage("inspect", _inspect),
    Stage("route", _route_stage),
    Stage("admit", _admit),
    Stage("audit", _audit),
    Stage("forward", _forward_stage),
    Stage("account", _account, always=True),
)
"""The stages of a relay request, in the order :func:`handle` runs them: the others in
order until one refuses, then the ``always`` ones. The one list of the request's order."""

_IN_ORDER = tuple(stage.run for stage in STAGES if not stage.always)
_AT_END = tuple(stage.run for stage in STAGES if stage.always)


def _check_target(scope: Scope) -> None:
    """Only plain relay paths, only POST."""
    if escaped_api_path(scope):  # the one rule of every API path (gateway.h1.asgi_io)
        raise PathNotFound("Not Found")
    if scope["method"] != "POST":
        raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use POST.")


def _read_head(state: GatewayState, scope: Scope) -> _Head:
    head = _Head()
    class_header = state.class_header
    for name, value in scope["headers"]:
        if name == b"authorization":
            if head.auth is not None:  # which one would count? neither: refused
                raise ambiguous_credentials()
            head.auth = value
        elif name == b"content-length":
            try:
                head.declared = int(value)
            except ValueError as exc:
                raise InvalidRequest("Invalid Content-Length header.") from exc
        elif name == b"accept":
            head.accept = value.decode("latin-1")
        elif name in state.forward_headers:
            head.forwarded.append((name.decode("latin-1"), value.decode("latin-1")))
        if name == class_header:
            if head.class_value is not None:  # which one would count? neither: refused
                raise repeated_header(name.decode("latin-1"))
            head.class_value = value.decode("latin-1")
    return head


def _caller(
    state: GatewayState, head: _Head, record: RequestRecord, scope: Scope
) -> Principal:
    try:
        principal: Principal = state.authenticator.authenticate(bearer_token(head.auth), scope)
    except GatewayError as exc:  # gateway.identity: a verified caller that no rule admits
        record.identity = getattr(exc, "identity", None)
        raise
    record.identify(principal.key_id, principal.team, principal.data_class)
    if principal.identity is not None:  # gateway.identity: who, and what verified it
        record.identity = principal.identity.audit_fields()
    return principal


def _authorised_pool(
    state: GatewayState, principal: Principal, label: str, record: RequestRecord
) -> Pool:
    pool = state.router.resolve(label, principal.may_use)
    if pool is None:
        raise ModelNotFound(f"The model '{label}' does not exist.", param="model")
    model = pool.model
    record.describe(record.model, record.stream, model.name, pool.upstream_name)
    if not principal.may_use(model.name):
        raise ModelNotAllowed(
            f"The API key '{principal.key_id}' may not use the model '{model.name}'.",
            param="model",
        )
    return pool


def _route(
    state: GatewayState, principal: Principal, pool: Pool, record: RequestRecord
) -> RouteDecision:
    """The routing policy's decision; refuse when it allows no replica."""
    model = pool.model
    decision = state.routes.decide(principal, pool)  # decided at assembly for config keys
    record.decided(decision.rule_id, decision.revision, bool(decision.candidates))
    if decision.revision is not None:
        if not decision.candidates:
            rule = f"rule {decision.rule_id}" if decision.rule_id else "no rule matched"
            raise PolicyDenied(
                f"The egress policy allows no replica of '{model.name}' for this request "
                f"({rule}): {decision.reason}",
                param="model",
            )
    if not decision.candidates:
        raise ModelNotAllowed(
            f"No replica of '{model.name}' is allowed for this key by the egress policy"
            + (f" (rule {decision.rule_id})." if decision.rule_id else "."),
            param="model",
        )
    return decision


