"""The batch store in a SQLite file (:class:`gateway.batch.store.BatchStore`).

Every statement is short and synchronous; each public method runs it in a thread
(:func:`asyncio.to_thread`) behind one lock. WAL journal, ``synchronous=FULL``: a stored answer
survives a crash of the process or the machine.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway.batch.store import (
    FINAL,
    UNFINISHED,
    BatchStoreUnavailable,
    OwnerLimits,
    OwnerUsage,
    RequestLine,
)

__all__ = ["SqliteBatchStore"]

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS files_owner ON files (owner);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    principal TEXT NOT NULL, object TEXT NOT NULL, lease_owner TEXT, lease_until REAL);
CREATE TABLE IF NOT EXISTS requests (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
    body BLOB NOT NULL, done INTEGER NOT NULL DEFAULT 0, ok INTEGER, result TEXT,
    PRIMARY KEY (batch_id, line));
"""

_UNFINISHED_SQL = ",".join(f"'{s}'" for s in UNFINISHED)
_FORGET_FINAL = ("DELETE FROM requests WHERE batch_id IN (SELECT id FROM batches "  # noqa: S608
                 f"WHERE status IN ({','.join(repr(s) for s in sorted(FINAL))}))")


def _usage(db: sqlite3.Connection, owner: str) -> OwnerUsage:
    """What ``owner`` stores (:class:`gateway.batch.store.OwnerUsage`): its files, and the
    request rows (bodies and answers) of its batches that still hold them."""
    files, used = db.execute(
        "SELECT count(*), coalesce(sum(length(content)), 0) FROM files WHERE owner=?",
        (owner,)).fetchone()
    batches, rows = db.execute(
        "SELECT count(DISTINCT r.batch_id), coalesce(sum(length(r.body) + "
        "coalesce(length(r.result), 0)), 0) FROM requests r JOIN batches b ON b.id=r.batch_id "
        "WHERE b.owner=?", (owner,)).fetchone()
    return OwnerUsage(bytes=int(used) + int(rows), files=int(files) + int(batches))


