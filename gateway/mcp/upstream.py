"""Forwarding one MCP message to an upstream server and reading its answer, bounded.

Requests go through the relay's own pooled HTTP/1.1 client (:class:`gateway.h1.RelayClient`,
the one model requests take), which dials through the egress policy's checked connector when a
policy is configured (every connection checked at connect time, no proxy from the
environment); redirects are never followed (the client does not follow any). ``DELETE`` of a
handshake-era session goes through the upstream aiohttp session (same connector). The client's
``Authorization`` is never forwarded: the server's own token (``auth_token_file``, a mounted
Secret) is injected instead.

Answers are checked as they arrive: a JSON answer is read up to ``max_response_bytes``; an SSE
answer is split into events relayed one by one (:class:`RelayedStream`), each JSON-RPC
response in it must carry the request's id, and the stream is cut at the byte limit, the call
deadline or an idle gap.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.h1 import (
    ConnectFailed,
    ConnectionClosed,
    ConnectTimedOut,
    IncompleteBody,
    RelayClient,
    Response,
)
from gateway.h1 import ProtocolError as H1ProtocolError
from gateway.mcp.jsonrpc import UPSTREAM_ERROR, McpRefusal
from gateway.mcp.settings import McpLimits, McpServerSettings
from gateway.mcp.sse import SseSplitter

__all__ = ["FORWARDED_HEADERS", "Answer", "Link", "RelayedStream", "Upstream", "read_final",
           "read_json_answer"]

FORWARDED_HEADERS = frozenset({
    "accept", "content-type", "mcp-protocol-version", "mcp-method", "mcp-name",
    "traceparent", "tracestate", "last-event-id",
})
"""Client headers relayed upstream; never ``authorization``, cookies or the client's
``mcp-param-*`` (rebuilt from the checked arguments, :mod:`gateway.mcp.params`)."""


@dataclass(frozen=True, slots=True)
class Link:
    """The upstream transports of one gateway state (``state.upstream``, ``state.session``).

    Attributes:
        client: The relay's pooled client (POST).
        session: The aiohttp session (DELETE).
        ssl: ``ssl`` argument for aiohttp requests (``state.upstream_ssl``).
    """

    client: RelayClient
    session: aiohttp.ClientSession
    ssl: Any = True

    @classmethod
    def of(cls, state: Any) -> Link:
        """The link of a :class:`gateway.state.GatewayState`."""
        return cls(state.upstream, state.session, state.upstream_ssl)


_DRAIN_BYTES = 65536
_DRAIN_S = 0.05


class Answer:
    """An upstream response whose head has arrived (use ``async with``: the connection goes
    back to the pool when the body was read to its end, else it is closed).

    Attributes:
        status: HTTP status.
        headers: Lower-case name -> value.
    """

    def __init__(self, response: Response) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self._abandoned = False

    @property
    def content_type(self) -> str:
        """The media type, lower case, without parameters."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def complete(self) -> bool:
        """The whole body has arrived (:meth:`read` returns at once, never waits)."""
        return self._response.complete

    async def read(self) -> bytes:
        """The body bytes received so far; ``b""`` at its end."""
        return await self._response.read()

    async def __aenter__(self) -> Answer:
        return self

    def abandon(self) -> None:
        """The answer was refused midway: close the connection at exit, read nothing more."""
        self._abandoned = True

    async def __aexit__(self, *exc: object) -> None:
        if not self._response.complete and exc[0] is None and not self._abandoned:
            # An SSE answer ends just after its final response: a short, bounded wait for that
            # end lets the connection go back to the pool instead of being closed.
            try:
                async with asyncio.timeout(_DRAIN_S):
                    left = _DRAIN_BYTES
                    while left > 0 and not self._response.complete:
                        chunk = await self._response.read()
                        if not chunk:
                            break
                        left -= len(chunk)
            except (TimeoutError, ConnectionClosed, IncompleteBody, H1ProtocolError):
                pass
        if self._response.complete:
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """One declared server: its URL and the credentials injected for it.

    Args:
        settings: The server's ``mcp.servers[]`` entry.
    """

    def __init__(self, settings: McpServerSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self.url = settings.url
        split = urlsplit(settings.url)
        self._parts = (f"{split.scheme}://{split.netloc}",
                       (split.path or "/") + (f"?{split.query}" if split.query else ""))
        self._token: str | None = None

    def load_secret(self) -> None:
        """Read ``auth_token_file`` (at start-up and reload; a missing file fails start-up).

        Raises:
            OSError: The file cannot be read.
        """
        path = self.settings.auth_token_file
        self._token = path.read_text(encoding="utf-8").strip() if path is not None else None

    def headers(self, client: Mapping[str, str], session_id: str | None,
                params: Mapping[str, str] | None = None) -> dict[str, str]:
        """The upstream request headers: relayed MCP headers of ``client``, the gateway's own
        ``mcp-param-*`` headers ``params``, the upstream session id, injected credentials."""
        out = {k: v for k, v in client.items() if k in FORWARDED_HEADERS}
        out.update(params or {})
        out.setdefault("content-type", "application/json")
        out.setdefault("accept", "application/json, text/event-stream")
        out["accept-encoding"] = "identity"  # the session does not decompress
        if session_id is not None:
            out["mcp-session-id"] = session_id
        if self._token is not None:
            out["authorization"] = f"Bearer {self._token}"
        return out

    async def post(self, link: Link, body: bytes, headers: Mapping[str, str],
                   limits: McpLimits) -> Answer:
        """POST one message upstream and return the answer (head read, body not).

        Raises:
            McpRefusal: 502 ``upstream_unreachable`` (an egress refusal of the connection
                included, with the policy's reason) / 504 ``upstream_timeout``.
        """
        parts = self._parts
        try:
            # asyncio.timeout, not wait_for: no task per call on this path (Python 3.11).
            async with asyncio.timeout(limits.idle_timeout_s):
                response = await link.client.post(parts[0], parts[1], dict(headers), body)
        except TimeoutError as exc:
            raise McpRefusal(504, UPSTREAM_ERROR, "upstream_timeout",
                             f"MCP server {self.name} did not answer in time") from exc
        except (ConnectFailed, ConnectTimedOut, ConnectionClosed, H1ProtocolError, OSError,
                ValueError) as exc:
            raise McpRefusal(502, UPSTREAM_ERROR, "upstream_unreachable",
                             f"MCP server {self.name} unreachable: {type(exc).__name__}") from exc
        except Exception as exc:
            # policy.EgressDenied and the like: a refusal of the connection by the policy.
            reason = getattr(exc, "message", None) or type(exc).__name__
            raise McpRefusal(502, UPSTREAM_ERROR, "upstream_unreachable",
                             f"MCP server {self.name} unreachable: {reason}") from exc
        return Answer(response)

    async def delete(self, link: Link, session_id: str) -> int:
        """End an upstream session (``DELETE`` with ``Mcp-Session-Id``); return the status."""
        headers = {"mcp-session-id": session_id}
        if self._token is not None:
            headers["authorization"] = f"Bearer {self._token}"
        async with link.session.delete(self.url, headers=headers, allow_redirects=False,
                                       ssl=link.ssl) as resp:
            return resp.status


def _check_id(message: Any, request_id: Any, server: str) -> bool:
    """True when ``message`` is the final response to ``request_id``.

    Raises:
        McpRefusal: A response carrying another id (502 ``upstream_wrong_id``).
    """
    if not isinstance(message, dict) or "method" in message:
        return False
    if "result" in message or "error" in message:
        if message.get("id") != request_id or type(message.get("id")) is not type(request_id):
            raise McpRefusal(502, UPSTREAM_ERROR, "upstream_wrong_id",
                             f"MCP server {server} answered with another request's id")
        return True
    return False


async def read_json_answer(resp: Answer, request_id: Any, server: str,
                           limits: McpLimits) -> tuple[bytes, Any]:
    """Read a JSON (or SSE, to its final response) answer whole, bounded.

    Returns:
        The response message bytes and the parsed message.

    Raises:
        McpRefusal: ``upstream_too_large`` (502), ``upstream_timeout`` (504),
            ``upstream_wrong_id``, ``upstream_invalid`` (not JSON-RPC).
    """
    return await read_final(RelayedStream(resp, request_id, server, limits))


async def read_final(stream: RelayedStream) -> tuple[bytes, Any]:
    """:func:`read_json_answer` of a stream the caller holds (its ``bytes_in`` then says how
    many body bytes were read).

    Raises:
        McpRefusal: See :func:`read_json_answer`.
    """
    request_id, server = stream.request_id, stream.server
    final: tuple[bytes, Any] | None = None
    async for _raw, message_bytes, message in stream.events():
        if message_bytes is not None and _check_id(message, request_id, server):
            final = (message_bytes, message)
            break
    if final is None:
        raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                         f"MCP server {server} sent no response to the request")
    return final


