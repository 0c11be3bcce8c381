"""The batch store in PostgreSQL (:class:`gateway.batch.store.BatchStore`), asyncpg.

Used when the audit store is PostgreSQL: the same database (the audit store's DSN), its own
tables ``sg_batch_files``, ``sg_batch_batches`` and ``sg_batch_requests``, created if missing
under an advisory lock (several pods and workers may start at once). Every pod sharing the
database resumes unfinished batches; the lease in ``sg_batch_batches`` lets one run each.
Connection and server errors become :class:`~gateway.batch.store.BatchStoreUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from gateway.batch.store import (
    FINAL,
    UNFINISHED,
    BatchStoreUnavailable,
    OwnerLimits,
    OwnerUsage,
    RequestLine,
)

__all__ = ["PostgresBatchStore"]

_T = TypeVar("_T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sg_batch_files ("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,"
    " created_at BIGINT NOT NULL, content BYTEA NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sg_batch_files_owner ON sg_batch_files (owner)",
    "CREATE TABLE IF NOT EXISTS sg_batch_batches ("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL,"
    " created_at BIGINT NOT NULL, principal TEXT NOT NULL, object TEXT NOT NULL,"
    " lease_owner TEXT, lease_until DOUBLE PRECISION)",
    "CREATE INDEX IF NOT EXISTS sg_batch_batches_owner ON sg_batch_batches (owner, created_at)",
    "CREATE INDEX IF NOT EXISTS sg_batch_batches_status ON sg_batch_batches (status)",
    "CREATE TABLE IF NOT EXISTS sg_batch_requests ("
    " batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,"
    " body BYTEA NOT NULL, done BOOLEAN NOT NULL DEFAULT FALSE, ok BOOLEAN, result TEXT,"
    " PRIMARY KEY (batch_id, line))",
)
_LOCK_ID = 7239117  # pg_advisory_xact_lock key of the schema creation
_QUOTA_LOCK = 7239118  # first key of the per-owner lock (the second: hashtext(owner))
_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


async def _usage(conn: asyncpg.Connection, owner: str) -> OwnerUsage:
    """What ``owner`` stores (:class:`gateway.batch.store.OwnerUsage`): its files, and the
    request rows (bodies and answers) of its batches that still hold them."""
    files = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(octet_length(content)), 0) AS bytes "
        "FROM sg_batch_files WHERE owner=$1", owner)
    rows = await conn.fetchrow(
        "SELECT count(DISTINCT r.batch_id) AS n, coalesce(sum(octet_length(r.body) + "
        "coalesce(octet_length(r.result), 0)), 0) AS bytes FROM sg_batch_requests r "
        "JOIN sg_batch_batches b ON b.id=r.batch_id WHERE b.owner=$1", owner)
    assert files is not None and rows is not None
    return OwnerUsage(bytes=int(files["bytes"]) + int(rows["bytes"]),
                      files=int(files["n"]) + int(rows["n"]))


class PostgresBatchStore:
    """The Batch API's tables in a PostgreSQL database.

    Args:
        url: ``postgresql://user@host:port/db`` (the audit store's).
        timeout_s: Connect and command timeout, seconds.
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        """Connect (a pool of up to 4) and create the tables if missing."""
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(self.url, min_size=1, max_size=4,
                                             timeout=self._timeout_s,
                                             command_timeout=self._timeout_s)
        except _ERRORS as exc:
            raise BatchStoreUnavailable(f"cannot connect to the batch database: {exc}") from exc
        try:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
                for stmt in _SCHEMA:
                    await conn.execute(stmt)
                # A batch that ended keeps its answers in its output files: rows left by a
                # stop between its end and their clean-up are removed here.
                await conn.execute(
                    "DELETE FROM sg_batch_requests WHERE batch_id IN (SELECT id FROM "
                    "sg_batch_batches WHERE status = ANY($1::text[]))", sorted(FINAL))
        except _ERRORS as exc:
            await pool.close()
            raise BatchStoreUnavailable(f"cannot create the batch tables: {exc}") from exc
        self._pool = pool

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _run(self, fn: Callable[[asyncpg.Pool], Awaitable[_T]]) -> _T:
        if self._pool is None:
            raise BatchStoreUnavailable("the batch database is closed")
        try:
            return await fn(self._pool)
        except _ERRORS as exc:
            raise BatchStoreUnavailable(f"batch database: {exc}") from exc

    # files

    async def add_file(self, row: dict[str, Any], content: bytes,
                       limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """See :meth:`gateway.batch.store.BatchStore.add_file`."""
        async def add(pool: asyncpg.Pool) -> OwnerUsage | None:
            async with pool.acquire() as conn, conn.transaction():
                if limits is not None:
                    # One owner's uploads queue on this lock (held to the commit), so two
                    # uploads cannot both pass the sum; other owners are not held up.
                    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                                       _QUOTA_LOCK, row["owner"])
                    usage = await _usage(conn, row["owner"])
                    if (usage.files + 1 > limits.max_files
                            or usage.bytes + len(content) > limits.max_bytes):
                        return usage
                await conn.execute(
                    "INSERT INTO sg_batch_files VALUES ($1,$2,$3,$4,$5,$6)",
                    row["id"], row["owner"], row["purpose"], row["filename"],
                    row["created_at"], content)
            return None
        return await self._run(add)

    async def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        """See :meth:`gateway.batch.store.BatchStore.file`."""
        got = await self._run(lambda p: p.fetchrow(
            "SELECT id, purpose, filename, created_at, octet_length(content) AS bytes "
            "FROM sg_batch_files WHERE id=$1 AND owner=$2", file_id, owner))
        return dict(got) if got is not None else None

    async def content(self, file_id: str, owner: str) -> bytes | None:
        """See :meth:`gateway.batch.store.BatchStore.content`."""
        got = await self._run(lambda p: p.fetchval(
            "SELECT content FROM sg_batch_files WHERE id=$1 AND owner=$2", file_id, owner))
        return bytes(got) if got is not None else None

    async def delete_file(self, file_id: str, owner: str) -> bool:
        """See :meth:`gateway.batch.store.BatchStore.delete_file`."""
        status = await self._run(lambda p: p.execute(
            "DELETE FROM sg_batch_files WHERE id=$1 AND owner=$2", file_id, owner))
        return str(status).endswith(" 1")

    # batches

    async def add_batch(self, obj: dict[str, Any], owner: str, principal: dict[str, Any],
                        lines: list[RequestLine],
                        limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """See :meth:`gateway.batch.store.BatchStore.add_batch`."""
        size = sum(len(line[3]) for line in lines)

        async def add(pool: asyncpg.Pool) -> OwnerUsage | None:
            async with pool.acquire() as conn, conn.transaction():
                if limits is not None:
                    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                                       _QUOTA_LOCK, owner)
                    usage = await _usage(conn, owner)
                    if (usage.files + 1 > limits.max_files
                            or usage.bytes + size > limits.max_bytes):
                        return usage
                await conn.execute(
                    "INSERT INTO sg_batch_batches (id, owner, status, created_at, principal, "
                    "object) VALUES ($1,$2,$3,$4,$5,$6)", obj["id"], owner, obj["status"],
                    obj["created_at"], json.dumps(principal), json.dumps(obj))
                await conn.copy_records_to_table(
                    "sg_batch_requests", columns=("batch_id", "line", "custom_id", "url", "body"),
                    records=[(obj["id"], *line) for line in lines])
            return None
        return await self._run(add)

    async def remove_batch(self, batch_id: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.remove_batch`."""
        async def remove(pool: asyncpg.Pool) -> None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("DELETE FROM sg_batch_requests WHERE batch_id=$1", batch_id)
                await conn.execute("DELETE FROM sg_batch_batches WHERE id=$1", batch_id)
        await self._run(remove)

    async def forget_requests(self, batch_id: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.forget_requests`."""
        await self._run(lambda p: p.execute(
            "DELETE FROM sg_batch_requests WHERE batch_id=$1", batch_id))

    async def batch(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """See :meth:`gateway.batch.store.BatchStore.batch`."""
        got = await self._run(lambda p: p.fetchval(
            "SELECT object FROM sg_batch_batches WHERE id=$1 AND ($2::text IS NULL OR owner=$2)",
            batch_id, owner))
        return dict(json.loads(got)) if got is not None else None

    async def batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """See :meth:`gateway.batch.store.BatchStore.batches`."""
        rows = await self._run(lambda p: p.fetch(
            "SELECT id, object FROM sg_batch_batches WHERE owner=$1 "
            "ORDER BY created_at DESC, id DESC", owner))
        ids = [r[0] for r in rows]
        start = ids.index(after) + 1 if after in ids else 0
        return [json.loads(r[1]) for r in rows[start:start + limit]]

    async def save_batch(self, obj: dict[str, Any]) -> None:
        """See :meth:`gateway.batch.store.BatchStore.save_batch`."""
        await self._run(lambda p: p.execute(
            "UPDATE sg_batch_batches SET status=$1, object=$2 WHERE id=$3",
            obj["status"], json.dumps(obj), obj["id"]))

    async def principal(self, batch_id: str) -> dict[str, Any]:
        """See :meth:`gateway.batch.store.BatchStore.principal`."""
        got = await self._run(lambda p: p.fetchval(
            "SELECT principal FROM sg_batch_batches WHERE id=$1", batch_id))
        return dict(json.loads(got))

    async def unfinished(self) -> list[str]:
        """See :meth:`gateway.batch.store.BatchStore.unfinished`."""
        rows = await self._run(lambda p: p.fetch(
            "SELECT id FROM sg_batch_batches WHERE status = ANY($1::text[]) "
            "ORDER BY created_at, id", list(UNFINISHED)))
        return [r[0] for r in rows]

    async def claim(self, batch_id: str, me: str, now: float, until: float) -> bool:
        """See :meth:`gateway.batch.store.BatchStore.claim`."""
        status = await self._run(lambda p: p.execute(
            "UPDATE sg_batch_batches SET lease_owner=$1, lease_until=$2 WHERE id=$3 AND "
            "(lease_owner IS NULL OR lease_owner=$1 OR lease_until<$4)",
            me, until, batch_id, now))
        return str(status) == "UPDATE 1"

    async def release(self, batch_id: str, me: str) -> None:
        """See :meth:`gateway.batch.store.BatchStore.release`."""
        await self._run(lambda p: p.execute(
            "UPDATE sg_batch_batches SET lease_owner=NULL, lease_until=0 "
            "WHERE id=$1 AND lease_owner=$2", batch_id, me))

    # requests

    async def pending(self, batch_id: str) -> list[RequestLine]:
        """See :meth:`gateway.batch.store.BatchStore.pending`."""
        rows = await self._run(lambda p: p.fetch(
            "SELECT line, custom_id, url, body FROM sg_batch_requests "
            "WHERE batch_id=$1 AND NOT done ORDER BY line", batch_id))
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def answer(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> None:
        """See :meth:`gateway.batch.store.BatchStore.answer`."""
        await self._run(lambda p: p.execute(
            "UPDATE sg_batch_requests SET done=TRUE, ok=$1, result=$2 "
            "WHERE batch_id=$3 AND line=$4", ok, json.dumps(result), batch_id, line))

    async def counts(self, batch_id: str) -> tuple[int, int, int]:
        """See :meth:`gateway.batch.store.BatchStore.counts`."""
        got = await self._run(lambda p: p.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE done AND ok), "
            "count(*) FILTER (WHERE done AND NOT ok) FROM sg_batch_requests WHERE batch_id=$1",
            batch_id))
        assert got is not None
        return int(got[0]), int(got[1]), int(got[2])

    async def results(self, batch_id: str, ok: bool) -> list[str]:
        """See :meth:`gateway.batch.store.BatchStore.results`."""
        rows = await self._run(lambda p: p.fetch(
            "SELECT result FROM sg_batch_requests WHERE batch_id=$1 AND done AND ok=$2 "
            "ORDER BY line", batch_id, ok))
        return [r[0] for r in rows]
