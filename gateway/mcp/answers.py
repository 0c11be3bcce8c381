"""Forwarding a checked MCP message upstream and relaying the answer to the client.

The answer is relayed as it comes (:class:`gateway.mcp.upstream.RelayedStream` checks ids,
bytes and time): a JSON answer whole, an SSE answer event by event (a server request on a
2026-07-28 stream ends it with a JSON-RPC error), a list answer (tools, prompts, resources,
resource templates) filtered to what the caller may use (:mod:`gateway.mcp.governed`),
and every message, JSON or SSE event by event, sifted of the resources the caller may not
read (:mod:`gateway.mcp.withhold`: items replaced, ``resources/read`` contents removed,
``notifications/resources/updated`` dropped; a message without a ``"uri"`` key is relayed as
its bytes came, and the count withheld goes into the record).
An answer to a request takes that path whatever its HTTP status: a 2xx is relayed as 200, a
client error (4xx but 401/403/407) keeps its status, anything else becomes 502; a body that
is not the request's JSON-RPC response (another id, an HTML error page) is never relayed but
replaced by the gateway's error (``upstream_status``). Notifications and client responses
are answered ``202`` with no body when the server accepted them, else with the gateway's
error; the server's body is read (bounded) and only hashed. The SHA-256 of what the server
sent is always recorded. An upstream session id is wrapped to the caller
(:mod:`gateway.mcp.sessions`) before it reaches the client. The record of the call gets the
status, the bytes sent and the SHA-256 of the final response.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from gateway.mcp.access import ToolAccess
from gateway.mcp.asgi import send_json, send_response
from gateway.mcp.governed import LISTS, listed_entries
from gateway.mcp.jsonrpc import (
    INTERNAL_ERROR,
    MODERN_VERSIONS,
    UPSTREAM_ERROR,
    McpRefusal,
    Message,
    error_body,
)
from gateway.mcp.records import CallRecord
from gateway.mcp.sessions import SessionBinder
from gateway.mcp.settings import McpLimits
from gateway.mcp.sse import with_data
from gateway.mcp.subscriptions import Subscriptions, listen_uris
from gateway.mcp.upstream import Answer, Link, RelayedStream, Upstream
from gateway.mcp.uritext import UriText
from gateway.mcp.withhold import ResourceSieve, Withheld

__all__ = ["AnswerRelay"]

_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


class AnswerRelay:
    """Sends checked messages upstream and relays the answers (see module docstring).

    Args:
        limits: The ``mcp.limits`` (response bytes, call and idle timeouts, sessions).
        sessions: Wraps upstream session ids to the caller.
        access: Filters list answers to what the caller may use.
        uri_text: ``mcp.uri_text``: URIs in strings ``redact``-ed, ``refuse``-d or ``off``.

    Attributes:
        subscriptions: The resources each handshake-era session subscribed to.
    """

    def __init__(self, limits: McpLimits, sessions: SessionBinder, access: ToolAccess,
                 uri_text: str = "redact") -> None:
        self._limits = limits
        self._sessions = sessions
        self._access = access
        self._uri_text = uri_text
        self._texts: dict[frozenset[str], UriText] = {}
        self.subscriptions = Subscriptions(limits.max_sessions)

    async def forward(self, link: Link, upstream: Upstream, principal: Any, msg: Message,
                      body: bytes, headers: Mapping[str, str], upstream_sid: str | None,
                      rec: CallRecord, send: Any, params: Mapping[str, str] | None = None,
                      ) -> None:
        """Send the checked message upstream and relay the answer.

        Args:
            headers: The client's headers (only the MCP ones are relayed).
            params: The ``Mcp-Param-*`` headers to send
                (:meth:`gateway.mcp.checks.MessageChecks.check_call`).
        """
        limits = self._limits
        resp = await upstream.post(link, body,
                                   upstream.headers(headers, upstream_sid, params), limits)
        async with resp:
            out_headers: list[tuple[bytes, bytes]] = []
            sid = resp.headers.get("mcp-session-id")
            if sid is not None:
                out_headers.append((b"mcp-session-id", self._sessions.wrap(
                    principal.key_id, upstream.name, sid).encode()))
            if not msg.is_request:
                await self._relay_ack(resp, upstream.name, rec, send, out_headers)
                return
            status = _answer_status(resp.status)
            stream = RelayedStream(resp, msg.id, upstream.name, limits)
            sieve = self._sieve(principal, upstream.name, msg, upstream_sid)
            try:
                if resp.status < 200 or 300 <= resp.status < 400 or (
                        status != 200 and stream.is_sse):
                    if not stream.is_sse:
                        stream.digest = await _body_digest(stream)
                    raise McpRefusal(502, UPSTREAM_ERROR, "upstream_status",
                                     f"MCP server {upstream.name} answered HTTP {resp.status}"
                                     + (" with an event stream" if stream.is_sse else ""))
                if msg.method is not None and msg.method in LISTS:
                    await self._relay_filtered(msg.method, stream, principal, upstream, rec,
                                               send, out_headers, sieve, status)
                elif stream.is_sse:
                    await self._relay_sse(stream, msg, rec, send, out_headers, sieve)
                else:
                    answer, message = await stream.whole()
                    if "result" in message:  # the server answered the prompt it was asked
                        rec.confirm("prompt")
                    if sieve.may_withhold(answer) and sieve.sift(message, msg.method):
                        answer = _encode(message)
                    rec.status = status
                    _settled(rec, sieve, stream)
                    await send_json(send, status, answer, out_headers)
            except McpRefusal as exc:
                if resp.status == 200 or exc.reason not in _NOT_THE_RESPONSE:
                    raise
                # Not the request's JSON-RPC response (an HTML error page, another id...): the
                # gateway writes the error; a client error status (404: session gone) is kept.
                raise McpRefusal(502 if status == 200 else status, UPSTREAM_ERROR,
                                 "upstream_status",
                                 f"MCP server {upstream.name} answered HTTP {resp.status} "
                                 "without the request's JSON-RPC response") from exc
            finally:
                if sieve.withheld.count:
                    rec.withheld = sieve.withheld.record()
                rec.result_sha256 = stream.digest  # of the answer as the server sent it

    async def _relay_ack(self, resp: Answer, server: str, rec: CallRecord, send: Any,
                         out_headers: list[tuple[bytes, bytes]]) -> None:
        """Answer a notification or client response: ``202`` with no body when the server
        accepted it (2xx), else the gateway's JSON-RPC error without an id, the status kept
        for a client error (4xx but 401/403/407, which concern the gateway's own credential)
        and 502 otherwise. The server's body is never relayed (the transport expects none;
        an error body is read, bounded, and only its SHA-256 recorded).

        Raises:
            McpRefusal: ``upstream_status`` (the server did not accept the message), or a
                bound of :class:`RelayedStream` crossed.
        """
        rec.result_sha256 = await _body_digest(RelayedStream(resp, None, server, self._limits))
        if not 200 <= resp.status < 300:
            raise McpRefusal(_error_status(resp.status), UPSTREAM_ERROR, "upstream_status",
                             f"MCP server {server} did not accept the message "
                             f"(HTTP {resp.status})")
        rec.status = 202
        await send_response(send, 202, b"", out_headers)

    def _sieve(self, principal: Any, server: str, msg: Message,
               upstream_sid: str | None) -> ResourceSieve:
        """The sieve of this caller's answer to ``msg`` from ``server``
        (:mod:`gateway.mcp.withhold`), with the caller's subscriptions: the session's
        (``resources/subscribe`` recorded here when forwarded, ``unsubscribe`` removed), or
        a ``subscriptions/listen`` request's own (:mod:`gateway.mcp.subscriptions`)."""
        key_id, team, access = principal.key_id, principal.team, self._access
        session = (key_id, server, upstream_sid) if upstream_sid is not None else None
        uri = msg.params.get("uri")
        if session is not None and isinstance(uri, str):
            if msg.method == "resources/subscribe":
                self.subscriptions.add(session, uri)
            elif msg.method == "resources/unsubscribe":
                self.subscriptions.remove(session, uri)
        subscribed: Callable[[str], bool]
        if msg.method == "subscriptions/listen":
            subscribed = listen_uris(msg.params).covers
        else:
            subscriptions = self.subscriptions
            subscribed = lambda u: subscriptions.covers(session, u)  # noqa: E731
        return ResourceSieve(lambda u: access.check_resource(key_id, team, server, u),
                             Withheld(), subscribed, self._text_of(key_id, team, server),
                             self._uri_text == "refuse")

    def _text_of(self, key_id: str, team: str | None, server: str) -> UriText | None:
        """The finder of the URIs the caller's globs name in strings (``None``: none, or
        ``uri_text: off``); one per set of schemes."""
        if self._uri_text == "off":
            return None
        schemes = self._access.resource_schemes(key_id, team, server)
        if not schemes:
            return None
        text = self._texts.get(schemes)
        if text is None:
            if len(self._texts) >= 256:
                self._texts.clear()
            text = self._texts[schemes] = UriText(schemes)
        return text

    async def _relay_sse(self, stream: RelayedStream, msg: Message, rec: CallRecord, send: Any,
                         out_headers: list[tuple[bytes, bytes]], sieve: ResourceSieve) -> None:
        started = ended = False
        try:
            async for raw, data, message in stream.events():
                if data is not None and sieve.may_withhold(data):
                    sifted = sieve.sift(message, msg.method)
                    if sifted is None:
                        continue  # a notification about a resource the caller may not read
                    if sifted:
                        raw = with_data(raw, _encode(message))
                if isinstance(message, dict) and "method" in message and "id" in message and (
                        rec.protocol_version in MODERN_VERSIONS
                        or msg.meta_version in MODERN_VERSIONS):
                    stream.resp.abandon()
                    raise McpRefusal(502, INTERNAL_ERROR, "upstream_request_refused",
                                     "MCP server sent a request on a 2026-07-28 stream")
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [*_SSE_HEADERS, *out_headers]})
                    started = True
                    rec.status = 200
                # The final response ends the body in the same write (one send, one wake-up
                # of the client, instead of a second write for the last chunk).
                ended = stream.final  # the generator ends after the final response
                if ended:
                    if isinstance(message, dict) and "result" in message:
                        rec.confirm("prompt")  # the server answered the prompt it was asked
                    _settled(rec, sieve, stream)
                await send({"type": "http.response.body", "body": raw, "more_body": not ended})
        except McpRefusal as exc:
            if not started:
                raise
            # The stream has begun: the refusal becomes the request's final JSON-RPC error.
            final = error_body(msg.id, exc.rpc_code, exc.message)
            event = b"event: message\ndata: " + final + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            rec.reason, rec.rpc_error = exc.reason, exc.rpc_code
        if not started:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*_SSE_HEADERS, *out_headers]})
            rec.status = 200
        if not ended:
            _settled(rec, sieve, stream)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_filtered(self, method: str, stream: RelayedStream, principal: Any,
                              upstream: Upstream, rec: CallRecord, send: Any,
                              out_headers: list[tuple[bytes, bytes]],
                              sieve: ResourceSieve, status: int = 200) -> None:
        final: Any = None
        async for _, _, message in stream.events():
            if stream.final:
                final = message
        if not isinstance(final, dict):
            raise McpRefusal(502, INTERNAL_ERROR, "upstream_invalid", f"no {method} answer")
        listed_entries(method, final.get("result"), self._access, principal, upstream.name)
        sieve.sift(final, method)  # URIs in the entries' descriptions, titles, _meta
        data = json.dumps(final, separators=(",", ":")).encode()
        rec.status = status
        _settled(rec, sieve, stream)
        await send_json(send, status, data, out_headers)


