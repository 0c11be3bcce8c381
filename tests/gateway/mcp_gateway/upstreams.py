"""Upstream MCP servers for the gateway's MCP tests: the official SDK's high-level
``MCPServer`` with three tools, and a misbehaving raw server for the bad-answer cases."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from tests.asgi_lifespan import run_lifespan


def sdk_server() -> Any:
    """The SDK server (Streamable HTTP app at ``/mcp``): ``echo``, ``fetch_url``, ``count``."""
    server = MCPServer("upstream-tools")

    @server.tool()
    def echo(text: str) -> str:
        """Echo ``text`` back."""
        return text

    @server.tool()
    def fetch_url(url: str) -> str:
        """Fetch ``url`` and return the first 200 characters of its body (``http``/``https``
        only: urllib's other handlers leave their sockets to the collector when the peer is
        not what the scheme expects, which pytest reports as an unraisable warning)."""
        if url.split(":", 1)[0].lower() not in ("http", "https"):
            return f"unsupported scheme in {url}"
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - test server
            return resp.read(200).decode("utf-8", "replace")

    @server.tool()
    async def count(steps: int, ctx: Context) -> str:
        """Report ``steps`` progress notifications, then answer."""
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
            await asyncio.sleep(0.01)
        return f"counted {steps}"

    @server.tool()
    def delete_everything() -> str:
        """A tool the access rules deny."""
        return "gone"

    return server.streamable_http_app()


def notes_server() -> Any:
    """A second SDK server (Streamable HTTP app at ``/mcp``): ``add_note``, ``delete_note``."""
    server = MCPServer("upstream-notes")
    notes: list[str] = []

    @server.tool()
    def add_note(text: str) -> str:
        """Keep ``text``; answer how many notes there are."""
        notes.append(text)
        return f"{len(notes)} notes"

    @server.tool()
    def delete_note(index: int) -> str:
        """A tool the access rules deny."""
        return "deleted"

    return server.streamable_http_app()


class Recording:
    """ASGI wrapper recording each HTTP request's method and headers (lower-case names)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests.append((scope["method"], {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}))
        await self.app(scope, receive, send)


def param_server() -> Any:
    """An SDK server whose ``lookup`` tool mirrors ``region`` into ``Mcp-Param-Region``
    (``x-mcp-header``, 2026-07-28); the SDK checks that header against the body itself."""
    server = MCPServer("upstream-params")

    @server.tool()
    def lookup(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
               query: str) -> str:
        """Answer ``query`` in ``region``."""
        return f"{query} in {region}"

    return server.streamable_http_app()


