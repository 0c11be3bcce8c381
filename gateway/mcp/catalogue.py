"""The tool catalogue of each upstream server, as the gateway itself lists it.

Tool calls are checked against the server's own tool definitions (the name must be one of
its tools, the arguments must match its ``inputSchema``). The gateway asks the server with
its own ``tools/list`` (all pages), in the modern stateless form (2026-07-28) first; a server
that answers that with an HTTP error and no modern JSON-RPC error is asked through the
``initialize`` handshake (2025-11-25), its session ended with ``DELETE``. The list is kept
for ``catalogue_ttl_s`` seconds per server; concurrent calls share one fetch.

No client asked for these requests, so no client's record shows them: each fetch is reported
(``record``, the audit log's ``mcp.catalogue``) with the server, the requests it took by
method, its outcome (``ok`` or the refusal's reason), HTTP status, duration and bytes, so the
chain shows every connection the gateway made to an MCP server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.mcp.arguments import CompiledSchema, compile_schema
from gateway.mcp.jsonrpc import HANDSHAKE_VERSIONS, MODERN_VERSIONS, UPSTREAM_ERROR, McpRefusal
from gateway.mcp.params import Annotations, header_annotations
from gateway.mcp.settings import McpLimits
from gateway.mcp.upstream import Answer, Link, RelayedStream, Upstream, read_final

__all__ = ["Catalogue", "FetchSink", "ToolCatalogue", "modern_meta"]

FetchSink = Callable[[dict[str, Any]], None]
"""Told of each catalogue fetch (the fields of an ``mcp.catalogue`` record); must not block."""

_log = logging.getLogger(__name__)

_CLIENT_INFO = {"name": "sovereign-gateway", "version": "0.1.0"}
_MAX_PAGES = 100


@dataclass(frozen=True, slots=True)
class ToolCatalogue:
    """The tools of one server at one time.

    Attributes:
        tools: Tool definitions by name (as the server sent them).
        modern: The server answered the modern (stateless) request form.
        fetched_at: ``time.monotonic()`` of the fetch.
    """

    tools: Mapping[str, Mapping[str, Any]]
    modern: bool
    fetched_at: float
    validators: dict[str, CompiledSchema | None] = field(default_factory=dict)
    """Compiled ``inputSchema`` validators by tool name (filled on first use)."""
    header_params: dict[str, Annotations] = field(default_factory=dict)
    """``x-mcp-header`` annotations of each tool's ``inputSchema`` (filled on first use)."""

    def annotations(self, tool: str) -> Annotations:
        """The ``x-mcp-header`` annotations of ``tool``'s ``inputSchema``
        (:func:`gateway.mcp.params.header_annotations`, computed once per tool)."""
        if tool not in self.header_params:
            self.header_params[tool] = header_annotations(self.tools[tool].get("inputSchema"))
        return self.header_params[tool]

    def validator(self, tool: str) -> CompiledSchema | None:
        """The compiled validator of ``tool``'s ``inputSchema`` (``None``: no schema).

        Raises:
            McpRefusal: 502 ``tool_schema_invalid``.
        """
        if tool not in self.validators:
            schema = self.tools[tool].get("inputSchema")
            self.validators[tool] = compile_schema(schema) if isinstance(schema, dict) else None
        return self.validators[tool]


def modern_meta() -> dict[str, Any]:
    """The ``_meta`` envelope of the gateway's own 2026-07-28 requests (as a client)."""
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSIONS[-1],
        "io.modelcontextprotocol/clientInfo": dict(_CLIENT_INFO),
        "io.modelcontextprotocol/clientCapabilities": {},
    }


def _modern_body(method: str, rid: str, params: Mapping[str, Any] | None = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                       "params": {**(params or {}), "_meta": modern_meta()}}).encode()


class _Tally:
    """The requests of one fetch: by method, with the bytes sent and read (for its record)."""

    __slots__ = ("bytes_in", "bytes_out", "methods", "status")

    def __init__(self) -> None:
        self.methods: dict[str, int] = {}
        self.bytes_out = 0
        self.bytes_in = 0
        self.status: int | None = None

    def sent(self, method: str, body: bytes) -> None:
        self.methods[method] = self.methods.get(method, 0) + 1
        self.bytes_out += len(body)

    def got(self, status: int, stream: RelayedStream | None = None) -> None:
        self.status = status
        if stream is not None:
            self.bytes_in += stream.bytes_in


