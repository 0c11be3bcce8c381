"""``notifications/resources/updated`` reaches a caller only for what it subscribed to.

The upstream is the official SDK's low-level ``Server`` (it accepts ``resources/subscribe``
and ``resources/unsubscribe``) with one tool, ``notify``, that announces updates of whatever
URIs it is given on its request's stream, as a server that ignores subscriptions would; the
SDK client subscribes through a real ``gateway serve`` (2025-11-25 sessions). Only updates of
URIs that this caller's session subscribed to (or below them) and that the key may read
arrive; another caller's session gets none; ``resources/unsubscribe`` ends them; a stateless
2026-07-28 tool call's stream carries none (updates ride ``subscriptions/listen`` there).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server.lowlevel import Server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    ListToolsResult,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    SubscribeRequestParams,
    TextContent,
    Tool,
    UnsubscribeRequestParams,
)

from gateway.mcp.withhold import NOT_SUBSCRIBED
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_resource_withholding import ACCESS, client
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

README = "docs://public/readme"
ANNOUNCED = [README, README + "/part", "docs://public/readme-v2", "docs://public/other",
             "docs://secret/keys"]


def announcing_server(subscribed: list[str]) -> Any:
    """The SDK low-level server: ``notify(uris)`` sends an update of each URI on its
    request's stream whoever subscribed; ``subscribed`` records the (un)subscriptions it
    receives (``+uri`` / ``-uri``)."""
    async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name="notify", input_schema={
            "type": "object", "properties": {"uris": {"type": "array",
                                                      "items": {"type": "string"}}}})])

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        for uri in (params.arguments or {}).get("uris", []):
            await ctx.session.send_notification(
                ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri=uri)),
                related_request_id=ctx.request_id)
        return CallToolResult(content=[TextContent(type="text", text="notified")])

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        subscribed.append("+" + str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        subscribed.append("-" + str(params.uri))
        return EmptyResult()

    server: Server[Any] = Server("upstream-announcing", on_list_tools=list_tools,
                                 on_call_tool=call_tool, on_subscribe_resource=subscribe,
                                 on_unsubscribe_resource=unsubscribe)
    return server.streamable_http_app()


@pytest.fixture
def gw(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[tuple[Gateway, list[str]]]:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    subscribed: list[str] = []
    upstream = serve_asgi(announcing_server(subscribed))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS

    gateway = start_gateway(tmp_path, sim.url, {"docs": upstream.url + "/mcp"}, {}, extra)
    try:
        yield gateway, subscribed
    finally:
        gateway.stop()


def _updated(seen: list[Any]) -> list[str]:
    return [str(m.params.uri) for m in seen if isinstance(m, ResourceUpdatedNotification)]


def _calls(gw: Gateway) -> list[dict[str, Any]]:
    return [r["data"] for r in gw.records()
            if r["type"] == "mcp.tool_call" and r["data"]["mcp_method"] == "tools/call"]


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # 2025 only
def test_updates_reach_only_the_subscribed_session_until_it_unsubscribes(
        gw: tuple[Gateway, list[str]]) -> None:
    gateway, subscribed = gw
    mine: list[Any] = []
    other: list[Any] = []
    after: list[Any] = []

    async def go() -> None:
        async with client(gateway.mcp("docs"), "legacy", mine) as c, \
                client(gateway.mcp("docs"), "legacy", other, key="sg-mcp-other") as o:
            await c.subscribe_resource(README)
            await c.call_tool("notify", {"uris": ANNOUNCED})
            await o.call_tool("notify", {"uris": ANNOUNCED})  # same team, no subscription
            await c.unsubscribe_resource(README)
            mine_after = len(mine)
            await c.call_tool("notify", {"uris": ANNOUNCED})
            after.extend(mine[mine_after:])

    anyio.run(go)
    assert subscribed == ["+" + README, "-" + README]  # both were forwarded
    assert _updated(mine) == [README, README + "/part"]  # the URI and a sub-resource of it
    assert _updated(other) == []
    assert _updated(after) == []
    first, second, third = _calls(gateway)
    assert first["key_id"] == "k-agent" and second["key_id"] == "k-other"
    assert first["withheld"] == {
        "count": 3, "rules": [NOT_SUBSCRIBED, "no access rule allows it"],
        "uri_sha256": [hashlib.sha256(u.encode()).hexdigest() for u in ANNOUNCED[2:]]}
    assert second["withheld"]["count"] == third["withheld"]["count"] == 5


def test_a_stateless_tool_call_stream_carries_no_updates(gw: tuple[Gateway, list[str]]) -> None:
    gateway, _ = gw
    seen: list[Any] = []

    async def go() -> None:
        async with client(gateway.mcp("docs"), "auto", seen) as c:
            await c.call_tool("notify", {"uris": [README]})

    anyio.run(go)
    assert _updated(seen) == []
    [rec] = _calls(gateway)
    assert rec["protocol_version"] == "2026-07-28"
    assert rec["withheld"]["rules"] == [NOT_SUBSCRIBED]
