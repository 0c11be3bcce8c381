"""The official TypeScript SDK (npm ``@modelcontextprotocol/sdk``) as a client of a real
``gateway serve`` fronting the official Python SDK's ``MCPServer``.

The TypeScript SDK speaks the ``initialize`` handshake (2025-11-25, sessions): it must list
the tools the key may call, call them, see a refused tool as an error, and end its session;
every call and the refusal are audit records carrying the client's trace id.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.gateway.mcp_gateway.harness import KEYS, ROOT

HERE = Path(__file__).parent
PACKAGE_DIR = ROOT / ".cache" / "npm" / "mcp-sdk"  # Makefile: MCP_SDK_STAMP
NODE = shutil.which("node")
TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def run_ts_client(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Run ``ts_client.mjs`` against ``url``; its JSON report."""
    # Not a skip: CI installs it (make tools), and a missing real part must not pass silently.
    assert NODE is not None, "node is needed for the TypeScript SDK client"
    assert (PACKAGE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(), (
        "@modelcontextprotocol/sdk is not installed: make .cache/npm/mcp-sdk/.installed-1.32.2")
    res = subprocess.run(
        [NODE, str(HERE / "ts_client.mjs"), str(PACKAGE_DIR), url, key, TRACEPARENT,
         json.dumps(calls)],
        capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"},
        check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def test_ts_sdk_client_lists_calls_and_is_refused_through_the_gateway(
        stack: dict[str, Any]) -> None:
    gw = stack["gateway"]
    report = run_ts_client(gw.mcp("tools"), KEYS["agent"], [
        ("echo", {"text": "hello from typescript"}),
        ("count", {"steps": 2}),
        ("delete_everything", {}),
    ])
    assert report["protocolVersion"] == "2025-11-25"
    # The session id the client holds is the gateway's caller-bound wrapper, not the server's.
    assert report["sessionId"] and "." in report["sessionId"]
    assert sorted(report["tools"]) == ["count", "echo", "fetch_url"]  # delete_* denied
    echo, count, denied = report["calls"]
    assert echo["ok"] and echo["result"]["content"] == [
        {"type": "text", "text": "hello from typescript"}]
    assert count["ok"] and count["result"]["content"][0]["text"] == "counted 2"
    assert not denied["ok"]
    assert denied["error"]["code"] == 403, denied  # StreamableHTTPError carries the status
    assert "denies 'delete_*'" in denied["error"]["message"]
    # The refused call never reached the server.
    assert stack["upstream"].calls() == ["tools/call:echo", "tools/call:count"]

    records = gw.records()
    calls = [r["data"] for r in records if r["type"] == "mcp.tool_call"
             and r["data"]["mcp_method"] == "tools/call"]  # every forwarded message is one
    assert [c["tool"] for c in calls] == ["echo", "count"]
    for call in calls:
        assert call["key_id"] == "k-agent" and call["server"] == "tools"
        assert call["decision"] == "allow" and call["status"] == 200
        assert call["protocol_version"] == "2025-11-25"
        assert call["trace_id"] == TRACE_ID
        assert len(call["result_sha256"]) == 64
    args = json.dumps({"text": "hello from typescript"}, separators=(",", ":")).encode()
    assert calls[0]["arguments_sha256"] == hashlib.sha256(args).hexdigest()
    refused = [r["data"] for r in records if r["type"] == "mcp.refused"]
    # The SDK's optional standalone GET stream (after ``initialized``) is answered 405, which
    # the SDK accepts; like every refusal it is audited (the SDK does not await that GET, so
    # the order of the two records is not fixed).
    # (A tool is named as given once the server's cached catalogue holds it.)
    seen = sorted((r["tool"] or "", r["reason"], r["status"], r["trace_id"]) for r in refused)
    assert seen == [
        ("", "method_not_allowed", 405, TRACE_ID),
        ("delete_everything", "tool_denied", 403, TRACE_ID)]
