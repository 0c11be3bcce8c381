"""``gateway audit export --subject`` follows the records that amend a subject's requests by
request id only: ``request.completed`` and also ``request.undelivered`` (written after the
completion: the client left before the end of the answer) and ``mcp.undelivered``; another
subject's amendments stay out. Real SQLite audit store, the real writer and CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway.audit import AuditLog, Signer, open_store
from tests.gateway.gateway_cli import gateway

ALICE, BOB = "hmac-sha256:" + "a" * 64, "hmac-sha256:" + "b" * 64


def test_the_subject_export_follows_completions_and_undelivered_amendments(
        tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'audit.db'}"

    async def write() -> None:
        log = AuditLog(open_store(url), Signer.generate(), replica_id="r1")
        await log.start()
        for rid, who in (("req-a", ALICE), ("req-b", BOB)):
            await log.append({"type": "request.started", "request_id": rid,
                              "identity": {"method": "jwt", "subject": who}})
        for rid in ("req-a", "req-b"):
            await log.append({"type": "request.completed", "request_id": rid, "status": 200})
            await log.append({"type": "request.undelivered", "request_id": rid,
                              "outcome": "client_disconnect", "bytes_out": 1,
                              "bytes_recorded": 9})
        await log.append({"type": "mcp.tool_call", "request_id": "mcp-a",
                          "identity": {"method": "jwt", "subject": ALICE}})
        await log.append({"type": "mcp.undelivered", "request_id": "mcp-a",
                          "outcome": "client_disconnect", "bytes_out": 0, "bytes_recorded": 5})
        await log.close()

    asyncio.run(write())
    res = gateway("audit", "export", "--store", url, "--subject", ALICE)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines() if line.strip()]
    assert [(r["type"], r["data"]["request_id"]) for r in rows] == [
        ("request.started", "req-a"), ("request.completed", "req-a"),
        ("request.undelivered", "req-a"), ("mcp.tool_call", "mcp-a"),
        ("mcp.undelivered", "mcp-a")]
