"""Durable state of the Batch API: files, batches and each batch request's answer, in SQLite.

One table per concept: ``files`` (uploads and produced output files, content as a BLOB, owner
key id), ``batches`` (the OpenAI batch object's fields as JSON, owner, status) and ``requests``
(one row per input line: ``done`` once its answer is stored). A batch is run by one runner
at a time (worker processes or pods sharing the file): the runner holds a lease on it
(:meth:`BatchStore.claim`), renewed while it runs, released when it stops.
A request's answer is written in the same statement that marks it done, so after a
restart only requests without an answer are sent again. Every call is short and synchronous;
callers run them in a thread (:func:`asyncio.to_thread`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

__all__ = ["BatchStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    principal TEXT NOT NULL, object TEXT NOT NULL, lease_owner TEXT, lease_until REAL);
CREATE TABLE IF NOT EXISTS requests (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
    body BLOB NOT NULL, done INTEGER NOT NULL DEFAULT 0, ok INTEGER, result TEXT,
    PRIMARY KEY (batch_id, line));
"""


class BatchStore:
    """The SQLite database of the Batch API.

    Args:
        path: The database file (created with its directory when missing).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    # files

    def add_file(self, row: dict[str, Any], content: bytes) -> None:
        """Store a file (``row``: the file object's id, purpose, filename, created_at, owner)."""
        with self._lock:
            self._db.execute("INSERT INTO files VALUES (?,?,?,?,?,?)",
                             (row["id"], row["owner"], row["purpose"], row["filename"],
                              row["created_at"], content))

    def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        """The file's row (without content) if ``owner`` owns it, else ``None``."""
        with self._lock:
            got = self._db.execute(
                "SELECT id, purpose, filename, created_at, length(content) FROM files "
                "WHERE id=? AND owner=?", (file_id, owner)).fetchone()
        if got is None:
            return None
        return {"id": got[0], "purpose": got[1], "filename": got[2], "created_at": got[3],
                "bytes": got[4]}

    def content(self, file_id: str, owner: str) -> bytes | None:
        """The file's bytes if ``owner`` owns it, else ``None``."""
        with self._lock:
            got = self._db.execute("SELECT content FROM files WHERE id=? AND owner=?",
                                   (file_id, owner)).fetchone()
        return bytes(got[0]) if got is not None else None

    # batches

    def add_batch(self, obj: dict[str, Any], owner: str, principal: dict[str, Any],
                  lines: list[tuple[int, str, str, bytes]]) -> None:
        """Store a new batch and its request lines ``(line, custom_id, url, body)`` at once."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT INTO batches (id, owner, status, created_at, "
                                 "principal, object) VALUES (?,?,?,?,?,?)",
                                 (obj["id"], owner, obj["status"], obj["created_at"],
                                  json.dumps(principal), json.dumps(obj)))
                self._db.executemany(
                    "INSERT INTO requests (batch_id, line, custom_id, url, body) "
                    "VALUES (?,?,?,?,?)", [(obj["id"], *line) for line in lines])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def batch(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """The batch object (``owner`` ``None``: whoever owns it)."""
        with self._lock:
            got = self._db.execute(
                "SELECT object FROM batches WHERE id=? AND (? IS NULL OR owner=?)",
                (batch_id, owner, owner)).fetchone()
        return json.loads(got[0]) if got is not None else None

    def batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """``owner``'s batches, newest first, after the batch id ``after`` (pagination)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, object FROM batches WHERE owner=? ORDER BY created_at DESC, id DESC",
                (owner,)).fetchall()
        ids = [r[0] for r in rows]
        start = ids.index(after) + 1 if after in ids else 0
        return [json.loads(r[1]) for r in rows[start:start + limit]]

    def save_batch(self, obj: dict[str, Any]) -> None:
        """Write the batch object back (status and counts changed)."""
        with self._lock:
            self._db.execute("UPDATE batches SET status=?, object=? WHERE id=?",
                             (obj["status"], json.dumps(obj), obj["id"]))

    def principal(self, batch_id: str) -> dict[str, Any]:
        """The stored principal fields of the batch's owner."""
        with self._lock:
            got = self._db.execute("SELECT principal FROM batches WHERE id=?",
                                   (batch_id,)).fetchone()
        return dict(json.loads(got[0]))

    def unfinished(self) -> list[str]:
        """Ids of batches not in a final state (to resume after a restart), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM batches WHERE status IN "
                "('validating','in_progress','finalizing','cancelling') ORDER BY created_at, id"
            ).fetchall()
        return [r[0] for r in rows]

    def claim(self, batch_id: str, me: str, now: float, until: float) -> bool:
        """Take (or renew) the lease on running the batch: ``me`` runs it until ``until``
        (Unix seconds) unless another runner holds an unexpired lease. Returns whether it did."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE batches SET lease_owner=?, lease_until=? WHERE id=? AND "
                "(lease_owner IS NULL OR lease_owner=? OR lease_until<?)",
                (me, until, batch_id, me, now))
        return cur.rowcount == 1

    def release(self, batch_id: str, me: str) -> None:
        """Give up ``me``'s lease (another runner may take the batch at once)."""
        with self._lock:
            self._db.execute("UPDATE batches SET lease_owner=NULL, lease_until=0 "
                             "WHERE id=? AND lease_owner=?", (batch_id, me))

    # requests

    def pending(self, batch_id: str) -> list[tuple[int, str, str, bytes]]:
        """The batch's requests without an answer: ``(line, custom_id, url, body)``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT line, custom_id, url, body FROM requests WHERE batch_id=? AND done=0 "
                "ORDER BY line", (batch_id,)).fetchall()
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    def answer(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> None:
        """Store a request's answer (its output or error line) and mark it done."""
        with self._lock:
            self._db.execute("UPDATE requests SET done=1, ok=?, result=? "
                             "WHERE batch_id=? AND line=?",
                             (int(ok), json.dumps(result), batch_id, line))

    def counts(self, batch_id: str) -> tuple[int, int, int]:
        """``(total, completed, failed)`` requests of the batch."""
        with self._lock:
            got = self._db.execute(
                "SELECT count(*), coalesce(sum(done=1 AND ok=1),0), "
                "coalesce(sum(done=1 AND ok=0),0) FROM requests WHERE batch_id=?",
                (batch_id,)).fetchone()
        return int(got[0]), int(got[1]), int(got[2])

    def results(self, batch_id: str, ok: bool) -> list[str]:
        """The stored output (``ok``) or error lines of the batch, in input order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT result FROM requests WHERE batch_id=? AND done=1 AND ok=? ORDER BY line",
                (batch_id, int(ok))).fetchall()
        return [r[0] for r in rows]
