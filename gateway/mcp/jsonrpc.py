"""JSON-RPC framing of the MCP Streamable HTTP transport: parse one message, check the
request-metadata headers against it, build error responses.

Sources: JSON-RPC 2.0; MCP specification 2026-07-28, ``basic/transports/streamable-http``
("Request Metadata", "Server Validation": ``MCP-Protocol-Version``, ``Mcp-Method``,
``Mcp-Name`` with the ``=?base64?...?=`` sentinel, error ``-32020`` HeaderMismatch and
``-32022`` UnsupportedProtocolVersion) and 2025-06-18 / 2025-11-25 (``initialize`` sessions).

A body is one JSON object: batches (arrays, removed from the protocol in 2025-06-18) are
refused whole, and an object with a repeated key is refused (two ``method`` members would let
the header check and the upstream read different values).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.relay.strict_json import StrictJsonError, loads_strict

__all__ = [
    "HANDSHAKE_VERSIONS",
    "MODERN_VERSIONS",
    "McpRefusal",
    "Message",
    "check_headers",
    "error_body",
    "parse_message",
]

MODERN_VERSIONS = ("2026-07-28",)
"""Stateless per-request versions (``_meta`` carries the version; no ``initialize``)."""
HANDSHAKE_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
"""Streamable-HTTP versions negotiated by ``initialize`` (sessions by ``Mcp-Session-Id``)."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
FORBIDDEN = -32001  # the gateway's refusals (access, data class, egress): HTTP 403
UPSTREAM_ERROR = -32002  # the upstream server misbehaved (wrong id, too large, too slow)

_META_VERSION = "io.modelcontextprotocol/protocolVersion"
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


class McpRefusal(Exception):
    """A request the gateway refuses: answered with ``status`` and a JSON-RPC error, audited.

    Attributes:
        status: HTTP status.
        rpc_code: JSON-RPC error code.
        reason: Stable machine reason for the audit record and metrics.
        message: Human message (never the client's argument values).
        data: Optional JSON-RPC ``error.data``.
        headers: Extra response headers (``Retry-After`` of a limit), lower-case names.
    """

    def __init__(self, status: int, rpc_code: int, reason: str, message: str,
                 data: Any = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or []
        self.status = status
        self.rpc_code = rpc_code
        self.reason = reason
        self.message = message
        self.data = data
        self.identity: dict[str, Any] | None = None
        """The audit fields of a verified caller refused at authentication
        (:func:`gateway.mcp.oauth.auth_refusal`)."""
        self.answered: int | None = None
        """The body bytes of the HTTP server's own answer, when the server refused the request
        itself (:func:`gateway.mcp.asgi.read_body`): nothing more is sent."""


@dataclass(frozen=True, slots=True)
class Message:
    """One parsed client message.

    Attributes:
        obj: The JSON object.
        method: ``method`` (``None`` for a client's JSON-RPC response).
        id: ``id`` (``None`` for a notification).
        is_request: Has both ``method`` and ``id``.
        name: ``params.name`` / ``params.uri`` of named methods.
    """

    obj: dict[str, Any]
    method: str | None
    id: Any
    is_request: bool
    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def meta_version(self) -> str | None:
        """``params._meta["io.modelcontextprotocol/protocolVersion"]`` if present."""
        meta = self.params.get("_meta")
        value = meta.get(_META_VERSION) if isinstance(meta, dict) else None
        return value if isinstance(value, str) else None


def _proposed(msg: Message) -> str | None:
    """The handshake version an ``initialize`` request proposes (``params.protocolVersion``;
    the handshake of 2025-06-18 and 2025-11-25 sends no version header yet), for its record.
    Any other proposal is the server's to negotiate (it answers a version it supports): not
    taken, so that it is not refused here."""
    if msg.method != "initialize":
        return None
    proposed = msg.params.get("protocolVersion")
    return proposed if proposed in HANDSHAKE_VERSIONS else None


def parse_message(body: bytes) -> Message:
    """Parse one JSON-RPC message of a POST body.

    Raises:
        McpRefusal: 400 ``parse_error`` (not JSON; also not UTF-8, a byte order mark,
            ``NaN``, a number overflowing to infinity, a lone surrogate escape, nesting deeper
            than 128 levels), ``batch_refused`` (an array),
            ``invalid_request`` (not a JSON-RPC 2.0 object, or a request whose id is
            null), ``duplicate_key``.
    """
    if body[:1] == b"[" or body.lstrip()[:1] == b"[":
        raise McpRefusal(400, INVALID_REQUEST, "batch_refused",
                         "JSON-RPC batches are not accepted: send one message per POST")
    try:
        # One decoder built once (json.loads with hooks builds one per call); the walk for
        # lone surrogates and nesting depth only when the text could hold either.
        obj = loads_strict(body)
    except StrictJsonError as exc:
        if exc.duplicate_key:
            raise McpRefusal(400, INVALID_REQUEST, "duplicate_key", str(exc)) from exc
        raise McpRefusal(400, PARSE_ERROR, "parse_error",
                         f"body is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request",
                         "body is not a JSON-RPC 2.0 object")
    method = obj.get("method")
    if "method" in obj and not isinstance(method, str):  # "method": null is no response
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request", "method must be a string")
    has_id = "id" in obj
    msg_id = obj.get("id")
    if (has_id and not isinstance(msg_id, str | int | None)) or isinstance(msg_id, bool):
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request",
                         "id must be a string or integer")
    if method is None and not has_id:
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request",
                         "neither a request nor a response")
    if method is not None and has_id and msg_id is None:
        # MCP (basic/index, "Requests"): unlike base JSON-RPC, a request's id MUST NOT be
        # null; the answer to it could not be told from an error about an unparsable message.
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request",
                         "a request's id must not be null")
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise McpRefusal(400, INVALID_REQUEST, "invalid_request", "params must be an object")
    name = None
    if method in _NAMED:
        value = params.get(_NAMED[method])
        if not isinstance(value, str):
            raise McpRefusal(400, INVALID_PARAMS, "invalid_params",
                             f"params.{_NAMED[method]} must be a string")
        name = value
    return Message(obj, method, msg_id, method is not None and has_id, name, params)


