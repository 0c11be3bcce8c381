"""An attacker's try of the MCP endpoint (round 4): each test is one way past a promise of
``docs/mcp.md``, against a real ``gateway serve`` on loopback in front of a hostile raw
upstream (:func:`tests.gateway.mcp_gateway.upstreams.status_server`) or the official SDK's
``MCPServer``, the audit chain read back with ``gateway audit export``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, call, headers, post
from tests.gateway.mcp_gateway.upstreams import status_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ACCESS = [{"teams": ["agents"], "allow": ["*"],
           "resources": {"allow": ["docs://public/*"]}}]
LEAKS = ("SECRET", "etc/passwd", "private/plan", "upstream=1", "realm")


@pytest.fixture
def hostile(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The gateway (aggregate endpoint on) in front of :func:`status_server` as ``evil``;
    ``received``: every message the upstream got."""
    received: list[dict[str, Any]] = []
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    evil = serve_asgi(status_server(received))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS
        mcp["aggregate"] = True

    gw = start_gateway(tmp_path, sim.url, {"evil": evil.url + "/mcp"}, {}, extra)
    try:
        yield {"gateway": gw, "received": received}
    finally:
        gw.stop()


def _records(gw: Gateway, kind: str | None = None) -> list[dict[str, Any]]:
    return [r["data"] | {"type": r["type"]} for r in gw.records()
            if r["type"].startswith("mcp.") and (kind is None or r["type"] == kind)]


def _clean(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, (leak, text[:400])


def test_an_answer_with_any_http_status_is_checked_like_a_200(hostile: dict[str, Any]) -> None:
    """Whatever the upstream's status, its answer to a request is id-checked, sifted and
    hashed: a JSON-RPC response with the request's id is relayed with the denied resources
    withheld (2xx as 200, a client error's status kept, a server error as 502); a body that
    is not the request's response (another id, an HTML page) becomes the gateway's own
    JSON-RPC error; the upstream's headers never reach the client. The aggregate endpoint
    and filtered lists take the same path."""
    gw: Gateway = hostile["gateway"]
    expected = {201: 200, 203: 200, 299: 200, 400: 400, 404: 404, 429: 429, 500: 502,
                503: 502, 401: 502, 403: 502}
    rid = 0
    for upstream_status, status in expected.items():
        for body in ("result", "error"):
            rid += 1
            resp = post(gw.mcp("evil"), call("answer", {"status": upstream_status,
                                                        "body": body}, rid),
                        headers(name="answer"))
            assert resp.status_code == status, (upstream_status, body, resp.text)
            _clean(resp.text + json.dumps(dict(resp.headers)))
            assert resp.json()["id"] == rid
            assert "withheld by the gateway" in resp.text
        for bad in ({"id": "someone-else"}, {"body": "html"}):
            rid += 1
            resp = post(gw.mcp("evil"), call("answer", {"status": upstream_status, **bad},
                                             rid), headers(name="answer"))
            _clean(resp.text + json.dumps(dict(resp.headers)))
            assert resp.status_code == (status if status != 200 else 502), (bad, resp.text)
            assert resp.json() == {"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32002, "message": resp.json()["error"]["message"]}}
    calls = _records(gw, "mcp.tool_call")
    assert len(calls) == rid
    assert all(c["result_sha256"] for c in calls), calls
    relayed = [c for c in calls if c["reason"] is None]
    assert len(relayed) == 2 * len(expected)
    assert all(c["withheld"]["count"] == 2 for c in relayed), relayed
    assert {c["reason"] for c in calls if c["reason"]} == {"upstream_status"}

    for cursor in ("203", "404"):
        listing = {"jsonrpc": "2.0", "id": 9, "method": "resources/list",
                   "params": {"cursor": cursor, "_meta": META}}
        resp = post(gw.mcp("evil"), listing, headers(method="resources/list"))
        _clean(resp.text)
        assert [r["uri"] for r in resp.json()["result"]["resources"]] == ["docs://public/ok"]

    resp = post(gw.url + "/mcp", call("evil__answer", {"status": 203}, 77),
                headers(name="evil__answer"))
    assert resp.status_code == 200 and "withheld by the gateway" in resp.text
    _clean(resp.text)


def test_an_answer_to_a_notification_or_client_response_is_never_relayed(
        hostile: dict[str, Any]) -> None:
    """The transport expects ``202`` with no body for a notification or a client response:
    an upstream body is never relayed (accepted: 202 and nothing; refused: the gateway's
    JSON-RPC error without an id), and the record holds the SHA-256 of what came back."""
    gw: Gateway = hostile["gateway"]
    old = {**headers(method="notifications/progress"), "mcp-protocol-version": "2025-06-18"}
    note: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": 1}}
    for status, expected in ((200, 202), (299, 202), (202, 202), (400, 400), (500, 502)):
        resp = post(gw.mcp("evil"), {**note, "params": {**note["params"], "status": status}},
                    old)
        assert resp.status_code == expected, (status, resp.text)
        _clean(resp.text + json.dumps(dict(resp.headers)))
        if expected == 202:
            assert resp.content == b""
        else:
            assert resp.json()["id"] is None and resp.json()["error"]["code"] == -32002
    answer = {"jsonrpc": "2.0", "id": 5, "result": {"status": 200}}
    old.pop("mcp-method")
    resp = post(gw.mcp("evil"), answer, old)
    assert resp.status_code == 202 and resp.content == b"", resp.text
    records = [r for r in _records(gw) if r["mcp_method"] in ("notifications/progress", None)]
    assert len(records) == 6 and all(r["result_sha256"] for r in records), records
