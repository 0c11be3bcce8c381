"""``Mcp-Param-*`` headers (2026-07-28 ``x-mcp-header``): the gateway's rules against the
official SDK's (``mcp.shared.inbound``, the oracle), and through a real ``gateway serve`` in
front of an SDK server that checks the headers itself: the client's headers are checked, never
relayed; the server gets headers rebuilt from the checked arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.inbound import mcp_param_headers, validate_mcp_param_headers, x_mcp_header_map

from gateway.mcp.jsonrpc import McpRefusal
from gateway.mcp.params import check_param_headers, param_headers
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_sdk_through_gateway import sdk_client
from tests.gateway.mcp_gateway.upstreams import Recording, param_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

SCHEMA = {"type": "object", "properties": {
    "region": {"type": "string", "x-mcp-header": "Region"},
    "limit": {"type": "integer", "x-mcp-header": "Limit"},
    "dry": {"type": "boolean", "x-mcp-header": "Dry"},
    "inner": {"type": "object", "properties": {
        "zone": {"type": "string", "x-mcp-header": "Zone"}}},
    "query": {"type": "string"},
}}
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(max_size=8), st.sampled_from(["eu", " eu", "=?base64?ZXU=?=", "é"]))
NAMES = ("mcp-param-region", "mcp-param-limit", "mcp-param-dry", "mcp-param-zone",
         "mcp-param-other")


def _ours_refuses(arguments: dict[str, Any], lines: list[tuple[str, str]]) -> bool:
    try:
        check_param_headers(SCHEMA, arguments, lines)
    except McpRefusal as exc:
        assert exc.rpc_code == -32020 and exc.status == 400
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(region=SCALARS, limit=SCALARS, dry=SCALARS, zone=SCALARS)
def test_rebuilt_headers_equal_the_sdk_clients(region: Any, limit: Any, dry: Any,
                                               zone: Any) -> None:
    arguments = {"region": region, "limit": limit, "dry": dry, "inner": {"zone": zone}}
    theirs = {k.lower(): v for k, v in mcp_param_headers(x_mcp_header_map(SCHEMA),
                                                         arguments).items()}
    assert param_headers(SCHEMA, arguments) == theirs
    # What the SDK client would send, the gateway accepts, and so does the SDK server.
    assert not _ours_refuses(arguments, list(theirs.items()))
    assert validate_mcp_param_headers(SCHEMA, arguments, theirs) is None


@settings(max_examples=300, deadline=None)
@given(region=SCALARS, limit=SCALARS,
       lines=st.lists(st.tuples(st.sampled_from(NAMES), st.one_of(
           st.sampled_from(["eu", "5", "5.0", "true", "=?base64?ZXU=?=", "=?base64?ZX=?=",
                            "=?base64?!!?="]), st.text(alphabet="abc5", max_size=3))),
           max_size=4))
def test_header_checks_agree_with_the_sdk_server(region: Any, limit: Any,
                                                 lines: list[tuple[str, str]]) -> None:
    arguments = {"region": region, "limit": limit}
    names = [n for n, _ in lines]
    theirs = validate_mcp_param_headers(SCHEMA, arguments, dict(lines))
    # The SDK folds a repeated line before its check; the gateway refuses every repeat.
    if len(set(names)) == len(names):
        assert _ours_refuses(arguments, lines) == (theirs is not None), (arguments, lines)
    else:
        assert _ours_refuses(arguments, lines)


@pytest.fixture
def params_gw(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Recording(param_server())

    def extra(mcp: dict[str, Any]) -> None:
        mcp["aggregate"] = True

    gw: Gateway = start_gateway(tmp_path, sim.url,
                                {"geo": serve_asgi(upstream).url + "/mcp"}, {}, extra)
    try:
        yield {"gateway": gw, "upstream": upstream}
    finally:
        gw.stop()


def _modern_call(url: str, name: str, arguments: dict[str, Any],
                 extra: list[tuple[str, str]]) -> httpx.Response:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    headers = [("authorization", f"Bearer {KEYS['agent']}"), ("mcp-protocol-version",
               "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", name),
               ("accept", "application/json, text/event-stream"), *extra]
    return httpx.post(url, timeout=30, headers=headers, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta}})


def test_param_headers_through_the_gateway(params_gw: dict[str, Any]) -> None:
    gw, upstream = params_gw["gateway"], params_gw["upstream"]

    async def go(url: str, tool: str) -> str:
        async with sdk_client(url, KEYS["agent"]) as client:  # 2026-07-28: sends Mcp-Param-*
            await client.list_tools()
            result = await client.call_tool(tool, {"region": "eu-de", "query": "q"})
            return result.content[0].text  # type: ignore[union-attr]

    # The SDK server checks the header itself: it is there, rebuilt, on both endpoints.
    assert anyio.run(go, gw.mcp("geo"), "lookup") == "q in eu-de"
    assert anyio.run(go, gw.url + "/mcp", "geo__lookup") == "q in eu-de"
    calls = [h for _, h in upstream.requests if h.get("mcp-method") == "tools/call"]
    assert [h.get("mcp-param-region") for h in calls] == ["eu-de", "eu-de"]

    before = len(upstream.requests)
    for name, arguments, lines in (
            ("lookup", {"region": "eu-de", "query": "q"}, [("mcp-param-region", "us-east")]),
            ("lookup", {"region": "eu-de", "query": "q"}, []),  # missing
            ("lookup", {"query": "q"}, [("mcp-param-region", "eu-de")]),  # no argument
            ("lookup", {"region": "eu-de", "query": "q"},
             [("mcp-param-region", "eu-de"), ("mcp-param-region", "eu-de")]),
            ("lookup", {"region": "eu-de", "query": "q"},
             [("mcp-param-region", "eu-de"), ("mcp-method", "tools/call")])):  # repeated
        res = _modern_call(gw.mcp("geo"), name, arguments, lines)
        assert res.status_code == 400, res.text
        assert res.json()["error"]["code"] == -32020, res.text
    assert len(upstream.requests) == before  # nothing forwarded

    # A header no annotation declares is not relayed (it would bypass the argument checks).
    res = _modern_call(gw.mcp("geo"), "lookup", {"region": "eu-de", "query": "q"},
                       [("mcp-param-region", "eu-de"), ("mcp-param-smuggled", "secret-data")])
    assert res.status_code == 200, res.text
    last = upstream.requests[-1][1]
    assert last["mcp-param-region"] == "eu-de" and "mcp-param-smuggled" not in last
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [r["reason"] for r in refused] == ["header_mismatch"] * 5
