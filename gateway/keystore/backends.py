"""The key store for a URL: :func:`open_keystore` picks the backend by the URL's scheme.

In a module of its own so that the backends, which import the protocol and the tables of
:mod:`gateway.keystore.store`, are not imported back by it (no import circle).
"""

from __future__ import annotations

from gateway.keystore.errors import KeystoreConfigError
from gateway.keystore.store import KeyStore

__all__ = ["open_keystore"]


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
