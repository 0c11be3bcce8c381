"""``gateway audit timeline``: one trace's steps, and a warning when callers share a trace id.

A trace id is chosen by the client, so any key can send another key's ``traceparent`` and put
its own steps into that timeline. The timeline cannot refuse what was recorded, but it says
so and names the callers, and ``--key`` shows one caller's steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.audit import AuditLog, Signer, open_store

ROOT = Path(__file__).resolve().parents[3]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _append_all(url: str, records: list[dict[str, Any]]) -> None:
    """Write ``records`` in order into a new chain of the store at ``url``, then close it."""
    async def run() -> None:
        log = AuditLog(open_store(url), Signer.generate(), replica_id="r1")
        await log.start()
        for record in records:
            await log.append(record)
        await log.close()

    asyncio.run(run())


def _model_call(rid: str, key: str = "k-agent", **completed: Any) -> list[dict[str, Any]]:
    """A model call's two records, in the session ``TRACE``."""
    return [{"type": "request.started", "request_id": rid, "key_id": key, "model": "m",
             "decision": "allow", "trace_id": TRACE},
            {"type": "request.completed", "request_id": rid, "status": 200, "outcome": "ok",
             **completed}]


def _write(url: str) -> None:
    _append_all(url, _model_call("r-a") + _model_call("r-b", "k-other"))


def _timeline(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "timeline", "--store", url, *args],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_trace_shared_by_two_callers_is_named_and_one_caller_can_be_chosen(
        tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'audit.db'}"
    _write(url)
    both = _timeline(url, "--trace-id", TRACE, "--json")
    assert both.returncode == 0, both.stderr
    assert [json.loads(line)["key_id"] for line in both.stdout.splitlines()] == [
        "k-agent", "k-other"]
    assert "holds the steps of 2 callers (k-agent, k-other)" in both.stderr
    assert "--key" in both.stderr
    one = _timeline(url, "--trace-id", TRACE, "--key", "k-agent", "--json")
    assert one.returncode == 0, one.stderr
    assert [json.loads(line)["key_id"] for line in one.stdout.splitlines()] == ["k-agent"]
    assert "callers" not in one.stderr


def test_a_trace_id_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'audit.db'}"
    _write(url)
    for bad in (TRACE.upper(), TRACE[:-1], "z" * 32):
        res = _timeline(url, "--trace-id", bad)
        assert res.returncode == 2, (bad, res.stdout, res.stderr)
        assert "--trace-id" in res.stderr and "32 lowercase hex" in res.stderr


def test_a_tool_call_is_one_step_and_one_without_its_answer_says_so(tmp_path: Path) -> None:
    """A tool call is placed by its ``mcp.started`` (before the model call that its answer
    fed) and completed by its ``mcp.tool_call``; a call whose answer record never came (the
    gateway stopped while it was in flight) is still a step, marked as such."""
    url = f"sqlite://{tmp_path / 'audit.db'}"
    call = {"key_id": "k-agent", "server": "tools", "tool": "search", "mcp_method": "tools/call",
            "decision": "allow", "trace_id": TRACE}

    started, completed = _model_call("r-a")
    _append_all(url, [
        {"type": "mcp.started", "request_id": "t-1", **call},
        started,
        {"type": "mcp.tool_call", "request_id": "t-1", "status": 200, "duration_us": 42_000,
         **call},
        completed,
        {"type": "mcp.started", "request_id": "t-2", **call, "tool": "write"},
    ])
    res = _timeline(url, "--trace-id", TRACE, "--json")
    assert res.returncode == 0, res.stderr
    steps = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(s["kind"], s["what"], s["status"], s["detail"]) for s in steps] == [
        ("tool", "tools/search", 200, "42ms"),
        ("model", "m", 200, "outcome=ok tokens=None/None"),
        ("tool", "tools/write", None, "no answer recorded"),
    ], steps
    assert steps[0]["ref"].endswith("#1")  # placed by its first record


def test_an_answer_whose_client_left_after_its_record_says_so(tmp_path: Path) -> None:
    """A follow-up ``request.undelivered`` / ``mcp.undelivered`` (the client left while the
    final record waited for the store) shows on its step: the final record alone reads as a
    delivered answer."""
    url = f"sqlite://{tmp_path / 'audit.db'}"
    call = {"key_id": "k-agent", "server": "tools", "tool": "search", "mcp_method": "tools/call",
            "decision": "allow", "trace_id": TRACE}

    _append_all(url, [
        {"type": "mcp.started", "request_id": "t-1", **call},
        {"type": "mcp.tool_call", "request_id": "t-1", "status": 200, "bytes_out": 256,
         "duration_us": 2_000, **call},
        {"type": "mcp.undelivered", "request_id": "t-1", "bytes_out": 0, "bytes_recorded": 256,
         "outcome": "client_disconnect"},
        *_model_call("r-a", bytes_out=651),
        {"type": "request.undelivered", "request_id": "r-a", "bytes_out": 0,
         "bytes_recorded": 651, "outcome": "client_disconnect"},
    ])
    res = _timeline(url, "--trace-id", TRACE, "--json")
    assert res.returncode == 0, res.stderr
    tool, model = (json.loads(line) for line in res.stdout.splitlines())
    assert tool["detail"] == "2ms undelivered: client_disconnect after 0 of 256 bytes"
    assert model["status"] == 200
    assert model["detail"].endswith("undelivered: client_disconnect after 0 of 651 bytes")
