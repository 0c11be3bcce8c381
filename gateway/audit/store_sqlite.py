"""SQLite audit store: WAL journal with ``synchronous=FULL``, one transaction per batch.

All sqlite3 calls run on one dedicated worker thread that owns the connection, so the event
loop never blocks on fsync. ``BEGIN IMMEDIATE`` takes the write lock up front; a lock held by
another process longer than ``busy_timeout_ms`` fails the batch with :class:`AuditUnavailable`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from gateway.audit.errors import AuditUnavailable
from gateway.audit.records import Record
from gateway.audit.store import ChainInfo, StoredCheckpoint, replica_of

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chain TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts_us INTEGER NOT NULL,
    type TEXT NOT NULL,
    request_id TEXT,
    hash BLOB NOT NULL,
    body BLOB NOT NULL,
    UNIQUE (chain, seq)
);
CREATE INDEX IF NOT EXISTS audit_records_request ON audit_records (request_id);
CREATE INDEX IF NOT EXISTS audit_records_ts ON audit_records (ts_us);
CREATE TABLE IF NOT EXISTS audit_chains (
    chain TEXT PRIMARY KEY,
    replica TEXT NOT NULL,
    started_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_checkpoints (
    chain TEXT NOT NULL,
    size INTEGER NOT NULL,
    ts_us INTEGER NOT NULL,
    note TEXT NOT NULL,
    PRIMARY KEY (chain, size, ts_us)
);
"""


