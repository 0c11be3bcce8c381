"""Errors of the Batch API (OpenAI-style JSON through :class:`gateway.errors.GatewayError`).

``BatchError`` (400 ``invalid_request_error``) with ``BadInputFile`` (400, ``invalid_jsonl``:
the message names the line), ``FileTooLarge`` (413), ``StorageQuotaExceeded`` (413, the
owner's stored bytes or file count would pass its limit), ``RequestTooLarge`` (413, a
``POST /v1/batches`` body above its bound), ``NotFound`` (404, also for another key's
file or batch: its existence is not revealed) and ``NotCancellable`` (409).
"""

from __future__ import annotations

from gateway.errors import GatewayError

__all__ = ["BadInputFile", "BatchError", "FileTooLarge", "NotCancellable", "NotFound",
           "RequestTooLarge", "StorageQuotaExceeded"]


class BatchError(GatewayError):
    """A Batch API request that cannot be served as asked."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class BadInputFile(BatchError):
    """An input file that is not valid batch JSONL (the message names the line)."""

    code = "invalid_jsonl"


class FileTooLarge(BatchError):
    """An upload above ``batch.max_file_bytes``."""

    status = 413
    code = "file_too_large"


class StorageQuotaExceeded(BatchError):
    """An upload that would take its owner above ``batch.max_stored_bytes_per_owner`` (code
    ``storage_quota_exceeded``) or ``batch.max_files_per_owner`` (``file_count_quota_exceeded``,
    given as ``code=``). 413 rather than 429 for both: the OpenAI SDKs retry a 429 on their
    own, and a retry cannot succeed until the owner deletes a file."""

    status = 413
    code = "storage_quota_exceeded"


class RequestTooLarge(BatchError):
    """A ``POST /v1/batches`` body above its bound."""

    status = 413
    code = "request_too_large"


class NotFound(BatchError):
    """No such file or batch for this key."""

    status = 404
    code = "not_found"


class NotCancellable(BatchError):
    """The batch already ended."""

    status = 409
    code = "batch_not_cancellable"
