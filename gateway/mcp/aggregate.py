"""The aggregate MCP endpoint ``/mcp`` (``mcp.aggregate: true``): every server behind one URL.

The gateway answers the protocol itself here (``initialize``, ``server/discover``, ``ping``,
``tools/list``) and forwards only tool calls. ``tools/list`` merges the tools of every server
the caller may use (an ``access`` rule for it, its credential accepted on ``/mcp/<server>`` by
``identity.routes``, and the server's destination may receive the caller's data class) under
``<server>__<tool>``, filtered per tool by the same globs as ``/mcp/<server>``. A
``tools/call`` of ``<server>__<tool>`` is checked and forwarded by the per-server
pipeline of :class:`~gateway.mcp.endpoint.McpEndpoint` (data class, access, size,
sensitive data, catalogue, ``inputSchema``, URL arguments, bounded relay, one audit record
naming the server and the tool), as a stateless 2026-07-28 request with the client's id,
arguments and progress token.

Quotas: a ``tools/call`` (one request and a ``max_concurrent`` slot), a ``tools/list`` (it
may list every server) and every refusal of an authenticated caller count against its request
quotas as at ``/mcp/<server>``; what the gateway answers itself (``initialize``,
``server/discover``, ``ping``, notifications, client responses, ``DELETE``) is free.

Limits: only servers that speak 2026-07-28 are merged (a handshake-era server has per-client
sessions the aggregate does not keep; call it at ``/mcp/<server>``); resources, prompts and
other methods are answered ``-32601``. Handshake-era clients get a caller-bound session id
(:mod:`gateway.mcp.sessions`, server name ``""``) that carries no state.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.mcp.asgi import RequestHeaders, client_host
from gateway.mcp.catalogue import modern_meta
from gateway.mcp.jsonrpc import (
    FORBIDDEN,
    HANDSHAKE_VERSIONS,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MODERN_VERSIONS,
    UPSTREAM_ERROR,
    McpRefusal,
    Message,
    check_headers,
)
from gateway.mcp.oauth import caller_identity, check_scopes
from gateway.mcp.paths import PREFIX
from gateway.mcp.records import CallRecord
from gateway.mcp.settings import AGGREGATE_SEPARATOR
from gateway.mcp.upstream import Link, Upstream
from gateway.relay.records import trace_id_of

if TYPE_CHECKING:
    from gateway.mcp.endpoint import McpEndpoint

__all__ = ["handle_aggregate", "split_tool_name"]

_log = logging.getLogger(__name__)

SESSION_SCOPE = ""
"""The server name the aggregate's session ids are bound to (no declared server has it)."""
_SERVER_INFO = {"name": "sovereign-gateway", "version": "0.1.0"}
_CAPABILITIES = {"tools": {"listChanged": False}}
_META_PREFIX = "io.modelcontextprotocol/"


def split_tool_name(name: str) -> tuple[str, str] | None:
    """``(server, tool)`` of an aggregate tool name ``<server>__<tool>``, or ``None``."""
    server, sep, tool = name.partition(AGGREGATE_SEPARATOR)
    return (server, tool) if sep and server and tool else None


