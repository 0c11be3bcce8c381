"""Client credentials never pass upstream; the gateway's own credential (the server's
``auth_token_file``, a mounted Secret) does.

The upstream is the official SDK's ``MCPServer`` behind an ASGI wrapper that records the
headers of every request it receives (the gateway's own catalogue requests included). The
client is the official SDK client in both protocol eras, sending an ``Authorization`` (its
gateway key), a ``Cookie``, ``Proxy-Authorization``, ``Forwarded``/``X-Forwarded-*`` and other
``X-`` headers; a session id the client made up is refused without anything being forwarded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.upstreams import Recording, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

UPSTREAM_TOKEN = "upstream-token-from-the-secret"  # noqa: S105 - a test value
CLIENT_HEADERS = {
    "cookie": "session=client-cookie-value",
    "proxy-authorization": "Basic Y2xpZW50OnByb3h5LXNlY3JldA==",
    "x-api-key": "client-x-api-key",
    "x-auth-token": "client-x-auth-token",
    "x-forwarded-for": "203.0.113.7",
    "x-forwarded-host": "evil.example",
    "forwarded": "for=203.0.113.7;host=evil.example",
    "x-custom": "client-custom-value",
}
SECRETS = [KEYS["agent"], *CLIENT_HEADERS.values()]


@pytest.fixture
def recorded(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Recording(sdk_server())
    token = tmp_path / "tools-token"
    token.write_text(UPSTREAM_TOKEN + "\n")

    def extra(mcp: dict[str, Any]) -> None:
        mcp["servers"][0]["auth_token_file"] = str(token)

    gw: Gateway = start_gateway(tmp_path, sim.url, {"tools": serve_asgi(upstream).url + "/mcp"},
                                {}, extra)
    try:
        yield {"gateway": gw, "upstream": upstream}
    finally:
        gw.stop()


@asynccontextmanager
async def leaky_client(url: str, mode: str, sessions: list[str]) -> AsyncIterator[Client]:
    """The SDK client sending the gateway key and every header of ``CLIENT_HEADERS``; the
    session ids the gateway hands it are appended to ``sessions``."""

    async def note(response: httpx2.Response) -> None:
        if "mcp-session-id" in response.headers:
            sessions.append(response.headers["mcp-session-id"])

    async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {KEYS['agent']}", **CLIENT_HEADERS},
            event_hooks={"response": [note]}, timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_client_credentials_never_reach_the_upstream(recorded: dict[str, Any],
                                                     mode: str) -> None:
    gw, upstream = recorded["gateway"], recorded["upstream"]
    client_sessions: list[str] = []

    async def go() -> str:
        async with leaky_client(gw.mcp("tools"), mode, client_sessions) as client:
            await client.list_tools()
            result = await client.call_tool("echo", {"text": "no leaks"})
            return result.content[0].text  # type: ignore[union-attr]

    assert anyio.run(go) == "no leaks"
    seen = upstream.requests
    assert len(seen) >= 3  # catalogue, tools/list, tools/call at least
    for method, headers in seen:
        # The gateway's credential, from the Secret, on every request (its own included).
        assert headers.get("authorization") == f"Bearer {UPSTREAM_TOKEN}", (method, headers)
        for name in CLIENT_HEADERS:
            assert name not in headers, (name, method, headers)
        for value in headers.values():
            assert not any(secret in value for secret in SECRETS), (method, headers)
    # Legacy: the upstream sees its own session ids, never the caller-bound ones.
    upstream_sids = {h["mcp-session-id"] for _, h in seen if "mcp-session-id" in h}
    assert not upstream_sids & set(client_sessions)
    if mode == "legacy":  # the client's session went through, unwrapped
        assert client_sessions and upstream_sids


def test_a_client_made_session_id_is_refused_and_not_forwarded(
        recorded: dict[str, Any]) -> None:
    gw, upstream = recorded["gateway"], recorded["upstream"]
    before = len(upstream.requests)
    for version, status in (("2025-11-25", 404), ("2026-07-28", 400)):
        res = httpx.post(gw.mcp("tools"), timeout=10, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": version}}},
            headers={"authorization": f"Bearer {KEYS['agent']}",
                     "mcp-session-id": "client-chosen-session", "mcp-protocol-version": version,
                     "mcp-method": "tools/list", "accept": "application/json, text/event-stream",
                     **CLIENT_HEADERS})
        assert res.status_code == status, res.text
    assert len(upstream.requests) == before
    reasons = [r["data"]["reason"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert reasons == ["session_unknown", "session_refused"]