class Catalogue:
    """Cached tool catalogues of the declared servers.

    Args:
        limits: The ``mcp.limits`` (TTL, response bounds).
        record: Told of each fetch (``None``: not recorded): ``server``, ``destination``,
            ``methods`` (requests sent by method, ``DELETE`` for ending a session),
            ``outcome`` (``ok`` or the refusal's reason, e.g. ``upstream_unreachable``),
            ``status`` (the last HTTP status, ``None`` if none arrived), ``modern``, ``tools``
            (how many were listed), ``duration_us``, ``bytes_out`` and ``bytes_in`` (request
            and answer body bytes).
    """

    def __init__(self, limits: McpLimits, record: FetchSink | None = None) -> None:
        self._limits = limits
        self._record = record
        self._cache: dict[str, ToolCatalogue] = {}
        self._pending: dict[str, asyncio.Task[ToolCatalogue]] = {}

    def cached(self, upstream: Upstream) -> ToolCatalogue | None:
        """The server's tools if a fetch younger than ``catalogue_ttl_s`` holds them, else
        ``None`` (then :meth:`get`); no await on the hot path of a call."""
        hit = self._cache.get(upstream.name)
        if hit is not None and time.monotonic() - hit.fetched_at < self._limits.catalogue_ttl_s:
            return hit
        return None

    async def get(self, upstream: Upstream, link: Link) -> ToolCatalogue:
        """The server's tools (cached up to ``catalogue_ttl_s``).

        Raises:
            McpRefusal: The server could not be listed (502/504).
        """
        hit = self._cache.get(upstream.name)
        if hit is not None and time.monotonic() - hit.fetched_at < self._limits.catalogue_ttl_s:
            return hit
        task = self._pending.get(upstream.name)
        if task is None:
            task = asyncio.ensure_future(self._recorded_fetch(upstream, link))
            self._pending[upstream.name] = task
            task.add_done_callback(lambda _: self._pending.pop(upstream.name, None))
        result = await asyncio.shield(task)
        self._cache[upstream.name] = result
        return result

    async def _recorded_fetch(self, upstream: Upstream, link: Link) -> ToolCatalogue:
        """:meth:`_fetch`, reported to ``record`` however it ends (but cancelled)."""
        tally = _Tally()
        t0 = time.perf_counter()
        outcome, found = "ok", None
        try:
            found = await self._fetch(upstream, link, tally)
            return found
        except McpRefusal as exc:
            outcome = exc.reason
            raise
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            if self._record is not None and (found is not None or outcome != "ok"):
                self._record({
                    "server": upstream.name, "destination": upstream.settings.destination,
                    "methods": tally.methods, "outcome": outcome, "status": tally.status,
                    "modern": found.modern if found is not None else None,
                    "tools": len(found.tools) if found is not None else None,
                    "duration_us": round((time.perf_counter() - t0) * 1e6),
                    "bytes_out": tally.bytes_out, "bytes_in": tally.bytes_in})

    async def _post(self, upstream: Upstream, link: Link, body: bytes,
                    headers: Mapping[str, str], method: str, tally: _Tally) -> Answer:
        tally.sent(method, body)
        resp = await upstream.post(link, body, headers, self._limits)
        tally.status = resp.status
        return resp

    async def _read(self, resp: Answer, rid: str | None, upstream: Upstream,
                    tally: _Tally) -> Any:
        """The answer's final message (``rid`` ``None``: read to its end, nothing parsed)."""
        stream = RelayedStream(resp, rid, upstream.name, self._limits)
        try:
            if rid is None:
                async for _ in stream.chunks():
                    pass  # read to the end: the connection goes back to the pool
                return None
            return (await read_final(stream))[1]
        finally:
            tally.got(resp.status, stream)

    async def _list(self, upstream: Upstream, link: Link,
                    headers: dict[str, str], modern: bool,
                    tally: _Tally) -> dict[str, Mapping[str, Any]]:
        tools: dict[str, Mapping[str, Any]] = {}
        cursor: str | None = None
        for page in range(_MAX_PAGES):
            params = {"cursor": cursor} if cursor else {}
            rid = f"gateway-tools-{page}"
            body = (_modern_body("tools/list", rid, params) if modern else json.dumps(
                {"jsonrpc": "2.0", "id": rid, "method": "tools/list", "params": params}).encode())
            resp = await self._post(upstream, link, body,
                                    {**headers, "mcp-method": "tools/list"}, "tools/list", tally)
            async with resp:
                if resp.status != 200:
                    raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                                     f"MCP server {upstream.name} answered tools/list with "
                                     f"HTTP {resp.status}")
                message = await self._read(resp, rid, upstream, tally)
            result = message.get("result") if isinstance(message, dict) else None
            if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
                raise McpRefusal(502, UPSTREAM_ERROR, "upstream_invalid",
                                 f"MCP server {upstream.name} sent no tool list")
            for tool in result["tools"]:
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    tools[tool["name"]] = tool
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return tools

    async def _fetch(self, upstream: Upstream, link: Link, tally: _Tally) -> ToolCatalogue:
        modern_headers = upstream.headers({"mcp-protocol-version": MODERN_VERSIONS[-1]}, None)
        probe = await self._post(
            upstream, link, _modern_body("server/discover", "gateway-discover"),
            {**modern_headers, "mcp-method": "server/discover"}, "server/discover", tally)
        async with probe:
            modern = probe.status == 200
            await self._read(probe, None, upstream, tally)
        if modern:
            tools = await self._list(upstream, link, modern_headers, True, tally)
            return ToolCatalogue(tools, True, time.monotonic())
        version = HANDSHAKE_VERSIONS[-1]
        init = json.dumps({"jsonrpc": "2.0", "id": "gateway-init", "method": "initialize",
                           "params": {"protocolVersion": version, "capabilities": {},
                                      "clientInfo": _CLIENT_INFO}}).encode()
        resp = await self._post(upstream, link, init, upstream.headers({}, None), "initialize",
                                tally)
        async with resp:
            sid = resp.headers.get("mcp-session-id")
            await self._read(resp, "gateway-init", upstream, tally)
        headers = upstream.headers({"mcp-protocol-version": version}, sid)
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        async with await self._post(upstream, link, note, headers,
                                    "notifications/initialized", tally) as answer:
            await self._read(answer, None, upstream, tally)
        try:
            tools = await self._list(upstream, link, headers, False, tally)
        finally:
            if sid is not None:
                tally.sent("DELETE", b"")
                try:
                    tally.status = await upstream.delete(link, sid)
                except aiohttp.ClientError as exc:
                    _log.warning("MCP server %s: ending the catalogue session failed: %s",
                                 upstream.name, exc)
        return ToolCatalogue(tools, False, time.monotonic())
