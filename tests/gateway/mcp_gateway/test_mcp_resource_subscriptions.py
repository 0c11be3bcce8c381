"""``notifications/resources/updated`` reaches a caller only for what it subscribed to.

The upstream is the official SDK's low-level ``Server`` (it accepts ``resources/subscribe``
and ``resources/unsubscribe``) with one tool, ``notify``, that announces updates of whatever
URIs it is given on its request's stream, as a server that ignores subscriptions would; the
SDK client subscribes through a real ``gateway serve`` (2025-11-25 sessions). Only updates of
URIs that this caller's session subscribed to (or below them) and that the key may read
arrive; another caller's session gets none; ``resources/unsubscribe`` ends them; a stateless
2026-07-28 tool call's stream carries none (updates ride ``subscriptions/listen`` there), and a
``subscriptions/listen`` stream only those of its own ``resourceSubscriptions`` filter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server.lowlevel import Server
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    ListToolsResult,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    SubscribeRequestParams,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    TextContent,
    Tool,
    UnsubscribeRequestParams,
)

from gateway.mcp.withhold import NOT_SUBSCRIBED
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, headers, post
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

    async def listen(ctx: Any, params: SubscriptionsListenRequestParams,
                     ) -> SubscriptionsListenResult:
        # Acknowledges the filter as asked, then announces every URI of ANNOUNCED on the
        # stream whatever the filter said, and closes it gracefully.
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        await ctx.session.send_notification(SubscriptionsAcknowledgedNotification(
            params=SubscriptionsAcknowledgedNotificationParams(
                notifications=params.notifications, _meta=meta)),
            related_request_id=ctx.request_id)
        for uri in ANNOUNCED:
            await ctx.session.send_notification(ResourceUpdatedNotification(
                params=ResourceUpdatedNotificationParams(uri=uri, _meta=meta)),
                related_request_id=ctx.request_id)
        return SubscriptionsListenResult(_meta=meta)

    server: Server[Any] = Server("upstream-announcing", on_list_tools=list_tools,
                                 on_call_tool=call_tool, on_subscribe_resource=subscribe,
                                 on_unsubscribe_resource=unsubscribe,
                                 on_subscriptions_listen=listen)
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


def test_a_listen_stream_carries_only_the_updates_of_its_filter(
        gw: tuple[Gateway, list[str]]) -> None:
    gateway, _ = gw
    body = {"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
        "notifications": {"resourceSubscriptions": [README]}, "_meta": META}}
    resp = post(gateway.mcp("docs"), body, headers(method="subscriptions/listen"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(line[5:]) for line in resp.text.splitlines()
              if line.startswith("data:")]
    assert [f.get("method") for f in frames] == [
        "notifications/subscriptions/acknowledged", "notifications/resources/updated",
        "notifications/resources/updated", None]
    assert [f["params"]["uri"] for f in frames[1:3]] == [README, README + "/part"]
    assert frames[-1]["id"] == 9 and "result" in frames[-1]
    [rec] = [r["data"] for r in gateway.records() if r["type"] == "mcp.tool_call"]
    assert rec["mcp_method"] == "subscriptions/listen"
    assert rec["withheld"]["count"] == 3
    assert rec["withheld"]["rules"] == [NOT_SUBSCRIBED, "no access rule allows it"]
