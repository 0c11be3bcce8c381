"""PostgreSQL audit store (asyncpg) for several replicas sharing one database.

Each replica writes its own chains, so writers never contend on a row. ``append_batch`` is one
statement (records, checkpoints and the chain row inserted through data-modifying CTEs from
arrays), hence one transaction and one round trip. With PostgreSQL's default
``synchronous_commit=on`` a returned commit is durable (WAL flushed). Connection and server
errors become :class:`AuditUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.audit.errors import AuditUnavailable
from gateway.audit.records import Record
from gateway.audit.store import ChainInfo, StoredCheckpoint, replica_of

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_records (
    id BIGSERIAL PRIMARY KEY,
    chain TEXT NOT NULL,
    seq BIGINT NOT NULL,
    ts_us BIGINT NOT NULL,
    type TEXT NOT NULL,
    request_id TEXT,
    hash BYTEA NOT NULL,
    body BYTEA NOT NULL,
    UNIQUE (chain, seq)
);
CREATE INDEX IF NOT EXISTS audit_records_request ON audit_records (request_id);
CREATE INDEX IF NOT EXISTS audit_records_ts ON audit_records (ts_us);
CREATE TABLE IF NOT EXISTS audit_chains (
    chain TEXT PRIMARY KEY,
    replica TEXT NOT NULL,
    started_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_checkpoints (
    chain TEXT NOT NULL,
    size BIGINT NOT NULL,
    ts_us BIGINT NOT NULL,
    note TEXT NOT NULL,
    PRIMARY KEY (chain, size, ts_us)
);
"""

_APPEND = """
WITH new_chain AS (
    INSERT INTO audit_chains (chain, replica, started_us)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
), new_checkpoints AS (
    INSERT INTO audit_checkpoints (chain, size, ts_us, note)
    SELECT * FROM unnest($4::text[], $5::bigint[], $6::bigint[], $7::text[])
)
INSERT INTO audit_records (chain, seq, body, hash, ts_us, type, request_id)
SELECT * FROM unnest(
    $8::text[], $9::bigint[], $10::bytea[], $11::bytea[], $12::bigint[], $13::text[], $14::text[]
)
"""
_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


def _rec(row: Any) -> Record:
    return Record(
        chain=row["chain"],
        seq=row["seq"],
        body=bytes(row["body"]),
        hash=bytes(row["hash"]),
        ts_us=row["ts_us"],
        type=row["type"],
        request_id=row["request_id"],
    )


