"""Forwarding a checked MCP message upstream and relaying the answer to the client.

The answer is relayed as it comes (:class:`gateway.mcp.upstream.RelayedStream` checks ids,
bytes and time): a JSON answer whole, an SSE answer event by event (a server request on a
2026-07-28 stream ends it with a JSON-RPC error), a list answer (tools, prompts, resources,
resource templates) filtered to what the caller may use (:mod:`gateway.mcp.governed`),
and every message, JSON or SSE event by event, sifted of the resources the caller may not
read (:mod:`gateway.mcp.withhold`: items replaced, ``resources/read`` contents removed,
``notifications/resources/updated`` dropped; a message without a ``"uri"`` key is relayed as
its bytes came, and the count withheld goes into the record);
notifications, client responses and upstream HTTP errors keep
their status with a bounded body. An upstream session id is wrapped to the caller
(:mod:`gateway.mcp.sessions`) before it reaches the client. The record of the call gets the
status, the bytes sent and the SHA-256 of the final response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from gateway.mcp.access import ToolAccess
from gateway.mcp.asgi import send_json, send_response
from gateway.mcp.governed import LISTS, listed_entries
from gateway.mcp.jsonrpc import INTERNAL_ERROR, MODERN_VERSIONS, McpRefusal, Message, error_body
from gateway.mcp.records import CallRecord
from gateway.mcp.sessions import SessionBinder
from gateway.mcp.settings import McpLimits
from gateway.mcp.sse import with_data
from gateway.mcp.subscriptions import Subscriptions, listen_uris
from gateway.mcp.upstream import Link, RelayedStream, Upstream
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
            if not msg.is_request or resp.status != 200:
                # Notifications and client responses (202), upstream HTTP errors: relay the
                # status with a bounded body.
                stream = RelayedStream(resp, None, upstream.name, limits)
                data = bytearray()
                async for chunk in stream.chunks():
                    data += chunk
                ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
                rec.status = resp.status
                await send_response(send, resp.status, bytes(data),
                            [(b"content-type", ctype), *out_headers])
                rec.bytes_out = len(data)
                return
            stream = RelayedStream(resp, msg.id, upstream.name, limits)
            sieve = self._sieve(principal, upstream.name, msg, upstream_sid)
            try:
                if msg.method is not None and msg.method in LISTS:
                    await self._relay_filtered(msg.method, stream, principal, upstream, rec,
                                               send, out_headers, sieve)
                elif stream.is_sse:
                    await self._relay_sse(stream, msg, rec, send, out_headers, sieve)
                else:
                    answer, message = await stream.whole()
                    if sieve.may_withhold(answer) and sieve.sift(message, msg.method):
                        answer = _encode(message)
                    rec.status = 200
                    await send_json(send, 200, answer, out_headers)
                    rec.bytes_out = len(answer)
            finally:
                if sieve.withheld.count:
                    rec.withheld = sieve.withheld.record()
            rec.result_sha256 = stream.digest  # of the answer as the server sent it

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
                await send({"type": "http.response.body", "body": raw, "more_body": not ended})
                rec.bytes_out += len(raw)
        except McpRefusal as exc:
            if not started:
                raise
            # The stream has begun: the refusal becomes the request's final JSON-RPC error.
            final = error_body(msg.id, exc.rpc_code, exc.message)
            event = b"event: message\ndata: " + final + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            rec.bytes_out += len(event)
            rec.reason, rec.rpc_error = exc.reason, exc.rpc_code
        if not started:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*_SSE_HEADERS, *out_headers]})
            rec.status = 200
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_filtered(self, method: str, stream: RelayedStream, principal: Any,
                              upstream: Upstream, rec: CallRecord, send: Any,
                              out_headers: list[tuple[bytes, bytes]],
                              sieve: ResourceSieve) -> None:
        final: Any = None
        async for _, _, message in stream.events():
            if stream.final:
                final = message
        if not isinstance(final, dict):
            raise McpRefusal(502, INTERNAL_ERROR, "upstream_invalid", f"no {method} answer")
        listed_entries(method, final.get("result"), self._access, principal, upstream.name)
        sieve.sift(final, method)  # URIs in the entries' descriptions, titles, _meta
        data = json.dumps(final, separators=(",", ":")).encode()
        rec.status = 200
        await send_json(send, 200, data, out_headers)
        rec.bytes_out = len(data)


def _encode(message: Any) -> bytes:
    """A sifted message, encoded again (compact JSON)."""
    return json.dumps(message, separators=(",", ":")).encode()