def _settled(rec: CallRecord, sieve: ResourceSieve, stream: RelayedStream) -> None:
    """Put what the answer withheld and its digest on ``rec`` before the answer's last bytes
    are sent: the record is written then (``McpEndpoint._recorded_before_end``)."""
    if sieve.withheld.count:
        rec.withheld = sieve.withheld.record()
    rec.result_sha256 = stream.digest  # of the answer as the server sent it


def _encode(message: Any) -> bytes:
    """A sifted message, encoded again (compact JSON)."""
    return json.dumps(message, separators=(",", ":")).encode()


_NOT_THE_RESPONSE = frozenset({"upstream_invalid", "upstream_wrong_id"})
"""Reasons of an answer that is not the request's JSON-RPC response."""


def _error_status(status: int) -> int:
    """The status of the gateway's error for an upstream HTTP error ``status``: a client
    error is kept (404: the upstream session is gone, the client starts a new one), but not
    401/403/407 (they concern the gateway's own credential for the server, which the client
    cannot fix; relayed, the client would take them for a refusal of its own); anything
    else is 502."""
    return status if 400 <= status < 500 and status not in (401, 403, 407) else 502


def _answer_status(status: int) -> int:
    """The status under which an upstream answer to a request is relayed once checked: 200
    for any 2xx, an HTTP error's own status for a client error (:func:`_error_status`), 502
    for anything else (a server error's JSON-RPC error body, checked, is relayed with it;
    a 1xx/3xx answer is refused: never an MCP answer, and redirects are not followed)."""
    return 200 if 200 <= status < 300 else _error_status(status)


async def _body_digest(stream: RelayedStream) -> str:
    """SHA-256 (hex) of an answer's body, read to its end within the stream's bounds.

    Raises:
        McpRefusal: A bound of :class:`RelayedStream` crossed.
    """
    digest = hashlib.sha256()
    async for chunk in stream.chunks():
        digest.update(chunk)
    return digest.hexdigest()
