"""Opening the Batch API's store: a SQLite file or the PostgreSQL audit store's database.

Its own module so that :mod:`gateway.batch.store` (the protocol both backends implement)
imports no backend.
"""

from __future__ import annotations

from pathlib import Path

from gateway.batch.store import BatchStore

__all__ = ["open_batch_store"]


def open_batch_store(where: Path | str) -> BatchStore:
    """The (not yet opened) store: a SQLite file, or a ``postgresql://`` DSN.

    Args:
        where: A SQLite database path, or the PostgreSQL audit store's URL.
    """
    # Imported when opened: a gateway without batches never loads a database driver for them.
    if isinstance(where, str) and where.startswith(("postgresql://", "postgres://")):
        from gateway.batch.store_postgres import PostgresBatchStore

        return PostgresBatchStore(where)
    from gateway.batch.store_sqlite import SqliteBatchStore

    return SqliteBatchStore(Path(where))
