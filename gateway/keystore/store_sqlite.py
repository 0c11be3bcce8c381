"""SQLite key store (stdlib ``sqlite3`` in worker threads; WAL, ``synchronous=FULL``)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gateway.keystore.errors import KeyExists, KeyNotFound, KeyStateError, KeystoreUnavailable
from gateway.keystore.models import KeySecret, ManagedKey
from gateway.keystore.store import SCHEMA, keys_from_rows

T = TypeVar("T")


class SqliteKeyStore:
    """Managed keys in a SQLite file (may be the audit log's file: separate tables).

    Args:
        path: database file path.
        busy_timeout_ms: how long a writer waits for another writer's lock.
    """

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000) -> None:
        self.path = Path(path)
        self.url = f"sqlite://{self.path}"
        self._busy_s = busy_timeout_ms / 1000.0

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_s, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def work() -> T:
            try:
                conn = self._connect()
            except sqlite3.Error as exc:
                raise KeystoreUnavailable(f"cannot open key store {self.path}: {exc}") from exc
            try:
                return fn(conn)
            except sqlite3.OperationalError as exc:
                raise KeystoreUnavailable(f"key store {self.path}: {exc}") from exc
            finally:
                conn.close()

        return await asyncio.to_thread(work)

    async def init(self) -> None:
        """Create the tables (and the file) if missing."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            for stmt in SCHEMA:
                conn.execute(stmt)
            conn.execute("INSERT OR IGNORE INTO sg_keystore_revision(id, revision) VALUES (1, 0)")
            conn.execute("COMMIT")

        await self._run(work)

    async def close(self) -> None:
        """Nothing to close: each call opens and closes its own connection."""

    async def revision(self) -> int:
        """Return the change counter."""
        return await self._run(_revision)

    async def load(self) -> tuple[int, list[ManagedKey]]:
        """Return the revision and all keys, read in one transaction."""

        def work(conn: sqlite3.Connection) -> tuple[int, list[ManagedKey]]:
            conn.execute("BEGIN")
            try:
                rev = _revision(conn)
                keys = conn.execute(
                    "SELECT id, team, models, data_class, description, "
                    "created_at, expires_at, revoked_at FROM sg_managed_keys"
                ).fetchall()
                secrets = conn.execute(
                    "SELECT digest, key_id, created_at, valid_until FROM sg_managed_key_secrets "
                    "ORDER BY created_at DESC, digest"
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return rev, keys_from_rows(keys, secrets)

        return await self._run(work)

    async def get(self, key_id: str) -> ManagedKey:
        """Return one key with its secrets."""

        def work(conn: sqlite3.Connection) -> ManagedKey:
            row = conn.execute(
                "SELECT id, team, models, data_class, description, "
                "created_at, expires_at, revoked_at FROM sg_managed_keys WHERE id = ?",
                (key_id,),
            ).fetchone()
            if row is None:
                raise KeyNotFound(f"no managed key with id {key_id!r}")
            secrets = conn.execute(
                "SELECT digest, key_id, created_at, valid_until FROM sg_managed_key_secrets "
                "WHERE key_id = ? ORDER BY created_at DESC, digest",
                (key_id,),
            ).fetchall()
            return keys_from_rows([row], secrets)[0]

        return await self._run(work)

    async def insert(self, key: ManagedKey, secret: KeySecret) -> None:
        """Store a new key and its first secret."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO sg_managed_keys (id, team, models, data_class, description, "
                    "created_at, expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        key.id,
                        key.team,
                        json.dumps(list(key.models)),
                        key.data_class,
                        key.description,
                        key.created_at,
                        key.expires_at,
                        key.revoked_at,
                    ),
                )
                _insert_secret(conn, secret)
                _bump(conn)
            except sqlite3.IntegrityError as exc:
                conn.execute("ROLLBACK")
                raise KeyExists(f"a managed key with id {key.id!r} already exists") from exc
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await self._run(work)

    async def rotate(
        self, key_id: str, secret: KeySecret, grace_until_ms: int, now_ms: int
    ) -> None:
        """Add a secret; end the older ones at ``grace_until_ms``."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                _check_usable(conn, key_id, now_ms)
                conn.execute(
                    "UPDATE sg_managed_key_secrets SET valid_until = ? WHERE key_id = ? "
                    "AND (valid_until IS NULL OR valid_until > ?)",
                    (grace_until_ms, key_id, grace_until_ms),
                )
                _insert_secret(conn, secret)
                _bump(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await self._run(work)

    async def revoke(self, key_id: str, now_ms: int) -> None:
        """Revoke a key."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT revoked_at FROM sg_managed_keys WHERE id = ?", (key_id,)
                ).fetchone()
                if row is None:
                    raise KeyNotFound(f"no managed key with id {key_id!r}")
                if row[0] is not None:
                    raise KeyStateError(f"managed key {key_id!r} is already revoked")
                conn.execute(
                    "UPDATE sg_managed_keys SET revoked_at = ? WHERE id = ?", (now_ms, key_id)
                )
                _bump(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await self._run(work)


def _revision(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT revision FROM sg_keystore_revision WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE sg_keystore_revision SET revision = revision + 1 WHERE id = 1")


def _insert_secret(conn: sqlite3.Connection, secret: KeySecret) -> None:
    conn.execute(
        "INSERT INTO sg_managed_key_secrets (digest, key_id, created_at, valid_until) "
        "VALUES (?, ?, ?, ?)",
        (secret.digest, secret.key_id, secret.created_at, secret.valid_until),
    )


def _check_usable(conn: sqlite3.Connection, key_id: str, now_ms: int) -> None:
    row = conn.execute(
        "SELECT revoked_at, expires_at FROM sg_managed_keys WHERE id = ?", (key_id,)
    ).fetchone()
    if row is None:
        raise KeyNotFound(f"no managed key with id {key_id!r}")
    if row[0] is not None:
        raise KeyStateError(f"managed key {key_id!r} is revoked")
    if row[1] is not None and row[1] <= now_ms:
        raise KeyStateError(f"managed key {key_id!r} has expired")
