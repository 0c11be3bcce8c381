"""The per-request record and the hooks that observe it (audit, quotas, telemetry).

Life cycle of one relayed request (``POST /v1/...``), in the order the relay calls the hooks:

1. ``on_request(record, headers)`` (optional hook) as soon as the request arrives, with the raw
   ASGI request headers (telemetry continues the client's ``traceparent`` here).
2. Authentication, classification, body validation, model resolution, authorisation and
   routing. A failure here ends the request with ``outcome="denied"`` (or ``"invalid"``); only
   ``on_end`` is called then.
3. ``admission`` hooks (quotas) are awaited with the record and the parsed body; any may raise a
   :class:`~gateway.errors.GatewayError` (for example a 429) to refuse.
4. Content opt-in: when the deciding policy rule sets ``audit: {content_hmac: true}``,
   ``record.content_hmac`` is ``True`` and every observer with a ``content_tap`` hook is handed
   the request body bytes (the very object the relay read, no copy) and may return a tap that
   the responder then calls with every response body chunk. Without the opt-in nothing is
   copied or called.
5. Every observer's ``on_start`` is awaited, in order, *before* a byte goes upstream (the audit
   log makes its "started" record durable here). Any may raise a ``GatewayError`` (for example
   a 503 when the audit store is down): the request is then refused and never forwarded.
6. ``on_response_start(record, headers)`` (optional hook) when the response status line is
   about to be sent; it may append headers (quotas add ``x-ratelimit-*``).
7. The response is relayed; then every observer's ``on_end`` is awaited once with the final
   record (also when the client disconnected or the upstream failed). Exceptions from ``on_end``
   are logged, never sent to the client.
8. ``end_recorded(record) -> bool`` (optional hook): when any observer has it, the responder
   holds back the end of the response (the last chunk of a sized body, the ``data: [DONE]``
   event, or a Responses API stream's ``response.completed`` event, and what follows of a
   stream) until step 7 is over, and sends it only if every such
   hook answers ``True`` (the audit log: the completion record is durable). Otherwise the
   connection is closed without the end, so a client never fully receives a response whose
   completion is not recorded.
9. ``on_undelivered(record, bytes_out)`` (optional hook, awaited): the end was released after
   ``on_end`` but the client's connection was lost before it went out (the gateway's own
   server tells, ``LOST_EXTENSION``): the final record overstates what the client got;
   ``bytes_out`` is the body bytes it did get (the audit log appends ``request.undelivered``).

Optional hooks are found once, when the app is built (:meth:`ObserverHooks.of`), never per
request. The record never holds prompts, completions or keys; it is written only through its
named methods (:meth:`RequestRecord.authenticated`, :meth:`~RequestRecord.requested`, ...).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from gateway.bounded import PREFIX_CHARS, bounded

__all__ = [
    "AdmissionHook", "ContentObserver", "ContentTap", "EndGate", "Headers", "ObserverHooks",
    "Outcome", "RequestHook", "RequestObserver", "RequestRecord", "ResponseStartHook",
    "UndeliveredHook", "trace_id_of",
]

ContentTap = Callable[[bytes], None]
"""Called with each response body chunk exactly as sent to the client, in order."""

Outcome = Literal[
    "pending",
    "ok",
    "invalid",  # 400 / 413 / 404: malformed or unknown
    "denied",  # 401 / 403 / refused by an admission hook or observer
    "upstream_error",  # backend failed (5xx, connect error, broken stream)
    "timeout",  # connect / first byte / idle timeout
    "client_disconnect",  # the client went away; upstream was cancelled
    "gateway_error",  # a bug in the gateway (500)
]


_log = logging.getLogger(__name__)


_HEX_LC = frozenset(b"0123456789abcdef")


def trace_id_of(traceparent: bytes | str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header value; ``None`` if absent or invalid.

    W3C Trace Context (Recommendation, section 3.2): ``version-traceid-parentid-flags``, each
    field lowercase hex of 2, 32, 16 and 2 digits; version ``ff`` is invalid; an all-zero trace
    id or parent id is invalid; version ``00`` has exactly these four fields, a later version
    may append ``-`` and more (at most 512 characters in all). Whitespace around the value is
    ignored (HTTP OWS). Uppercase hex is invalid, not lower-cased: a header a client cannot
    send validly links nothing in the audit log. OpenTelemetry's
    ``TraceContextTextMapPropagator`` is the oracle of the generated test
    (``tests/gateway/test_traceparent.py``).

    Args:
        traceparent: The header value (bytes as received, or text).

    Returns:
        The 32-digit lowercase trace id, or ``None``.
    """
    if not traceparent:
        return None
    raw = traceparent.encode("latin-1") if isinstance(traceparent, str) else traceparent
    if len(raw) > 512:  # OpenTelemetry's bound on the header
        return None
    raw = raw.strip(b" \t")
    if len(raw) < 55 or (len(raw) > 55 and (raw[55:56] != b"-" or raw[:2] == b"00")):
        return None
    if raw[2:3] != b"-" or raw[35:36] != b"-" or raw[52:53] != b"-":
        return None
    version, trace, parent, flags = raw[:2], raw[3:35], raw[36:52], raw[53:55]
    if not _HEX_LC.issuperset(version + trace + parent + flags) or version == b"ff":
        return None
    if trace == b"0" * 32 or parent == b"0" * 16:
        return None
    return trace.decode("ascii")


