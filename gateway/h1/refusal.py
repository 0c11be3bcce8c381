"""The answers of the client-facing HTTP/1.1 server to requests it refuses before the app.

:class:`gateway.h1.server.ServerProtocol` refuses a request or connection without handing it to
the application when its head is malformed or breaks the framing rules
(:class:`gateway.h1.framing.RequestRefused`), its head or chunked body is over its limit, its
head is not complete within the header timeout, or the connection cap is reached. This module
holds what is answered (:class:`Refusal`: the status, the OpenAI error JSON, the error code);
the server writes it, shuts its write side and closes the connection after a bounded linger,
so the client reads the answer instead of a connection reset. The answer never echoes the
client's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "EvictionHook",
    "Refusal",
    "RefusalHook",
    "address_cap_refusal",
    "connection_cap_refusal",
    "eviction_refusal",
    "header_timeout_refusal",
]

RefusalHook = Callable[[int, str, str, "str | None"], None]
"""``(status, error code, message sent, client host or None)`` of a refused request."""

EvictionHook = Callable[[str, str, "str | None"], None]
"""``(state, cause, client host or None)`` of an idle connection closed to make room for a new
one: ``state`` is ``no_request`` (nothing received) or ``partial_head`` (both answered
:func:`eviction_refusal`), ``keep_alive`` (idle between requests) or ``lingering`` (already
answered, discarding input); ``cause`` is ``connection_cap`` or ``address_cap``
(:class:`gateway.h1.conntable.EvictionCause`)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal answer.

    Attributes:
        status: HTTP status code sent (400, 408, 413, 431 or 503).
        reason: Its reason phrase on the status line.
        message: ``error.message`` of the OpenAI error JSON (also told to the ``on_refused``
            hook).
        code: ``error.code`` (``invalid_framing``, ``request_timeout``, ...).
        err_type: ``error.type`` (``invalid_request_error`` or ``server_error``).
    """

    status: int
    reason: str
    message: str
    code: str
    err_type: str = "invalid_request_error"

    def body(self) -> bytes:
        """The compact OpenAI error JSON body."""
        return json.dumps(
            {"error": {"message": self.message, "type": self.err_type, "param": None,
                       "code": self.code}},
            separators=(",", ":"),
        ).encode()

    def response(self) -> bytes:
        """The complete HTTP/1.1 response: status line, ``content-type: application/json``,
        ``content-length``, ``connection: close`` and :meth:`body`."""
        body = self.body()
        return (
            f"HTTP/1.1 {self.status} {self.reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode() + body


def connection_cap_refusal() -> Refusal:
    """503 ``too_many_connections``: a connection over ``limits.max_client_connections``."""
    return Refusal(503, "Service Unavailable",
                   "The gateway is at its client connection limit; retry later.",
                   "too_many_connections", "server_error")


def address_cap_refusal() -> Refusal:
    """429 ``too_many_connections_from_address``: a connection over
    ``limits.max_client_connections_per_address`` while every connection of its address
    carries a request."""
    return Refusal(429, "Too Many Requests",
                   "Too many connections from this address carry requests; retry later.",
                   "too_many_connections_from_address")


def eviction_refusal() -> Refusal:
    """503 ``too_many_connections`` sent to a connection that never got an answer (nothing or
    part of a request head received), closed to make room for a new connection at the
    connection cap."""
    return Refusal(503, "Service Unavailable",
                   "The gateway is at its client connection limit and closed this connection "
                   "before its request was read; retry.",
                   "too_many_connections", "server_error")


def header_timeout_refusal(timeout_s: float) -> Refusal:
    """408 ``request_timeout``: part of a request head, not all of it, within ``timeout_s``
    seconds (``limits.client_header_timeout_s``)."""
    return Refusal(408, "Request Timeout",
                   f"The request headers were not received within {timeout_s:g} s.",
                   "request_timeout")
