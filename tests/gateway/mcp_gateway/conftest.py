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


@pytest.fixture
def stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Upstreams (``tools``: the SDK server; ``wrongid``, ``forever``, ``huge``: bad ones),
    a ``web`` site, the simulator and the gateway in front of them."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"], auto_tool_calls=True)))
    counting = Counting(sdk_server())
    tools = serve_asgi(counting)
    bad = {mode: serve_asgi(bad_server(mode)) for mode in ("wrong_id", "forever", "huge")}
    web = serve_asgi(create_sim(SimConfig(models=["w"])))
    servers = {"tools": tools.url + "/mcp",
               **{mode.replace("_", ""): srv.url + "/mcp" for mode, srv in bad.items()}}

    def extra(mcp: dict[str, Any]) -> None:
        for server in mcp["servers"]:
            if server["name"] == "tools":
                server["tools"] = {"fetch_url": {"url_arguments": ["url"]}}
        mcp["limits"] = {"max_response_bytes": 2_000_000, "call_timeout_s": 3,
                         "idle_timeout_s": 3}

    gw: Gateway = start_gateway(tmp_path, sim.url, servers, {"web": web.port}, extra)
    try:
        yield {"gateway": gw, "sim": sim, "web": web, "tools": tools, "upstream": counting}
    finally:
        gw.stop()
