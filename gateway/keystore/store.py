"""The managed key store: a protocol, and :func:`open_keystore` for a store URL.

Store URLs are those of the audit log (``gateway.audit``), so managed keys can live in the same
database as the audit records, in tables of their own:

* ``sqlite:///abs/path.db`` (everything after ``sqlite://`` is the file path);
* ``postgresql://user@host:port/db`` (also ``postgres://``), via asyncpg.

Tables (same in both)::

    sg_managed_keys(id PK, team, models JSON, data_class, description,
                    created_at, expires_at, revoked_at)               -- times: Unix ms
    sg_managed_key_secrets(digest PK (hex sha256), key_id, created_at, valid_until)
    sg_keystore_revision(id = 1, revision)                           -- bumped by every change

Replicas poll ``revision`` (cheap) and reload the keys only when it changed.
"""

from __future__ import annotations

from typing import Protocol

from gateway.keystore.errors import KeystoreConfigError
from gateway.keystore.models import KeySecret, ManagedKey

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sg_managed_keys (
        id TEXT PRIMARY KEY,
        team TEXT,
        models TEXT NOT NULL,
        data_class TEXT NOT NULL,
        description TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT,
        revoked_at BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS sg_managed_key_secrets (
        digest TEXT PRIMARY KEY,
        key_id TEXT NOT NULL REFERENCES sg_managed_keys(id),
        created_at BIGINT NOT NULL,
        valid_until BIGINT
    )""",
    """CREATE INDEX IF NOT EXISTS sg_managed_key_secrets_key
        ON sg_managed_key_secrets(key_id)""",
    """CREATE TABLE IF NOT EXISTS sg_keystore_revision (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        revision BIGINT NOT NULL
    )""",
)


class KeyStore(Protocol):
    """Persistence of managed keys (hashed secrets only)."""

    url: str

    async def init(self) -> None:
        """Create the tables if missing (idempotent)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    async def revision(self) -> int:
        """Return the change counter (bumped by every insert, rotate and revoke)."""
        ...

    async def load(self) -> tuple[int, list[ManagedKey]]:
        """Return the revision and every key with its secrets (newest secret first)."""
        ...

    async def get(self, key_id: str) -> ManagedKey:
        """Return one key. Raises ``KeyNotFound``."""
        ...

    async def insert(self, key: ManagedKey, secret: KeySecret) -> None:
        """Store a new key and its first secret. Raises ``KeyExists``."""
        ...

    async def rotate(
        self, key_id: str, secret: KeySecret, grace_until_ms: int, now_ms: int
    ) -> None:
        """Add ``secret``; older secrets stay valid until ``grace_until_ms``.

        Raises:
            KeyNotFound: no such key.
            KeyStateError: the key is revoked or expired.
        """
        ...

    async def revoke(self, key_id: str, now_ms: int) -> None:
        """Revoke a key (all its secrets). Raises ``KeyNotFound`` / ``KeyStateError``."""
        ...


def open_keystore(url: str, *, busy_timeout_ms: int = 5000) -> KeyStore:
    """Open (lazily: no I/O until ``init``) the key store at ``url``.

    Raises:
        KeystoreConfigError: unsupported or empty URL.
    """
    if url.startswith("sqlite://"):
        path = url[len("sqlite://") :]
        if not path:
            raise KeystoreConfigError("sqlite store URL needs a path: sqlite:///abs/path.db")
        from gateway.keystore.store_sqlite import SqliteKeyStore

        return SqliteKeyStore(path, busy_timeout_ms=busy_timeout_ms)
    if url.startswith(("postgresql://", "postgres://")):
        from gateway.keystore.store_postgres import PostgresKeyStore

        return PostgresKeyStore(url)
    raise KeystoreConfigError(
        f"unsupported key store URL {url!r}: use sqlite:///PATH or postgresql://..."
    )