def _decode_sentinel(value: str) -> str | None:
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11:
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def _mismatch(msg: Message, text: str) -> McpRefusal:
    return McpRefusal(400, HEADER_MISMATCH, "header_mismatch", f"Header mismatch: {text}")


_ROUTING = ("mcp-protocol-version", "mcp-method", "mcp-name")


def check_headers(msg: Message, headers: Mapping[str, str],
                  repeated: Collection[str] = ()) -> str:
    """Check the request-metadata headers against the body; return the protocol version.

    Modern versions (2026-07-28) require ``MCP-Protocol-Version`` equal to the body's
    ``_meta`` version, ``Mcp-Method`` equal to ``method`` and ``Mcp-Name`` equal to
    ``params.name``/``params.uri`` of named methods. Handshake versions may omit them (they
    predate the headers), but a header that is present must still match the body.

    Args:
        msg: The parsed message.
        headers: Request headers, lower-case names, latin-1 decoded.
        repeated: Lower-case names of the headers the request sent more than once
            (:func:`gateway.mcp.asgi.request_headers`): a routing header given twice is a
            mismatch (readers of the first and of the last copy would disagree).

    Returns:
        The protocol version the request speaks (``2025-03-26`` when nothing says).

    Raises:
        McpRefusal: 400 ``header_mismatch`` (-32020) or ``unsupported_version`` (-32022).
    """
    if repeated:
        for name in _ROUTING:
            if name in repeated:
                raise _mismatch(msg, f"{name} header appears more than once")
    header_version = headers.get("mcp-protocol-version")
    version = header_version or msg.meta_version or _proposed(msg) or "2025-03-26"
    if version not in MODERN_VERSIONS and version not in HANDSHAKE_VERSIONS:
        raise McpRefusal(
            400, UNSUPPORTED_VERSION, "unsupported_version",
            f"Unsupported protocol version {version!r}",
            {"supported": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS], "requested": version},
        )
    modern = version in MODERN_VERSIONS
    if modern and msg.method is not None:
        if header_version is None:
            raise _mismatch(msg, "MCP-Protocol-Version header is required")
        if msg.meta_version != header_version:
            raise _mismatch(msg, f"MCP-Protocol-Version {header_version!r} does not match "
                                 f"_meta protocolVersion {msg.meta_version!r}")
    method_header = headers.get("mcp-method")
    if msg.method is not None:
        if method_header is None and modern:
            raise _mismatch(msg, "Mcp-Method header is required")
        if method_header is not None and method_header != msg.method:
            raise _mismatch(msg, f"Mcp-Method header {method_header!r} does not match body "
                                 f"method {msg.method!r}")
    if msg.name is not None:
        raw = headers.get("mcp-name")
        if raw is None:
            if modern:
                raise _mismatch(msg, "Mcp-Name header is required for " + str(msg.method))
        else:
            decoded = _decode_sentinel(raw)
            if decoded is None:
                raise _mismatch(msg, "Mcp-Name header has an invalid base64 value")
            if decoded != msg.name:
                raise _mismatch(msg, "Mcp-Name header does not match the body's name")
    return version


def error_body(msg_id: Any, code: int, message: str, data: Any = None) -> bytes:
    """A JSON-RPC error response (``id`` ``null`` when the request's id is unknown)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error},
                      separators=(",", ":")).encode()
