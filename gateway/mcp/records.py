"""The audit records of one MCP call or refusal (``mcp.started``, ``mcp.tool_call`` /
``mcp.refused``).

A message forwarded upstream (tool calls, other requests, notifications, client responses)
has two records in the gateway's hash chain: ``mcp.started``, durable before a byte of it
leaves (who, where, what, the SHA-256 of the arguments: the fields known then), and
``mcp.tool_call``, durable before the last bytes of its answer go out; a refused request
has one, ``mcp.refused``. As ``request.started``/``request.completed`` for model calls
(docs/audit.md "Durability"): a store that cannot write the first record means 503
``audit_unavailable`` and nothing forwarded. It holds
who, where, what and why, the SHA-256 of the arguments and of the result (never their
content), byte counts, the duration, the verified identity of a token or client certificate
(issuer, subject pseudonym, scopes) and the W3C trace id that links it to the chat completion
whose answer asked for the call. A server, tool or prompt name not known to exist is recorded
as its SHA-256 and length only (``unknown_names``). A refusal of a caller not authenticated
is not one record per request: it is counted per client and reason
(:meth:`CallRecord.counted_fields`), with no trace id.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.h1.asgi_io import DISCONNECT_EXTENSION, LOST_EXTENSION

__all__ = ["MCP_REFUSED", "MCP_STARTED", "MCP_TOOL_CALL", "MCP_UNDELIVERED", "CallRecord",
           "name_digest"]

MCP_STARTED = "mcp.started"
MCP_TOOL_CALL = "mcp.tool_call"
MCP_REFUSED = "mcp.refused"
MCP_UNDELIVERED = "mcp.undelivered"

@dataclass
class CallRecord:
    """What is known about one MCP request as it goes (filled in by the endpoint)."""

    server: str | None
    method: str | None = None
    started: float = field(default_factory=time.monotonic)
    started_us: int = field(default_factory=lambda: int(time.time() * 1_000_000))
    key_id: str | None = None
    team: str | None = None
    data_class: str | None = None
    destination: str | None = None
    tool: str | None = None
    protocol_version: str | None = None
    decision: str = "deny"
    reason: str | None = None
    status: int = 0
    arguments_sha256: str | None = None
    params_sha256: str | None = None  # of the other params forwarded (_meta, other keys)
    result_sha256: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    trace_id: str | None = None
    rpc_error: int | None = None
    pii: dict[str, Any] | None = None  # sensitive data in the arguments (types, counts, classes)
    identity: dict[str, Any] | None = None  # a token's or certificate's verified caller
    prompt: str | None = None  # prompts/get, completion/complete of a prompt
    resource_sha256: str | None = None  # of the (first refused, else last) resource URI
    withheld: dict[str, Any] | None = None  # resources withheld from the answer (count, rules)
    asked: dict[str, str] = field(default_factory=dict)  # names asked for, not known (yet)
    client_host: str | None = None  # the peer's address (a counted refusal's client)
    forwarded: bool = False  # the message went upstream (then it is always recorded)
    client_gone: bool = False  # the client's connection was lost before its answer ended
    started_recorded: bool = False  # its mcp.started is durable (a final record follows)
    recorded: bool = False
    lost: Callable[[], int | None] | None = field(default=None, repr=False)
    """The server's ``LOST_EXTENSION`` (:mod:`gateway.h1.asgi_io`), when it offers one."""
    _request_id: str | None = field(default=None, repr=False)

    @property
    def request_id(self) -> str:
        """A random id (32 hex), drawn when first asked for: by the audit record or a log
        line (a call neither records nor logs does not pay for the random bytes)."""
        if self._request_id is None:
            self._request_id = secrets.token_hex(16)
        return self._request_id

    def ask(self, what: str, name: str) -> None:
        """Note the ``server``, ``tool`` or ``prompt`` name the request asks for, not yet
        known to exist: until :meth:`confirm` it is recorded as its SHA-256 and length only
        (``unknown_names``), never as given (it is the client's text: it may hold data, and
        be of any length), and it is no metric label or span attribute."""
        self.asked[what] = name

    def confirm(self, what: str) -> None:
        """The asked ``what`` name is known (a declared server, a tool of its catalogue, a
        prompt the server answered): from now on it is recorded as given."""
        name = self.asked.pop(what, None)
        if name is not None:
            setattr(self, what, name)

    @property
    def authenticated(self) -> bool:
        """The caller is known (a key, or a verified identity refused later)."""
        return self.key_id is not None or self.identity is not None

    def note_resource(self, uri: str) -> None:
        """Record the SHA-256 of a resource URI the request names (never the URI: it may
        carry data, e.g. a name or an id, that the ``pii`` section has not yet seen)."""
        self.resource_sha256 = hashlib.sha256(uri.encode("utf-8", "surrogatepass")).hexdigest()

    @property
    def duration_us(self) -> int:
        """Microseconds since the request arrived."""
        return int((time.monotonic() - self.started) * 1_000_000)

    def event(self) -> dict[str, Any]:
        """The audit event (``mcp.tool_call`` when forwarded, else ``mcp.refused``)."""
        return {
            "type": MCP_TOOL_CALL if self.decision == "allow" else MCP_REFUSED,
            "request_id": self.request_id,
            "started_us": self.started_us,
            "key_id": self.key_id,
            "team": self.team,
            "data_class": self.data_class,
            "server": self.server,
            "destination": self.destination,
            "mcp_method": self.method,
            "tool": self.tool,
            "protocol_version": self.protocol_version,
            "decision": self.decision,
            "reason": self.reason,
            "status": self.status,
            "rpc_error": self.rpc_error,
            "arguments_sha256": self.arguments_sha256,
            "result_sha256": self.result_sha256,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "duration_us": self.duration_us,
            "trace_id": self.trace_id,
            **({"pii": self.pii} if self.pii is not None else {}),
            **({"identity": self.identity} if self.identity is not None else {}),
            **({"prompt": self.prompt} if self.prompt is not None else {}),
            **({"resource_sha256": self.resource_sha256}
               if self.resource_sha256 is not None else {}),
            **({"withheld": self.withheld} if self.withheld is not None else {}),
            **({"params_sha256": self.params_sha256} if self.params_sha256 is not None else {}),
            **({"unknown_names": {what: name_digest(name) for what, name in self.asked.items()}}
               if self.asked else {}),
            # As the relay's request.completed outcome: the answer was not delivered.
            **({"outcome": "client_disconnect"} if self.client_gone else {}),
            # Its mcp.started is in the chain, but the client left before it went upstream.
            **({"forwarded": False} if self.started_recorded and not self.forwarded else {}),
        }

    def watch_client(self, scope: Mapping[str, Any]) -> Callable[[], None] | None:
        """Note (:attr:`client_gone`) when the client's connection is lost before the answer
        ends, through the gateway server's disconnect watch (``DISCONNECT_EXTENSION`` of
        :mod:`gateway.h1.asgi_io`; another ASGI server: not noted).

        Returns:
            ``unwatch()`` to call when the request is over, or ``None`` (nothing watched).
        """
        extensions = scope.get("extensions") or {}
        lost_of = extensions.get(LOST_EXTENSION)
        self.lost = lost_of() if lost_of is not None else None  # bound to this request
        watch = extensions.get(DISCONNECT_EXTENSION)
        if watch is None:
            return None

        def gone() -> None:
            self.client_gone = True

        unwatch: Callable[[], None] | None = watch(gone)
        return unwatch

    def left(self) -> bool:
        """Whether the client's connection is lost now (noted in :attr:`client_gone`; with
        the server's ``LOST_EXTENSION``, :attr:`bytes_out` is cut to the body bytes handed
        to the connection before: what a final record may count as sent)."""
        gone = self.lost() if self.lost is not None else None
        if gone is not None:
            self.client_gone = True
            self.bytes_out = min(gone, self.bytes_out)
        return self.client_gone

    def undelivered_event(self, sent: int) -> dict[str, Any]:
        """The ``mcp.undelivered`` event: the client left after this call's final record was
        durable but before the last bytes of its answer went out; ``sent``: the body bytes
        its connection was handed (the final record's ``bytes_out`` is ``bytes_recorded``)."""
        return {"type": MCP_UNDELIVERED, "request_id": self.request_id,
                "outcome": "client_disconnect", "bytes_out": sent,
                "bytes_recorded": self.bytes_out}

    def started_event(self) -> dict[str, Any]:
        """The ``mcp.started`` event of a message about to be forwarded: the fields of
        :meth:`event` known before the answer (no status, result, duration or bytes out)."""
        event = self.event()
        for name in ("status", "rpc_error", "reason", "result_sha256", "bytes_out",
                     "duration_us", "withheld", "outcome"):
            event.pop(name, None)
        event["type"] = MCP_STARTED
        return event

    def counted_fields(self) -> dict[str, Any]:
        """The fields of a refusal counted per client and reason
        (:meth:`gateway.audit.observer.AuditObserver.mcp_refused`): nothing that differs
        between two requests (no request id, time, trace id or name asked for)."""
        return {"server": self.server, "destination": self.destination, "decision": "deny",
                "reason": self.reason, "status": self.status, "rpc_error": self.rpc_error}


def name_digest(name: str) -> dict[str, Any]:
    """The recorded form of a name not known to exist: ``{"sha256": hex, "bytes": n}`` (UTF-8)."""
    data = name.encode("utf-8", "surrogatepass")
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
