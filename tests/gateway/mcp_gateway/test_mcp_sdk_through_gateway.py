"""The official ``mcp`` SDK (2.3) as client and upstream server through a real ``gateway serve``.

Both protocol eras the SDK speaks: 2026-07-28 (stateless, ``server/discover``, ``Mcp-Method``
headers) and the ``initialize`` handshake (2025-11-25 sessions). ``tools/list`` shows only what
the key may call, progress notifications are relayed as they come, and every tool call is one
audit record with the digests of its arguments and result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.mcp.records import name_digest
from tests.gateway.mcp_gateway.harness import KEYS


@asynccontextmanager
async def sdk_client(url: str, key: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's ``Client`` over its Streamable HTTP transport, with the API key."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                  timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_sdk_client_lists_and_calls_tools_through_the_gateway(stack: dict[str, Any],
                                                              mode: str) -> None:
    gw = stack["gateway"]
    progress: list[float] = []

    async def go() -> tuple[list[str], str, str]:
        async with sdk_client(gw.mcp("tools"), KEYS["agent"], mode) as client:
            listed = await client.list_tools()
            echoed = await client.call_tool("echo", {"text": "hello through the door"})

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)

            counted = await client.call_tool("count", {"steps": 3},
                                             progress_callback=on_progress)
            return ([t.name for t in listed.tools], echoed.content[0].text,  # type: ignore[union-attr]
                    counted.content[0].text)  # type: ignore[union-attr]

    names, echoed, counted = anyio.run(go)
    assert sorted(names) == ["count", "echo", "fetch_url"]  # delete_everything is denied
    assert echoed == "hello through the door"
    assert counted == "counted 3" and progress == [1, 2, 3]
    calls = [r["data"] for r in gw.records() if r["type"] == "mcp.tool_call"
             and r["data"]["mcp_method"] == "tools/call"]  # every forwarded message is one
    assert [c["tool"] for c in calls] == ["echo", "count"]
    echo = calls[0]
    assert echo["key_id"] == "k-agent" and echo["server"] == "tools"
    assert echo["data_class"] == "internal" and echo["decision"] == "allow"
    assert echo["destination"] == "tools-tools"
    args = json.dumps({"text": "hello through the door"}, separators=(",", ":")).encode()
    assert echo["arguments_sha256"] == hashlib.sha256(args).hexdigest()
    assert len(echo["result_sha256"]) == 64 and echo["bytes_out"] > 0
    assert echo["protocol_version"] == ("2026-07-28" if mode == "auto" else "2025-11-25")


def test_denied_tool_is_refused_and_audited(fresh_stack: dict[str, Any]) -> None:
    # Its own gateway: one that listed the tools already knows the name (recorded as given).
    gw = fresh_stack["gateway"]

    async def go() -> Any:
        async with sdk_client(gw.mcp("tools"), KEYS["agent"]) as client:
            try:
                await client.call_tool("delete_everything", {})
            except MCPError as exc:
                return exc
        return None

    err = anyio.run(go)
    assert isinstance(err, MCPError), err
    assert "denies 'delete_*'" in str(err)
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    # Refused before the tool catalogue was read: the name is not known to exist, so the
    # record holds its digest (gateway.mcp.records.name_digest), not the client's text.
    assert refused[-1]["tool"] is None
    assert refused[-1]["unknown_names"] == {"tool": name_digest("delete_everything")}
    assert refused[-1]["reason"] == "tool_denied" and refused[-1]["status"] == 403
