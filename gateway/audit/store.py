"""The audit store protocol, the values it keeps, and its URLs.

The backends (:mod:`gateway.audit.store_sqlite`, :mod:`gateway.audit.store_postgres`)
implement :class:`Store` and import this module; :func:`gateway.audit.backends.open_store`
picks one by URL. This module imports no backend, so the dependency runs one way.

Store URLs:

* ``sqlite:///abs/path/audit.db`` (everything after ``sqlite://`` is the file path, so
  ``sqlite://rel/audit.db`` is relative: to the working directory when given on a command
  line, to the config file's directory in a config file, see :func:`sqlite_url_under`);
* ``postgresql://user@host:port/dbname`` (also ``postgres://``), via asyncpg.

A store keeps records (unique per chain and sequence number, plus a global insertion id for
``tail``/``export``), the chains table and the signed checkpoints. ``append_batch`` is one
transaction: after a crash a batch is either wholly present or wholly absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.audit.records import Record


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A signed checkpoint as stored.

    Attributes:
        chain: Chain id (the checkpoint origin).
        size: Tree size (number of records covered).
        note: The signed note text.
        ts_us: When it was signed, microseconds since the epoch.
    """

    chain: str
    size: int
    note: str
    ts_us: int


@dataclass(frozen=True, slots=True)
class ChainInfo:
    """A chain known to the store.

    Attributes:
        chain: Chain id, ``<replica>/<boot id>``.
        replica: Replica id.
        started_us: Time of the chain's start, microseconds since the epoch.
        size: Number of records stored for it now.
    """

    chain: str
    replica: str
    started_us: int
    size: int


class Store(Protocol):
    """What the writer, the verifier and the CLI need from a backend."""

    @property
    def display_url(self) -> str:
        """The URL without credentials."""
        ...

    async def open(self) -> None:
        """Connect and create the schema if needed. Raises AuditUnavailable."""
        ...

    async def close(self) -> None:
        """Release connections (idempotent)."""
        ...

    async def append_batch(
        self,
        records: Sequence[Record],
        checkpoints: Sequence[StoredCheckpoint] = (),
        new_chain: ChainInfo | None = None,
    ) -> None:
        """Insert records, checkpoints and a new chain row in ONE transaction.

        Raises:
            AuditUnavailable: If the transaction did not commit.
        """
        ...

    async def list_chains(self) -> list[ChainInfo]:
        """All chains (from the chains table and the records), oldest first."""
        ...

    async def last_record(self, chain: str) -> Record | None:
        """The record with the highest sequence number of ``chain``."""
        ...

    async def read_records(self, chain: str, start_seq: int, limit: int) -> list[Record]:
        """Up to ``limit`` records of ``chain`` with ``seq >= start_seq``, by sequence number."""
        ...

    async def checkpoints(self, chain: str) -> list[StoredCheckpoint]:
        """All stored checkpoints of ``chain``, by size then time."""
        ...

    async def find_request(self, request_id: str) -> list[Record]:
        """Records whose ``data.request_id`` is ``request_id``."""
        ...

    async def scan(
        self, after_id: int, limit: int, since_us: int | None = None, until_us: int | None = None
    ) -> list[tuple[int, Record]]:
        """Records in insertion order with insertion id > ``after_id`` (and in the time range)."""
        ...


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite://PATH`` URL, or ``None`` (another scheme, no path, or
    an in-memory database)."""
    if not url.startswith("sqlite://"):
        return None
    path = url[len("sqlite://") :]
    if not path or ":memory:" in path or "mode=memory" in path:
        return None
    return Path(path)


def sqlite_url_under(url: str, base: Path) -> str:
    """``url`` with a relative SQLite file path made relative to ``base``.

    A config file's ``audit.store: sqlite://audit.db`` means the file next to the config, as
    every other relative path in it does, not a file in whatever directory ``gateway serve``
    or ``gateway audit verify --config`` happens to be started from.

    Args:
        url: A store URL; only a ``sqlite://`` URL with a relative path is changed.
        base: The directory the path is relative to (the config file's).

    Returns:
        The URL, its file path absolute when it was relative.
    """
    path = sqlite_file(url)
    if path is None or path.is_absolute():
        return url
    return f"sqlite://{base.absolute() / path}"


def replica_of(chain: str) -> str:
    """The replica id part of a chain id ``<replica>/<boot id>``."""
    return chain.split("/", 1)[0]
