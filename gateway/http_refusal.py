"""The answers of the client-facing HTTP/1.1 server to requests it refuses before the app.

:class:`gateway.http_guard.GuardedH11Protocol` refuses a request or connection without handing it
to the application when its head breaks the framing rules (:mod:`gateway.http_framing`), h11
cannot parse it, its head is over h11's size limit, its chunked body announces more than the
body limit (:mod:`gateway.http_body`), its head is not complete within the header timeout, or the
connection cap is reached. This module holds what is answered (:class:`Refusal`: the status, the
OpenAI error JSON, the error code) and how it is sent (:func:`send_and_linger`); only a refused
request runs it.

Refusals are written as complete responses (``connection: close``), then the write side is shut
(``FIN``) and anything the client still sends is discarded for at most :data:`LINGER_S` before
the socket is closed, so the client reads the answer instead of a connection reset. The answer
never echoes the client's bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import h11

from gateway.http_body import TOO_LARGE_STATUS

__all__ = [
    "LINGER_S",
    "Refusal",
    "RefusalHook",
    "connection_cap_refusal",
    "header_timeout_refusal",
    "parse_refusal",
    "send_and_linger",
]

RefusalHook = Callable[[int, str, str, "str | None"], None]
"""``(status, error code, message sent, client host or None)`` of a refused request."""

LINGER_S = 2.0
"""Seconds a refused connection keeps reading (and discarding) before it is closed."""

# h11 quotes the offending bytes after its reason (": bytearray(b'...')"): never echoed back.
_REASON_BYTES = re.compile(r":? *(bytearray\(|b['\"]).*\Z", re.DOTALL)


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

    def response(self) -> bytes:
        """The complete HTTP/1.1 response: status line, ``content-type: application/json``,
        ``content-length``, ``connection: close`` and the compact error JSON body."""
        body = json.dumps(
            {"error": {"message": self.message, "type": self.err_type, "param": None,
                       "code": self.code}},
            separators=(",", ":"),
        ).encode()
        return (
            f"HTTP/1.1 {self.status} {self.reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode() + body


def parse_refusal(
    framing_error: str | None, protocol_error: h11.RemoteProtocolError | None,
    max_head_bytes: int, body_limit: Callable[[], int] | None, fallback: str,
) -> Refusal:
    """The answer to a request h11 (with the gateway's readers) refused while parsing.

    Args:
        framing_error: The framing problem found in the request head, if one was
            (400 ``invalid_framing``).
        protocol_error: What h11 raised: status hint 431 (request head over ``max_head_bytes``,
            RFC 6585 §5: 431 ``request_header_too_large``), :data:`TOO_LARGE_STATUS` (a chunked
            body over the limit: 413 ``request_too_large``), or any other malformed request
            (400 ``invalid_http_request`` naming h11's reason without the client's bytes).
        max_head_bytes: h11's limit on a request head, in bytes.
        body_limit: The ``max_body_bytes`` in force, in bytes (``None``: 0 is named).
        fallback: The message when there is no reason to name (uvicorn's).
    """
    if framing_error:
        return Refusal(400, "Bad Request", f"Invalid HTTP request framing: {framing_error}.",
                       "invalid_framing")
    exc = protocol_error
    if exc is not None and exc.error_status_hint == 431:
        return Refusal(431, "Request Header Fields Too Large",
                       f"The request line and headers are larger than the limit of "
                       f"{max_head_bytes} bytes.",
                       "request_header_too_large")
    if exc is not None and exc.error_status_hint == TOO_LARGE_STATUS:
        limit = body_limit() if body_limit is not None else 0
        return Refusal(413, "Content Too Large",
                       f"Request body exceeds the limit of {limit} bytes.", "request_too_large")
    reason = _REASON_BYTES.sub("", str(exc)) if exc is not None else ""
    return Refusal(400, "Bad Request", f"Invalid HTTP request: {reason}." if reason else fallback,
                   "invalid_http_request")


def connection_cap_refusal() -> Refusal:
    """503 ``too_many_connections``: a connection over ``limits.max_client_connections``."""
    return Refusal(503, "Service Unavailable",
                   "The gateway is at its client connection limit; retry later.",
                   "too_many_connections", "server_error")


def header_timeout_refusal(timeout_s: float) -> Refusal:
    """408 ``request_timeout``: part of a request head, not all of it, within ``timeout_s``
    seconds (``limits.client_header_timeout_s``)."""
    return Refusal(408, "Request Timeout",
                   f"The request headers were not received within {timeout_s:g} s.",
                   "request_timeout")


def send_and_linger(
    transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, refusal: Refusal
) -> None:
    """Write ``refusal``'s response, shut the write side and close the socket
    :data:`LINGER_S` seconds later (at once when the transport cannot half-close)."""
    transport.write(refusal.response())
    if transport.can_write_eof():
        transport.write_eof()
        loop.call_later(LINGER_S, transport.close)
    else:
        transport.close()
