"""Idle connections closed to make room are in the audit log, counted like refusals.

At the connection cap a new connection closes the one idle the longest
(:mod:`gateway.h1.conntable`). A real ``gateway serve`` must record these closures as
``http.evicted`` records counted per client and (state, cause): the first of a key written at
once, the rest of the interval as one record with their ``count``, so an attacker who churns
connections cannot flood the chain; and the chain must verify.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.gateway.audit._served_audit import audited_gateway
from tests.gateway.gateway_server import connect, read_until_closed, split_response
from tests.gateway.helpers import Sim


def test_evicted_connections_are_audited_and_counted(sim: Sim, tmp_path: Path) -> None:
    with audited_gateway(sim, tmp_path, {"client_header_timeout_s": 60,
                                         "max_client_connections": 2}, "evictions") as gw:
        port = gw.port
        # Two silent sockets, then five with part of a head: each newcomer closes the
        # connection idle the longest (accepted in the order they connected).
        silent = [connect(port) for _ in range(2)]
        partial = []
        for _ in range(5):
            sock = connect(port)
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHo")
            partial.append(sock)
        for sock in (*silent, *partial[:3]):  # never answered: told why
            data, closed = read_until_closed(sock)
            assert closed
            status, _, body = split_response(data)
            assert (status, json.loads(body)["error"]["code"]) == (
                503, "too_many_connections")
        for sock in (*silent, *partial):
            sock.close()
    records = gw.records
    evicted = [r["data"] for r in records if r["type"] == "http.evicted"]
    by_state = {state: [r["count"] for r in evicted if r["state"] == state]
                for state in ("no_request", "partial_head")}
    # The first of each key at once (count 1), the rest of the interval as one record.
    assert by_state == {"no_request": [1, 1], "partial_head": [1, 2]}, evicted
    assert all(r["cause"] == "connection_cap" and r["interval_ms"] == 10_000
               and r["client"].startswith("hmac-sha256:") for r in evicted)
    assert not [r for r in records if r["type"] == "http.refused"]  # nobody was refused
    assert b"127.0.0.1" not in gw.db.read_bytes()