class PostgresStore:
    """Audit store in a PostgreSQL database (see module docstring)."""

    def __init__(
        self, dsn: str, *, connect_timeout_s: float = 5.0, read_only: bool = False
    ) -> None:
        self._dsn = dsn
        self._read_only = read_only
        self._timeout_s = connect_timeout_s
        self._pool: asyncpg.Pool | None = None

    @property
    def display_url(self) -> str:
        """The DSN without the password."""
        parts = urlsplit(self._dsn)
        netloc = parts.hostname or ""
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def _pool_or_raise(self) -> asyncpg.Pool:
        if self._pool is None:
            raise AuditUnavailable(f"audit store {self.display_url} is not open")
        return self._pool

    async def open(self) -> None:
        """Connect (pool of 1-4) and create the schema.

        Raises:
            AuditUnavailable: If the server cannot be reached or the schema not created.
        """
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self._dsn, min_size=1, max_size=4, timeout=self._timeout_s, command_timeout=30
            )
        except _ERRORS as exc:
            msg = f"cannot connect to audit store {self.display_url}: {exc}"
            raise AuditUnavailable(msg) from exc
        if self._read_only:
            self._pool = pool
            return
        try:
            async with pool.acquire() as conn:
                # Serialise concurrent schema creation by several replicas.
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(7466353101)")
                    await conn.execute(_SCHEMA)
        except _ERRORS as exc:
            await pool.close()
            msg = f"cannot initialise audit store {self.display_url}: {exc}"
            raise AuditUnavailable(msg) from exc
        self._pool = pool

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except _ERRORS:
                pool.terminate()

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        """Insert everything in one transaction (see Store)."""
        pool = self._pool_or_raise()
        chains = [new_chain] if new_chain is not None else []
        try:
            async with pool.acquire() as conn:
                # One statement (atomic on its own) and one round trip for the whole batch.
                await conn.execute(
                    _APPEND,
                    [c.chain for c in chains],
                    [c.replica for c in chains],
                    [c.started_us for c in chains],
                    [c.chain for c in checkpoints],
                    [c.size for c in checkpoints],
                    [c.ts_us for c in checkpoints],
                    [c.note for c in checkpoints],
                    [r.chain for r in records],
                    [r.seq for r in records],
                    [r.body for r in records],
                    [r.hash for r in records],
                    [r.ts_us for r in records],
                    [r.type for r in records],
                    [r.request_id for r in records],
                )
        except _ERRORS as exc:
            raise AuditUnavailable(f"audit store {self.display_url}: append failed: {exc}") from exc

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        pool = self._pool_or_raise()
        try:
            async with pool.acquire() as conn:
                return list(await conn.fetch(sql, *args))
        except _ERRORS as exc:
            raise AuditUnavailable(f"audit store {self.display_url}: read failed: {exc}") from exc

    async def list_chains(self) -> list[ChainInfo]:
        """See Store."""
        rows = await self._fetch(
            "SELECT c.chain, c.replica, c.started_us, "
            " (SELECT count(*) FROM audit_records r WHERE r.chain = c.chain) AS n "
            "FROM audit_chains c "
            "UNION ALL "
            "SELECT r.chain, NULL, min(r.ts_us), count(*) FROM audit_records r "
            "WHERE r.chain NOT IN (SELECT chain FROM audit_chains) GROUP BY r.chain "
            "ORDER BY 3, 1"
        )
        return [ChainInfo(r[0], r[1] or replica_of(r[0]), r[2], r[3]) for r in rows]

    async def last_record(self, chain: str) -> Record | None:
        """See Store."""
        rows = await self._fetch(
            "SELECT chain, seq, body, hash, ts_us, type, request_id "
            "FROM audit_records WHERE chain = $1 ORDER BY seq DESC LIMIT 1",
            chain,
        )
        return _rec(rows[0]) if rows else None

    async def read_records(self, chain: str, start_seq: int, limit: int) -> list[Record]:
        """See Store."""
        rows = await self._fetch(
            "SELECT chain, seq, body, hash, ts_us, type, request_id "
            "FROM audit_records WHERE chain = $1 AND seq >= $2 "
            "ORDER BY seq LIMIT $3",
            chain,
            start_seq,
            limit,
        )
        return [_rec(r) for r in rows]

    async def checkpoints(self, chain: str) -> list[StoredCheckpoint]:
        """See Store."""
        rows = await self._fetch(
            "SELECT chain, size, note, ts_us FROM audit_checkpoints WHERE chain = $1 "
            "ORDER BY size, ts_us",
            chain,
        )
        return [StoredCheckpoint(r["chain"], r["size"], r["note"], r["ts_us"]) for r in rows]

    async def find_request(self, request_id: str) -> list[Record]:
        """See Store."""
        rows = await self._fetch(
            "SELECT chain, seq, body, hash, ts_us, type, request_id "
            "FROM audit_records WHERE request_id = $1 ORDER BY id",
            request_id,
        )
        return [_rec(r) for r in rows]

    async def scan(
        self, after_id: int, limit: int, since_us: int | None = None, until_us: int | None = None
    ) -> list[tuple[int, Record]]:
        """See Store."""
        rows = await self._fetch(
            "SELECT id, chain, seq, body, hash, ts_us, type, request_id "
            "FROM audit_records WHERE id > $1 "
            "AND ($2::bigint IS NULL OR ts_us >= $2) AND ($3::bigint IS NULL OR ts_us < $3) "
            "ORDER BY id LIMIT $4",
            after_id,
            since_us,
            until_us,
            limit,
        )
        return [(r["id"], _rec(r)) for r in rows]
