"""Every message a caller sends to ``/mcp/<server>`` counts against its request quota, not
only ``tools/call`` (tester2 finding 3), through a real ``gateway serve`` in front of the
official SDK's server with ``requests_per_minute: 2`` per key:

* allowed ``resources/read``: two are forwarded, the third is refused 429 (``-32003``,
  ``rate_limit_exceeded``, ``Retry-After``, the request's id) and never reaches the server;
* refused reads (a resource the access rules deny) are charged as well: after two of them the
  key's next read, and its next tool call, are 429;
* notifications (of a caller with no rule for the server: refused ``server_denied``) count
  too: the third is 429 (JSON-RPC error without an id);
* a message refused before its admission (headers not matching the body) is charged too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.mcp_gateway.harness import start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, call, headers, post
from tests.gateway.mcp_gateway.test_mcp_prompts_resources_access import ACCESS, docs_server
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

PUBLIC, SECRET = "docs://public/readme", "docs://secret/keys"


def _read(url: str, key: str, uri: str, rid: int) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": rid, "method": "resources/read",
            "params": {"uri": uri, "_meta": META}}
    return post(url, body, headers(key, method="resources/read", name=uri))


def _notify(url: str, key: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"_meta": META}}
    return post(url, body, headers(key, method="notifications/initialized"))


def _limited(resp: httpx.Response, rid: int | None) -> None:
    assert resp.status_code == 429, resp.text
    answer = resp.json()
    assert answer["id"] == rid
    assert answer["error"]["code"] == -32003 and answer["error"]["data"]["limit"] == "requests"
    assert int(resp.headers["retry-after"]) >= 1


def test_every_message_counts_against_the_callers_request_quota(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Counting(docs_server())
    url = serve_asgi(upstream).url + "/mcp"

    def quotas(cfg: dict[str, Any]) -> None:
        cfg["quotas"] = {"enabled": True, "defaults": {"key": {"requests_per_minute": 2}}}

    gw = start_gateway(tmp_path, sim.url, {"docs": url}, {}, lambda m: m.update(access=ACCESS),
                       cfg_extra=quotas)
    try:
        docs = gw.mcp("docs")
        # Allowed reads: two forwarded, the third refused and kept from the server.
        assert [_read(docs, "agent", PUBLIC, i).status_code for i in (1, 2)] == [200, 200]
        _limited(_read(docs, "agent", PUBLIC, 3), 3)
        assert upstream.seen.count("resources/read") == 2
        # Refused reads are charged: the third read and the next tool call are over the limit.
        denied = [_read(docs, "other", SECRET, i) for i in (1, 2)]
        assert [r.status_code for r in denied] == [403, 403]
        assert {r.json()["error"]["code"] for r in denied} == {-32001}
        _limited(_read(docs, "other", SECRET, 3), 3)
        _limited(post(docs, call("echo", {"text": "x"}, 4), headers("other", name="echo")), 4)
        # Notifications count too (here refused: this key has no rule for the server).
        assert [_notify(docs, "nobody").status_code for _ in (1, 2)] == [403, 403]
        _limited(_notify(docs, "nobody"), None)
        # A message refused before its admission (here its Mcp-Name does not match the body)
        # is charged too: after two, a good read is over the limit.
        bad = {"jsonrpc": "2.0", "id": 9, "method": "resources/read",
               "params": {"uri": PUBLIC, "_meta": META}}
        mismatched = [post(docs, bad, headers("secret", method="resources/read", name="x"))
                      for _ in (1, 2)]
        assert [r.status_code for r in mismatched] == [400, 400]
        _limited(_read(docs, "secret", PUBLIC, 10), 10)
        assert upstream.seen.count("resources/read") == 2  # no denied read left
        assert not any(s.startswith("tools/call") for s in upstream.seen)
    finally:
        gw.stop()
    refused = [(r["data"]["key_id"], r["data"]["mcp_method"], r["data"]["reason"])
               for r in gw.records() if r["type"] == "mcp.refused"]
    assert refused.count(("k-agent", "resources/read", "rate_limit_exceeded")) == 1
    assert refused.count(("k-other", "resources/read", "resource_denied")) == 2
    assert refused.count(("k-other", "resources/read", "rate_limit_exceeded")) == 1
    assert refused.count(("k-other", "tools/call", "rate_limit_exceeded")) == 1
    assert refused.count(("k-nobody", "notifications/initialized", "rate_limit_exceeded")) == 1
    assert refused.count(("k-secret", "resources/read", "header_mismatch")) == 2
    assert refused.count(("k-secret", "resources/read", "rate_limit_exceeded")) == 1


def _message(url: str, method: str, rid: int | None) -> httpx.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": {"_meta": META}}
    if rid is not None:
        body["id"] = rid
    if method == "notifications/cancelled":
        body["params"]["requestId"] = 999
    return post(url, body, headers("agent", method=method))


def test_only_requests_hold_a_concurrency_slot(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """``max_concurrent: 1``: while a slow tool call holds the key's slot, another request
    (``ping`` at ``/mcp/tools``, ``tools/list`` at the aggregate ``/mcp``) is 429
    ``concurrency``, but a notification (here ``notifications/cancelled``, which must reach
    the server while the call runs) is forwarded, and the aggregate's own ``ping`` is free."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = Counting(sdk_server())
    url = serve_asgi(upstream).url + "/mcp"

    def quotas(cfg: dict[str, Any]) -> None:
        cfg["quotas"] = {"enabled": True, "defaults": {"key": {"max_concurrent": 1}}}
        cfg["mcp"]["aggregate"] = True

    gw = start_gateway(tmp_path, sim.url, {"tools": url}, {}, cfg_extra=quotas)
    results: dict[str, httpx.Response] = {}
    try:
        tools = gw.mcp("tools")
        slow = threading.Thread(target=lambda: results.update(slow=post(
            tools, call("count", {"steps": 300}, 1), headers(name="count"))))
        slow.start()
        deadline = time.monotonic() + 30
        while "tools/call:count" not in upstream.seen:  # in flight upstream, slot held
            assert time.monotonic() < deadline, "the slow call never reached the server"
            time.sleep(0.01)
        ping = _message(tools, "ping", 2)
        listed = _message(gw.url + "/mcp", "tools/list", 3)
        own_ping = _message(gw.url + "/mcp", "ping", 4)
        cancelled = _message(tools, "notifications/cancelled", None)
        assert slow.is_alive()
        slow.join(60)
    finally:
        gw.stop()
    assert results["slow"].status_code == 200
    for resp, rid in ((ping, 2), (listed, 3)):
        assert resp.status_code == 429, resp.text
        assert resp.json()["id"] == rid and resp.json()["error"]["data"]["limit"] == "concurrency"
    assert own_ping.status_code == 200
    assert cancelled.status_code == 202, cancelled.text
    assert "notifications/cancelled" in upstream.seen and "ping" not in upstream.seen
