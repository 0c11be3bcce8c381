"""The MCP endpoint ``/mcp/<server>``: Streamable HTTP in front of a declared upstream server.

Order of one POST (each refusal is a JSON-RPC error with an HTTP status, audited, and nothing
is forwarded)::

    server known -> authenticate (401 + RFC 9728 hint; a bearer token must be issued for this
    server's resource URI, :mod:`gateway.mcp.oauth`) -> Origin -> data class (header, by
    grant) -> body (size, one JSON-RPC object, headers match body) -> the caller's request
    quotas (every message: :meth:`McpEndpoint.admit`; one refused before is charged too) ->
    the token's scopes (403 insufficient_scope) -> policy: the server's
    destination may receive the class -> session bound to this caller -> tools/call: access
    globs, argument size, sensitive data in the arguments (policy ``pii``: the class raised
    and the destination checked again, masked or refused), tool exists, Mcp-Param-*
    headers (2026-07-28), inputSchema, URL arguments; any other message (notifications and
    client responses included): governed by the access rules or refused
    (:mod:`gateway.mcp.governed`: prompts and resources by their globs, protocol messages by
    access to the server, other methods refused), sensitive data in its params or result ->
    forward (checked transport, injected credentials, Mcp-Param-* rebuilt from the forwarded
    arguments) -> relay the answer (ids, bytes, time checked) -> list answers (tools,
    prompts, resources, templates) filtered to what the caller may use, resources the caller
    may not read withheld from every answer (:mod:`gateway.mcp.withhold`) -> audit record

The checks before the forward are :class:`gateway.mcp.checks.MessageChecks`' (data class,
``tools/call`` arguments, sensitive data) and :mod:`gateway.mcp.governed`'s (which messages
may go, under which access rule); the forward and the relay of the answer are
:class:`gateway.mcp.answers.AnswerRelay`'s; the ASGI reading and writing
:mod:`gateway.mcp.asgi`'s.

Modern requests (2026-07-28) are stateless; handshake-era requests (2025-03-26..2025-11-25)
get caller-bound session ids (:mod:`gateway.mcp.sessions`). ``GET`` (the old standalone
stream) is answered 405, as the 2025 revisions allow.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.auth import bearer_token, canonical_path, repeated_header
from gateway.errors import GatewayError
from gateway.h1.asgi_io import REFUSED_EXTENSION
from gateway.mcp.access import ToolAccess
from gateway.mcp.answers import AnswerRelay
from gateway.mcp.asgi import (
    RequestHeaders,
    client_host,
    read_body,
    request_headers,
    send_json,
    send_response,
)
from gateway.mcp.catalogue import Catalogue, FetchSink
from gateway.mcp.checks import MessageChecks
from gateway.mcp.governed import check_message
from gateway.mcp.jsonrpc import (
    FORBIDDEN,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    MODERN_VERSIONS,
    McpRefusal,
    Message,
    check_headers,
    error_body,
    parse_message,
)
from gateway.mcp.limits import ServerGate, quota_refusal
from gateway.mcp.metadata import metadata_document
from gateway.mcp.metrics import McpMetrics
from gateway.mcp.oauth import auth_refusal, caller_identity, challenge, check_scopes
from gateway.mcp.paths import AGGREGATE, PREFIX
from gateway.mcp.records import CallRecord
from gateway.mcp.sessions import SessionBinder
from gateway.mcp.settings import McpSettings
from gateway.mcp.spans import ToolCallSpans
from gateway.mcp.upstream import Link, Upstream
from gateway.quotas import QuotaError
from gateway.quotas.tool_calls import ToolCallQuotas
from gateway.relay.records import trace_id_of
from policy import EgressMatcher, Policy

__all__ = ["McpEndpoint", "holds_slot"]

_log = logging.getLogger(__name__)

SINGLE_HEADERS = frozenset({
    "authorization", "mcp-session-id", "traceparent", "origin", "content-type",
    "last-event-id",
})
"""Single-valued request headers the endpoint reads, refused when repeated (besides the
classification header and the routing headers of :func:`check_headers`); list-valued ones
(``Accept``, ``tracestate``) may be split over lines."""

AuditSink = Callable[[Mapping[str, Any]], Awaitable[Any]]
RefusalSink = Callable[[Mapping[str, Any], str | None], None]


AggregateHandler = Callable[
    ["McpEndpoint", Any, Mapping[str, Any], RequestHeaders, Any, Any], Awaitable[None]]
"""Serves the aggregate endpoint ``/mcp`` with an endpoint's checks
(:func:`gateway.mcp.aggregate.handle_aggregate`, given by :func:`gateway.mcp.wiring`)."""


def holds_slot(msg: Message) -> bool:
    """Does ``msg`` hold a ``max_concurrent`` slot of its caller while its answer lasts? A
    request does; a notification, a client response (they belong to work already admitted,
    e.g. a call waiting for its client's answer) and a ``subscriptions/listen`` stream (open
    as long as the client likes) only take one of ``requests_per_minute``."""
    return msg.is_request and msg.method != "subscriptions/listen"


class McpEndpoint:
    """Serves ``/mcp/<server>`` for the servers of the ``mcp:`` section.

    Args:
        settings: The ``mcp:`` section.
        policy: The egress policy (``None``: no policy; then a server needs no destination,
            and URL arguments are refused, failing closed).
        matcher: The address checks shared with the process guard (one pin store).
        audit: Appends an audit event and waits until it is durable (``None``: audit off).
        session_key: HMAC key of handshake-era session ids (``None``: random, this process).
        spans: Opens and closes each request's span (``None``: telemetry off).
        quotas: Charges each MCP request to the caller's request quotas (``None``: no quotas).
        count_refusal: Counts a refusal of a caller not authenticated (its record's fields
            and the peer's address) into one record per client and reason per interval
            (:meth:`gateway.audit.observer.AuditObserver.mcp_refused`; ``None``: each is
            appended with ``audit``).
        record_fetch: Told of each of the gateway's own catalogue fetches (``initialize``,
            ``tools/list``... that no client asked for: :class:`gateway.mcp.catalogue.Catalogue`;
            :meth:`gateway.audit.observer.AuditObserver.mcp_catalogue`; ``None``: not recorded).
    """

    def __init__(self, settings: McpSettings, policy: Policy | None,
                 matcher: EgressMatcher | None, audit: AuditSink | None,
                 session_key: bytes | None = None,
                 aggregate: AggregateHandler | None = None,
                 spans: ToolCallSpans | None = None,
                 quotas: ToolCallQuotas | None = None,
                 count_refusal: RefusalSink | None = None,
                 record_fetch: FetchSink | None = None) -> None:
        self.settings = settings
        self._count_refusal = count_refusal
        self._aggregate = aggregate
        self.upstreams = {s.name: Upstream(s) for s in settings.servers}
        self.access = ToolAccess(settings.access)
        self.catalogue = Catalogue(settings.limits, record_fetch)
        self.sessions = SessionBinder(session_key)
        self.answers = AnswerRelay(settings.limits, self.sessions, self.access,
                                   settings.uri_text)
        self.metrics = McpMetrics()
        self.checks = MessageChecks(settings, self.access, self.catalogue, policy, matcher)
        self._audit = audit
        self._spans = spans
        self._quotas = quotas
        self.gates = {s.name: ServerGate(s.name, s.flow) for s in settings.servers
                      if s.flow is not None}

    def rebound(self, policy: Policy | None) -> McpEndpoint:
        """A copy judging by ``policy`` (a live reload's new revision; same destinations),
        sharing the catalogue, session key, metrics and credentials."""
        other = copy.copy(self)
        other.checks = self.checks.rebound(policy)
        return other

    async def startup(self) -> None:
        """Read the injected upstream credentials (a missing Secret fails start-up)."""
        for upstream in self.upstreams.values():
            upstream.load_secret()

    async def handle(self, state: Any, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        """Serve one HTTP request under ``/mcp/`` (or the aggregate endpoint ``/mcp``)."""
        headers = request_headers(scope["headers"])
        # One form for the dispatch and identity.routes (gateway.auth.canonical_path), and
        # no percent-escapes: server names never need one, and /mcp/tools%2f must not be a
        # spelling of /mcp/tools that a proxy in front matching literal paths lets through.
        path = canonical_path(scope["path"])
        escaped = b"%" in (scope.get("raw_path") or b"")
        if (path == AGGREGATE and not escaped and self.settings.aggregate
                and self._aggregate is not None):
            await self._aggregate(self, state, scope, headers, receive, send)
            return
        name = path[len(PREFIX):]
        rec = CallRecord(server=None, trace_id=trace_id_of(headers.get("traceparent")),
                         client_host=client_host(scope))
        rec.ask("server", name)
        msg: Message | None = None
        opened: list[object] = []
        admission: Any = None
        principal: Any = None
        charged = False  # admission asked for (a refusal before it is charged in except)
        unwatch = rec.watch_client(scope)
        try:
            if escaped:
                raise McpRefusal(404, INVALID_REQUEST, "unknown_server",
                                 "an MCP path is spelled without percent-escapes")
            if path == AGGREGATE:
                raise McpRefusal(404, INVALID_REQUEST, "unknown_server",
                                 "the aggregate endpoint /mcp is off (mcp.aggregate)")
            upstream = self.upstreams.get(name)
            if upstream is None:
                raise McpRefusal(404, INVALID_REQUEST, "unknown_server", f"no MCP server {name!r}")
            rec.confirm("server")
            rec.destination = upstream.settings.destination
            principal = self.authenticate(state, headers, scope)
            rec.key_id, rec.team, rec.data_class = (principal.key_id, principal.team,
                                                     principal.data_class)
            rec.identity = caller_identity(principal)  # gateway.mcp.oauth
            method = scope["method"]
            if method == "DELETE":
                charged = True
                admission = await self.admit(principal, hold=False)
                await self._delete(state, upstream, principal.key_id, headers, rec, send)
                return
            msg, body = await self.read_message(scope, headers, receive, rec)
            tool = msg.name if msg.method == "tools/call" else None
            if tool is not None:
                rec.ask("tool", tool)
            rec.protocol_version = check_headers(msg, headers, headers.repeated)
            charged = True  # every message counts, before the checks that may refuse it
            admission = await self.admit(principal, hold=holds_slot(msg))
            check_scopes(self.settings, principal, upstream.name, tool)  # 403 + challenge
            self.checks.check_class(principal, upstream, rec)
            upstream_sid = self._session(principal.key_id, upstream, headers, rec)
            params: Mapping[str, str] = {}
            if msg.method == "tools/call":
                modern = rec.protocol_version in MODERN_VERSIONS
                principal, body, params = await self.checks.check_call(
                    state, upstream, principal, msg, body, rec,
                    headers.params if modern else None)
                params = params if modern else {}
            else:  # every other message, notifications and client responses included
                check_message(self.access, principal, upstream.name, msg, rec)
                principal, body = await self.checks.scan_message(upstream, principal, msg,
                                                                 body, rec)
            await self.forward_allowed(state, upstream, principal, msg, body, headers,
                                       upstream_sid, rec, send, params, opened)
        except McpRefusal as exc:
            if principal is not None and not charged:
                await self.charge_refused(principal)
            await self.refuse(exc, rec, msg, self.challenge(name), send)
        finally:
            if unwatch is not None:
                unwatch()
            if admission is not None:  # no await (no coroutine) when nothing was charged
                await self.settle(admission)
            self.resolve_names(rec)
            self.metrics.observe(rec)
            if self._spans is not None:
                self.end_span(rec, headers, opened)
            if self._audit is not None and not rec.recorded:
                await self.record(rec)

    async def read_message(self, scope: Mapping[str, Any], headers: Mapping[str, str],
                           receive: Any, rec: CallRecord) -> tuple[Message, bytes]:
        """The request's one JSON-RPC message and its body bytes: POST only (405), an allowed
        ``Origin`` (403), the body within ``limits.max_request_bytes`` (413), parsed (400).
        Fills ``rec``'s size and method; the caller checks the ``Mcp-*`` headers against the
        message (:func:`check_headers`), so that a refusal answers the message's id."""
        if scope["method"] != "POST":
            raise McpRefusal(405, INVALID_REQUEST, "method_not_allowed",
                             "use POST (the standalone GET stream is not offered)")
        if "origin" in headers and headers["origin"] not in self.settings.allowed_origins:
            raise McpRefusal(403, FORBIDDEN, "origin_refused", "Origin not allowed")
        body = await read_body(receive, headers, self.settings.limits.max_request_bytes,
                               (scope.get("extensions") or {}).get(REFUSED_EXTENSION))
        rec.bytes_in = len(body)
        msg = parse_message(body)
        rec.method = msg.method
        return msg, body

    async def forward_allowed(self, state: Any, upstream: Upstream, principal: Any,
                              msg: Message, body: bytes, headers: Mapping[str, str],
                              upstream_sid: str | None, rec: CallRecord, send: Any,
                              params: Mapping[str, str], opened: list[object]) -> None:
        """Forward an allowed request through its server's flow gate (a slot, or 503
        ``server_busy``) in a span whose ``traceparent`` goes upstream.

        Args:
            opened: Receives the span when one is opened (for :meth:`end_span`, whatever
                happens to the forward).
        """
        gate = self.gates.get(upstream.name)  # flow control: wait for a slot, or 503
        if gate is None:
            await self._forward(state, upstream, principal, msg, body, headers, upstream_sid,
                                rec, send, params, opened)
            return
        async with gate.slot():
            await self._forward(state, upstream, principal, msg, body, headers, upstream_sid,
                                rec, send, params, opened)

    async def _forward(self, state: Any, upstream: Upstream, principal: Any, msg: Message,
                       body: bytes, headers: Mapping[str, str], upstream_sid: str | None,
                       rec: CallRecord, send: Any, params: Mapping[str, str],
                       opened: list[object]) -> None:
        rec.decision = "allow"
        self.resolve_names(rec)  # the checked tool is in the catalogue: the span names it
        if self._spans is not None:  # the span's traceparent goes upstream
            span, trace_headers = self._spans.forwarding(rec, headers)
            opened.append(span)
            headers = {**headers, **trace_headers}
        if self._audit is not None:
            await self.record_start(rec)  # with the span's trace id
            if rec.left():  # while mcp.started waited for the store: nothing goes upstream
                return
        rec.forwarded = True
        send = self._recorded_before_end(send, rec)
        await self.answers.forward(Link.of(state), upstream, principal, msg, body, headers,
                                   upstream_sid, rec, send, params)

    async def settle(self, admission: Any) -> None:
        """End a request's quota admission (:meth:`admit`; ``None``: nothing charged)."""
        if admission is not None and self._quotas is not None:
            await self._quotas.finish(admission)

    def end_span(self, rec: CallRecord, headers: Mapping[str, str], opened: list[object]) -> None:
        """Close the request's span (or record a refused request's), telemetry on; the span
        of a caller not authenticated joins no trace (its ``traceparent`` is anyone's)."""
        if self._spans is not None:
            if not rec.authenticated:
                headers = {}
            self._spans.finished(rec, headers, opened[0] if opened else None)

    def resolve_names(self, rec: CallRecord) -> None:
        """Confirm the tool name asked for when its server's cached catalogue holds it
        (:meth:`CallRecord.confirm`; not fetched for this: an unconfirmed name is recorded
        as its digest)."""
        tool = rec.asked.get("tool")
        upstream = self.upstreams.get(rec.server) if rec.server is not None else None
        if tool is not None and upstream is not None:
            catalogue = self.catalogue.cached(upstream)
            if catalogue is not None and tool in catalogue.tools:
                rec.confirm("tool")

    async def refuse(self, exc: McpRefusal, rec: CallRecord, msg: Message | None,
                     challenge: bytes, send: Any) -> None:
        """Answer ``exc`` (unless the answer has begun), after its audit record is durable.

        Args:
            challenge: The ``WWW-Authenticate`` value of a 401.
        """
        rec.reason, rec.status, rec.rpc_error = exc.reason, exc.status, exc.rpc_code
        rec.identity = rec.identity or exc.identity  # who a refused verified token was
        if exc.answered is not None:  # the HTTP server answered itself (asgi.read_body)
            rec.bytes_out = exc.answered
            await self.record(rec)
        elif rec.bytes_out == 0:  # nothing sent yet: the refusal is the answer
            extra = []
            if exc.status == 401 and not any(n == b"www-authenticate" for n, _ in exc.headers):
                extra.append((b"www-authenticate", challenge))
            if exc.status == 405:
                extra.append((b"allow", b"POST, DELETE"))
            extra.extend(exc.headers)
            out = error_body(msg.id if msg is not None and msg.is_request else None,
                             exc.rpc_code, exc.message, exc.data)
            rec.bytes_out = len(out)
            await self.record(rec)  # durable before the client hears of the refusal
            await send_json(send, exc.status, out, extra)

    def _recorded_before_end(self, send: Any, rec: CallRecord) -> Any:
        """``send`` that counts the body bytes sent (``rec.bytes_out``) and, with an audit
        chain, makes the request's record durable before the last body bytes go out: a client
        never holds a complete answer whose record is not written (the rule of the relay's
        ``request.completed``, docs/audit.md "Durability"). If the record cannot be written
        the error propagates and the connection closes before the answer ends."""
        audited = self._audit is not None

        async def send_recorded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                rec.bytes_out += len(message.get("body", b""))
                if audited and not message.get("more_body", False) and not rec.recorded:
                    await self.record(rec, durable=True)
                    await send(message)
                    await self.amend_undelivered(rec)
                    return
            await send(message)

        return send_recorded

    async def amend_undelivered(self, rec: CallRecord) -> None:
        """After an answer's last bytes were sent: when the client's connection was lost
        during the durable wait of its record (the server's ``LOST_EXTENSION``), that record
        overstates what the client got; append ``mcp.undelivered`` with the bytes it did get
        (the chain is append-only). A record lost is logged."""
        gone = rec.lost() if rec.lost is not None else None
        if self._audit is None or gone is None or gone >= rec.bytes_out:
            return
        try:
            await self._audit(rec.undelivered_event(gone))
        except Exception:
            _log.exception("audit record mcp.undelivered of MCP request %s lost",
                           rec.request_id)

    async def record_start(self, rec: CallRecord) -> None:
        """Make the ``mcp.started`` record of a message about to be forwarded durable (the
        rule of the relay's ``request.started``): nothing leaves unrecorded.

        Raises:
            McpRefusal: 503 ``audit_unavailable`` when it cannot be written (the message is
                not forwarded; its refusal is this log line, not a record: the store just
                failed, and a second wait for it would only delay the 503).
        """
        assert self._audit is not None
        try:
            await self._audit(rec.started_event())
            rec.started_recorded = True
        except Exception as exc:
            _log.error("audit unavailable, MCP request %s not forwarded: %s",
                       rec.request_id, exc)
            rec.decision = "deny"
            rec.recorded = True  # nothing to wait for: see Raises
            raise McpRefusal(503, INTERNAL_ERROR, "audit_unavailable",
                             "the audit log is unavailable; the request was not forwarded"
                             ) from exc

    async def record(self, rec: CallRecord, durable: bool = False) -> None:
        """Append the request's audit record once: every message forwarded upstream (tool
        calls, notifications and client responses included) and every refusal; only an
        allowed request the aggregate endpoint answered itself (``initialize``,
        ``tools/list``...) is not recorded."""
        if self._audit is None or rec.recorded:
            return
        self.resolve_names(rec)  # a refusal is recorded before the request's end
        if (rec.decision == "allow" and not rec.forwarded and not rec.started_recorded
                and rec.reason is None):
            return
        rec.recorded = True
        rec.left()  # the client gone: outcome client_disconnect, the bytes it was handed
        if not rec.authenticated and self._count_refusal is not None:
            # Anyone can send these: counted per client and reason (gateway.audit.refusals),
            # as the HTTP server's refusals are, so that they cannot flood the chain.
            self._count_refusal(rec.counted_fields(), rec.client_host)
            return
        try:
            await self._audit(rec.event())
        except Exception:
            _log.exception("audit record of MCP request %s lost", rec.request_id)
            if durable:
                raise

    def challenge(self, server: str | None) -> bytes:
        """The 401 challenge of ``/mcp/<server>`` (``None``: the aggregate ``/mcp``)."""
        return challenge(self.settings, server)

    async def handle_metadata(self, scope: Mapping[str, Any], send: Any) -> None:
        """Serve the RFC 9728 document (404 when not configured or another path)."""
        doc = metadata_document(self.settings, scope["path"])
        if doc is None:
            await send_json(send, 404, b'{"error":"not_found"}')
            return
        await send_json(send, 200, json.dumps(doc).encode())

    # -- checks ---------------------------------------------------------------------------

    async def admit(self, principal: Any, hold: bool = True) -> Any:
        """Charge one MCP request to the caller's request quotas (:mod:`gateway.mcp.limits`).

        Args:
            hold: Take a ``max_concurrent`` slot until :meth:`settle` (see
                :func:`holds_slot`).

        Returns:
            The admission for :meth:`settle` (``None``: no quotas, or no limit applies).

        Raises:
            McpRefusal: 429 ``rate_limit_exceeded`` / ``insufficient_quota``, 503
                ``quota_backend_unavailable`` (:func:`gateway.mcp.limits.quota_refusal`).
        """
        if self._quotas is None:
            return None
        identity = getattr(principal, "identity", None)
        org = identity.audit_fields().get("org") if identity is not None else None
        try:
            return await self._quotas.admit(principal.key_id, principal.team, org, hold)
        except QuotaError as exc:
            raise quota_refusal(exc) from exc

    async def charge_refused(self, principal: Any) -> None:
        """Charge a message refused before its admission (its headers, body, session...) as
        one request without a slot, so that refusals are never free; over a limit the
        refusal stands as it is (it is refused anyway)."""
        try:
            await self.settle(await self.admit(principal, hold=False))
        except McpRefusal:
            pass

    def authenticate(self, state: Any, headers: RequestHeaders,
                     scope: Mapping[str, Any]) -> Any:
        """The caller, authenticated as the relay does: with the request's scope, so that
        ``identity.routes`` (per-path credentials) and client certificates apply here too;
        then the classification header, within the caller's grant.

        Raises:
            McpRefusal: 401 (no or bad credential) or 403 (credential not accepted on this
                path, class not granted), mapped from the authenticator's error.
        """
        if headers.repeated:  # which copy would count? neither (the /v1 rule)
            self.refuse_repeated(state, headers)
        token = bearer_token(headers.get("authorization", "").encode("latin-1") or None)
        try:
            principal = state.authenticator.authenticate(token, scope)
            header = state.class_header.decode() if state.class_header is not None else None
            if state.classify is not None and header is not None and header in headers:
                principal = state.classify(principal, headers[header])
        except GatewayError as exc:  # 401 with the resource's challenge (gateway.mcp.oauth)
            raise auth_refusal(self.settings, scope["path"], exc, token is not None) from exc
        return principal

    @staticmethod
    def refuse_repeated(state: Any, headers: RequestHeaders) -> None:
        """Refuse a request that gives a single-valued header the endpoint reads more than
        once (:data:`SINGLE_HEADERS` and the classification header), as ``/v1`` does
        (:func:`gateway.auth.repeated_header`). The routing headers (``Mcp-Method``,
        ``Mcp-Name``, ``MCP-Protocol-Version``) are refused later, by
        :func:`gateway.mcp.jsonrpc.check_headers`, to answer with the message's id.

        Raises:
            McpRefusal: 400, ``-32600``, ``ambiguous_credentials`` (``Authorization``) or
                ``repeated_header``.
        """
        single = SINGLE_HEADERS
        if state.class_header is not None:
            single = single | {state.class_header.decode("latin-1")}
        for name in sorted(headers.repeated & single, key=lambda n: n != "authorization"):
            exc = repeated_header(name)
            raise McpRefusal(400, INVALID_REQUEST, exc.code, exc.message)

    def _session(self, key_id: str, upstream: Upstream, headers: Mapping[str, str],
                 rec: CallRecord) -> str | None:
        presented = headers.get("mcp-session-id")
        if presented is None:
            return None
        if rec.protocol_version in MODERN_VERSIONS:
            raise McpRefusal(400, INVALID_REQUEST, "session_refused",
                             "protocol 2026-07-28 has no sessions")
        sid = self.sessions.unwrap(key_id, upstream.name, presented)
        if sid is None:
            raise McpRefusal(404, INVALID_REQUEST, "session_unknown", "Session not found")
        return sid

    # -- sessions ----------------------------------------------------------------------

    async def _delete(self, state: Any, upstream: Upstream, key_id: str,
                      headers: Mapping[str, str], rec: CallRecord, send: Any) -> None:
        rec.method = "DELETE"
        presented = headers.get("mcp-session-id")
        sid = self.sessions.unwrap(key_id, upstream.name, presented) if presented else None
        if sid is None:
            raise McpRefusal(404, INVALID_REQUEST, "session_unknown", "Session not found")
        rec.decision = "allow"
        if self._audit is not None:
            await self.record_start(rec)
            if rec.left():  # while mcp.started waited for the store: the session stays
                return
        rec.forwarded = True
        self.answers.subscriptions.end((key_id, upstream.name, sid))  # the session ends
        status = await upstream.delete(Link.of(state), sid)
        rec.status = status
        await send_response(send, status, b"", [])

