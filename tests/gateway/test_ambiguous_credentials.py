"""Two ``Authorization`` headers in one request are refused (400 ``ambiguous_credentials``)
on every surface that reads a credential, never resolved: the relay took the last one, the
models, usage and batch APIs the first, so which key a request ran as depended on the path
(and a proxy in front may have checked the other one).

A real gateway (uvicorn on loopback) with the simulator for the OpenAI paths, a real
``gateway serve`` in front of the official SDK's MCP server for ``/mcp``; both keys valid."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from tests.gateway.helpers import start_sim
from tests.gateway.mcp_gateway.harness import KEYS as MCP_KEYS
from tests.gateway.mcp_gateway.harness import start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from tests.gateway.test_batch_api import KEYS, settings
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TWO = [("authorization", f"Bearer {KEYS['owner']}"), ("authorization", f"Bearer {KEYS['other']}")]


def test_the_openai_paths_refuse_two_authorization_headers(serve_asgi: Any,
                                                           tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=url, timeout=30) as http:
        answers = {
            "chat": http.post("/v1/chat/completions", json=chat, headers=TWO),
            "models": http.get("/v1/models", headers=TWO),
            "usage": http.get("/v1/usage", headers=TWO),
            "files": http.post("/v1/files", headers=TWO, data={"purpose": "batch"},
                               files={"file": ("in.jsonl", io.BytesIO(b"{}\n"))}),
            "batches": http.get("/v1/batches", headers=TWO),
        }
        got = {name: (r.status_code, r.json()["error"]["code"]) for name, r in answers.items()}
        assert got == dict.fromkeys(answers, (400, "ambiguous_credentials")), got
        # one header: served as before
        one = [TWO[0]]
        assert http.post("/v1/chat/completions", json=chat, headers=one).status_code == 200
        assert http.get("/v1/models", headers=one).status_code == 200


def test_the_mcp_endpoint_refuses_two_authorization_headers(serve_asgi: Callable[..., Any],
                                                            tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    tools = Counting(sdk_server())
    gw = start_gateway(tmp_path, sim.url, {"tools": serve_asgi(tools).url + "/mcp"}, {})
    try:
        hdrs = [(k, v) for k, v in headers(name="echo").items() if k != "authorization"]
        hdrs += [("authorization", f"Bearer {MCP_KEYS['agent']}"),
                 ("authorization", f"Bearer {MCP_KEYS['nobody']}")]
        resp = httpx.post(gw.mcp("tools"), content=json.dumps(call("echo", {"text": "x"})),
                          headers=hdrs, timeout=30)
        assert resp.status_code == 400, resp.text[:300]
        assert "more than once" in resp.json()["error"]["message"]
        assert [s for s in tools.seen if s.startswith("tools/call")] == []
        assert [r["data"]["reason"] for r in gw.records()
                if r["type"] == "mcp.refused"] == ["ambiguous_credentials"]
    finally:
        gw.stop()
