"""An MCP answer reaches the client only after its audit record is durable (docs/audit.md
"Durability", the relay's rule for ``request.completed``): read straight from the SQLite
store the moment each answer has arrived, the record is already there."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.mcp_gateway.harness import Gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers, post
from tests.gateway.mcp_gateway.test_mcp_hostile_round4 import _hostile

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def hostile(serve_asgi: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from _hostile(serve_asgi, tmp_path)


def _calls_recorded(db: Path) -> list[dict[str, Any]]:
    """The ``mcp.tool_call`` records committed now (a reader of the WAL database sees only
    committed transactions)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT body FROM audit_records WHERE type = 'mcp.tool_call' "
                            "ORDER BY id").fetchall()
    return [json.loads(body)["data"] if "data" in json.loads(body) else json.loads(body)
            for (body,) in rows]


def test_each_answer_arrives_after_its_record_is_committed(hostile: dict[str, Any]) -> None:
    gw: Gateway = hostile["gateway"]
    for rid in range(1, 21):
        resp = post(gw.mcp("evil"), call("answer", {"status": 200, "body": "result"}, rid),
                    headers(name="answer"))
        assert resp.status_code == 200, resp.text
        records = _calls_recorded(gw.db)
        assert len(records) == rid, (rid, len(records))  # none written after its answer
    last = records[-1]
    assert last["result_sha256"] and last["bytes_out"] == len(resp.content), last
    assert last["withheld"]["count"] == 2, last  # what the answer withheld is on its record
