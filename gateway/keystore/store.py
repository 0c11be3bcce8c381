"""The managed key store: its protocol, its tables, and the rows -> keys mapping.

The backends (:mod:`gateway.keystore.store_sqlite`, :mod:`gateway.keystore.store_postgres`)
import this module; :func:`gateway.keystore.backends.open_keystore` picks one by URL. This
module imports no backend, so the dependency runs one way.

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

import json
from typing import Any, Protocol

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


def keys_from_rows(keys: list[Any], secrets: list[Any]) -> list[ManagedKey]:
    """Build :class:`ManagedKey` objects from key rows and secret rows (any DB driver).

    Args:
        keys: Rows ``(id, team, models JSON, data_class, description, created_at, expires_at,
            revoked_at)`` of ``sg_managed_keys`` (times: Unix ms).
        secrets: Rows ``(digest, key_id, created_at, valid_until)`` of
            ``sg_managed_key_secrets``.

    Returns:
        The keys, oldest first (ties by id), each with its secrets in row order.
    """
    by_key: dict[str, list[KeySecret]] = {}
    for digest, key_id, created_at, valid_until in secrets:
        by_key.setdefault(key_id, []).append(
            KeySecret(
                digest, key_id, int(created_at), None if valid_until is None else int(valid_until)
            )
        )
    out = []
    for kid, team, models, data_class, description, created, expires, revoked in keys:
        out.append(
            ManagedKey(
                id=kid,
                team=team,
                models=tuple(json.loads(models)),
                data_class=data_class,
                description=description,
                created_at=int(created),
                expires_at=None if expires is None else int(expires),
                revoked_at=None if revoked is None else int(revoked),
                secrets=tuple(by_key.get(kid, ())),
            )
        )
    out.sort(key=lambda k: (k.created_at, k.id))
    return out
