"""PostgreSQL key store (asyncpg pool), for several gateway replicas."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from gateway.keystore.errors import KeyExists, KeyNotFound, KeyStateError, KeystoreUnavailable
from gateway.keystore.models import KeySecret, ManagedKey
from gateway.keystore.store import SCHEMA, keys_from_rows

_UNAVAILABLE = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, TimeoutError)


class PostgresKeyStore:
    """Managed keys in PostgreSQL (may be the audit log's database: separate tables).

    Args:
        url: ``postgresql://user@host:port/db``.
        timeout_s: connect and command timeout, in seconds.
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.url,
                    min_size=1,
                    max_size=4,
                    timeout=self._timeout_s,
                    command_timeout=self._timeout_s,
                )
            except _UNAVAILABLE as exc:
                raise KeystoreUnavailable(f"cannot connect to the key store: {exc}") from exc
        return self._pool

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        pool = await self._get_pool()
        try:
            return list(await pool.fetch(sql, *args))
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc

    async def init(self) -> None:
        """Create the tables if missing."""
        pool = await self._get_pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                # Serialise concurrent first starts of several replicas.
                await conn.execute("SELECT pg_advisory_xact_lock(7239101)")
                for stmt in SCHEMA:
                    await conn.execute(stmt)
                await conn.execute(
                    "INSERT INTO sg_keystore_revision(id, revision) VALUES (1, 0) "
                    "ON CONFLICT (id) DO NOTHING"
                )
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def revision(self) -> int:
        """Return the change counter."""
        rows = await self._fetch("SELECT revision FROM sg_keystore_revision WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    async def load(self) -> tuple[int, list[ManagedKey]]:
        """Return the revision and all keys from one consistent snapshot."""
        pool = await self._get_pool()
        try:
            async with (
                pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                rev = await conn.fetchval("SELECT revision FROM sg_keystore_revision WHERE id = 1")
                keys = await conn.fetch(
                    "SELECT id, team, models, data_class, description, "
                    "created_at, expires_at, revoked_at FROM sg_managed_keys"
                )
                secrets = await conn.fetch(
                    "SELECT digest, key_id, created_at, valid_until FROM sg_managed_key_secrets "
                    "ORDER BY created_at DESC, digest"
                )
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc
        return int(rev or 0), keys_from_rows([tuple(r) for r in keys], [tuple(r) for r in secrets])

    async def get(self, key_id: str) -> ManagedKey:
        """Return one key with its secrets."""
        rows = await self._fetch(
            "SELECT id, team, models, data_class, description, "
            "created_at, expires_at, revoked_at FROM sg_managed_keys WHERE id = $1",
            key_id,
        )
        if not rows:
            raise KeyNotFound(f"no managed key with id {key_id!r}")
        secrets = await self._fetch(
            "SELECT digest, key_id, created_at, valid_until "
            "FROM sg_managed_key_secrets WHERE key_id = $1 "
            "ORDER BY created_at DESC, digest",
            key_id,
        )
        return keys_from_rows([tuple(rows[0])], [tuple(r) for r in secrets])[0]

    async def insert(self, key: ManagedKey, secret: KeySecret) -> None:
        """Store a new key and its first secret."""
        pool = await self._get_pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO sg_managed_keys (id, team, models, data_class, description, "
                    "created_at, expires_at, revoked_at) "
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    key.id,
                    key.team,
                    json.dumps(list(key.models)),
                    key.data_class,
                    key.description,
                    key.created_at,
                    key.expires_at,
                    key.revoked_at,
                )
                await _insert_secret(conn, secret)
                await _bump(conn)
        except asyncpg.UniqueViolationError as exc:
            raise KeyExists(f"a managed key with id {key.id!r} already exists") from exc
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc

    async def rotate(
        self, key_id: str, secret: KeySecret, grace_until_ms: int, now_ms: int
    ) -> None:
        """Add a secret; end the older ones at ``grace_until_ms``."""
        pool = await self._get_pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    "SELECT revoked_at, expires_at FROM sg_managed_keys WHERE id = $1 FOR UPDATE",
                    key_id,
                )
                if row is None:
                    raise KeyNotFound(f"no managed key with id {key_id!r}")
                if row[0] is not None:
                    raise KeyStateError(f"managed key {key_id!r} is revoked")
                if row[1] is not None and row[1] <= now_ms:
                    raise KeyStateError(f"managed key {key_id!r} has expired")
                await conn.execute(
                    "UPDATE sg_managed_key_secrets SET valid_until = $1 WHERE key_id = $2 "
                    "AND (valid_until IS NULL OR valid_until > $1)",
                    grace_until_ms,
                    key_id,
                )
                await _insert_secret(conn, secret)
                await _bump(conn)
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc

    async def revoke(self, key_id: str, now_ms: int) -> None:
        """Revoke a key."""
        pool = await self._get_pool()
        try:
            async with pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    "SELECT revoked_at FROM sg_managed_keys WHERE id = $1 FOR UPDATE", key_id
                )
                if row is None:
                    raise KeyNotFound(f"no managed key with id {key_id!r}")
                if row[0] is not None:
                    raise KeyStateError(f"managed key {key_id!r} is already revoked")
                await conn.execute(
                    "UPDATE sg_managed_keys SET revoked_at = $1 WHERE id = $2", now_ms, key_id
                )
                await _bump(conn)
        except _UNAVAILABLE as exc:
            raise KeystoreUnavailable(f"key store unreachable: {exc}") from exc


async def _insert_secret(conn: Any, secret: KeySecret) -> None:
    await conn.execute(
        "INSERT INTO sg_managed_key_secrets (digest, key_id, created_at, valid_until) "
        "VALUES ($1, $2, $3, $4)",
        secret.digest,
        secret.key_id,
        secret.created_at,
        secret.valid_until,
    )


async def _bump(conn: Any) -> None:
    await conn.execute("UPDATE sg_keystore_revision SET revision = revision + 1 WHERE id = 1")
