"""Access logging: one JSON line per request (logger ``gateway.access``).

Relay requests are logged by :mod:`gateway.relay.pipeline` from their :class:`RequestRecord`; the
other
HTTP endpoints by :class:`AccessLogMiddleware`. Liveness and readiness probes are not logged
(orchestrators call them every few seconds). Never prompts, completions or keys.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from gateway.bounded import bounded
from gateway.relay.records import RequestRecord

__all__ = ["AccessLogMiddleware", "log_record"]

_access = logging.getLogger("gateway.access")
_QUIET_PATHS = frozenset({"/healthz", "/readyz"})


def log_record(record: RequestRecord) -> None:
    """Write the access line of a relayed request."""
    if not _access.isEnabledFor(logging.INFO):
        return
    _access.info(
        "request",
        extra={
            "access": {
                "request_id": record.request_id,
                "trace_id": record.trace_id,
                "key_id": record.key_id,
                "method": record.method,
                "path": record.path,
                "model": record.canonical_model or bounded(record.model),
                "backend": record.replica_url,
                "route": record.route,
                "flow": record.flow,
                "attempts": record.attempts,
                "status": record.status,
                "outcome": record.outcome,
                "error_code": record.error_code,
                "latency_ms": record.latency_ms,
                "ttft_ms": record.ttft_ms,
                "input_tokens": record.input_tokens,
                "output_tokens": record.output_tokens,
                "usage_estimated": record.usage_estimated,
                "bytes_in": record.bytes_in,
                "bytes_out": record.bytes_out,
            }
        },
    )


class AccessLogMiddleware:
    """Pure-ASGI middleware: ``x-request-id`` and one access line for non-relay endpoints.

    Args:
        app: The wrapped ASGI app.
        log: Write access lines (``x-request-id`` is added either way).
    """

    def __init__(self, app: Any, log: bool = True) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        request_id = uuid.uuid4().hex
        status = 0

        async def send_wrapper(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            if self.log and _access.isEnabledFor(logging.INFO):
                _access.info(
                    "request",
                    extra={
                        "access": {
                            "request_id": request_id,
                            "method": scope["method"],
                            "path": scope["path"],
                            "status": status,
                            "latency_ms": round((time.perf_counter() - t0) * 1000.0, 3),
                        }
                    },
                )
