"""The per-request record and the hooks that observe it (audit, quotas, telemetry seams).

Life cycle of one relayed request (``POST /v1/...``):

1. Authentication, body validation, model resolution, authorisation and routing. A failure here
   ends the request with ``outcome="denied"`` (or ``"invalid"``); only ``on_end`` is called.
2. ``admission`` hooks (quotas, issue 9) are awaited with the record and the parsed body; any may
   raise a :class:`~gateway.errors.GatewayError` (for example a 429) to refuse.
3. Every observer's ``on_start`` is awaited, in order, *before* a byte goes upstream (the audit
   log makes its "started" record durable here). Any may raise a ``GatewayError`` (for example a
   503 when the audit store is down): the request is then refused and never forwarded.
4. The request is relayed; then every observer's ``on_end`` is awaited once with the final record
   (also when the client disconnected or the upstream failed). Exceptions from ``on_end`` are
   logged, never sent to the client.

The record never holds prompts, completions or keys.

Content opt-in (issue 4): when the deciding policy rule sets ``audit: {content_hmac: true}``,
``record.content_hmac`` is ``True`` and, just before step 3, every observer that implements
:class:`ContentObserver` is handed the request body bytes (the very object the relay read, no
copy) and may return a tap that the relay then calls with every response body chunk sent to
the client. Without the opt-in nothing is copied or called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "AdmissionHook", "ContentObserver", "ContentTap", "Outcome", "RequestObserver",
    "RequestRecord",
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
        input_tokens: Prompt tokens (from the backend's usage).
        output_tokens: Completion tokens (estimated when ``usage_estimated``).
        usage_estimated: ``output_tokens`` is the gateway's estimate, not the backend's usage:
            a stream ended without a usage event (client disconnect, broken or timed-out
            upstream) after relaying content; counted as one token per relayed SSE data event
            (see :class:`gateway.sse.SSEUsageScanner`). ``input_tokens`` stays ``None`` then.
        latency_ms: Total time in the gateway, milliseconds.
        ttft_ms: Time to the first response byte from the backend, milliseconds.
        bytes_in: Request body bytes received from the client.
        bytes_out: Response body bytes sent to the client.
        content_hmac: The deciding policy rule opted in to content HMACs (see module docstring).
        route: How a fleet-aware strategy chose the first replica (``prefix_affinity``):
            strategy, reason, replica position, matched and prompt blocks, and the load figures
            used (see :mod:`gateway.fleet.scoring`); ``None`` for the other strategies.
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
    input_tokens: int | None = None
    output_tokens: int | None = None
    usage_estimated: bool = False
    latency_ms: float | None = None
    ttft_ms: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    content_hmac: bool = False
    route: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (no prompts, no keys)."""
        return asdict(self)


class RequestObserver(Protocol):
    """Observes relayed requests (audit log, telemetry)."""

    async def on_start(self, record: RequestRecord) -> None:
        """Called before forwarding; raise a ``GatewayError`` to refuse the request."""
        ...

    async def on_end(self, record: RequestRecord) -> None:
        """Called once when the request has ended (whatever the outcome)."""
        ...


class AdmissionHook(Protocol):
    """Admission control before forwarding (quotas, issue 9)."""

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        """Raise a ``GatewayError`` (e.g. ``RateLimited``) to refuse; ``body`` is read-only."""
        ...


@runtime_checkable
class ContentObserver(Protocol):
    """An observer that digests request and response content when a policy rule opts in."""

    def content_tap(self, record: RequestRecord, body: bytes) -> ContentTap | None:
        """Digest the request ``body`` (never keep it); return a tap for the response, if any.

        Called only when ``record.content_hmac`` is set, after admission and before
        ``on_start``. Must not raise.
        """
        ...