async def handle_aggregate(ep: McpEndpoint, state: Any, scope: Mapping[str, Any],
                           headers: RequestHeaders, receive: Any, send: Any) -> None:
    """Serve one HTTP request to ``/mcp`` with the checks and audit of ``ep``."""
    rec = CallRecord(server=None, trace_id=trace_id_of(headers.get("traceparent")),
                     client_host=client_host(scope))
    msg: Message | None = None
    opened: list[object] = []
    principal: Any = None
    admission: Any = None
    charged = False  # admission asked for (a refusal before it is charged in except)
    unwatch = rec.watch_client(scope)
    try:
        principal = ep.authenticate(state, headers, scope)
        rec.key_id, rec.team, rec.data_class = (principal.key_id, principal.team,
                                                 principal.data_class)
        rec.identity = caller_identity(principal)
        if scope["method"] == "DELETE":
            rec.method = "DELETE"
            if _session(ep, principal.key_id, headers) is None:
                raise McpRefusal(404, INVALID_REQUEST, "session_unknown", "Session not found")
            rec.decision, rec.status = "allow", 200
            await _send(send, 200, None, [])
            return
        msg, _ = await ep.read_message(scope, headers, receive, rec)
        rec.protocol_version = check_headers(msg, headers, headers.repeated)
        route = _route(ep, msg, rec) if msg.method == "tools/call" else None
        if msg.method in ("tools/call", "tools/list"):  # the others are answered here, free
            charged = True
            admission = await ep.admit(principal, hold=msg.is_request)
        check_scopes(ep.settings, principal, None, None)  # the aggregate's own scopes
        if not any(ep.access.may_use_server(principal.key_id, principal.team, name)
                   for name in ep.upstreams):
            # As /mcp/<server> answers a caller no access rule names: nothing to discover.
            raise McpRefusal(403, FORBIDDEN, "tool_denied",
                             "no mcp.access rule lets this caller use any MCP server")
        modern = rec.protocol_version in MODERN_VERSIONS
        if "mcp-session-id" in headers:
            if modern:
                raise McpRefusal(400, INVALID_REQUEST, "session_refused",
                                 "protocol 2026-07-28 has no sessions")
            if _session(ep, principal.key_id, headers) is None:
                raise McpRefusal(404, INVALID_REQUEST, "session_unknown", "Session not found")
        if msg.method == "tools/call":
            client_params = headers.params if modern else None
            assert route is not None
            await _call(ep, state, principal, msg, route, headers, client_params, rec, send,
                        opened)
            return
        rec.decision = "allow"
        if not msg.is_request:  # notifications and client responses: nothing to do
            rec.status = 202
            await _send(send, 202, None, [])
            return
        extra: list[tuple[bytes, bytes]] = []
        if msg.method == "initialize":
            asked = msg.params.get("protocolVersion")
            result: dict[str, Any] = {
                "protocolVersion": asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1],
                "capabilities": _CAPABILITIES, "serverInfo": _SERVER_INFO}
            sid = ep.sessions.wrap(principal.key_id, SESSION_SCOPE, secrets.token_urlsafe(18))
            extra.append((b"mcp-session-id", sid.encode()))
        elif msg.method == "server/discover":
            result = {"supportedVersions": list(MODERN_VERSIONS), "capabilities": _CAPABILITIES,
                      "cacheScope": "private", "ttlMs": 0,
                      "_meta": {_META_PREFIX + "serverInfo": _SERVER_INFO}}
        elif msg.method == "ping":
            result = {}
        elif msg.method == "tools/list":
            result = {"tools": await _merged_tools(ep, state, principal)}
            if modern:  # 2026-07-28 cacheable results (ListToolsResult): not to be cached
                result.update(cacheScope="private", ttlMs=0)
        else:
            raise McpRefusal(404, METHOD_NOT_FOUND, "method_not_found",
                             f"the aggregate endpoint serves tools only, not {msg.method!r}")
        if modern:
            result["resultType"] = "complete"
        await _send(send, 200, {"jsonrpc": "2.0", "id": msg.id, "result": result}, extra, rec)
    except McpRefusal as exc:
        if principal is not None and not charged:
            await ep.charge_refused(principal)
        await ep.refuse(exc, rec, msg, ep.challenge(None), send)
    finally:
        if unwatch is not None:
            unwatch()
        await ep.settle(admission)
        ep.resolve_names(rec)
        ep.metrics.observe(rec)
        ep.end_span(rec, headers, opened)
        await ep.record(rec)


def _session(ep: McpEndpoint, key_id: str, headers: Mapping[str, str]) -> str | None:
    presented = headers.get("mcp-session-id")
    return ep.sessions.unwrap(key_id, SESSION_SCOPE, presented) if presented else None


def _check_route(state: Any, principal: Any, upstream: Upstream) -> None:
    """``identity.routes`` of ``/mcp/<server>`` hold at ``/mcp`` too: the credential the
    caller authenticated with (``key``, ``jwt``, ``mtls``) must be accepted on the server's
    own path, else a route limiting ``/mcp/tools`` to keys would be bypassed through
    ``tools__echo``.

    Raises:
        McpRefusal: 403 ``credential_not_accepted``.
    """
    section = getattr(state.settings, "identity", None)
    if section is None or not section.routes:
        return
    who = getattr(principal, "identity", None)
    method = who.method if who is not None else "key"
    path = PREFIX + upstream.name
    if method not in section.accepted(path):
        raise McpRefusal(403, FORBIDDEN, "credential_not_accepted",
                         f"{method} credentials are not accepted on {path} (identity.routes), "
                         f"so neither are calls of its tools through /mcp")


def _usable(ep: McpEndpoint, state: Any, principal: Any, upstream: Upstream) -> bool:
    """May the caller use some tool of ``upstream`` with its credential and data class?"""
    if not ep.access.may_use_tools(principal.key_id, principal.team, upstream.name):
        return False
    try:
        _check_route(state, principal, upstream)
    except McpRefusal:
        return False
    try:
        ep.checks.check_class(principal, upstream, CallRecord(server=upstream.name))
    except McpRefusal:
        return False
    return True


