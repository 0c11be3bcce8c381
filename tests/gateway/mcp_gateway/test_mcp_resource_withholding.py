"""What a server hands back is under the caller's ``resources`` rules too.

The official ``mcp`` SDK (2.3) as upstream server and as client (both protocol eras), through
a real ``gateway serve``: a tool result's ``resource_link`` and embedded ``resource`` items,
a prompt's embedded resource, a ``resources/read`` answer's extra contents,
``notifications/resources/updated`` for a URI the key may not read (or did not subscribe to)
and such URIs in text, ``structuredContent`` and ``_meta`` never reach the client; items are
replaced by the placeholder text, URIs in strings redacted (or the answer refused,
``mcp.uri_text: refuse``), the audit record counts them and names the rules, never the URIs
(digests only).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp_types import (
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ResourceLink,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    TextContent,
    TextResourceContents,
)

from gateway.mcp.uritext import REDACTED
from gateway.mcp.withhold import NOT_SUBSCRIBED, PLACEHOLDER, TEXT_REFUSED
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers, post
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ACCESS = [{"teams": ["agents"], "allow": ["*"], "prompts": {"allow": ["brief"]},
           "resources": {"allow": ["docs://public/*"], "deny": ["docs://public/private-*"]}}]
SECRETS = ("SECRET KEYS", "PRIVATE NOTES", "docs://secret", "private-notes")
MENTION = "read docs://public/readme, not docs://secret/keys; nor docs://{name} (a template)"
EXTRA = (b'{"uri":"docs://secret/keys","mimeType":"text/plain","text":"SECRET KEYS"},')


def _digest(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()


def out_server(json_response: bool) -> Any:
    """The SDK server: a tool answering with resource links and an embedded resource, a tool
    sending resource-updated notifications on its request's stream, a prompt embedding a
    resource, and a resource whose read (see :class:`ExtraContents`) holds another URI."""
    server = MCPServer("upstream-out")

    @server.tool(structured_output=False)
    def links() -> list[ContentBlock]:
        """Point at some documents."""
        return [
            TextContent(type="text", text="see"),
            ResourceLink(type="resource_link", uri="docs://public/readme", name="readme"),
            ResourceLink(type="resource_link", uri="docs://secret/keys", name="keys"),
            EmbeddedResource(type="resource", resource=TextResourceContents(
                uri="docs://public/private-notes", text="PRIVATE NOTES")),
        ]

    @server.tool(structured_output=False)
    def readme_link() -> list[ContentBlock]:
        """Point at the readme only."""
        return [ResourceLink(type="resource_link", uri="docs://public/readme", name="readme")]

    @server.tool()
    async def notify(ctx: Context) -> str:
        """Announce changes to two resources."""
        for uri in ("docs://secret/keys", "docs://public/readme"):
            await ctx.session.send_notification(
                ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri=uri)),
                related_request_id=ctx.request_id)
        return "notified"

    @server.tool()
    def mentions() -> CallToolResult:
        """Name documents in text, in the structured result and in ``_meta``."""
        return CallToolResult(
            content=[TextContent(type="text", text=MENTION)],
            structured_content={"doc": "docs://secret/keys", "ok": "docs://public/readme",
                                "docs://public/private-notes": ["Docs://Secret/keys"]},
            _meta={"source": "see docs://public/private-notes."})

    @server.resource("docs://public/bundle")
    def bundle() -> str:
        return "bundle"

    @server.prompt()
    def brief() -> list[Any]:
        """Brief with the keys attached."""
        return [UserMessage(EmbeddedResource(type="resource", resource=TextResourceContents(
            uri="docs://secret/keys", text="SECRET KEYS"))), UserMessage("brief me")]

    return ExtraContents(server.streamable_http_app(json_response=json_response))


class ExtraContents:
    """Adds a second contents entry, of a URI the key may not read, to every
    ``resources/read`` answer (the high-level SDK server answers with the asked URI only)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def rewrite(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    (k, v) for k, v in message["headers"] if k.lower() != b"content-length"]}
            elif message["type"] == "http.response.body":
                message = {**message, "body": message.get("body", b"").replace(
                    b'"contents":[', b'"contents":[' + EXTRA)}
            await send(message)

        await self.app(scope, receive, rewrite)


