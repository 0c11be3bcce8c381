"""Errors of flow control.

Exception tree (each class has a stable machine ``code`` and an HTTP ``status``)::

    FlowError                          code "flow_error"
    ├── Shed                           429, type "rate_limit_error", with Retry-After
    │   ├── QueueFull                  code "queue_full": the class's queue is full
    │   ├── FlowShareFull              code "flow_queue_full": this key's (team's) share of
    │   │                              the class's queue is full, the queue is not
    │   ├── QueueBytesFull             code "queue_bytes_full": the queued bodies' byte
    │   │                              budget (max_queued_body_bytes) is spent
    │   └── QueueTimeout               code "queue_timeout": waited the class's max_wait_s
    ├── BodyOverQueueBudget            413, code "body_exceeds_queue_budget"
    ├── PriorityRaiseRefused           403, code "priority_raise_forbidden"
    └── UnknownPriorityClass           400, code "unknown_priority_class"

The codes differ from the quota 429s (``rate_limit_exceeded``, ``insufficient_quota``) and from a
backend's 429 relayed by the gateway (``upstream_429``), so a client can tell "the fleet is busy,
retry later" from "your key is over its limit". The thin adapter (:mod:`gateway.flow.gate`) turns
them into the gateway's OpenAI-shaped errors.
"""

from __future__ import annotations

import math

__all__ = [
    "BodyOverQueueBudget",
    "FlowError",
    "FlowShareFull",
    "PriorityRaiseRefused",
    "QueueBytesFull",
    "QueueFull",
    "QueueTimeout",
    "Shed",
    "UnknownPriorityClass",
]


class FlowError(Exception):
    """Base of every flow-control error.

    Attributes:
        code: Stable machine code (``error.code``).
        status: HTTP status.
        error_type: OpenAI error ``type``.
        param: The request field (or header) at fault, if any.
    """

    code = "flow_error"
    status = 500
    error_type = "server_error"
    param: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        """Extra response headers (none by default)."""
        return {}


class Shed(FlowError):
    """The request was not dispatched (429); ``retry_after_s`` says when to try again.

    Args:
        message: Human-readable message.
        retry_after_s: Suggested wait before retrying, seconds (sent rounded up, at least 1).
    """

    status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds (RFC 9110 section 10.2.3), at least 1."""
        return {"retry-after": str(max(1, math.ceil(self.retry_after_s)))}


class QueueFull(Shed):
    """The request's class queue was full when it arrived."""

    code = "queue_full"


class FlowShareFull(Shed):
    """The request's key (or team) already holds its share of the class's queue."""

    code = "flow_queue_full"


class QueueBytesFull(Shed):
    """Queuing the request would pass the byte budget of queued bodies."""

    code = "queue_bytes_full"


class BodyOverQueueBudget(FlowError):
    """The request's body alone is larger than the byte budget of queued bodies."""

    code = "body_exceeds_queue_budget"
    status = 413
    error_type = "invalid_request_error"


class QueueTimeout(Shed):
    """The request waited its class's ``max_wait_s`` without a replica having room."""

    code = "queue_timeout"


class PriorityRaiseRefused(FlowError):
    """The priority header named a class above the key's own."""

    code = "priority_raise_forbidden"
    status = 403
    error_type = "permission_error"


class UnknownPriorityClass(FlowError):
    """The priority header named no configured class."""

    code = "unknown_priority_class"
    status = 400
    error_type = "invalid_request_error"
