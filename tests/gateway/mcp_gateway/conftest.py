"""Fixtures of the MCP tests: the SDK upstream, the simulator, a real ``gateway serve``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.upstreams import Counting, bad_server, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim


def _stack(serve: Callable[..., Any], tmp: Path) -> Iterator[dict[str, Any]]:
    """Upstreams (``tools``: the SDK server; ``wrongid``, ``forever``, ``huge``: bad ones),
    a ``web`` site, the simulator and the gateway in front of them."""
    sim = serve(create_sim(SimConfig(models=["m"], auto_tool_calls=True)))
    counting = Counting(sdk_server())
    tools = serve(counting)
    bad = {mode: serve(bad_server(mode)) for mode in ("wrong_id", "forever", "huge")}
    web = serve(create_sim(SimConfig(models=["w"])))
    servers = {"tools": tools.url + "/mcp",
               **{mode.replace("_", ""): srv.url + "/mcp" for mode, srv in bad.items()}}

    def extra(mcp: dict[str, Any]) -> None:
        for server in mcp["servers"]:
            if server["name"] == "tools":
                server["tools"] = {"fetch_url": {"url_arguments": ["url"]}}
        mcp["limits"] = {"max_response_bytes": 2_000_000, "call_timeout_s": 3,
                         "idle_timeout_s": 3}

    gw: Gateway = start_gateway(tmp, sim.url, servers, {"web": web.port}, extra)
    try:
        yield {"gateway": gw, "sim": sim, "web": web, "tools": tools, "upstream": counting}
    finally:
        gw.stop()


@pytest.fixture
def fresh_stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """:func:`_stack` for one test: a gateway that has read no server's catalogue yet."""
    yield from _stack(serve_asgi, tmp_path)


@pytest.fixture(scope="module")
def shared_stack(serve_asgi_module: Callable[..., Any],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """:func:`_stack` shared by a module's tests (one ``gateway serve`` start per module, not
    per test): use it through :func:`stack`.

    Shared because no test changes it: the gateway has no quotas or budgets, every test opens
    its own MCP sessions, and :func:`stack` shows each test only the audit records and upstream
    calls it caused (a test that counts Prometheus samples counts its own increase). A test
    that needs the gateway as started (no catalogue read yet) uses :func:`fresh_stack`.
    """
    yield from _stack(serve_asgi_module, tmp_path_factory.mktemp("mcp-stack"))


@pytest.fixture
def stack(shared_stack: dict[str, Any]) -> dict[str, Any]:
    """:func:`shared_stack` as one test sees it: ``gateway``'s records and ``upstream``'s
    calls are those from the start of this test on."""
    shared_stack["upstream"].seen.clear()
    return {**shared_stack, "gateway": shared_stack["gateway"].from_now()}
