"""Idle connections closed to make room are in the audit log, counted like refusals.

At the connection cap a new connection closes the one idle the longest
(:mod:`gateway.h1.conntable`). A real ``gateway serve`` must record these closures as
``http.evicted`` records counted per client and (state, cause): the first of a key written at
once, the rest of the interval as one record with their ``count``, so an attacker who churns
connections cannot flood the chain; and the chain must verify.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port, wait_until
from tests.gateway.gateway_server import connect, read_until_closed, split_response
from tests.gateway.helpers import BACKEND_KEY, Sim, config

ROOT = Path(__file__).parents[3]


def test_evicted_connections_are_audited_and_counted(sim: Sim, tmp_path: Path) -> None:
    signer = Signer.generate()
    key, pub = write_key_pair(signer, tmp_path / "audit.key")
    db = tmp_path / "audit.db"
    port = free_port()
    cfg = config([sim.url], listen={"host": "127.0.0.1", "port": port})
    cfg["limits"] = {"client_header_timeout_s": 60, "max_client_connections": 2}
    cfg["audit"] = {"store": f"sqlite://{db}", "signing_key_file": str(key),
                    "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
                    "replica_id": "evictions"}
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    cli = [sys.executable, "-m", "gateway.cli"]
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY}
    with subprocess.Popen([*cli, "serve", "--config", str(cfg_file)], cwd=ROOT, env=env,
                          stderr=subprocess.PIPE) as proc:
        try:
            def up() -> bool:
                assert proc.poll() is None
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, 30, "gateway serve answering /healthz")
            # Two silent sockets, then five with part of a head: each newcomer closes the
            # connection idle the longest (accepted in the order they connected).
            silent = [connect(port) for _ in range(2)]
            partial = []
            for _ in range(5):
                sock = connect(port)
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHo")
                partial.append(sock)
            for sock in silent:
                assert read_until_closed(sock) == (b"", True)
            for sock in partial[:3]:
                data, closed = read_until_closed(sock)
                assert closed
                status, _, body = split_response(data)
                assert (status, json.loads(body)["error"]["code"]) == (
                    503, "too_many_connections")
            for sock in (*silent, *partial):
                sock.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    res = subprocess.run([*cli, "audit", "verify", "--store", f"sqlite://{db}",
                          "--public-key", str(pub), "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and json.loads(res.stdout)["findings"] == [], res.stdout
    res = subprocess.run([*cli, "audit", "export", "--store", f"sqlite://{db}"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    records = list(map(json.loads, res.stdout.splitlines()))
    evicted = [r["data"] for r in records if r["type"] == "http.evicted"]
    by_state = {state: [r["count"] for r in evicted if r["state"] == state]
                for state in ("no_request", "partial_head")}
    # The first of each key at once (count 1), the rest of the interval as one record.
    assert by_state == {"no_request": [1, 1], "partial_head": [1, 2]}, evicted
    assert all(r["cause"] == "connection_cap" and r["interval_ms"] == 10_000
               and r["client"].startswith("hmac-sha256:") for r in evicted)
    assert not [r for r in records if r["type"] == "http.refused"]  # nobody was refused
    assert b"127.0.0.1" not in db.read_bytes()
