"""The Batch API's audit records and the trace id that links a batch's requests.

Every change a caller makes through the Batch API is one record in the audit chain, written
and durable before the answer (a store that cannot record answers 503 ``audit_unavailable``
and nothing is changed... see :meth:`gateway.batch.runner.BatchRunner.record`):

=============================  ===============================================================
``batch.file_created``         ``file_id``, ``key_id``, ``purpose``, ``bytes``, ``sha256``
                               (an upload; or ``batch_output`` with ``batch_id``: the output
                               or error file a finished batch stored)
``batch.file_deleted``         ``file_id``, ``key_id``
``batch.created``              ``batch_id``, ``key_id``, ``input_file_id``, ``endpoint``,
                               ``requests``, ``trace_id``
``batch.cancel_requested``     ``batch_id``, ``key_id``, ``status`` (before)
``batch.finished``             ``batch_id``, ``key_id``, ``status``, ``completed``, ``failed``,
                               ``output_file_id``, ``error_file_id``, ``trace_id``
``batch.request_refused``      a line refused before the relay (its owner no longer allowed):
                               ``request_id``, ``batch_id``, ``line``, ``custom_id``,
                               ``key_id``, ``path``, ``status``, ``code``, ``reason``,
                               ``trace_id``
=============================  ===============================================================

Every record written for a token or client-certificate owner also carries its ``identity``
(:func:`gateway.batch.owner.record_identity`: issuer, subject pseudonym, rule, ``kid``...), so
a data-subject export (``gateway audit export --subject``) finds it.

Each request of a batch that reaches the relay is audited as an interactive one
(``request.started`` / ``request.completed``) and carries the batch's trace id
(:func:`batch_trace_id`), so ``gateway audit timeline --trace-id`` lists a batch's requests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

__all__ = [
    "BATCH_CANCEL_REQUESTED", "BATCH_CREATED", "BATCH_FILE_CREATED", "BATCH_FILE_DELETED",
    "BATCH_FINISHED", "BATCH_REQUEST_REFUSED", "AuditSink", "batch_trace_id",
]

BATCH_FILE_CREATED: Final = "batch.file_created"
BATCH_FILE_DELETED: Final = "batch.file_deleted"
BATCH_CREATED: Final = "batch.created"
BATCH_CANCEL_REQUESTED: Final = "batch.cancel_requested"
BATCH_FINISHED: Final = "batch.finished"
BATCH_REQUEST_REFUSED: Final = "batch.request_refused"

AuditSink = Callable[[Mapping[str, Any]], Awaitable[Any]]
"""Appends one event and returns once it is durable (``AuditObserver.record_event``); raises
:class:`gateway.audit.errors.AuditUnavailable` when it cannot."""


def batch_trace_id(batch_id: str) -> str:
    """The W3C trace id of a batch's requests: the first 32 hex digits of SHA-256 of its id
    (derived, so a batch resumed by another pod or after a restart keeps it).

    Args:
        batch_id: ``batch_...``.

    Returns:
        32 lowercase hex digits (W3C Trace Context §3.2.2.3; all zero only with probability
        2**-128).
    """
    return hashlib.sha256(batch_id.encode()).hexdigest()[:32]
