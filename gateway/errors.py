"""Gateway errors and their one mapping to OpenAI-style JSON.

Every error the gateway raises on purpose derives from :class:`GatewayError`. Each subclass has a
stable machine ``code`` (the ``error.code`` field clients see), an HTTP ``status`` and an OpenAI
error ``type``. The JSON shape is the one the OpenAI API and vLLM use::

    {"error": {"message": str, "type": str, "param": str | null, "code": str}}

Tree::

    GatewayError
    ├── ConfigError                  (start-up only; never sent to a client)
    ├── InvalidRequest          400  invalid_request / invalid_json
    ├── AuthenticationFailed    401  invalid_api_key
    ├── ModelNotAllowed         403  model_not_allowed
    │   └── PolicyDenied             egress_denied (the egress policy allows no replica)
    ├── ClassChangeRefused      403  class_change_forbidden (x-data-classification not granted)
    ├── SensitiveDataRefused    403  pii_refused (the policy's pii section refuses an entity type)
    ├── ModelNotFound           404  model_not_found
    ├── MethodNotAllowed        405  method_not_allowed
    ├── PayloadTooLarge         413  request_too_large
    ├── RateLimited             429  rate_limit_exceeded   (quotas; carries Retry-After)
    ├── UpstreamError           502  upstream_error
    │   ├── UpstreamConnectError     upstream_connect_error (retried on another replica)
    │   ├── UpstreamEgressDenied     upstream_egress_denied / redirect_refused (transport policy)
    │   └── UpstreamStatusError      upstream_<status>      (relayed 5xx/429 after retries)
    ├── ServiceUnavailable      503  service_unavailable
    │   ├── NoHealthyReplica         no_healthy_replica
    │   ├── UpstreamConnectionsExhausted  upstream_connections_exhausted (no replica at fault)
    │   └── SensitiveDataScanFailed  pii_scan_failed (scan not finished; the request cannot pass)
    └── UpstreamTimeout         504  upstream_timeout (first byte / idle)
        └── UpstreamConnectTimeout   upstream_connect_timeout (retried on another replica)
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = [
    "AuthenticationFailed",
    "ClassChangeRefused",
    "ConfigError",
    "GatewayError",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotAllowed",
    "ModelNotFound",
    "NoHealthyReplica",
    "PayloadTooLarge",
    "PolicyDenied",
    "RateLimited",
    "SensitiveDataRefused",
    "SensitiveDataScanFailed",
    "ServiceUnavailable",
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamConnectionsExhausted",
    "UpstreamEgressDenied",
    "UpstreamError",
    "UpstreamStatusError",
    "UpstreamTimeout",
    "error_body",
    "sse_error_event",
]


class GatewayError(Exception):
    """Base of every gateway error.

    Attributes:
        status: HTTP status code sent to the client.
        type: OpenAI error ``type`` field.
        code: Stable machine code (``error.code``).
        param: The request field at fault, if any.
        headers: Extra response headers (for example ``retry-after``), lower-case names.
        reason: Why, for the audit and access logs only (never sent): refusals that share
            one answer may differ here (``missing_credential`` and ``unknown_key`` are both
            401 ``invalid_api_key``); ``None``: the ``code`` says it.
    """

    status: int = 500
    type: str = "server_error"
    code: str = "gateway_error"
    reason: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def to_dict(self) -> dict[str, dict[str, str | None]]:
        """Return the OpenAI error object ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class ConfigError(GatewayError):
    """The configuration file is missing, unreadable or invalid (raised at start-up)."""

    code = "config_error"


