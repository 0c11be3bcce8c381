"""A worker restarted inside a pod serves the configuration the pod serves, not the start-up one.

The supervisor restarts a worker that exited with the settings it was handed; those must be
the settings of the last applied reload. Started from the start-up settings, a restarted worker
served keys removed since (a revoked key worked again), at least until its own reload, and for
good when the file had been made invalid since (that reload is refused: the worker kept the
start-up configuration).
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from tests.conftest import wait_until as _wait
from tests.gateway.test_serve_workers import (  # noqa: F401 (fixtures)
    KEY_BULK,
    KEY_LIMITED,
    Pod,
    pod,
    sim_url,
)


def _count(db: Path, type_: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM audit_records WHERE type = ?",
                                (type_,)).fetchone()[0])


def _status_of(p: Pod, key: str) -> int:
    r = httpx.post(p.url + "/v1/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {key}", "connection": "close"},
                   json={"model": "m", "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code


def test_a_key_revoked_by_a_reload_stays_revoked_on_restarted_workers(
    pod: Callable[..., Pod], tmp_path: Path,  # noqa: F811 (the imported fixture)
) -> None:
    p = pod()
    db = tmp_path / "audit.db"
    cfg = yaml.safe_load(p.config.read_text())
    cfg["keys"] = [k for k in cfg["keys"] if k["id"] != "limited"]  # revoke
    # and its quota override with it (a leftover would be tolerated with a warning by the
    # reload, but the restarted workers' own reload of this file must apply cleanly too)
    cfg["quotas"]["keys"].pop("limited")
    p.config.write_text(yaml.safe_dump(cfg))
    p.proc.send_signal(signal.SIGHUP)
    _wait(lambda: _count(db, "config.reloaded") == 2, 60, "both workers to apply the reload")
    assert {_status_of(p, KEY_LIMITED) for _ in range(6)} == {401}

    p.config.write_text("models: [\n")  # an edit gone wrong: every reload of it is refused
    for victim in p.worker_pids():  # both: every connection then reaches a restarted worker
        os.kill(victim, signal.SIGKILL)
        _wait(lambda v=victim: len(p.worker_pids()) == 2 and v not in p.worker_pids(), 120,
              "the worker to be restarted")
    # Each restarted worker tries the file once it serves, and refuses it.
    _wait(lambda: _count(db, "config.reload_refused") == 2, 60, "the restarted workers' reload")
    assert {_status_of(p, KEY_BULK) for _ in range(6)} == {200}
    assert {_status_of(p, KEY_LIMITED) for _ in range(6)} == {401}