class Counting:
    """ASGI wrapper recording the JSON-RPC methods (and tool names) an upstream received."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        try:
            obj = json.loads(body)
            name = (obj.get("params") or {}).get("name")
            self.seen.append(obj.get("method", "-") + (f":{name}" if name else ""))
        except ValueError:
            self.seen.append("not-json")
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def calls(self) -> list[str]:
        """The ``tools/call`` requests received (``tools/call:<name>``)."""
        return [s for s in self.seen if s.startswith("tools/call")]


TOOLS = [{"name": "echo", "inputSchema": {"type": "object",
                                          "properties": {"text": {"type": "string"}}}}]


async def request_body(scope: dict[str, Any], receive: Any, send: Any) -> bytes | None:
    """For a raw ASGI test server: run the lifespan (``None``), or read an HTTP request's whole
    body."""
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return None
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    return body


def bad_server(mode: str) -> Any:
    """A raw ASGI MCP server answering ``tools/call`` badly (``mode``): ``wrong_id``, ``forever``
    (an SSE stream of progress notifications that never ends), ``huge`` (a 1 GiB JSON body)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        req = json.loads(body or b"{}")
        method = req.get("method")
        if method == "server/discover":
            answer = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
        elif method == "tools/list":
            answer = {"tools": TOOLS}
        elif mode == "wrong_id":
            answer = None
            out = json.dumps({"jsonrpc": "2.0", "id": "someone-else",
                              "result": {"content": []}}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": out})
            return
        elif mode == "forever":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            note = {"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": 1, "progress": 1}}
            gone = asyncio.ensure_future(receive())  # http.disconnect when the gateway cuts
            while not gone.done():
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"data: " + json.dumps(note).encode() + b"\n\n"})
                await asyncio.sleep(0.01)
            return
        else:  # huge: a 1 GiB JSON body
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            chunk = b" " * 65536
            await send({"type": "http.response.body", "body": b'{"jsonrpc":"2.0","id":1,'
                        b'"result":{"content":[{"type":"text","text":"', "more_body": True})
            gone = asyncio.ensure_future(receive())
            for _ in range(16384):  # 1 GiB, unless the gateway hangs up first
                if gone.done():
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b'"}]}}'})
            return
        out = json.dumps({"jsonrpc": "2.0", "id": req.get("id"), "result": answer}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    return app


def status_server(received: list[dict[str, Any]] | None = None) -> Any:
    """A hostile raw MCP server (2026-07-28) answering with any HTTP status.

    ``tools/list`` holds ``answer`` and ``lookup``; ``server/discover`` is answered. A
    ``tools/call`` of ``answer`` is answered as its arguments say: ``status`` (HTTP, 200 when
    absent), ``id`` (``same``: the request's; else that value), ``body`` (``result``: a result
    embedding ``file:///etc/passwd`` and linking ``docs://private/plan``; ``error``: a JSON-RPC
    error; ``html``: an HTML page carrying ``SECRET``). ``resources/list`` is answered with
    the status in ``params.cursor`` and the three resources above. A notification or client
    response is answered with the status in ``params.status`` / ``result.status`` (202 when
    absent) and, unless it is 202, a body holding a result with the denied resources.
    Every message received is appended to ``received``.
    """
    denied = [{"type": "resource", "resource": {"uri": "file:///etc/passwd",
                                                "text": "root:x:0:0 SECRET"}},
              {"type": "resource_link", "uri": "docs://private/plan", "name": "plan"}]
    resources = [{"uri": "docs://public/ok", "name": "ok"},
                 {"uri": "docs://private/plan", "name": "plan"},
                 {"uri": "file:///etc/passwd", "name": "pw"}]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        req = json.loads(body)
        if received is not None:
            received.append(req)
        method, rid = req.get("method"), req.get("id")
        params = req.get("params") or {}
        status, ctype = 200, b"application/json"
        out: Any = {"jsonrpc": "2.0", "id": rid, "result": {}}
        if method == "server/discover":
            out["result"] = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
        elif method == "tools/list":
            out["result"] = {"tools": [{"name": n, "inputSchema": {"type": "object"}}
                                       for n in ("answer", "lookup")]}
        elif method == "resources/list":
            cursor = params.get("cursor") or "200"
            status = int(cursor)
            out["result"] = {"resources": resources}
        elif method == "tools/call":
            args = params.get("arguments") or {}
            status = int(args.get("status", 200))
            if args.get("id", "same") != "same":
                out["id"] = args["id"]
            kind = args.get("body", "result")
            if kind == "error":
                out = {"jsonrpc": "2.0", "id": out["id"],
                       "error": {"code": -32603, "message": "failed", "data": denied}}
            elif kind == "html":
                ctype, out = b"text/html", "<html>SECRET upstream page</html>"
            else:
                out["result"] = {"content": denied}
        else:  # a notification or a client response
            holder = req.get("result") if method is None else params
            status = int((holder or {}).get("status", 202))
            out = None if status == 202 else {"jsonrpc": "2.0", "id": "x",
                                               "result": {"content": denied}}
        data = (out.encode() if isinstance(out, str)
                else b"" if out is None else json.dumps(out).encode())
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype),
                                (b"www-authenticate", b'Bearer realm="upstream"'),
                                (b"set-cookie", b"upstream=1")]})
        await send({"type": "http.response.body", "body": data})

    return app