@dataclass
class RelayedStream:
    """The answer of one upstream request, as complete messages, within the limits.

    Every bound is checked on each read (:meth:`_next`): the byte limit, the call deadline
    (``call_timeout_s`` from the first read) and the idle gap (``idle_timeout_s``); a read of a
    body already received whole cannot wait, so it is made without a timer. A refusal abandons
    the answer (its connection closes).

    Attributes:
        bytes_in: Body bytes read so far.
        digest: SHA-256 of the final response message's bytes (set when it arrives; of a
            JSON answer's body even when it is refused).
    """

    resp: Answer
    request_id: Any
    server: str
    limits: McpLimits
    bytes_in: int = 0
    digest: str | None = None
    final: bool = field(default=False)
    _deadline: float | None = field(default=None, repr=False)

    @property
    def is_sse(self) -> bool:
        """The answer is an event stream."""
        return self.resp.content_type == "text/event-stream"

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive, within the byte limit, deadline and idle gap.

        Raises:
            McpRefusal: A bound was crossed (the answer is then abandoned: its connection
                closes).
        """
        while chunk := await self._next():
            yield chunk

    async def _next(self) -> bytes:
        """The next body bytes (``b""`` at the end), within the bounds.

        Raises:
            McpRefusal: ``upstream_timeout`` (504), ``upstream_invalid`` (the body was broken
                off), ``upstream_too_large`` (502); the answer is abandoned.
        """
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.limits.call_timeout_s
        try:
            left = self._deadline - now
            if left <= 0:
                raise McpRefusal(504, UPSTREAM_ERROR, "upstream_timeout",
                                 f"MCP server {self.server} exceeded the call timeout")
            try:
                if self.resp.complete:  # the body is all here: the read cannot wait
                    chunk = await self.resp.read()
                else:
                    async with asyncio.timeout(min(left, self.limits.idle_timeout_s)):
                        chunk = await self.resp.read()
            except TimeoutError as exc:
                raise McpRefusal(504, UPSTREAM_ERROR, "upstream_timeout",
                                 f"MCP server {self.server} went silent") from exc
            except (ConnectionClosed, IncompleteBody, H1ProtocolError) as exc:
                raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                                 f"MCP server {self.server} broke the answer off") from exc
            self.bytes_in += len(chunk)
            if self.bytes_in > self.limits.max_response_bytes:
                raise McpRefusal(502, UPSTREAM_ERROR, "upstream_too_large",
                                 f"MCP server {self.server} sent more than "
                                 f"{self.limits.max_response_bytes} bytes")
        except McpRefusal:
            self.resp.abandon()
            raise
        return chunk

    async def whole(self) -> tuple[bytes, Any]:
        """A JSON answer read to its end: its bytes and its parsed message, which must be the
        final response to the request (:attr:`final`, :attr:`digest` set).

        Raises:
            McpRefusal: See :func:`read_json_answer`; ``upstream_invalid`` also for a JSON
                answer that is not the response (a batch array, a bare value, a request), an
                event that is not one JSON object, or a stream that ends without the response
                (the answer is then abandoned).
        """
        first = await self._next()
        body = first
        if first:
            parts = [first]
            while chunk := await self._next():
                parts.append(chunk)
            body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.digest = hashlib.sha256(body).hexdigest()  # recorded even when refused
        try:
            message = self._parse(body)
            if not _check_id(message, self.request_id, self.server):
                # A JSON answer is the response or nothing: a batch array, a bare value, a
                # request or notification is never relayed as the call's result.
                raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                                 f"MCP server {self.server} answered with something other "
                                 "than the request's JSON-RPC response")
            self.final = True
        except McpRefusal:
            self.resp.abandon()
            raise
        return body, message

    async def events(self) -> AsyncIterator[tuple[bytes, bytes | None, Any]]:
        """Yield ``(raw bytes to relay, message bytes or None, parsed message)`` in order.

        A JSON answer is one item (its whole body, :meth:`whole`); an SSE answer one item per
        event. Reading stops after the final response to the request.

        Raises:
            McpRefusal: See :func:`read_json_answer` (the answer is then abandoned).
        """
        if not self.is_sse:
            body, message = await self.whole()
            yield body, body, message
            return
        try:
            async for item in self._sse_events():
                yield item
        except McpRefusal:
            self.resp.abandon()
            raise

    async def _sse_events(self) -> AsyncIterator[tuple[bytes, bytes | None, Any]]:
        splitter = SseSplitter(self.limits.max_event_bytes)
        while chunk := await self._next():
            try:
                events = splitter.feed(chunk)
            except ValueError as exc:
                raise McpRefusal(502, UPSTREAM_ERROR, "upstream_too_large",
                                 f"MCP server {self.server}: {exc}") from exc
            for event in events:
                if event.data is None or event.data == "":
                    yield event.raw, None, None  # comments, keep-alives, priming events
                    continue
                data = event.data.encode()
                message = self._parse(data)
                if not isinstance(message, dict):
                    raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                                     f"MCP server {self.server} sent an event that is not one "
                                     "JSON-RPC message")
                if _check_id(message, self.request_id, self.server):
                    self.digest = hashlib.sha256(data).hexdigest()
                    self.final = True
                    yield event.raw, data, message
                    return
                yield event.raw, data, message
        raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                         f"MCP server {self.server} ended the stream without the response")

    def _parse(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                             f"MCP server {self.server} sent a message that is not JSON") from exc
