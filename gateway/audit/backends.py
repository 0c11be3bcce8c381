"""The audit store for a URL: :func:`open_store` picks the backend by the URL's scheme.

In a module of its own so that the backends, which import the protocol and the values of
:mod:`gateway.audit.store`, are not imported back by it (no import circle).
"""

from __future__ import annotations

from gateway.audit.errors import AuditConfigError
from gateway.audit.store import Store

__all__ = ["open_store"]


def open_store(
    url: str,
    *,
    busy_timeout_ms: int = 5000,
    read_only: bool = False,
    timeout_s: float | None = None,
) -> Store:
    """Create (not yet open) the store for ``url``.

    Args:
        url: ``sqlite://PATH`` or ``postgresql://...``.
        busy_timeout_ms: SQLite only: how long to wait for a lock before failing.
        timeout_s: If given, overrides ``busy_timeout_ms`` (SQLite) and is the connect timeout
            (PostgreSQL), seconds.
        read_only: Never create or change anything (verify, export, prove). SQLite: the file
            must exist.

    Raises:
        AuditConfigError: On an unknown URL scheme.
    """
    if timeout_s is not None:
        busy_timeout_ms = max(1, int(timeout_s * 1000))
    if url.startswith("sqlite://"):
        from gateway.audit.store_sqlite import SqliteStore

        path = url[len("sqlite://") :]
        if not path:
            raise AuditConfigError("sqlite store URL needs a path: sqlite:///abs/path.db")
        return SqliteStore(path, busy_timeout_ms=busy_timeout_ms, read_only=read_only)
    if url.startswith(("postgresql://", "postgres://")):
        from gateway.audit.store_postgres import PostgresStore

        return PostgresStore(
            url, read_only=read_only, connect_timeout_s=timeout_s if timeout_s else 5.0
        )
    raise AuditConfigError(f"unsupported audit store URL (sqlite:// or postgresql://): {url!r}")
