"""The ``batch:`` config section (the OpenAI-compatible Batch API, :mod:`gateway.batch`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from gateway.audit.settings import AuditSettings

__all__ = [
    "NO_DATABASE",
    "BatchSettings",
    "audit_store_url",
    "default_location",
    "store_location",
]


class BatchSettings(BaseModel):
    """``batch:``: files and batches of ``/v1/files`` and ``/v1/batches``.

    Attributes:
        enabled: Serve the Batch API (default true once the section is present).
        database: SQLite file of the job state and the files. Default: the audit store's
            database when it is PostgreSQL (tables ``sg_batch_*``), else ``batch.db`` next to
            the audit store's SQLite file (a relative path is relative to the config file).
        max_file_bytes: Largest accepted upload, in bytes (413 ``file_too_large`` above).
        max_stored_bytes_per_owner: Most bytes one key may store: its files (uploads and its
            batches' output files) and the request rows of its batches until they end,
            checked before an upload or a batch is stored (413 ``storage_quota_exceeded``);
            ``DELETE /v1/files/{id}`` and a batch's end free room.
        max_files_per_owner: Most files one key may store, a batch holding request rows
            counted as one (413 ``file_count_quota_exceeded``).
        max_requests: Most request lines in one input file.
        concurrency: Requests of all batches in flight at once, the slots handed round-robin
            between owners (:class:`gateway.batch.slots.FairSlots`); they then wait in the flow
            control ``batch`` class like any other request of that class.
        priority_class: The flow-control class named in the priority header of batch requests
            (when flow control is on; it must then be one of ``flow_control.classes``, checked
            by :class:`gateway.config.settings.GatewaySettings`).
        retries: How many times a request answered 429 or 503 (a full queue, a rate limit,
            no replica) is sent again before its answer is recorded as its error line; an
            answer that says waiting cannot help is not (:func:`gateway.batch.slots.retriable`).
        retry_max_wait_s: Longest wait before a retry, seconds (the answer's
            ``retry-after-ms``/``Retry-After``, else doubling from 0.5 s); an answer asking
            for a longer wait is its line's error at once.
        lease_s: How long a runner's claim on a batch lasts without renewal, seconds: after a
            crash, another worker or the restarted gateway takes the batch over this late
            (a clean stop gives it up at once).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    database: Path | None = None
    max_file_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    max_stored_bytes_per_owner: int = Field(default=1024 * 1024 * 1024, gt=0)
    max_files_per_owner: int = Field(default=1000, gt=0)
    max_requests: int = Field(default=50_000, gt=0)
    concurrency: int = Field(default=4, gt=0, le=256)
    priority_class: str = "batch"
    retries: int = Field(default=5, ge=0, le=100)
    retry_max_wait_s: float = Field(default=30.0, gt=0)
    lease_s: float = Field(default=30.0, ge=1.0)


def store_location(batch: BatchSettings, audit_store: str | None) -> Path | str:
    """Where the batch state lives: ``batch.database`` (a SQLite file); else the audit store's
    PostgreSQL database (its URL: tables ``sg_batch_*`` beside the audit tables); else
    ``batch.db`` next to the audit store's SQLite file.

    Args:
        batch: The section.
        audit_store: The audit store URL (``None`` without an audit section; the content of
            ``audit.store_file`` once read at start-up).

    Raises:
        ConfigError: None of them is given.
    """
    from gateway.errors import ConfigError

    found = default_location(batch, audit_store)
    if found is None:
        raise ConfigError(NO_DATABASE)
    return found


NO_DATABASE = ("batch.database: not set, and there is no audit store to keep the batches in "
               "(a PostgreSQL database, or a SQLite file to put batch.db next to); set "
               "batch.database")


def default_location(batch: BatchSettings, audit_store: str | None) -> Path | str | None:
    """:func:`store_location`, or ``None`` where it raises (for the settings' cross-check)."""
    from gateway.audit.store import sqlite_file

    if batch.database is not None:
        return batch.database
    if audit_store is None:
        return None
    if audit_store.startswith(("postgresql://", "postgres://")):
        return audit_store
    audit_file = sqlite_file(audit_store)
    return audit_file.parent / "batch.db" if audit_file is not None else None


def audit_store_url(audit: AuditSettings | None) -> str | None:
    """The ``audit.store`` URL as the config names it (``None`` without an audit section or
    when the URL is read from ``audit.store_file`` at start-up: see
    :meth:`AuditSettings.store_url`)."""
    if audit is None or audit.store_file is not None:
        return None
    return audit.store