@pytest.fixture(scope="module")
def gateways(serve_asgi_module: Callable[..., Any],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[bool], Gateway]]:
    """``gateways(json_response) -> Gateway``: the gateway in front of :func:`out_server`
    answering with SSE (``False``) or JSON, started at its first use and shared by the
    module's tests from then on.

    Shared because no test changes it: each sends requests with the agent's key and reads
    the audit records of its own requests only (see ``gw``); the gateway keeps no state
    between requests that the tests assert (no quotas, no budgets; every SDK client opens its
    own session).
    """
    sim = serve_asgi_module(create_sim(SimConfig(models=["m"])))
    started: dict[bool, Gateway] = {}

    def get(json_response: bool) -> Gateway:
        if json_response not in started:
            upstream = serve_asgi_module(out_server(json_response))

            def extra(mcp: dict[str, Any]) -> None:
                mcp["access"] = ACCESS

            started[json_response] = start_gateway(
                tmp_path_factory.mktemp("json" if json_response else "sse"), sim.url,
                {"docs": upstream.url + "/mcp"}, {}, extra)
        return started[json_response]

    try:
        yield get
    finally:
        for gateway in started.values():
            gateway.stop()


@pytest.fixture(params=[False, True], ids=["sse", "json"])
def gw(gateways: Callable[[bool], Gateway], request: pytest.FixtureRequest) -> Gateway:
    """The shared gateway of this test's upstream answer style, its records from now on."""
    return gateways(request.param).from_now()


@asynccontextmanager
async def client(url: str, mode: str, seen: list[Any] | None = None,
                 key: str = "sg-mcp-agent") -> AsyncIterator[Client]:
    """The SDK client with ``key`` (the agent's); ``seen`` receives every incoming message."""
    async def handler(message: Any) -> None:
        if seen is not None:
            seen.append(message)

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                  timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          message_handler=handler) as c:
            yield c


def _dump(model: Any) -> dict[str, Any]:
    """An SDK model as its JSON-RPC wire form."""
    return dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def _allowed(gw: Gateway, method: str) -> list[dict[str, Any]]:
    return [r["data"] for r in gw.records()
            if r["type"] == "mcp.tool_call" and r["data"]["mcp_method"] == method]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tool_result_withholds_links_and_embedded_resources_the_key_may_not_read(
        gw: Gateway, mode: str) -> None:
    async def go() -> list[dict[str, Any]]:
        async with client(gw.mcp("docs"), mode) as c:
            result = await c.call_tool("links", {})
            return [_dump(block) for block in result.content]

    content = anyio.run(go)
    assert [b["type"] for b in content] == ["text", "resource_link", "text", "text"]
    assert content[1]["uri"] == "docs://public/readme"  # allowed: relayed as it came
    assert content[2]["text"] == content[3]["text"] == PLACEHOLDER
    assert not any(s in json.dumps(content) for s in SECRETS)
    [rec] = _allowed(gw, "tools/call")
    assert rec["withheld"] == {
        "count": 2, "rules": ["no access rule allows it",
                              "access[0] denies resource 'docs://public/private-*'"],
        "uri_sha256": [_digest("docs://secret/keys"), _digest("docs://public/private-notes")]}
    assert "docs://secret" not in json.dumps(gw.records())


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_resource_read_drops_contents_of_other_uris_and_prompt_withholds_embedded(
        gw: Gateway, mode: str) -> None:
    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with client(gw.mcp("docs"), mode) as c:
            read = await c.read_resource("docs://public/bundle")
            prompt = await c.get_prompt("brief")
            return ([_dump(x) for x in read.contents], [_dump(m) for m in prompt.messages])

    contents, messages = anyio.run(go)
    assert contents == [{"uri": "docs://public/bundle", "mimeType": "text/plain",
                         "text": "bundle"}]
    assert [m["content"] for m in messages] == [{"type": "text", "text": PLACEHOLDER},
                                                {"type": "text", "text": "brief me"}]
    [read] = _allowed(gw, "resources/read")
    [prompt] = _allowed(gw, "prompts/get")
    for rec in (read, prompt):
        assert rec["withheld"] == {"count": 1, "rules": ["no access rule allows it"],
                                   "uri_sha256": [_digest("docs://secret/keys")]}


