"""ASGI input and output of the MCP endpoints: request headers in one pass, the bounded
request body, whole responses.

The request's header lines are read once per request (:func:`request_headers`): the lookup
map, the names sent more than once (a repeated routing header is a mismatch,
:func:`gateway.mcp.jsonrpc.check_headers`) and the ``Mcp-Param-*`` lines
(:mod:`gateway.mcp.params`) come out of the same pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.mcp.jsonrpc import INVALID_REQUEST, McpRefusal
from gateway.mcp.params import PARAM_PREFIX

__all__ = ["RequestHeaders", "client_host", "read_body", "request_headers", "send_json",
           "send_response"]


class RequestHeaders(dict[str, str]):
    """A request's headers: lower-case name -> latin-1 value (the last line of a repeated
    name), with what one pass over the lines also found.

    Attributes:
        repeated: Lower-case names of the headers sent more than once.
        params: The ``Mcp-Param-*`` lines (lower-case names, values, in order, repeats kept).
    """

    __slots__ = ("params", "repeated")

    def __init__(self) -> None:
        super().__init__()
        self.repeated: set[str] = set()
        self.params: list[tuple[str, str]] = []


_KNOWN = {name.encode(): name for name in (
    "host", "content-type", "content-length", "accept", "accept-encoding", "authorization",
    "user-agent", "connection", "origin", "traceparent", "tracestate", "mcp-protocol-version",
    "mcp-method", "mcp-name", "mcp-session-id", "last-event-id")}
"""Lower-case header names as ASGI servers pass them -> ``str`` (a lookup, not a decode and a
``lower()`` per line; other names are decoded)."""


def request_headers(raw: list[tuple[bytes, bytes]]) -> RequestHeaders:
    """Read an ASGI header list (names lower-cased here too: ASGI only recommends it)."""
    out = RequestHeaders()
    known = _KNOWN
    for name_bytes, value_bytes in raw:
        name = known.get(name_bytes)
        if name is None:  # not a known name, so perhaps an Mcp-Param-* line
            name = name_bytes.decode("latin-1").lower()
            if name.startswith(PARAM_PREFIX):
                out.params.append((name, value_bytes.decode("latin-1")))
        out[name] = value_bytes.decode("latin-1")
    if len(out) != len(raw):  # some name came more than once: which (a second pass, rare)
        seen: set[str] = set()
        for name_bytes, _ in raw:
            name = known.get(name_bytes) or name_bytes.decode("latin-1").lower()
            if name in seen:
                out.repeated.add(name)
            seen.add(name)
    return out


async def read_body(receive: Any, headers: Mapping[str, str], limit: int,
                    refused: Callable[[], tuple[int, str, int] | None] | None = None) -> bytes:
    """The request body, up to ``limit`` bytes. A batch is refused at its first byte and an
    announced length above the limit at the first chunk: neither is read whole.

    Args:
        refused: The server's ``REFUSED_EXTENSION`` (:mod:`gateway.h1.asgi_io`), if offered:
            why the body ended early when the server answered the request itself.

    Raises:
        McpRefusal: 400 ``client_gone`` / ``batch_refused``, 413 ``request_too_large``; the
            server's own status and code (413 ``request_too_large``, 408 ``request_timeout``)
            with :attr:`McpRefusal.answered` set when it refused the body itself.
    """
    length = headers.get("content-length")
    too_large = length is not None and length.isdigit() and int(length) > limit
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            answered = refused() if refused is not None else None
            if answered is not None:  # the server's own 413/408, not a client gone
                exc = McpRefusal(answered[0], INVALID_REQUEST, answered[1],
                                 "the HTTP server refused the request body")
                exc.answered = answered[2]
                raise exc
            raise McpRefusal(400, INVALID_REQUEST, "client_gone", "client disconnected")
        body += message.get("body", b"")
        if body.lstrip()[:1] == b"[":
            raise McpRefusal(400, INVALID_REQUEST, "batch_refused",
                             "JSON-RPC batches are not accepted: send one message per POST")
        if too_large or len(body) > limit:
            raise McpRefusal(413, INVALID_REQUEST, "request_too_large",
                             f"request body above the limit of {limit} bytes")
        if not message.get("more_body", False):
            return bytes(body)


async def send_response(send: Any, status: int, body: bytes,
                        headers: list[tuple[bytes, bytes]]) -> None:
    """Send a whole response (``content-length`` added)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Any, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a whole ``application/json`` response."""
    await send_response(send, status, body,
                        [(b"content-type", b"application/json"), *(headers or [])])


def client_host(scope: Mapping[str, Any]) -> str | None:
    """The peer's address of an ASGI ``scope`` (``None`` when the server gives none)."""
    client = scope.get("client")
    return str(client[0]) if client else None
