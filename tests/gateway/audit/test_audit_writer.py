"""The writer on real stores: group commit, durability, checkpoints, heartbeats, outages."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import pytest
from _audit_helpers import raw_sql, verify, write_log

from gateway.audit import (
    AuditFormatError,
    AuditLog,
    AuditUnavailable,
    Signer,
    StoredCheckpoint,
    open_store,
    write_key_pair,
)
from gateway.audit.records import Record
from gateway.audit.store import ChainInfo, Store

HERE = Path(__file__).parent


class CountingStore:
    """Delegates to a real store and counts transactions (to observe group commit)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        await self.inner.append_batch(records, checkpoints, new_chain)
        self.batches.append(len(records))


def test_group_commit_and_durability(store_url: str, signer: Signer) -> None:
    store = CountingStore(open_store(store_url))

    async def run() -> None:
        log = AuditLog(store, signer, replica_id="r1")  # type: ignore[arg-type]
        await log.start()
        receipts = await asyncio.gather(
            *(log.append({"type": "request.started", "request_id": f"g{i}"}) for i in range(300))
        )
        assert sorted(r.seq for r in receipts) == list(range(1, 301))
        # Each receipt means committed: another connection sees the record right away.
        last = max(receipts, key=lambda r: r.seq)
        rows = raw_sql(
            store_url,
            "SELECT hash FROM audit_records WHERE chain = ? AND seq = ?",
            last.chain,
            last.seq,
        )
        assert bytes(rows[0][0]) == last.hash
        await log.close()

    asyncio.run(run())
    request_batches = store.batches[1:-1]
    assert sum(request_batches) == 300
    assert len(request_batches) < 300 / 4, f"appends were not grouped: {request_batches}"
    assert verify(store_url, signer).ok


def test_a_cancelled_append_is_still_committed(tmp_path: Path, signer: Signer) -> None:
    """An append whose caller is cancelled while it waits (a client gone) is committed all the
    same, and the appends around it get their receipts."""
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        log = AuditLog(open_store(url), signer, replica_id="r1")
        await log.start()
        gone = asyncio.ensure_future(log.append({"type": "request.started", "request_id": "x"}))
        kept = asyncio.ensure_future(log.append({"type": "request.started", "request_id": "y"}))
        await asyncio.sleep(0)  # both queued
        gone.cancel()
        receipt = await kept
        with pytest.raises(asyncio.CancelledError):
            await gone
        await log.close()
        ids = raw_sql(url, "SELECT request_id FROM audit_records WHERE chain = ? ORDER BY seq",
                      receipt.chain)
        assert [row[0] for row in ids if row[0] is not None] == ["x", "y"]

    asyncio.run(run())
    assert verify(url, signer).ok