def _client_trace_id(scope: Mapping[str, Any]) -> str | None:
    """The trace id of the client's W3C ``traceparent`` (links a chat completion to the tool
    calls its answer asked for in the audit log; telemetry replaces it with its span's)."""
    for name, value in scope.get("headers") or ():
        if name == b"traceparent":
            return trace_id_of(value)
    return None


def _request_id() -> str:
    """A random version-4 UUID as 32 hex digits (``uuid.uuid4().hex``, without the UUID
    object: a third of the time)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


@dataclass(slots=True)
class RequestRecord:
    """Who asked what, where it went, and how it ended.

    Attributes:
        request_id: Gateway-assigned id (also sent upstream and to the client as x-request-id).
        started_at: Wall-clock start, Unix epoch seconds.
        method: HTTP method.
        path: Request path (``/v1/chat/completions``).
        client_addr: ``host:port`` of the TCP peer.
        key_id: Id of the authenticated key (``None`` if authentication failed).
        team: Team of the key.
        data_class: Data class of the key.
        model: Model name as the client sent it (may be an alias).
        canonical_model: Configured model name.
        served_model: Name sent to the backend.
        stream: Whether the client asked for a stream.
        replica_url: Replica of the last attempt.
        destination: Policy destination id of that replica.
        region: Region of that destination (from the egress policy).
        policy_rule: Policy rule that allowed the routing, if a policy is configured.
        policy_decision: ``"allow"`` or ``"deny"`` when an egress policy decided, else ``None``.
        policy_revision: Revision (``sha256:<hex>``) of the policy that decided.
        trace_id: W3C trace id (32 hex) of the request's server span, when tracing is on.
        attempts: Upstream attempts made (retries = attempts - 1).
        status: HTTP status sent to the client (200 even if a stream later failed).
        outcome: How the request ended.
        error_code: Gateway error code, if any.
        reason: Why it was refused, for the logs only (never sent), when the error code
            does not say it alone (:attr:`gateway.errors.GatewayError.reason`:
            ``missing_credential``, ``unknown_key``, ``invalid_token``,
            ``ambiguous_credentials``); else ``None``.
        input_tokens: Prompt tokens (from the backend's usage).
        output_tokens: Completion tokens (estimated when ``usage_estimated``).
        usage_estimated: ``output_tokens`` is the gateway's estimate, not the backend's usage:
            a stream ended without a usage event (client disconnect, broken or timed-out
            upstream) after relaying content; counted as one token per relayed SSE data event
            (see :class:`gateway.relay.rewrite.SSEUsageScanner`). ``input_tokens`` stays
            ``None`` then.
        latency_ms: Total time in the gateway, milliseconds.
        ttft_ms: Time to the first response byte from the backend, milliseconds.
        bytes_in: Request body bytes received from the client.
        bytes_out: Response body bytes sent to the client.
        content_hmac: The deciding policy rule opted in to content HMACs (see module docstring).
        route: How a fleet-aware strategy chose the first replica (``prefix_affinity``):
            strategy, reason, replica position, matched and prompt blocks, and the load figures
            used (see :mod:`gateway.fleet.scoring`); ``None`` for the other strategies.
        flow: Flow control (see :mod:`gateway.flow`): ``{"class", "outcome", "wait_ms"}`` with
            outcome ``immediate``, ``dispatched``, ``queue_full``, ``queue_timeout`` or
            ``client_disconnect`` and the wait in the gateway (integer milliseconds); ``None``
            when flow control does not cover the model or the request was refused before.
        pii: The sensitive-data scan (see :mod:`gateway.pii.request`): ``{"entities": {type: count},
            "actions", "rules", "class_before", "class_after", "error", "scan_us"}``; ``None``
            when the policy has no ``pii`` section or the path is not scanned.
    """

    request_id: str
    started_at: float
    method: str
    path: str
    client_addr: str | None = None
    key_id: str | None = None
    team: str | None = None
    data_class: str | None = None
    model: str | None = None
    canonical_model: str | None = None
    served_model: str | None = None
    stream: bool = False
    replica_url: str | None = None
    destination: str | None = None
    region: str | None = None
    policy_rule: str | None = None
    policy_decision: str | None = None
    policy_revision: str | None = None
    trace_id: str | None = None
    attempts: int = 0
    status: int = 0
    outcome: Outcome = "pending"
    error_code: str | None = None
    reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    usage_estimated: bool = False
    latency_ms: float | None = None
    ttft_ms: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    content_hmac: bool = False
    route: dict[str, Any] | None = None
    flow: dict[str, Any] | None = None
    pii: dict[str, Any] | None = None
    identity: dict[str, Any] | None = None

    @classmethod
    def for_scope(cls, scope: Mapping[str, Any]) -> RequestRecord:
        """A new record for the ASGI HTTP request ``scope``: a fresh 32-hex-digit request id,
        the wall-clock start (Unix epoch seconds), method, path (:func:`gateway.bounded.bounded`
        when longer than 64 characters or not printable) and ``host:port`` of the client,
        and the trace id of the client's ``traceparent``.
        """
        client = scope.get("client")
        path: str = scope["path"]
        return cls(
            request_id=_request_id(),
            started_at=time.time(),
            method=scope["method"],
            # Reported only (records, spans, logs): a client's long path is bounded here, once.
            path=path if len(path) <= PREFIX_CHARS and path.isprintable() else bounded(path),
            client_addr=f"{client[0]}:{client[1]}" if client else None,
            trace_id=_client_trace_id(scope),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (no prompts, no keys)."""
        return asdict(self)

    # The named writers: the relay, the forwarder, the backends and the tracer write the
    # record only through these.

    def identify(self, key_id: str | None, team: str | None, data_class: str | None) -> None:
        """Who asked: the authenticated key, its team and the request's data class."""
        self.key_id = key_id
        self.team = team
        self.data_class = data_class

    def detected(self, verdict: dict[str, Any]) -> None:
        """The sensitive-data scan's verdict (:meth:`policy.PiiVerdict.as_record`: entity
        types and counts, actions, class before and after; never matched text)."""
        self.pii = verdict

    def received(self, bytes_in: int) -> None:
        """The request body arrived: ``bytes_in`` bytes."""
        self.bytes_in = bytes_in

    def describe(
        self, model: str | None, stream: bool, canonical_model: str | None = None,
        served_model: str | None = None,
    ) -> None:
        """What was asked: the model as sent, stream mode, and the configured model it is."""
        self.model = model
        self.stream = stream
        self.canonical_model = canonical_model
        self.served_model = served_model

    def decided(self, rule: str | None, revision: str | None, allowed: bool) -> None:
        """The routing decision of the egress policy (``revision`` ``None``: no policy)."""
        self.policy_rule = rule
        if revision is not None:
            self.policy_revision = revision
            self.policy_decision = "allow" if allowed else "deny"

    def attempt(
        self, url: str, destination: str | None, region: str | None, attempts: int | None = None
    ) -> None:
        """Where it goes: the replica of the current attempt (``attempts`` so far, if any)."""
        self.replica_url = url
        self.destination = destination
        self.region = region
        if attempts is not None:
            self.attempts = attempts

    def first_byte(self, ttft_ms: float) -> None:
        """The backend's first response byte arrived after ``ttft_ms`` milliseconds."""
        self.ttft_ms = ttft_ms

    def used(self, input_tokens: int | None, output_tokens: int | None,
             estimated: bool = False) -> None:
        """Token usage: from the backend, or (``estimated``) the gateway's output estimate."""
        if estimated:
            self.output_tokens = output_tokens
            self.usage_estimated = True
            return
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens

    def ended(self, outcome: Outcome) -> None:
        """How it ended, without an error code of the gateway's."""
        self.outcome = outcome

    def failed(self, outcome: Outcome, error_code: str | None,
               reason: str | None = None) -> None:
        """How it ended, with the gateway error code sent to the client and, when that code
        does not say why alone, the ``reason`` for the logs (never sent)."""
        self.outcome = outcome
        self.error_code = error_code
        self.reason = reason

    def content_opt_in(self) -> None:
        """The deciding policy rule opted in to content HMACs (see the module docstring)."""
        self.content_hmac = True

    def flowed(self, class_name: str, outcome: str, wait_ms: int) -> None:
        """Flow control: the request's class, how it left the gateway's queue, its wait (ms)."""
        self.flow = {"class": class_name, "outcome": outcome, "wait_ms": wait_ms}

    def traced(self, trace_id: str) -> None:
        """The W3C trace id (32 hex) of the request's server span."""
        self.trace_id = trace_id

    def sent(self, status: int, bytes_out: int, latency_ms: float) -> None:
        """What the client got: status, body bytes, and the total time in milliseconds."""
        self.status = status
        self.bytes_out = bytes_out
        self.latency_ms = latency_ms


class RequestObserver(Protocol):
    """Observes relayed requests (audit log, quotas, telemetry).

    Required: ``on_start`` and ``on_end``. Optional hooks, found once by
    :meth:`ObserverHooks.of`: ``on_request`` (:class:`RequestHook`), ``on_response_start``
    (:class:`ResponseStartHook`), ``content_tap`` (:class:`ContentObserver`) and
    ``end_recorded`` (:class:`EndGate`), ``on_undelivered`` (:class:`UndeliveredHook`); the
    module docstring says when each is called.
    """

    async def on_start(self, record: RequestRecord) -> None:
        """Called before forwarding; raise a ``GatewayError`` to refuse the request."""
        ...

    async def on_end(self, record: RequestRecord) -> None:
        """Called once when the request has ended (whatever the outcome)."""
        ...


class AdmissionHook(Protocol):
    """Admission control before forwarding (quotas; telemetry keeps span parameters)."""

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        """Raise a ``GatewayError`` (e.g. ``RateLimited``) to refuse; ``body`` is read-only."""
        ...


Headers = list[tuple[bytes, bytes]]
"""Raw ASGI headers: ``(lower-case name, value)`` byte pairs."""


class RequestHook(Protocol):
    """An observer that sees the raw request headers when the request arrives."""

    def on_request(self, record: RequestRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Called first, before authentication; must not raise."""
        ...


class ResponseStartHook(Protocol):
    """An observer that may add response headers."""

    def on_response_start(self, record: RequestRecord, headers: Headers) -> None:
        """Called just before the status line is sent; may append to ``headers``."""
        ...


class ContentObserver(Protocol):
    """An observer that digests request and response content when a policy rule opts in."""

    def content_tap(self, record: RequestRecord, body: bytes) -> ContentTap | None:
        """Digest the request ``body`` (never keep it); return a tap for the response, if any.

        Called only when ``record.content_hmac`` is set, after admission and before
        ``on_start``. Must not raise.
        """
        ...


class EndGate(Protocol):
    """An observer that must confirm a request's completion before its response may end."""

    def end_recorded(self, record: RequestRecord) -> bool:
        """Called after every ``on_end``: ``True`` if the end of the response may be sent."""
        ...


class UndeliveredHook(Protocol):
    """An observer told when a response recorded as delivered did not reach the client."""

    async def on_undelivered(self, record: RequestRecord, bytes_out: int) -> None:
        """Called after ``on_end`` and the release of the end, when the client left before the
        end went out; ``bytes_out``: the body bytes it did get. Exceptions are logged."""
        ...


@dataclass(frozen=True, slots=True)
class ObserverHooks:
    """The bound hooks of a gateway's observers and admission hooks, in call order.

    Built once per app by :meth:`of`; the relay calls these tuples and nothing else.
    """

    on_request: tuple[Callable[[RequestRecord, Sequence[tuple[bytes, bytes]]], None], ...] = ()
    admit: tuple[Callable[[RequestRecord, Mapping[str, Any]], Awaitable[None]], ...] = ()
    content_tap: tuple[Callable[[RequestRecord, bytes], ContentTap | None], ...] = ()
    on_start: tuple[Callable[[RequestRecord], Awaitable[None]], ...] = ()
    on_response_start: tuple[Callable[[RequestRecord, Headers], None], ...] = ()
    on_end: tuple[Callable[[RequestRecord], Awaitable[None]], ...] = ()
    end_recorded: tuple[Callable[[RequestRecord], bool], ...] = ()
    undelivered: tuple[Callable[[RequestRecord, int], Awaitable[None]], ...] = ()

    async def ended(self, record: RequestRecord) -> None:
        """Run every ``on_end`` hook for ``record``, in order; a hook that raises is logged
        (with the request id) and the others still run."""
        for on_end in self.on_end:
            try:
                await on_end(record)
            except Exception:
                _log.exception("observer on_end failed (request %s)", record.request_id)

    @classmethod
    def of(
        cls, observers: Sequence[RequestObserver], admission: Sequence[AdmissionHook] = ()
    ) -> ObserverHooks:
        """Collect the hooks of ``observers`` (in order) and ``admission`` (in order).

        Optional hooks are looked up here, once, so the hot path never probes an object.
        """

        def optional(name: str) -> tuple[Any, ...]:
            return tuple(h for h in (getattr(o, name, None) for o in observers) if h is not None)

        return cls(
            on_request=optional("on_request"),
            admit=tuple(hook.admit for hook in admission),
            content_tap=optional("content_tap"),
            on_start=tuple(o.on_start for o in observers),
            on_response_start=optional("on_response_start"),
            on_end=tuple(o.on_end for o in observers),
            end_recorded=optional("end_recorded"),
            undelivered=optional("on_undelivered"),
        )