class InvalidRequest(GatewayError):
    """The request is malformed (bad JSON, missing ``model``, ...)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    """No API key, or an unknown one. Same body for every cause (no oracle).

    Args:
        reason: ``missing_credential`` (no ``Authorization: Bearer`` credential: no header,
            another scheme, an empty or unreadable token) or ``unknown_key`` (a key no
            configured or managed key matches); kept in :attr:`reason` for the logs, never
            sent.
    """

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"

    def __init__(self, reason: str = "unknown_key") -> None:
        super().__init__(
            "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'.",
            headers={"www-authenticate": 'Bearer realm="sovereign-gateway"'},
        )
        self.reason = reason


class ModelNotAllowed(GatewayError):
    """The key exists but may not use this model."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class PolicyDenied(ModelNotAllowed):
    """The egress policy allows no replica of the model for this request (names the rule)."""

    code = "egress_denied"


class ClassChangeRefused(GatewayError):
    """The request asked to change its data class without a grant in the policy."""

    status = 403
    type = "permission_error"
    code = "class_change_forbidden"


class ModelNotFound(GatewayError):
    """No configured model or alias has this name."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PathNotFound(GatewayError):
    """No endpoint at this path (also a relay path spelled with percent-escapes)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RequestTimeout(GatewayError):
    """The client stopped sending its request body (``limits.client_body_timeout_s``)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class MethodNotAllowed(GatewayError):
    """The path exists but not for this HTTP method."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    """The request body exceeds ``limits.max_body_bytes``."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    """A limit was reached; ``retry-after`` (seconds) tells the client when to retry."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class UpstreamError(GatewayError):
    """The backend failed in a way that is not the client's fault."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class UpstreamConnectError(UpstreamError):
    """No TCP/TLS connection to the replica could be made (retried on another replica)."""

    code = "upstream_connect_error"


class UpstreamEgressDenied(UpstreamError):
    """The policy-checked transport refused the connection or a redirect (never retried)."""

    code = "upstream_egress_denied"


class UpstreamStatusError(UpstreamError):
    """The backend answered a retryable status (429/502/503) and no other replica could help.

    Args:
        message: Human-readable message.
        status: The backend's HTTP status, relayed to the client.
        headers: Headers to relay (for example ``retry-after``).
    """

    def __init__(self, message: str, *, status: int, headers: Mapping[str, str] | None = None):
        super().__init__(message, code=f"upstream_{status}", headers=headers)
        self.status = status
        if status == 429:
            self.type = "rate_limit_error"


class ServiceUnavailable(GatewayError):
    """The gateway cannot serve now (for example the audit store is down)."""

    status = 503
    type = "server_error"
    code = "service_unavailable"


class SensitiveDataRefused(GatewayError):
    """The request holds an entity type the policy refuses (named; the value never is)."""

    status = 403
    type = "permission_error"
    code = "pii_refused"


class SensitiveDataScanFailed(ServiceUnavailable):
    """The sensitive-data scan did not finish, and the request cannot pass unscanned: its class
    fails closed, or a ``mask``/``refuse`` action could apply (docs/pii.md, "Fail-safe")."""

    code = "pii_scan_failed"


class NoHealthyReplica(ServiceUnavailable):
    """Every replica of the model is down or was already tried."""

    code = "no_healthy_replica"


class UpstreamConnectionsExhausted(ServiceUnavailable):
    """Every upstream connection (``limits.max_upstream_connections``) stayed busy until the
    request's first-byte deadline: nothing was sent to a replica."""

    code = "upstream_connections_exhausted"


class UpstreamTimeout(GatewayError):
    """Connect, first-byte or idle timeout towards the backend."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"


class UpstreamConnectTimeout(UpstreamTimeout):
    """No connection to the replica within ``timeouts.connect_s`` (retried on another replica)."""

    code = "upstream_connect_timeout"


def error_body(exc: GatewayError) -> bytes:
    """Serialise ``exc`` as the OpenAI error JSON (UTF-8 bytes)."""
    return json.dumps(exc.to_dict(), separators=(",", ":")).encode()


def sse_error_event(exc: GatewayError) -> bytes:
    """The final SSE event that ends a stream that already started: ``data: {"error": ...}``."""
    return b"data: " + error_body(exc) + b"\n\n"
