"""``gateway audit tail`` shows what clients sent (the model name) escaped, never raw.

A key holder chooses the ``model`` of a request; a refused one is recorded as sent. Printed raw,
an ESC sequence repaints the security officer's terminal and a newline forges a whole record
line (``... model=x`` then ``FAKE ... chain.closed``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.audit import AuditLog, Signer, open_store
from tests.gateway.gateway_cli import gateway

HOSTILE = "\x1b[2J\x1b[32mOK\n2026-12-01T00:00:00.000+00:00 r1/x#9 chain.closed\u202e"


def test_tail_escapes_client_text(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'audit.db'}"

    async def write() -> None:
        log = AuditLog(open_store(url), Signer.generate(), replica_id="r1")
        await log.start()
        await log.append({"type": "request.denied", "request_id": "req-1", "model": HOSTILE,
                          "status": 404, "outcome": "invalid"})
        await log.close()

    asyncio.run(write())
    res = gateway("audit", "tail", "--store", url, "-n", "2")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split()[2] for line in lines] == ["request.denied", "chain.closed"]
    escaped = r"\u001b[2J\u001b[32mOK\n2026-12-01T00:00:00.000+00:00 r1/x#9 chain.closed\u202e"
    assert f'model="{escaped}"' in lines[0]
    for char in ("\x1b", "\u202e"):
        assert char not in res.output


def test_tail_names_the_mcp_server_method_and_tool(tmp_path: Path) -> None:
    """An MCP record's line said only ``key_id``, ``destination`` and ``decision``: a
    ``tools/list`` and a ``tools/call`` read the same. It names server, method and tool (the
    tool as the client sent it, escaped like the model)."""
    url = f"sqlite://{tmp_path / 'audit.db'}"

    async def write() -> None:
        log = AuditLog(open_store(url), Signer.generate(), replica_id="r1")
        await log.start()
        await log.append({"type": "mcp.tool_call", "request_id": "req-1", "key_id": "k",
                          "server": "search", "mcp_method": "tools/call", "tool": "fetch\x1b",
                          "destination": "tools-search", "decision": "allow", "status": 200})
        await log.close()

    asyncio.run(write())
    res = gateway("audit", "tail", "--store", url, "-n", "2")
    assert res.exit_code == 0, res.output
    line = res.output.splitlines()[0]
    assert "server=search mcp_method=tools/call tool=" in line, line
    assert "\x1b" not in line and "u001b" in line, line
