"""The gateway's own requests to MCP servers (catalogue fetches) are in the audit chain.

To check a tool call and to answer the aggregate endpoint's ``tools/list``, the gateway asks
each server for its tools itself (``server/discover``, ``initialize``, ``tools/list`` pages):
requests no client asked for, which left no record, so the chain did not show every
connection the gateway made to an MCP server. Driven through a real ``gateway serve`` (SQLite
chain) with the official SDK client on the aggregate endpoint, two real SDK servers that count
what they receive and one server that is not there: each fetch is one ``mcp.catalogue``
record whose ``methods`` are exactly what the servers received beyond the client's forwarded
calls; a failing server's repeated fetches are counted, not written one by one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.conftest import free_port
from tests.gateway.mcp_gateway.harness import KEYS, start_gateway
from tests.gateway.mcp_gateway.test_mcp_sdk_through_gateway import sdk_client
from tests.gateway.mcp_gateway.upstreams import Counting, notes_server, request_body, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim


class HandshakeServer:
    """A 2025-11-25 server (no ``server/discover``): a session from ``initialize``, one tool;
    records every request it receives (``DELETE`` included)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":
            self.seen.append("DELETE")
            return await _answer(send, 200, b"")
        body = await request_body(scope, receive, send)
        if body is None:  # the lifespan
            return None
        msg = json.loads(body or b"{}")
        self.seen.append(msg.get("method", "-"))
        if msg.get("method") == "server/discover":
            return await _answer(send, 404, b"")
        if "id" not in msg:
            return await _answer(send, 202, b"")
        result: dict[str, Any] = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        if msg["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "old", "version": "1"}}
        out = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        await _answer(send, 200, out, [(b"mcp-session-id", b"s-1")])


async def _answer(send: Any, status: int, body: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def test_catalogue_fetches_are_recorded(serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    tools, notes = Counting(sdk_server()), Counting(notes_server())
    servers = {"tools": serve_asgi(tools).url + "/mcp", "notes": serve_asgi(notes).url + "/mcp",
               "gone": f"http://127.0.0.1:{free_port()}/mcp"}  # nothing listens there

    def extra(mcp: dict[str, Any]) -> None:
        mcp["aggregate"] = True
        mcp["access"] = [{"keys": ["k-agent"], "allow": ["*"], "deny": ["delete_*"]}]

    gw = start_gateway(tmp_path, sim.url, servers, {}, extra)
    try:
        async def go() -> tuple[list[str], list[str]]:
            async with sdk_client(gw.url + "/mcp", KEYS["agent"]) as client:
                first = [t.name for t in (await client.list_tools()).tools]
                await client.call_tool("tools__echo", {"text": "hi"})
                again = [t.name for t in (await client.list_tools()).tools]
                return first, again

        first, again = anyio.run(go)
    finally:
        gw.stop()
    assert sorted(first) == sorted(again) == [
        "notes__add_note", "tools__count", "tools__echo", "tools__fetch_url"]
    records = [r["data"] for r in gw.records() if r["type"] == "mcp.catalogue"]
    by_server: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_server.setdefault(r["server"], []).append(r)
    # What each server received, but the client's forwarded call, is in the chain.
    for name, upstream in (("tools", tools), ("notes", notes)):
        received = Counter(m for m in upstream.seen if not m.startswith("tools/call"))
        recorded: Counter[str] = Counter()
        for r in by_server[name]:
            recorded.update(r["methods"])
        assert recorded == received and received, (name, received, by_server[name])
        ok = by_server[name][0]
        assert (ok["outcome"], ok["status"], ok["destination"], ok["count"]) == (
            "ok", 200, f"tools-{name}", 1)
        assert ok["bytes_out"] > 0 and ok["bytes_in"] > 0 and ok["duration_us"] > 0
    assert by_server["tools"][0]["tools"] == 4  # the server's own list (delete_* included)
    assert tools.calls() == ["tools/call:echo"]
    # The server that is not there: each list tried it again; counted per server and outcome.
    gone = by_server["gone"]
    assert {(r["outcome"], r["status"], r["tools"]) for r in gone} == {
        ("upstream_unreachable", None, None)}
    assert sum(r["count"] for r in gone) == 2 and len(gone) == 2, gone
    assert all("client" not in r for r in records)


def test_a_handshake_era_fetch_is_recorded_with_its_session_end(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """A 2025 server is listed through ``initialize`` and a session the gateway ends with
    ``DELETE``: all five requests are in the fetch's record."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    old = HandshakeServer()
    servers = {"old": serve_asgi(old).url + "/mcp"}

    def extra(mcp: dict[str, Any]) -> None:
        mcp["aggregate"] = True

    gw = start_gateway(tmp_path, sim.url, servers, {}, extra)
    try:
        listed = httpx.post(gw.url + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}, headers={
            "authorization": f"Bearer {KEYS['agent']}", "mcp-method": "tools/list",
            "mcp-protocol-version": "2026-07-28",
            "accept": "application/json, text/event-stream"}, timeout=30)
        assert listed.status_code == 200, listed.text
    finally:
        gw.stop()
    assert old.seen == ["server/discover", "initialize", "notifications/initialized",
                        "tools/list", "DELETE"]
    [record] = [r["data"] for r in gw.records() if r["type"] == "mcp.catalogue"]
    assert record["methods"] == Counter(old.seen)
    assert (record["server"], record["outcome"], record["modern"], record["tools"],
            record["status"]) == ("old", "ok", False, 1, 200)