async def _merged_tools(ep: McpEndpoint, state: Any, principal: Any) -> list[dict[str, Any]]:
    """The tools the caller may call, of every usable modern server, by prefixed name. A
    server that cannot be listed is left out (logged), not the whole list."""
    link = Link.of(state)
    usable = [u for u in ep.upstreams.values() if _usable(ep, state, principal, u)]
    found = await asyncio.gather(*(ep.catalogue.get(u, link) for u in usable),
                                 return_exceptions=True)
    tools: list[dict[str, Any]] = []
    for upstream, catalogue in zip(usable, found, strict=True):
        if isinstance(catalogue, McpRefusal):
            _log.warning("aggregate tools/list: MCP server %s left out: %s", upstream.name,
                         catalogue.message)
            continue
        if isinstance(catalogue, BaseException):
            raise catalogue
        if not catalogue.modern:
            continue
        for name, tool in catalogue.tools.items():
            if ep.access.check(principal.key_id, principal.team, upstream.name, name).allowed:
                tools.append({**tool, "name": f"{upstream.name}{AGGREGATE_SEPARATOR}{name}"})
    return tools


def _route(ep: McpEndpoint, msg: Message, rec: CallRecord) -> tuple[Upstream, str]:
    """The server and tool of a ``tools/call`` of ``<server>__<tool>``, named in ``rec``.

    Raises:
        McpRefusal: 400 ``unknown_tool`` (not ``<server>__<tool>``, or no such server).
    """
    split = split_tool_name(msg.name or "")
    upstream = ep.upstreams.get(split[0]) if split is not None else None
    if split is None or upstream is None:
        rec.ask("tool", msg.name or "")
        raise McpRefusal(400, INVALID_PARAMS, "unknown_tool",
                         f"no tool {msg.name!r} (aggregate names are <server>__<tool>)")
    rec.server, rec.destination = upstream.name, upstream.settings.destination
    rec.ask("tool", split[1])
    return upstream, split[1]


async def _call(ep: McpEndpoint, state: Any, principal: Any, msg: Message,
                route: tuple[Upstream, str], headers: Mapping[str, str],
                client_params: list[tuple[str, str]] | None,
                rec: CallRecord, send: Any, opened: list[object]) -> None:
    """Forward a call of ``route`` (:func:`_route`) through the per-server checks and flow
    gate (charged to the caller's quotas by :func:`handle_aggregate`)."""
    upstream, tool = route
    check_scopes(ep.settings, principal, upstream.name, tool)  # the server's and tool's too
    _check_route(state, principal, upstream)
    ep.checks.check_class(principal, upstream, rec)
    client_meta = msg.params.get("_meta")
    meta = {k: v for k, v in (client_meta if isinstance(client_meta, dict) else {}).items()
            if not k.startswith(_META_PREFIX)}
    params = {**msg.params, "name": tool, "_meta": {**meta, **modern_meta()}}
    obj = {**msg.obj, "params": params}
    forwarded = Message(obj, "tools/call", msg.id, True, tool, params)
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    await _checked_call(ep, state, upstream, principal, forwarded, body, tool, headers,
                        client_params, rec, send, opened)


async def _checked_call(ep: McpEndpoint, state: Any, upstream: Upstream, principal: Any,
                        forwarded: Message, body: bytes, tool: str, headers: Mapping[str, str],
                        client_params: list[tuple[str, str]] | None, rec: CallRecord, send: Any,
                        opened: list[object]) -> None:
    principal, body, params = await ep.checks.check_call(state, upstream, principal, forwarded,
                                                         body, rec, client_params)
    if not (await ep.catalogue.get(upstream, Link.of(state))).modern:
        raise McpRefusal(502, UPSTREAM_ERROR, "upstream_legacy",
                         f"MCP server {upstream.name} speaks only the initialize handshake: "
                         f"call it at /mcp/{upstream.name}")
    upstream_headers = {
        "mcp-protocol-version": MODERN_VERSIONS[-1], "mcp-method": "tools/call",
        "mcp-name": tool if tool.isascii() and tool.strip() == tool and tool.isprintable()
        else "=?base64?" + _b64(tool) + "?=",
        **{k: headers[k] for k in ("traceparent", "tracestate") if k in headers},
    }
    await ep.forward_allowed(state, upstream, principal, forwarded, body, upstream_headers, None,
                             rec, send, params, opened)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


async def _send(send: Any, status: int, message: dict[str, Any] | None,
                headers: list[tuple[bytes, bytes]], rec: CallRecord | None = None) -> None:
    body = b"" if message is None else json.dumps(message, separators=(",", ":")).encode()
    out = [*headers, (b"content-length", str(len(body)).encode())]
    if message is not None:
        out.insert(0, (b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})
    if rec is not None:
        rec.status, rec.bytes_out = status, len(body)
