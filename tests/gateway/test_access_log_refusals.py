"""The access log's lines of refusals before a principal is known are bounded per client network.

A keyless client wrote 44,500 access lines in 10 s (one per refused request): anyone could fill
the gateway's disk. Driven through a real ``gateway serve`` (JSON access log on, SQLite audit
chain): per interval, the first ``logging.refused_lines_per_client`` refusals of a client
network get their line, the rest are counted into one ``refused_summary`` line per (network,
reason), written when the interval ends or at shutdown; past 16 networks the rest fold into one
summary per reason. A caller with a key keeps one line per request.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from gateway.access import CLIENTS_PER_INTERVAL
from tests.conftest import wait_until
from tests.gateway.audit._served_audit import audited_gateway
from tests.gateway.helpers import KEY_A, Sim

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
LINES = 10


def _access(stderr: str) -> list[dict[str, Any]]:
    """The access lines of the gateway's stderr (a last line still being written is skipped)."""
    found = []
    for line in stderr.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("type") == "access":
            found.append(entry)
    return found


def _keyless_from(port: int, source: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5,
                                  source_address=(source, 0)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_refusals_before_a_principal_are_bounded_per_client_network(
        sim: Sim, tmp_path: Path) -> None:
    logging = {"access_log": True, "format": "json", "refused_lines_per_client": LINES,
               "refused_interval_s": 3600}  # one interval: its summaries come at shutdown
    others = [f"127.0.8.{i}" for i in range(1, 41)]
    with audited_gateway(sim, tmp_path, {}, "access", sections={"logging": logging}) as gw, \
            httpx.Client(base_url=f"http://127.0.0.1:{gw.port}", timeout=10) as http:
        statuses: Counter[int] = Counter()
        for _ in range(300):
            statuses[http.post("/v1/chat/completions", json=CHAT).status_code] += 1
        for i in range(100):
            statuses[http.get("/v1/models", headers={
                "authorization": f"Bearer sk-guess-{i}"}).status_code] += 1
        for i in range(20):  # a route of the app's own
            statuses[http.get("/v1/usage", headers={
                "authorization": f"Bearer sk-guess-u{i}"}).status_code] += 1
        for i in range(50):  # no such path
            statuses[http.get(f"/nothing-here-{i}").status_code] += 1
        for _ in range(30):  # a known caller: every request its line
            statuses[http.post("/v1/chat/completions", json=CHAT,
                               headers={"authorization": f"Bearer {KEY_A}"}).status_code] += 1
        for source in others:
            statuses[_keyless_from(gw.port, source)] += 1
        assert statuses == {401: 420 + len(others), 404: 50, 200: 30}, statuses
    lines = _access(gw.stderr)
    known = [r for r in lines if r.get("key_id") == "team-a"]
    assert len(known) == 30 and {r["status"] for r in known} == {200}
    summaries = [r for r in lines if r.get("event") == "refused_summary"]
    refused = [r for r in lines if r not in known and r not in summaries]
    # The first client (127.0.0.1) got LINES lines, each of the next 15 networks its one.
    own_networks = CLIENTS_PER_INTERVAL - 1
    assert len(refused) == LINES + own_networks, len(refused)
    assert {(r["status"], r["reason"]) for r in refused} == {(401, "missing_credential")}
    by_key = {(r["client_network"], r["reason"]): r for r in summaries}
    assert {k: r["count"] for k, r in by_key.items()} == {
        ("127.0.0.1", "missing_credential"): 300 - LINES,
        ("127.0.0.1", "unknown_key"): 120,
        ("127.0.0.1", "not_found"): 50,
        (None, "missing_credential"): len(others) - own_networks,
    }, summaries
    assert by_key[None, "missing_credential"]["clients"] == len(others) - own_networks
    assert all(r["interval_ms"] == 3_600_000 for r in summaries)
    assert "sk-guess" not in gw.stderr
    # Every refusal is in the log: a line of its own or a summary's count.
    assert len(refused) + sum(r["count"] for r in summaries) == 420 + len(others) + 50


def test_a_summary_is_written_when_its_interval_ends(sim: Sim, tmp_path: Path) -> None:
    logging = {"access_log": True, "format": "json", "refused_lines_per_client": 2,
               "refused_interval_s": 0.5}
    with audited_gateway(sim, tmp_path, {}, "interval", sections={"logging": logging}) as gw:
        with httpx.Client(base_url=f"http://127.0.0.1:{gw.port}", timeout=10) as http:
            for _ in range(12):
                assert http.get("/v1/models").status_code == 401
        log_file = tmp_path / "gateway.stderr"

        def summarised() -> bool:
            return any(r.get("event") == "refused_summary"
                       for r in _access(log_file.read_text(errors="replace")))

        wait_until(summarised, 10, "a refused_summary line before shutdown")
    counted = sum(r["count"] for r in _access(gw.stderr) if r.get("event") == "refused_summary")
    own = [r for r in _access(gw.stderr) if r.get("reason") == "missing_credential"
           and r.get("event") is None]
    assert counted + len(own) == 12 and counted >= 1
