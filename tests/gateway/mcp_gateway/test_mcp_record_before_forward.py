"""An MCP message leaves for its server only after its ``mcp.started`` record is durable (the
relay's rule for ``request.started``, docs/audit.md "Durability"): the upstream reads the
gateway's SQLite store the moment a call reaches it and finds the call's record committed;
with the store unavailable the call is answered 503 ``audit_unavailable`` and the upstream
receives nothing. Before, a tool call (and the prompt's data in its arguments) reached the
server with no record at all, and still did when the audit log was down."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.helpers import take_request_body
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers, post
from tests.gateway.mcp_gateway.test_mcp_hostile_round4 import ACCESS
from tests.gateway.mcp_gateway.upstreams import status_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _committed(db: Path, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` records committed now (a reader of the WAL database sees only committed
    transactions)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT body FROM audit_records WHERE type = ? ORDER BY id",
                            (kind,)).fetchall()
    docs = [json.loads(body) for (body,) in rows]
    return [d.get("data", d) for d in docs]


@pytest.fixture
def stack(serve_asgi: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The gateway in front of :func:`status_server`, wrapped so that each tool call it
    receives first notes the ``mcp.started`` records committed at that moment."""
    received: list[dict[str, Any]] = []
    seen: list[list[dict[str, Any]]] = []
    where: dict[str, Path] = {}
    inner = status_server(received)

    async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        if "db" in where and scope["method"] == "POST":
            seen.append([r for r in _committed(where["db"], "mcp.started")
                         if r["mcp_method"] == "tools/call"])
        body, replay = await take_request_body(receive)
        if b'"delay"' in body:  # a slow tool: the client may leave meanwhile
            await asyncio.sleep(1.0)
        await inner(scope, replay, send)

    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    evil = serve_asgi(upstream)

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS

    gw = start_gateway(tmp_path, sim.url, {"evil": evil.url + "/mcp"}, {}, extra)
    where["db"] = gw.db
    try:
        yield {"gateway": gw, "received": received, "seen": seen}
    finally:
        gw.stop()


def _calls(received: list[dict[str, Any]]) -> int:
    return sum(1 for m in received if m.get("method") == "tools/call")


def test_each_call_reaches_its_server_after_its_started_record_is_committed(
        stack: dict[str, Any]) -> None:
    gw: Gateway = stack["gateway"]
    for rid in range(1, 11):
        args = {"status": 200, "body": "result", "n": rid}
        resp = post(gw.mcp("evil"), call("answer", args, rid), headers(name="answer"))
        assert resp.status_code == 200, resp.text
        calls = [s for s in stack["seen"] if s is not None]
        # The last POST the server received was this call: its record was there already.
        assert len(calls[-1]) == rid, (rid, calls[-1])
    started = _committed(gw.db, "mcp.started")
    finished = _committed(gw.db, "mcp.tool_call")
    calls_started = [r for r in started if r["mcp_method"] == "tools/call"]
    calls_finished = {r["request_id"]: r for r in finished if r["mcp_method"] == "tools/call"}
    assert len(calls_started) == 10 and set(calls_finished) == {
        r["request_id"] for r in calls_started}
    for rec in calls_started:
        done = calls_finished[rec["request_id"]]
        # Who, where, what and the arguments' digest, as in the answer's record; nothing of
        # the answer (status, result, duration) is known yet.
        for name in ("key_id", "server", "destination", "tool", "data_class",
                     "arguments_sha256", "trace_id", "bytes_in"):
            assert rec[name] == done[name], name
        assert rec["decision"] == "allow" and rec["arguments_sha256"]
        assert not {"status", "result_sha256", "duration_us", "bytes_out"} & set(rec)


def test_with_the_audit_store_unavailable_nothing_is_forwarded(stack: dict[str, Any]) -> None:
    gw: Gateway = stack["gateway"]
    args = {"status": 200, "body": "result"}
    assert post(gw.mcp("evil"), call("answer", args, 1), headers(name="answer")).status_code \
        == 200
    before = _calls(stack["received"])
    lock = sqlite3.connect(str(gw.db), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        resp = post(gw.mcp("evil"), call("answer", args, 2), headers(name="answer"))
        assert resp.status_code == 503, resp.text
        assert resp.json()["id"] == 2 and resp.json()["error"]["code"] == -32603, resp.text
        assert "audit" in resp.json()["error"]["message"]
        assert _calls(stack["received"]) == before, "a call left without its record"
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    # The store is back: calls are forwarded (and recorded) again.
    resp = post(gw.mcp("evil"), call("answer", args, 3), headers(name="answer"))
    assert resp.status_code == 200, resp.text
    assert _calls(stack["received"]) == before + 1


def test_an_initialize_is_recorded_with_the_version_it_proposes(stack: dict[str, Any]) -> None:
    """The 2025-06-18 and 2025-11-25 handshakes send no version header: the records name the
    version ``initialize`` proposes, not the transport's default 2025-03-26 (tester's
    finding); a version the gateway does not know is still the server's to negotiate."""
    gw: Gateway = stack["gateway"]
    base = {"authorization": headers()["authorization"],
            "accept": "application/json, text/event-stream",
            "content-type": "application/json"}
    for rid, asked in enumerate(("2025-06-18", "2025-11-25", "2099-01-01"), start=1):
        init = {"jsonrpc": "2.0", "id": rid, "method": "initialize",
                "params": {"protocolVersion": asked, "capabilities": {},
                           "clientInfo": {"name": "probe", "version": "0"}}}
        # status_server answers an initialize with 202 and no response (the gateway's 502):
        # forwarded all the same, so both records are written.
        resp = post(gw.mcp("evil"), init, base)
        assert resp.status_code in (200, 502), resp.text
    versions = [r["protocol_version"] for kind in ("mcp.started", "mcp.tool_call")
                for r in _committed(gw.db, kind) if r["mcp_method"] == "initialize"]
    assert versions == ["2025-06-18", "2025-11-25", "2025-03-26"] * 2, versions


def test_a_call_whose_client_left_before_its_answer_is_recorded_as_such(
        stack: dict[str, Any]) -> None:
    """The tool ran (its side effects happened) but the agent never got its result: the
    record says so (``outcome: client_disconnect``, as the relay's ``request.completed``),
    where it looked like a delivered answer (tester's finding)."""
    gw: Gateway = stack["gateway"]
    port = int(gw.url.rsplit(":", 1)[1])
    hdrs = headers(name="answer")
    for rid, leave in ((1, False), (2, True)):
        body = json.dumps(call("answer", {"status": 200, "body": "result", "delay": 1},
                               rid)).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /mcp/evil HTTP/1.1\r\nHost: gw\r\n"
                         + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items())
                         + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            if leave:
                time.sleep(0.3)  # the tool is still running
            else:
                sock.settimeout(10)
                assert sock.recv(100).startswith(b"HTTP/1.1 200 ")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done = [r for r in _committed(gw.db, "mcp.tool_call") if r["mcp_method"] == "tools/call"]
        if len(done) == 2:
            break
        time.sleep(0.1)
    assert [r.get("outcome") for r in done] == [None, "client_disconnect"], done
    assert _calls(stack["received"]) == 2  # both calls reached the server
