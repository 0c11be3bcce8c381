"""A real ``gateway serve`` with a SQLite audit chain, for the tests of what the HTTP server
itself records (``http.refused``, ``http.evicted``): start it, wait until it answers, stop it
with SIGTERM (it must exit 0), then verify the chain and hand back its records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port, wait_until
from tests.gateway.helpers import BACKEND_KEY, Sim, config

ROOT = Path(__file__).parents[3]
CLI = [sys.executable, "-m", "gateway.cli"]


@dataclass
class AuditedGateway:
    """The running gateway's port and where its chain is (``records`` after it stopped)."""

    port: int
    db: Path
    public_key: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""


@contextmanager
def audited_gateway(sim: Sim, tmp_path: Path, limits: dict[str, Any],
                    replica_id: str, audit: dict[str, Any] | None = None,
                    sections: dict[str, Any] | None = None
                    ) -> Iterator[AuditedGateway]:
    """Serve with ``limits`` and an audit chain (``audit``: more keys of its section;
    ``sections``: more top-level sections, e.g. ``identity``); on exit stop it (exit 0
    asserted), assert the chain verifies with no finding, and fill ``records`` from
    ``gateway audit export`` and ``stderr`` with what the gateway wrote there."""
    key, pub = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    gw = AuditedGateway(free_port(), tmp_path / "audit.db", pub)
    cfg = config([sim.url], listen={"host": "127.0.0.1", "port": gw.port})
    cfg["limits"] = {**cfg.get("limits", {}), **limits}
    cfg.update(sections or {})
    cfg["audit"] = {"store": f"sqlite://{gw.db}", "signing_key_file": str(key),
                    "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
                    "replica_id": replica_id, **(audit or {})}
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY}
    log_file = tmp_path / "gateway.stderr"  # a file, not a pipe: a full pipe blocks it
    with log_file.open("wb") as log, subprocess.Popen(
            [*CLI, "serve", "--config", str(cfg_file)], cwd=ROOT, env=env,
            stderr=log) as proc:
        try:
            def up() -> bool:
                assert proc.poll() is None
                try:
                    return httpx.get(f"http://127.0.0.1:{gw.port}/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, 30, "gateway serve answering /healthz")
            yield gw
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    gw.stderr = log_file.read_text(errors="replace")
    assert proc.returncode == 0, gw.stderr[-2000:]
    store = f"sqlite://{gw.db}"
    res = subprocess.run([*CLI, "audit", "verify", "--store", store, "--public-key", str(pub),
                          "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and json.loads(res.stdout)["findings"] == [], res.stdout
    res = subprocess.run([*CLI, "audit", "export", "--store", store],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    gw.records.extend(map(json.loads, res.stdout.splitlines()))