def test_checkpoint_every_n_and_on_time(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        log = AuditLog(
            open_store(url),
            signer,
            replica_id="r1",
            checkpoint_every_records=5,
            checkpoint_every_s=0.3,
        )
        await log.start()
        for i in range(6):
            await log.append({"type": "request.started", "request_id": str(i)})
        assert log.latest_checkpoint is not None and log.latest_checkpoint.size == 6
        await log.append({"type": "request.started", "request_id": "late"})
        assert log.latest_checkpoint.size == 6
        for _ in range(100):  # sealed by the timer, without further appends
            await asyncio.sleep(0.05)
            if log.latest_checkpoint.size == 8:
                break
        assert log.latest_checkpoint.size == 8
        await log.close()

    asyncio.run(run())
    assert verify(url, signer).ok


async def _until_heartbeats(url: str, chain: str, n: int, timeout_s: float = 10.0) -> None:
    """Wait until chain ``chain`` has ``n`` committed heartbeat records (bounded)."""
    deadline = time.monotonic() + timeout_s
    sql = "SELECT count(*) FROM audit_records WHERE chain=? AND type='audit.heartbeat'"
    while raw_sql(url, sql, chain)[0][0] < n:
        assert time.monotonic() < deadline, f"fewer than {n} heartbeats after {timeout_s} s"
        await asyncio.sleep(0.02)


def test_heartbeat_when_idle(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> str:
        async with AuditLog(open_store(url), signer, replica_id="r1", heartbeat_s=0.2) as log:
            await _until_heartbeats(url, log.chain_id, 2)
            return log.chain_id

    chain = asyncio.run(run())
    types = [
        r[0]
        for r in raw_sql(url, "SELECT type FROM audit_records WHERE chain=? ORDER BY seq", chain)
    ]
    assert types.count("audit.heartbeat") >= 2
    report = verify(url, signer)
    assert report.ok, report.findings


def test_rejects_floats_and_reserved_types(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        async with AuditLog(open_store(url), signer, replica_id="r1") as log:
            with pytest.raises(AuditFormatError, match="floats are not allowed"):
                await log.append({"type": "request.completed", "latency_ms": 1.5})
            with pytest.raises(AuditFormatError):
                await log.append({"type": "chain.closed"})
            assert log.size == 1

    asyncio.run(run())


def test_an_invalid_event_fails_only_its_own_append_in_a_batch(
    tmp_path: Path, signer: Signer
) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        async with AuditLog(open_store(url), signer, replica_id="r1") as log:
            # Appended together: the committer builds both records in one batch.
            results = await asyncio.gather(
                log.append({"type": "request.started", "request_id": "ok-1"}),
                log.append({"type": "request.completed", "latency_ms": 1.5}),
                log.append({"type": "request.completed", "request_id": "ok-1"}),
                return_exceptions=True,
            )
            assert isinstance(results[1], AuditFormatError)
            assert [r.seq for r in (results[0], results[2])] == [1, 2]  # type: ignore[union-attr]
            assert log.size == 3

    asyncio.run(run())
    report = verify(url, signer)
    assert report.ok, report.findings


def test_sqlite_locked_store_raises_unavailable_then_recovers(
    tmp_path: Path, signer: Signer
) -> None:
    path = tmp_path / "a.db"
    url = f"sqlite://{path}"

    async def run() -> None:
        log = AuditLog(open_store(url, busy_timeout_ms=100), signer, replica_id="r1")
        log.store = open_store(url, busy_timeout_ms=100)
        await log.start()
        await log.append({"type": "request.started", "request_id": "before"})
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(AuditUnavailable, match=r"audit store .* append failed"):
                await log.append({"type": "request.started", "request_id": "during"})
        finally:
            other.execute("ROLLBACK")
            other.close()
        receipt = await log.append({"type": "request.started", "request_id": "after"})
        assert receipt.seq == 2
        await log.close()

    asyncio.run(run())
    ids = [r[0] for r in raw_sql(url, "SELECT request_id FROM audit_records ORDER BY seq")]
    assert "during" not in ids and ids[1:3] == ["before", "after"]
    assert verify(url, signer).ok


def test_postgres_unreachable_and_dropped(pg_database: str, signer: Signer) -> None:
    async def run() -> None:
        log = AuditLog(
            open_store("postgresql://postgres@127.0.0.1:1/nothing"), signer, replica_id="r1"
        )
        with pytest.raises(AuditUnavailable, match="cannot connect"):
            await log.start()
        log = AuditLog(open_store(pg_database), signer, replica_id="r1")
        await log.start()
        await log.append({"type": "request.started", "request_id": "ok"})
        name = pg_database.rsplit("/", 1)[1]
        admin = await asyncpg.connect(pg_database.rsplit("/", 1)[0] + "/postgres")
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        with pytest.raises(AuditUnavailable):
            await log.append({"type": "request.started", "request_id": "lost"})
        await log.close()

    asyncio.run(run())


def test_sigkill_during_appends_leaves_a_verifiable_log(
    store_url: str, signer: Signer, tmp_path: Path
) -> None:
    key, _ = write_key_pair(signer, tmp_path / "audit.key")
    with subprocess.Popen(
        [sys.executable, str(HERE / "_audit_crash_writer.py"), store_url, str(key), "400"],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            # Kill it mid-run: once some records are committed, while it keeps appending.
            deadline = time.monotonic() + 10
            while not raw_sql(store_url, "SELECT count(*) FROM audit_records")[0][0]:
                assert time.monotonic() < deadline, "the writer committed nothing"
                time.sleep(0.01)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    report = verify(store_url, signer)
    assert report.ok, [str(f) for f in report.errors]
    [summary] = report.chains
    assert summary.records > 400 and not summary.closed
    # A restarted writer names the crashed chain's tail; the pair still verifies.
    write_log(store_url, signer, 2, replica="crash", prefix="after")
    report = verify(store_url, signer)
    assert report.ok, [str(f) for f in report.errors]
    assert len(report.chains) == 2


class CommitThenFail(CountingStore):
    """A real store whose next commit lands but reports failure (a lost COMMIT reply)."""

    fail_next = False

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        await self.inner.append_batch(records, checkpoints, new_chain)
        if self.fail_next:
            self.fail_next = False
            raise AuditUnavailable("connection lost after COMMIT")


def test_commit_that_landed_but_failed_is_adopted(store_url: str, signer: Signer) -> None:
    store = CommitThenFail(open_store(store_url))

    async def run() -> None:
        log = AuditLog(store, signer, replica_id="r1")  # type: ignore[arg-type]
        await log.start()
        await log.append({"type": "request.started", "request_id": "a"})
        store.fail_next = True
        with pytest.raises(AuditUnavailable, match="after COMMIT"):
            await log.append({"type": "request.started", "request_id": "ambiguous"})
        receipt = await log.append({"type": "request.started", "request_id": "b"})
        assert receipt.seq == 3  # continues after the record that did land
        await log.close()

    asyncio.run(run())
    report = verify(store_url, signer)
    assert report.ok, [str(f) for f in report.errors]


class SlowStore(CountingStore):
    """A real store whose commits take a little longer, so commits overlap in time."""

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        await asyncio.sleep(0.003)
        await self.inner.append_batch(records, checkpoints, new_chain)


def test_forced_checkpoints_race_with_appends(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    store = SlowStore(open_store(url))

    async def run() -> None:
        async with AuditLog(store, signer, replica_id="r1") as log:  # type: ignore[arg-type]

            async def appends() -> None:
                for i in range(40):
                    await log.append({"type": "request.started", "request_id": str(i)})

            async def checkpoints() -> None:
                for _ in range(200):
                    await log.checkpoint()
                    await asyncio.sleep(0.001)

            await asyncio.gather(appends(), appends(), checkpoints())

    asyncio.run(run())
    report = verify(url, signer)
    assert report.ok, [str(f) for f in report.errors]
    assert report.chains[0].records == 82


def test_replicas_share_one_postgres_database(pg_database: str, signer: Signer) -> None:
    async def run() -> list[str]:
        logs = [AuditLog(open_store(pg_database), signer, replica_id=f"gw-{i}") for i in range(3)]
        await asyncio.gather(*(log.start() for log in logs))
        await asyncio.gather(
            *(
                log.append({"type": "request.started", "request_id": f"{log.replica_id}-{i}"})
                for i in range(40)
                for log in logs
            )
        )
        await asyncio.gather(*(log.close() for log in logs))
        return [log.chain_id for log in logs]

    chains = asyncio.run(run())
    report = verify(pg_database, signer)
    assert report.ok and not report.findings, [str(f) for f in report.findings]
    assert sorted(c.chain for c in report.chains) == sorted(chains)
    assert all(c.records == 42 and c.closed for c in report.chains)


def test_heartbeat_bound_holds_when_checkpoints_are_rarer(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        async with AuditLog(
            open_store(url), signer, replica_id="r1", heartbeat_s=0.2, checkpoint_every_s=5
        ) as log:
            await log.append({"type": "request.started", "request_id": "1"})
            await _until_heartbeats(url, log.chain_id, 2)

    asyncio.run(run())
    rows = raw_sql(url, "SELECT type FROM audit_records ORDER BY seq")
    # Heartbeats keep coming although the unsealed record's checkpoint was not yet due.
    assert [r[0] for r in rows].count("audit.heartbeat") >= 2
    assert verify(url, signer).ok
