"""Handshake-era (2025-11-25) sessions across gateway processes: with ``mcp.session_key_file``
shared, a session opened on one ``gateway serve`` continues on another (as across workers and
pods); without it, each process's random key binds sessions to that process."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.audit import generate_key_file
from gateway.errors import ConfigError
from gateway.mcp.sessions import SessionBinder
from gateway.mcp.settings import McpSettings
from gateway.mcp.wiring import build_mcp
from tests.gateway.mcp_gateway.harness import KEYS, start_gateway
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next of ``ports`` on loopback (a load balancer without
    affinity); counts the requests per port."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.sent: dict[int, int] = dict.fromkeys(ports, 0)
        self._next = 0
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[self._next % len(self.ports)]
        self._next += 1
        self.sent[port] += 1
        request.url = request.url.copy_with(port=port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def test_a_session_continues_on_another_gateway_sharing_the_key(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Counting(sdk_server())
    servers = {"tools": serve_asgi(upstream).url + "/mcp"}
    key = generate_key_file(tmp_path / "mcp-session.key")

    def extra(mcp: dict[str, Any]) -> None:
        mcp["session_key_file"] = str(key)

    gateways = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            gateways.append(start_gateway(tmp_path / name, sim.url, servers, {}, extra))
        ports = [int(gw.url.rsplit(":", 1)[1]) for gw in gateways]
        balancer = RoundRobin(ports)

        async def go() -> tuple[list[str], str, str]:
            async with httpx2.AsyncClient(
                    transport=balancer, timeout=httpx2.Timeout(30.0),
                    headers={"Authorization": f"Bearer {KEYS['agent']}"}) as http:
                async with Client(streamable_http_client(gateways[0].mcp("tools"),
                                                         http_client=http),
                                  mode="legacy") as client:
                    listed = await client.list_tools()
                    first = await client.call_tool("echo", {"text": "one"})
                    second = await client.call_tool("echo", {"text": "two"})
                    return ([t.name for t in listed.tools], first.content[0].text,  # type: ignore[union-attr]
                            second.content[0].text)  # type: ignore[union-attr]

        names, first, second = anyio.run(go)
        assert "echo" in names and (first, second) == ("one", "two")
        assert all(n >= 2 for n in balancer.sent.values()), balancer.sent
        # Both gateways forwarded session requests; neither refused one.
        records = [{**r["data"], "type": r["type"]} for gw in gateways for r in gw.records()
                   if r["type"].startswith("mcp.") and r["type"] != "mcp.catalogue"]
        # (A standalone GET stream, if the SDK opens one, is answered 405.)
        assert {r["reason"] for r in records if r["decision"] != "allow"} <= {
            "method_not_allowed"}
        assert sorted(r["protocol_version"] for r in records if r["type"] == "mcp.tool_call"
                      and r["mcp_method"] == "tools/call") == ["2025-11-25", "2025-11-25"]
        assert upstream.calls() == ["tools/call:echo", "tools/call:echo"]
    finally:
        for gw in gateways:
            gw.stop()


def test_session_ids_bind_to_the_key() -> None:
    key = b"k" * 32
    sid = SessionBinder(key).wrap("k-agent", "tools", "upstream-session")
    assert SessionBinder(key).unwrap("k-agent", "tools", sid) == "upstream-session"
    # Per-process random keys (no session_key_file): another process does not know the id.
    assert SessionBinder().unwrap("k-agent", "tools", SessionBinder().wrap(
        "k-agent", "tools", "upstream-session")) is None
    assert SessionBinder(b"x" * 32).unwrap("k-agent", "tools", sid) is None
    with pytest.raises(ValueError, match="at least 32 bytes"):
        SessionBinder(b"short")


@pytest.mark.parametrize(("content", "problem"), [
    ("c2hvcnQ=\n", "at least 32 bytes (has 5)"),
    ("not base64!\n", "not base64"),
    (None, "cannot read"),
])
def test_a_bad_session_key_file_is_a_config_error(tmp_path: Path, content: str | None,
                                                  problem: str) -> None:
    path = tmp_path / "mcp-session.key"
    if content is not None:
        path.write_text(content)
    settings = McpSettings.model_validate({
        "servers": [{"name": "tools", "url": "http://127.0.0.1:1/mcp"}],
        "session_key_file": str(path)})
    with pytest.raises(ConfigError, match=r"mcp\.session_key_file: ") as err:
        build_mcp(settings, None, None, None)
    assert problem in err.value.message


def test_the_docs_command_makes_a_session_key_file_the_gateway_takes(tmp_path: Path) -> None:
    """docs/mcp.md named the format of ``session_key_file`` but no way to make one: its
    command, run as printed, writes a key that the wiring loads, readable by its owner only."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "mcp.md").read_text()
    command = next(block for block in re.findall(r"^```sh\n(.*?)^```", doc, re.S | re.M)
                   if "mcp-session.key" in block)
    subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, check=True,
                   timeout=60)
    path = tmp_path / "mcp-session.key"
    assert path.stat().st_mode & 0o777 == 0o600
    settings = McpSettings.model_validate({
        "servers": [{"name": "tools", "url": "http://127.0.0.1:1/mcp"}],
        "session_key_file": str(path)})
    build_mcp(settings, None, None, None)