@pytest.mark.parametrize("gw", [False], ids=["sse"], indirect=True)  # JSON: no notifications
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_resource_updated_notifications_without_a_subscription_are_dropped(
        gw: Gateway, mode: str) -> None:
    # The readable one was relayed before the gateway kept subscriptions (this client never
    # subscribed; tests/gateway/mcp_gateway/test_mcp_resource_subscriptions.py subscribes).
    seen: list[Any] = []

    async def go() -> str:
        async with client(gw.mcp("docs"), mode, seen) as c:
            result = await c.call_tool("notify", {})
            return str(result.content[0].text)  # type: ignore[union-attr]

    assert anyio.run(go) == "notified"
    assert not [m for m in seen if isinstance(m, ResourceUpdatedNotification)]
    [rec] = _allowed(gw, "tools/call")
    assert rec["withheld"] == {
        "count": 2, "rules": ["no access rule allows it", NOT_SUBSCRIBED],
        "uri_sha256": [_digest("docs://secret/keys"), _digest("docs://public/readme")]}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_uris_the_key_may_not_read_are_redacted_from_text_structured_content_and_meta(
        gw: Gateway, mode: str) -> None:
    async def go() -> dict[str, Any]:
        async with client(gw.mcp("docs"), mode) as c:
            return _dump(await c.call_tool("mentions", {}))

    result = anyio.run(go)
    assert result["content"] == [{"type": "text", "text": (
        f"read docs://public/readme, not {REDACTED}; nor docs://{{name}} (a template)")}]
    assert result["structuredContent"] == {"doc": REDACTED, "ok": "docs://public/readme",
                                           REDACTED: [REDACTED]}
    assert result["_meta"]["source"] == f"see {REDACTED}."
    assert not any(s in json.dumps(result) for s in SECRETS)
    [rec] = _allowed(gw, "tools/call")
    assert rec["withheld"]["count"] == rec["withheld"]["in_text"] == 5
    assert set(rec["withheld"]["rules"]) == {
        "no access rule allows it", "access[0] denies resource 'docs://public/private-*'"}
    assert "docs://secret" not in json.dumps(gw.records())


def test_uri_text_refuse_turns_the_answer_into_an_error(serve_asgi: Callable[..., Any],
                                                        tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = serve_asgi(out_server(True))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS
        mcp["uri_text"] = "refuse"

    gateway = start_gateway(tmp_path, sim.url, {"docs": upstream.url + "/mcp"}, {}, extra)
    try:
        refused = post(gateway.mcp("docs"), call("mentions", {}), headers(name="mentions"))
        kept = post(gateway.mcp("docs"), call("readme_link", {}, rid=2),
                    headers(name="readme_link"))
    finally:
        gateway.stop()
    assert refused.status_code == 200  # the server answered: the answer is what is refused
    assert refused.json() == {"jsonrpc": "2.0", "id": 1, "error": {
        "code": -32001, "message": TEXT_REFUSED}}
    assert kept.json()["result"]["content"][0]["uri"] == "docs://public/readme"
    first, second = _allowed(gateway, "tools/call")
    assert first["withheld"]["refused"] == 1 and first["withheld"]["in_text"] == 5
    assert "withheld" not in second


@pytest.mark.parametrize("gw", [True], ids=["json"], indirect=True)
def test_an_answer_with_nothing_to_withhold_is_relayed_byte_for_byte(gw: Gateway) -> None:
    # The record's result_sha256 is of the server's bytes: equal to the client's digest
    # only when the gateway relayed them as they came.
    kept = post(gw.mcp("docs"), call("readme_link", {}), headers(name="readme_link"))
    sifted = post(gw.mcp("docs"), call("links", {}, rid=2), headers(name="links"))
    assert kept.status_code == sifted.status_code == 200
    assert kept.json()["result"]["content"][0]["uri"] == "docs://public/readme"
    assert [c["type"] for c in sifted.json()["result"]["content"]] == [
        "text", "resource_link", "text", "text"]
    first, second = _allowed(gw, "tools/call")
    assert "withheld" not in first and second["withheld"]["count"] == 2
    assert first["result_sha256"] == hashlib.sha256(kept.content).hexdigest()
    assert second["result_sha256"] != hashlib.sha256(sifted.content).hexdigest()


def test_the_aggregate_endpoint_withholds_too(serve_asgi: Callable[..., Any],
                                              tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = serve_asgi(out_server(False))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS
        mcp["aggregate"] = True

    gateway = start_gateway(tmp_path, sim.url, {"docs": upstream.url + "/mcp"}, {}, extra)
    try:
        async def go() -> list[dict[str, Any]]:
            async with client(gateway.url + "/mcp", "auto") as c:
                result = await c.call_tool("docs__links", {})
                return [_dump(block) for block in result.content]

        content = anyio.run(go)
        assert [b["type"] for b in content] == ["text", "resource_link", "text", "text"]
        assert not any(s in json.dumps(content) for s in SECRETS)
        [rec] = _allowed(gateway, "tools/call")
        assert rec["tool"] == "links" and rec["withheld"]["count"] == 2
    finally:
        gateway.stop()