class SqliteBatchStore:
    """The Batch API's SQLite database.

    Args:
        path: The database file (created with its directory by :meth:`open`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def open(self) -> None:
        """Create the file, its directory and the tables if missing."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            # A batch that ended keeps its answers in its output files: rows left by a stop
            # between the end and the clean-up below are removed here.
            db.execute(_FORGET_FINAL)
        except (OSError, sqlite3.Error) as exc:
            raise BatchStoreUnavailable(f"cannot open the batch database {self.path}: {exc}") \
                from exc
        self._db = db

    async def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                if self._db is None:
                    raise BatchStoreUnavailable("the batch database is closed")
                try:
                    return fn(self._db)
                except sqlite3.OperationalError as exc:
                    raise BatchStoreUnavailable(f"batch database: {exc}") from exc
        return await asyncio.to_thread(locked)

    # files

    async def add_file(self, row: dict[str, Any], content: bytes,
                       limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """See :meth:`gateway.batch.store.BatchStore.add_file`."""
        def add(db: sqlite3.Connection) -> OwnerUsage | None:
            # BEGIN IMMEDIATE takes the write lock before the usage is read: another process
            # on the same file cannot slip a file in between the sum and the insert.
            db.execute("BEGIN IMMEDIATE")
            try:
                if limits is not None:
                    usage = _usage(db, row["owner"])
                    if (usage.files + 1 > limits.max_files
                            or usage.bytes + len(content) > limits.max_bytes):
                        db.execute("ROLLBACK")
                        return usage
                db.execute("INSERT INTO files VALUES (?,?,?,?,?,?)",
                           (row["id"], row["owner"], row["purpose"], row["filename"],
                            row["created_at"], content))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return None
        return await self._run(add)

    async def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        """See :meth:`gateway.batch.store.BatchStore.file`."""
        got = await self._run(lambda db: db.execute(
            "SELECT id, purpose, filename, created_at, length(content) FROM files "
            "WHERE id=? AND owner=?", (file_id, owner)).fetchone())
        if got is None:
            return None
        return {"id": got[0], "purpose": got[1], "filename": got[2], "created_at": got[3],
                "bytes": got[4]}

    async def content(self, file_id: str, owner: str) -> bytes | None:
        """See :meth:`gateway.batch.store.BatchStore.content`."""
        got = await self._run(lambda db: db.execute(
            "SELECT content FROM files WHERE id=? AND owner=?", (file_id, owner)).fetchone())
        return bytes(got[0]) if got is not None else None

    async def delete_file(self, file_id: str, owner: str) -> bool:
        """See :meth:`gateway.batch.store.BatchStore.delete_file`."""
        return await self._run(lambda db: db.execute(
            "DELETE FROM files WHERE id=? AND owner=?", (file_id, owner)).rowcount > 0)

    # batches

    async def add_batch(self, obj: dict[str, Any], owner: str, principal: dict[str, Any],
                        lines: list[RequestLine],
                        limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """See :meth:`gateway.batch.store.BatchStore.add_batch`."""
        size = sum(len(line[3]) for line in lines)

        def add(db: sqlite3.Connection) -> OwnerUsage | None:
            db.execute("BEGIN IMMEDIATE")  # the write lock before the usage is read
            try:
                if limits is not None:
                    usage = _usage(db, owner)
                    if (usage.files + 1 > limits.max_files
                            or usage.bytes + size > limits.max_bytes):
                        db.execute("ROLLBACK")
                        return usage
                db.execute("INSERT INTO batches (id, owner, status, created_at, principal, "
                           "object) VALUES (?,?,?,?,?,?)",
                           (obj["id"], owner, obj["status"], obj["created_at"],
                            json.dumps(principal), json.dumps(obj)))
                db.executemany("INSERT INTO requests (batch_id, line, custom_id, url, body) "
                               "VALUES (?,?,?,?,?)", [(obj["id"], *line) for line in lines])
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return None
        return await self._run(add)

    async def remove_batch(self, batch_id: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.remove_batch`."""
        def remove(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM requests WHERE batch_id=?", (batch_id,))
                db.execute("DELETE FROM batches WHERE id=?", (batch_id,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        await self._run(remove)

    async def forget_requests(self, batch_id: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.forget_requests`."""
        await self._run(lambda db: db.execute(
            "DELETE FROM requests WHERE batch_id=?", (batch_id,)))

    async def batch(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """See :meth:`gateway.batch.store.BatchStore.batch`."""
        got = await self._run(lambda db: db.execute(
            "SELECT object FROM batches WHERE id=? AND (? IS NULL OR owner=?)",
            (batch_id, owner, owner)).fetchone())
        return dict(json.loads(got[0])) if got is not None else None

    async def batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """See :meth:`gateway.batch.store.BatchStore.batches`."""
        rows = await self._run(lambda db: db.execute(
            "SELECT id, object FROM batches WHERE owner=? ORDER BY created_at DESC, id DESC",
            (owner,)).fetchall())
        ids = [r[0] for r in rows]
        start = ids.index(after) + 1 if after in ids else 0
        return [json.loads(r[1]) for r in rows[start:start + limit]]

    async def save_batch(self, obj: dict[str, Any]) -> None:
        """See :meth:`gateway.batch.store.BatchStore.save_batch`."""
        await self._run(lambda db: db.execute(
            "UPDATE batches SET status=?, object=? WHERE id=?",
            (obj["status"], json.dumps(obj), obj["id"])))

    async def principal(self, batch_id: str) -> dict[str, Any]:
        """See :meth:`gateway.batch.store.BatchStore.principal`."""
        got = await self._run(lambda db: db.execute(
            "SELECT principal FROM batches WHERE id=?", (batch_id,)).fetchone())
        return dict(json.loads(got[0]))

    async def unfinished(self) -> list[str]:
        """See :meth:`gateway.batch.store.BatchStore.unfinished`."""
        rows = await self._run(lambda db: db.execute(
            f"SELECT id FROM batches WHERE status IN ({_UNFINISHED_SQL}) "  # noqa: S608
            "ORDER BY created_at, id").fetchall())
        return [r[0] for r in rows]

    async def claim(self, batch_id: str, me: str, now: float, until: float) -> bool:
        """See :meth:`gateway.batch.store.BatchStore.claim`."""
        cur = await self._run(lambda db: db.execute(
            "UPDATE batches SET lease_owner=?, lease_until=? WHERE id=? AND "
            "(lease_owner IS NULL OR lease_owner=? OR lease_until<?)",
            (me, until, batch_id, me, now)))
        return cur.rowcount == 1

    async def release(self, batch_id: str, me: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.release`."""
        await self._run(lambda db: db.execute(
            "UPDATE batches SET lease_owner=NULL, lease_until=0 WHERE id=? AND lease_owner=?",
            (batch_id, me)))

    # requests

    async def pending(self, batch_id: str) -> list[RequestLine]:
        """See :meth:`gateway.batch.store.BatchStore.pending`."""
        rows = await self._run(lambda db: db.execute(
            "SELECT line, custom_id, url, body FROM requests WHERE batch_id=? AND done=0 "
            "ORDER BY line", (batch_id,)).fetchall())
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def answer(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> None:
        """See :meth:`gateway.batch.store.BatchStore.answer`."""
        await self._run(lambda db: db.execute(
            "UPDATE requests SET done=1, ok=?, result=? WHERE batch_id=? AND line=?",
            (int(ok), json.dumps(result), batch_id, line)))

    async def counts(self, batch_id: str) -> tuple[int, int, int]:
        """See :meth:`gateway.batch.store.BatchStore.counts`."""
        got = await self._run(lambda db: db.execute(
            "SELECT count(*), coalesce(sum(done=1 AND ok=1),0), "
            "coalesce(sum(done=1 AND ok=0),0) FROM requests WHERE batch_id=?",
            (batch_id,)).fetchone())
        return int(got[0]), int(got[1]), int(got[2])

    async def results(self, batch_id: str, ok: bool) -> list[str]:
        """See :meth:`gateway.batch.store.BatchStore.results`."""
        rows = await self._run(lambda db: db.execute(
            "SELECT result FROM requests WHERE batch_id=? AND done=1 AND ok=? ORDER BY line",
            (batch_id, int(ok))).fetchall())
        return [r[0] for r in rows]
