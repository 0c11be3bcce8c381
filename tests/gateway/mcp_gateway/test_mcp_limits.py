"""Tool calls under the caller's request quotas and a server's flow control, through a real
``gateway serve``: refused with a JSON-RPC error, an HTTP status and ``Retry-After``, audited,
and never forwarded.

* Quotas: with ``requests_per_minute: 2`` per key, a key's third tool call is refused (429,
  ``-32003``, ``rate_limit_exceeded``); the same counter refuses its next chat completion
  (the ``openai`` SDK sees 429), while another key is unaffected.
* Flow: with ``flow: {max_concurrent: 1, max_queued: 1}`` on the server, while one slow call is
  in flight a second waits and succeeds, a third is refused at once (503, ``server_busy``);
  the ``sg_gateway_mcp_queued`` gauge on ``/metrics`` shows the waiting call.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.mcp_gateway.harness import KEYS, start_gateway
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}


def _call(url: str, key: str, tool: str, arguments: dict[str, Any]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": META}}
    return httpx.post(url, content=json.dumps(body), timeout=60, headers={
        "authorization": f"Bearer {key}", "content-type": "application/json",
        "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call", "mcp-name": tool})


def _error(resp: httpx.Response) -> dict[str, Any]:
    err: dict[str, Any] = resp.json()["error"]
    return err


def _quota_gateway(serve_asgi: Callable[..., Any], tmp_path: Path,
                   aggregate: bool = False) -> tuple[Any, Counting]:
    """A gateway with ``requests_per_minute: 2`` per key in front of a counting SDK server
    ``tools`` (and the simulator); ``aggregate`` turns ``/mcp`` on."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Counting(sdk_server())
    tools = serve_asgi(upstream)

    def quotas(cfg: dict[str, Any]) -> None:
        cfg["quotas"] = {"enabled": True, "defaults": {"key": {"requests_per_minute": 2}}}
        cfg["mcp"]["aggregate"] = aggregate

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {}, cfg_extra=quotas)
    return gw, upstream


def test_tool_calls_count_against_the_callers_request_quota(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    gw, upstream = _quota_gateway(serve_asgi, tmp_path)
    try:
        url = gw.mcp("tools")
        first, second = (_call(url, KEYS["agent"], "echo", {"text": f"hi {i}"}) for i in (1, 2))
        assert (first.status_code, second.status_code) == (200, 200)
        third = _call(url, KEYS["agent"], "echo", {"text": "hi 3"})
        assert third.status_code == 429
        err = _error(third)
        assert err["code"] == -32003 and err["data"]["limit"] == "requests"
        assert "Rate limit reached for key 'k-agent'" in err["message"]
        assert int(third.headers["retry-after"]) >= 1
        assert upstream.calls() == ["tools/call:echo"] * 2  # the refused call never left
        # The same counter: the key's next model request is refused too.
        model = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["agent"], max_retries=0)
        with pytest.raises(openai.RateLimitError):
            model.chat.completions.create(model="m",
                                          messages=[{"role": "user", "content": "x"}])
        # Another key has its own quota.
        assert _call(url, KEYS["other"], "echo", {"text": "hi"}).status_code == 200
        samples = gw.metrics("sg_gateway_mcp_calls_total")
    finally:
        gw.stop()
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [(r["key_id"], r["tool"], r["reason"], r["status"]) for r in refused] == [
        ("k-agent", "echo", "rate_limit_exceeded", 429)]
    assert sum(v for k, v in samples.items()
               if dict(k).get("sg_mcp_reason") == "rate_limit_exceeded") == 1


def queued_gauge(gw: Any) -> dict[str, float]:
    """``sg_gateway_mcp_queued`` by server, from the admin ``/metrics`` page."""
    return {dict(labels)["sg_mcp_server"]: value
            for labels, value in gw.metrics("sg_gateway_mcp_queued").items()}


def test_a_busy_server_queues_one_call_and_refuses_the_next(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Counting(sdk_server())
    tools = serve_asgi(upstream)

    def flow(mcp: dict[str, Any]) -> None:
        mcp["servers"][0]["flow"] = {"max_concurrent": 1, "max_queued": 1,
                                     "queue_timeout_s": 60}

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {}, flow)
    try:
        url = gw.mcp("tools")
        assert _call(url, KEYS["agent"], "echo", {"text": "warm"}).status_code == 200
        results: dict[str, httpx.Response] = {}

        def run(name: str, steps: int) -> None:
            results[name] = _call(url, KEYS["agent"], "count", {"steps": steps})

        slow = threading.Thread(target=run, args=("slow", 300))  # >= 3 s upstream
        slow.start()
        deadline = time.monotonic() + 30
        while "tools/call:count" not in upstream.calls():  # in flight upstream
            assert time.monotonic() < deadline, "the slow call never reached the server"
            time.sleep(0.01)
        assert queued_gauge(gw) == {"tools": 0.0}
        queued = threading.Thread(target=run, args=("queued", 1))
        queued.start()
        # The gauge on a real /metrics scrape shows the call waiting behind the gate (and is
        # what tells this test it has taken the one queue place).
        while queued_gauge(gw) != {"tools": 1.0}:
            assert time.monotonic() < deadline, "the second call never queued"
            time.sleep(0.01)
        busy = _call(url, KEYS["agent"], "count", {"steps": 1})
        assert "queued" not in results and slow.is_alive()
        assert queued_gauge(gw) == {"tools": 1.0}  # the refused call did not queue
        slow.join(60)
        queued.join(60)
        assert queued_gauge(gw) == {"tools": 0.0}
    finally:
        gw.stop()
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert (_error(busy)["code"], _error(busy)["data"]) == (-32003, {"retry_after_s": 1})
    assert results["slow"].status_code == 200 and "counted 300" in results["slow"].text
    assert results["queued"].status_code == 200 and "counted 1" in results["queued"].text
    assert upstream.calls().count("tools/call:count") == 2  # the refused one never left
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [(r["reason"], r["status"]) for r in refused] == [("server_busy", 503)]


def test_calls_through_the_aggregate_count_against_the_same_quota(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """``/mcp`` (``tools__echo``) is charged like ``/mcp/tools``: no way around the quota."""
    gw, upstream = _quota_gateway(serve_asgi, tmp_path, aggregate=True)
    try:
        aggregate = gw.url + "/mcp"
        assert _call(gw.mcp("tools"), KEYS["agent"], "echo", {"text": "direct"}).status_code == 200
        assert _call(aggregate, KEYS["agent"], "tools__echo", {"text": "merged"}).status_code == 200
        third = _call(aggregate, KEYS["agent"], "tools__echo", {"text": "over"})
        assert third.status_code == 429 and _error(third)["code"] == -32003
        assert upstream.calls() == ["tools/call:echo"] * 2  # the refused call never left
    finally:
        gw.stop()
    refused = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [(r["key_id"], r["server"], r["tool"], r["reason"]) for r in refused] == [
        ("k-agent", "tools", "echo", "rate_limit_exceeded")]
