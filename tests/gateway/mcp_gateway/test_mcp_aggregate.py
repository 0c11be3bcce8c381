"""The aggregate endpoint ``/mcp`` (``mcp.aggregate: true``) with the official ``mcp`` SDK client:
the tools of two real SDK servers under ``<server>__<tool>``, each call routed to its server
with the per-server checks and audit, in both protocol eras the SDK speaks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.mcp.records import name_digest
from gateway.mcp.settings import McpSettings
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_sdk_through_gateway import sdk_client
from tests.gateway.mcp_gateway.upstreams import Counting, notes_server, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

TRACE_ID = "6bf92f3577b34da6a3ce929d0e0e4736"


def _agg(serve: Callable[..., Any], tmp: Path) -> Iterator[dict[str, Any]]:
    """Two SDK upstreams (``tools``, ``notes``) behind a gateway with ``aggregate: true``:
    ``k-agent`` may use both (no ``delete_*``), ``k-other`` only ``notes``, ``k-secret`` all,
    but its class may go to no tool server."""
    sim = serve(create_sim(SimConfig(models=["m"])))
    tools, notes = Counting(sdk_server()), Counting(notes_server())
    servers = {"tools": serve(tools).url + "/mcp", "notes": serve(notes).url + "/mcp"}

    def extra(mcp: dict[str, Any]) -> None:
        mcp["aggregate"] = True
        mcp["access"] = [
            {"keys": ["k-agent"], "allow": ["*"], "deny": ["delete_*"]},
            {"keys": ["k-other"], "servers": ["notes"], "allow": ["*"]},
            {"keys": ["k-secret"], "allow": ["*"]},
        ]

    gw: Gateway = start_gateway(tmp, sim.url, servers, {}, extra)
    try:
        yield {"gateway": gw, "tools": tools, "notes": notes}
    finally:
        gw.stop()


@pytest.fixture
def agg(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """:func:`_agg` for one test: no catalogue read yet, no note added (the notes server
    counts the notes it holds)."""
    yield from _agg(serve_asgi, tmp_path)


@pytest.fixture(scope="module")
def shared_agg(serve_asgi_module: Callable[..., Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _agg(serve_asgi_module, tmp_path_factory.mktemp("agg"))


@pytest.fixture
def agg_shared(shared_agg: dict[str, Any]) -> dict[str, Any]:
    """:func:`_agg` shared by the module's tests that add no note and do not depend on a
    catalogue being unread: the records and upstream calls from the start of the test."""
    shared_agg["tools"].seen.clear()
    shared_agg["notes"].seen.clear()
    return {**shared_agg, "gateway": shared_agg["gateway"].from_now()}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_aggregate_lists_prefixed_tools_and_routes_calls(agg: dict[str, Any], mode: str) -> None:
    gw = agg["gateway"]
    progress: list[float] = []

    async def go() -> tuple[list[str], str, str, str]:
        async with sdk_client(gw.url + "/mcp", KEYS["agent"], mode) as client:
            listed = await client.list_tools()

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)

            echoed = await client.call_tool("tools__echo", {"text": "via the aggregate"})
            counted = await client.call_tool("tools__count", {"steps": 2},
                                             progress_callback=on_progress)
            noted = await client.call_tool("notes__add_note", {"text": "n1"})
            return ([t.name for t in listed.tools],
                    echoed.content[0].text, counted.content[0].text,  # type: ignore[union-attr]
                    noted.content[0].text)  # type: ignore[union-attr]

    names, echoed, counted, noted = anyio.run(go)
    assert sorted(names) == ["notes__add_note", "tools__count", "tools__echo",
                             "tools__fetch_url"]  # delete_* denied on both servers
    assert (echoed, counted, noted) == ("via the aggregate", "counted 2", "1 notes")
    assert progress == [1, 2]
    # Each server got its own, unprefixed tool names.
    assert agg["tools"].calls() == ["tools/call:echo", "tools/call:count"]
    assert agg["notes"].calls() == ["tools/call:add_note"]
    calls = [r["data"] for r in gw.records() if r["type"] == "mcp.tool_call"]
    assert [(c["server"], c["tool"], c["destination"]) for c in calls] == [
        ("tools", "echo", "tools-tools"), ("tools", "count", "tools-tools"),
        ("notes", "add_note", "tools-notes")]
    version = "2026-07-28" if mode == "auto" else "2025-11-25"
    assert {c["protocol_version"] for c in calls} == {version}
    args = json.dumps({"text": "via the aggregate"}, separators=(",", ":")).encode()
    assert calls[0]["arguments_sha256"] == hashlib.sha256(args).hexdigest()
    assert all(c["key_id"] == "k-agent" and len(c["result_sha256"]) == 64 for c in calls)


def _call_error(gw: Gateway, key: str, tool: str, arguments: dict[str, Any]) -> MCPError:
    async def go() -> MCPError:
        async with sdk_client(gw.url + "/mcp", key) as client:
            try:
                await client.call_tool(tool, arguments)
            except MCPError as exc:
                return exc
        raise AssertionError(f"{tool} was not refused")

    return anyio.run(go)


def test_aggregate_applies_the_per_server_refusals(agg: dict[str, Any]) -> None:
    gw = agg["gateway"]

    async def listed(key: str) -> list[str]:
        async with sdk_client(gw.url + "/mcp", key) as client:
            return sorted(t.name for t in (await client.list_tools()).tools)

    assert anyio.run(listed, KEYS["other"]) == ["notes__add_note", "notes__delete_note"]
    assert anyio.run(listed, KEYS["secret"]) == []  # no tool server may receive "secret"

    refusals = [
        (KEYS["other"], "tools__echo", {"text": "x"}, "tool_denied"),  # server not granted
        (KEYS["agent"], "notes__delete_note", {"index": 0}, "tool_denied"),
        (KEYS["secret"], "tools__echo", {"text": "x"}, "class_refused"),
        (KEYS["agent"], "tools__nosuch", {}, "unknown_tool"),  # not on the server
        (KEYS["agent"], "nosuch__echo", {}, "unknown_tool"),  # no such server
        (KEYS["agent"], "echo", {"text": "x"}, "unknown_tool"),  # no prefix
        (KEYS["agent"], "tools__echo", {"text": 5}, "schema_invalid"),
    ]
    for key, tool, arguments, _ in refusals:
        err = _call_error(gw, key, tool, arguments)
        assert err.error.code in (-32001, -32602), (tool, err)
    # Nothing reached an upstream; each refusal is one record with its reason.
    assert agg["tools"].calls() == [] and agg["notes"].calls() == []
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [r["reason"] for r in refused] == [reason for *_, reason in refusals]
    # Refused before the tools server's catalogue was read: the name asked for is recorded as
    # its digest; once the catalogue holds it (the schema check read it), as given.
    assert refused[0]["server"] == "tools" and refused[0]["tool"] is None
    assert refused[0]["unknown_names"] == {"tool": name_digest("echo")}
    assert refused[0]["key_id"] == "k-other"
    assert refused[-1]["tool"] == "echo" and "unknown_names" not in refused[-1]
    assert [r["unknown_names"] for r in refused[4:6]] == [
        {"tool": name_digest("nosuch__echo")}, {"tool": name_digest("echo")}]


def test_aggregate_refuses_a_caller_no_access_rule_names(agg_shared: dict[str, Any]) -> None:
    """As ``/mcp/<server>`` does (403): a caller that may use no server gets nothing to
    discover at ``/mcp`` either (it answered initialize, ping and an empty tools/list)."""
    gw = agg_shared["gateway"]
    for method, params in (("ping", {}), ("tools/list", {}), ("server/discover", {})):
        resp = httpx.post(gw.url + "/mcp", timeout=10, json={
            "jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}}, headers={
            "authorization": f"Bearer {KEYS['nobody']}", "mcp-protocol-version": "2026-07-28",
            "mcp-method": method, "accept": "application/json, text/event-stream"})
        assert resp.status_code == 403, (method, resp.text)
        assert resp.json()["error"]["code"] == -32001
    assert [r["data"]["reason"] for r in gw.records() if r["type"] == "mcp.refused"
            and r["data"]["key_id"] == "k-nobody"] == ["tool_denied"] * 3


def test_aggregate_challenge_and_metadata(agg_shared: dict[str, Any]) -> None:
    gw = agg_shared["gateway"]
    no_key = httpx.post(gw.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                        headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
                        timeout=10)
    assert no_key.status_code == 401
    url = f"{gw.url}/.well-known/oauth-protected-resource/mcp"
    assert no_key.headers["www-authenticate"] == f'Bearer resource_metadata="{url}"'
    meta = httpx.get(url, timeout=10).json()
    assert meta["resource"] == gw.url + "/mcp"
    # A handshake-era session id belongs to its caller (and to /mcp only).
    init = httpx.post(gw.url + "/mcp", timeout=10, headers={
        "authorization": f"Bearer {KEYS['agent']}", "accept": "application/json"},
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
    assert init.status_code == 200 and init.json()["result"]["protocolVersion"] == "2025-11-25"
    sid = init.headers["mcp-session-id"]
    for key, path, status in ((KEYS["other"], "/mcp", 404), (KEYS["agent"], "/mcp/tools", 404),
                              (KEYS["agent"], "/mcp", 200)):
        res = httpx.post(gw.url + path, timeout=10, json={"jsonrpc": "2.0", "id": 2,
                                                         "method": "ping"},
                         headers={"authorization": f"Bearer {key}", "mcp-session-id": sid,
                                  "mcp-protocol-version": "2025-11-25",
                                  "accept": "application/json, text/event-stream"})
        assert res.status_code == status, (key, path, res.text)


def test_aggregate_is_off_by_default(stack: dict[str, Any]) -> None:
    gw = stack["gateway"]
    res = httpx.post(gw.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                     headers={"authorization": f"Bearer {KEYS['agent']}"}, timeout=10)
    assert res.status_code == 404 and "aggregate" in res.json()["error"]["message"]


def test_aggregate_refuses_server_names_with_the_separator() -> None:
    server = {"name": "a__b", "url": "http://127.0.0.1:1/mcp"}
    McpSettings.model_validate({"servers": [server]})  # fine without the aggregate
    with pytest.raises(ValidationError, match=r"servers\[0\]\.name: 'a__b' contains '__'"):
        McpSettings.model_validate({"servers": [server], "aggregate": True})


def test_ts_sdk_client_through_the_aggregate(agg_shared: dict[str, Any]) -> None:
    from tests.gateway.mcp_gateway.test_mcp_ts_sdk_client import run_ts_client

    gw = agg_shared["gateway"]
    report = run_ts_client(gw.url + "/mcp", KEYS["agent"], [
        ("tools__echo", {"text": "ts via the aggregate"}), ("notes__delete_note", {"index": 0})])
    assert report["protocolVersion"] == "2025-11-25" and report["sessionId"]
    assert sorted(report["tools"]) == ["notes__add_note", "tools__count", "tools__echo",
                                       "tools__fetch_url"]
    echo, denied = report["calls"]
    assert echo["ok"] and echo["result"]["content"][0]["text"] == "ts via the aggregate"
    assert not denied["ok"] and denied["error"]["code"] == 403
    assert agg_shared["tools"].calls() == ["tools/call:echo"] and agg_shared["notes"].calls() == []
