"""``gateway serve`` with an ``audit:`` section, end to end, then ``gateway audit verify``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.helpers import BACKEND_KEY, KEY_A, Sim, config

ROOT = Path(__file__).parents[3]


def test_gateway_serve_audits_and_verifies(sim: Sim, tmp_path: Path) -> None:
    signer = Signer.generate()
    key, pub = write_key_pair(signer, tmp_path / "audit.key")
    db = tmp_path / "audit.db"
    cps = tmp_path / "checkpoints"
    port = free_port()
    cfg = config([sim.url], listen={"host": "127.0.0.1", "port": port})
    cfg["audit"] = {
        "store": f"sqlite://{db}",
        "signing_key_file": str(key),
        "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
        "replica_id": "serve-test",
        "checkpoint_dir": str(cps),
    }
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY}
    cli = [sys.executable, "-m", "gateway.cli"]
    with subprocess.Popen([*cli, "serve", "--config", str(cfg_file)], cwd=ROOT, env=env) as proc:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY_A}"},
                json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
            assert r.status_code == 200
            request_id = r.headers["x-request-id"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    store = ["--store", f"sqlite://{db}"]
    # The store and the checkpoint directory come from the gateway config's audit: section.
    res = subprocess.run(
        [*cli, "audit", "verify", "--config", str(cfg_file), "--public-key", str(pub), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and report["findings"] == []
    [chain] = report["chains"]
    assert chain["closed"] and chain["sealed_size"] == chain["records"]
    with sqlite3.connect(db) as conn:
        [(stored,)] = conn.execute("SELECT count(*) FROM audit_checkpoints").fetchall()
    assert chain["checkpoints"] == stored + 1  # the exported file from the config was checked
    res = subprocess.run(
        [*cli, "audit", "export", *store], cwd=ROOT, capture_output=True, text=True, check=True
    )
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["type"] for r in records] == [
        "chain.started",
        "config.loaded",
        "request.started",
        "request.completed",
        "chain.closed",
    ]
    assert records[0]["data"]["config_sha256"] == records[1]["data"]["sha256"]
    assert {r["data"].get("request_id") for r in records[2:4]} == {request_id}