_INSERT_RECORDS = (
    "INSERT INTO audit_records (chain, seq, body, hash, ts_us, type, request_id) VALUES "
)
_ROWS_PER_INSERT = 128
"""Records per INSERT statement (7 parameters each: 896, within every SQLite's limit of 999
bound parameters)."""


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLITE_BUSY or SQLITE_LOCKED ("database is locked")."""
    primary = exc.sqlite_errorcode & 0xFF  # an extended result code's primary part
    return primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _text(data: bytes) -> str:
    """TEXT columns as str, also when an edit stored bytes that are not UTF-8 there (verify
    reports the column instead of failing with sqlite3's decode error)."""
    return data.decode("utf-8", "surrogateescape")


# Records are read with CAST(body AS BLOB), CAST(hash AS BLOB): the stored bytes even when an
# edit left TEXT there (the sqlite3 shell's replace() returns TEXT), so `gateway audit verify`
# reports the edited record instead of failing on its type.
def _row_to_record(row: Sequence[Any]) -> Record:
    return Record(
        chain=row[0],
        seq=row[1],
        body=bytes(row[2]),
        hash=bytes(row[3]),
        ts_us=row[4],
        type=row[5],
        request_id=row[6],
    )


class SqliteStore:
    """Audit store in one SQLite file (see module docstring)."""

    def __init__(
        self, path: str | Path, *, busy_timeout_ms: int = 5000, read_only: bool = False
    ) -> None:
        self.path = Path(path)
        self._read_only = read_only
        self._busy_timeout_ms = busy_timeout_ms
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    @property
    def display_url(self) -> str:
        """``sqlite://`` URL of the file."""
        return f"sqlite://{self.path}"

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        if self._executor is None or self._conn is None:
            raise AuditUnavailable(f"audit store {self.display_url} is not open")
        conn = self._conn
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, conn)
        except (sqlite3.Error, OSError) as exc:
            raise AuditUnavailable(f"audit store {self.display_url}: {what} failed: {exc}") from exc

    async def open(self) -> None:
        """Open the file (creating it and the schema) with WAL and synchronous=FULL.

        Raises:
            AuditUnavailable: If the file cannot be opened or initialised.
        """
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-sqlite")

        def connect() -> sqlite3.Connection:
            timeout = self._busy_timeout_ms / 1000
            if self._read_only:
                if not self.path.is_file():
                    raise sqlite3.OperationalError(f"no such file: {self.path}")
                uri = f"file:{self.path.resolve().as_posix()}?mode=ro"
                ro = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
                ro.text_factory = _text
                return ro
            # SQLite skips the busy handler where waiting could deadlock: two connections
            # that both hold SHARED and want to write (several workers switching a new file
            # to WAL or creating the schema at once) get SQLITE_BUSY at once, and a pod's
            # second worker failed to start. Such an attempt is retried, within the timeout.
            deadline = time.monotonic() + timeout
            pause_s = 0.005
            while True:
                try:
                    return self._initialised(timeout)
                except sqlite3.OperationalError as exc:
                    if not _busy(exc) or time.monotonic() + pause_s > deadline:
                        raise
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.1)

        loop = asyncio.get_running_loop()
        try:
            self._conn = await loop.run_in_executor(self._executor, connect)
        except (sqlite3.Error, OSError) as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise AuditUnavailable(f"cannot open audit store {self.display_url}: {exc}") from exc

    def _initialised(self, timeout_s: float) -> sqlite3.Connection:
        """A new connection with WAL, synchronous=FULL and the schema (in the worker thread).

        The schema is created in one ``BEGIN IMMEDIATE`` transaction: the write lock is taken
        first, where the busy handler waits, not upgraded from a read lock mid-statement.

        Raises:
            sqlite3.Error: The file cannot be opened or initialised (closed again).
        """
        conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        conn.text_factory = _text
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot enable WAL (journal_mode={mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}\nCOMMIT;")
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Close the connection and stop the worker thread."""
        if self._conn is not None and self._executor is not None:
            conn = self._conn
            self._conn = None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        """Insert everything in one ``BEGIN IMMEDIATE`` transaction (see Store)."""

        def txn(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if new_chain is not None:
                    conn.execute(
                        "INSERT INTO audit_chains (chain, replica, started_us) VALUES (?, ?, ?)",
                        (new_chain.chain, new_chain.replica, new_chain.started_us),
                    )
                # One multi-row INSERT per batch, not executemany: each step of a statement
                # releases the GIL and takes it back, and while the event loop thread is busy
                # each taking back may wait a whole switch interval (5 ms): a batch of n
                # records waited up to n of them before its commit.
                for start in range(0, len(records), _ROWS_PER_INSERT):
                    rows = records[start : start + _ROWS_PER_INSERT]
                    conn.execute(
                        _INSERT_RECORDS + ",".join(["(?,?,?,?,?,?,?)"] * len(rows)),
                        [
                            v
                            for r in rows
                            for v in (r.chain, r.seq, r.body, r.hash, r.ts_us, r.type,
                                      r.request_id)
                        ],
                    )
                if checkpoints:
                    conn.executemany(
                        "INSERT INTO audit_checkpoints (chain, size, ts_us, note) "
                        "VALUES (?, ?, ?, ?)",
                        [(c.chain, c.size, c.ts_us, c.note) for c in checkpoints],
                    )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        await self._run(txn, "append")

    async def list_chains(self) -> list[ChainInfo]:
        """All chains, oldest first (records without a chain row are included)."""

        def q(conn: sqlite3.Connection) -> list[ChainInfo]:
            rows = conn.execute(
                "SELECT c.chain, c.replica, c.started_us, "
                " (SELECT count(*) FROM audit_records r WHERE r.chain = c.chain) "
                "FROM audit_chains c "
                "UNION "
                "SELECT r.chain, NULL, min(r.ts_us), count(*) FROM audit_records r "
                "WHERE r.chain NOT IN (SELECT chain FROM audit_chains) GROUP BY r.chain "
                "ORDER BY 3, 1"
            ).fetchall()
            return [ChainInfo(r[0], r[1] or replica_of(r[0]), r[2], r[3]) for r in rows]

        return await self._run(q, "list chains")

    async def last_record(self, chain: str) -> Record | None:
        """See Store."""

        def q(conn: sqlite3.Connection) -> Record | None:
            row = conn.execute(
                "SELECT chain, seq, CAST(body AS BLOB), CAST(hash AS BLOB), ts_us, type, "
                "request_id "
                "FROM audit_records WHERE chain = ? ORDER BY seq DESC LIMIT 1",
                (chain,),
            ).fetchone()
            return None if row is None else _row_to_record(row)

        return await self._run(q, "read")

    async def read_records(self, chain: str, start_seq: int, limit: int) -> list[Record]:
        """See Store."""

        def q(conn: sqlite3.Connection) -> list[Record]:
            rows = conn.execute(
                "SELECT chain, seq, CAST(body AS BLOB), CAST(hash AS BLOB), ts_us, type, "
                "request_id "
                "FROM audit_records WHERE chain = ? AND seq >= ? "
                "ORDER BY seq LIMIT ?",
                (chain, start_seq, limit),
            ).fetchall()
            return [_row_to_record(r) for r in rows]

        return await self._run(q, "read")

    async def checkpoints(self, chain: str) -> list[StoredCheckpoint]:
        """See Store."""

        def q(conn: sqlite3.Connection) -> list[StoredCheckpoint]:
            rows = conn.execute(
                "SELECT chain, size, note, ts_us FROM audit_checkpoints WHERE chain = ? "
                "ORDER BY size, ts_us",
                (chain,),
            ).fetchall()
            return [StoredCheckpoint(r[0], r[1], _text(r[2]) if isinstance(r[2], bytes)
                                     else str(r[2]), r[3]) for r in rows]

        return await self._run(q, "read checkpoints")

    async def find_request(self, request_id: str) -> list[Record]:
        """See Store."""

        def q(conn: sqlite3.Connection) -> list[Record]:
            rows = conn.execute(
                "SELECT chain, seq, CAST(body AS BLOB), CAST(hash AS BLOB), ts_us, type, "
                "request_id "
                "FROM audit_records WHERE request_id = ? ORDER BY id",
                (request_id,),
            ).fetchall()
            return [_row_to_record(r) for r in rows]

        return await self._run(q, "read")

    async def scan(
        self, after_id: int, limit: int, since_us: int | None = None, until_us: int | None = None
    ) -> list[tuple[int, Record]]:
        """See Store."""

        def q(conn: sqlite3.Connection) -> list[tuple[int, Record]]:
            rows = conn.execute(
                "SELECT id, chain, seq, CAST(body AS BLOB), CAST(hash AS BLOB), ts_us, type, "
                "request_id "
                "FROM audit_records WHERE id > ? "
                "AND (? IS NULL OR ts_us >= ?) AND (? IS NULL OR ts_us < ?) ORDER BY id LIMIT ?",
                (after_id, since_us, since_us, until_us, until_us, limit),
            ).fetchall()
            return [(r[0], _row_to_record(r[1:])) for r in rows]

        return await self._run(q, "scan")
