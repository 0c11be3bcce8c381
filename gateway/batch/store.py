"""Durable state of the Batch API: the store protocol (opened by
:func:`gateway.batch.backends.open_batch_store`).

Three concepts, one table each (both backends): files (uploads and produced output files, the
content as bytes, the owner's key id), batches (the OpenAI batch object as JSON, its owner and
the owner's stored principal, its status, the runner's lease) and requests (one row per input
line; ``done`` once its answer is stored). A request's answer is written in the same statement
that marks it done, so after a restart only requests without an answer are sent again. A batch
is run by one runner at a time (worker processes or pods sharing the database): the runner
holds a lease on it (:meth:`BatchStore.claim`), renewed while it runs, released when it stops.

Backends: :class:`gateway.batch.store_sqlite.SqliteBatchStore` (a file, ``batch.database``, or
``batch.db`` next to a SQLite audit store) and
:class:`gateway.batch.store_postgres.PostgresBatchStore` (the PostgreSQL audit store's database,
tables ``sg_batch_*``). Every method is a coroutine; a database that cannot be reached raises
:class:`BatchStoreUnavailable` (503).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import ServiceUnavailable

__all__ = ["FINAL", "UNFINISHED", "BatchStore", "BatchStoreUnavailable", "OwnerLimits",
           "OwnerUsage"]

FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
"""Statuses a batch never leaves."""

UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch a runner still has to run (resumed after a restart)."""

RequestLine = tuple[int, str, str, bytes]
"""One request of a batch: ``(line number, custom_id, url, body)``."""


class BatchStoreUnavailable(ServiceUnavailable):
    """The batch database cannot be reached (503; the runner retries at its next scan)."""

    code = "batch_store_unavailable"


@dataclass(frozen=True, slots=True)
class OwnerLimits:
    """What one owner (key id) may store (``batch.max_stored_bytes_per_owner``,
    ``batch.max_files_per_owner``).

    Attributes:
        max_bytes: Total content of the owner's files, bytes.
        max_files: Number of the owner's files.
    """

    max_bytes: int
    max_files: int


@dataclass(frozen=True, slots=True)
class OwnerUsage:
    """What one owner stores: all its files (uploads and the batches' output files) and the
    request rows its batches hold until they end (each such batch also counts as one file: it
    will write at least one output file).

    Attributes:
        bytes: Content of the files plus the request rows' bodies and stored answers, bytes.
        files: Number of files plus the number of batches holding request rows.
    """

    bytes: int
    files: int


class BatchStore(Protocol):
    """What the endpoints and the runner need from the batch database."""

    async def open(self) -> None:
        """Connect and create the schema if missing (idempotent; several processes may start
        at once). Raises BatchStoreUnavailable."""
        ...

    async def close(self) -> None:
        """Release the connections (idempotent)."""
        ...

    async def add_file(self, row: dict[str, Any], content: bytes,
                       limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """Store a file (``row``: the file object's id, purpose, filename, created_at, owner).

        With ``limits``, the owner's usage is read and the file stored in one transaction
        (serialised per owner, across processes sharing the database): a file that would take
        the owner above either limit is not stored.

        Returns:
            ``None`` when stored, else the owner's usage before this file (nothing stored).
        """
        ...

    async def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        """The file's row (id, purpose, filename, created_at, bytes) if ``owner`` owns it."""
        ...

    async def content(self, file_id: str, owner: str) -> bytes | None:
        """The file's bytes if ``owner`` owns it, else ``None``."""
        ...

    async def delete_file(self, file_id: str, owner: str) -> bool:
        """Remove the file if ``owner`` owns it; ``False`` when there was no such file (a batch
        made from it keeps its own copy of the request lines until it ends, counted in the
        owner's usage)."""
        ...

    async def add_batch(self, obj: dict[str, Any], owner: str, principal: dict[str, Any],
                        lines: list[RequestLine],
                        limits: OwnerLimits | None = None) -> OwnerUsage | None:
        """Store a new batch, its owner's principal fields and its request lines at once.

        With ``limits``, the owner's usage (:class:`OwnerUsage`) is read and the batch stored in
        one transaction, serialised per owner like :meth:`add_file`: a batch whose request
        bodies would take the owner above ``max_bytes``, or whose owner has no file left
        under ``max_files`` (the batch counts as one), is not stored.

        Returns:
            ``None`` when stored, else the owner's usage before this batch (nothing stored).
        """
        ...

    async def remove_batch(self, batch_id: str) -> None:
        """Remove a batch and its request rows (a batch whose creation could not be audited)."""
        ...

    async def forget_requests(self, batch_id: str) -> None:
        """Remove an ended batch's request rows (its answers are in its output files); also
        done by :meth:`open` for every batch in a :data:`FINAL` status."""
        ...

    async def batch(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """The batch object (``owner`` ``None``: whoever owns it)."""
        ...

    async def batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """``owner``'s batches, newest first, after the batch id ``after`` (pagination)."""
        ...

    async def save_batch(self, obj: dict[str, Any]) -> None:
        """Write the batch object back (status and counts changed)."""
        ...

    async def principal(self, batch_id: str) -> dict[str, Any]:
        """The stored principal fields of the batch's owner."""
        ...

    async def unfinished(self) -> list[str]:
        """Ids of batches in an :data:`UNFINISHED` status, oldest first."""
        ...

    async def claim(self, batch_id: str, me: str, now: float, until: float) -> bool:
        """Take (or renew) the lease on running the batch: ``me`` runs it until ``until``
        (Unix seconds) unless another runner holds an unexpired lease. Returns whether it did."""
        ...

    async def release(self, batch_id: str, me: str) -> None:
        """Give up ``me``'s lease (another runner may take the batch at once)."""
        ...

    async def pending(self, batch_id: str) -> list[RequestLine]:
        """The batch's requests without an answer, by line."""
        ...

    async def answer(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> None:
        """Store a request's answer (its output or error line) and mark it done."""
        ...

    async def counts(self, batch_id: str) -> tuple[int, int, int]:
        """``(total, completed, failed)`` requests of the batch."""
        ...

    async def results(self, batch_id: str, ok: bool) -> list[str]:
        """The stored output (``ok``) or error lines of the batch, in input order."""
        ...
