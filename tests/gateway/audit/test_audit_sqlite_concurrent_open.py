"""Several writers opening one new SQLite audit store at once all open it.

``gateway serve --workers 2`` on a new audit file: one worker failed to start ("cannot open
audit store ...: database is locked") and the pod stopped (seen in CI,
``test_real_gateway_serves_the_probe_paths``). SQLite skips the busy handler where waiting
could deadlock, so two connections that hold a read lock and both want to write (switching the
new file to WAL, creating the schema) get SQLITE_BUSY at once whatever ``busy_timeout``. Here
three stores open each of 100 new files at the same moment; before the fix about 2% of the
opens failed (18 of 900 in one run), so 300 opens without a failure show the fix.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from gateway.audit.store_sqlite import SqliteStore


def _open_at_once(path: Path, n: int) -> list[str]:
    start = threading.Barrier(n)
    outcomes: list[str] = []

    def one() -> None:
        async def go() -> None:
            store = SqliteStore(path)
            start.wait(10)
            try:
                await store.open()
                outcomes.append("ok")
            except Exception as exc:  # the test reports every failure
                outcomes.append(f"{type(exc).__name__}: {exc}")
            finally:
                await store.close()

        asyncio.run(go())

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def test_three_writers_opening_a_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    failures = []
    for i in range(100):
        path = tmp_path / f"audit-{i}.db"
        outcomes = _open_at_once(path, 3)
        assert len(outcomes) == 3
        failures += [o for o in outcomes if o != "ok"]
        with sqlite3.connect(path) as conn:  # one schema, in WAL
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert {"audit_records", "audit_chains", "audit_checkpoints"} <= tables
    assert failures == []
