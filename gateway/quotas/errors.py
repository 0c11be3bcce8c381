"""Errors of the quota subsystem, and which of several refusals to raise (:func:`pick_denial`).

Exception tree (each class has a stable machine ``code`` and an HTTP ``status``)::

    QuotaError                         code "quota_error"
    ├── RateLimited                    429, code "rate_limit_exceeded" (rpm, tpm, concurrency)
    │   ├── BudgetExhausted            429, code "insufficient_quota" (daily / monthly tokens)
    │   └── RequestTooLarge            429, code "request_too_large" (can never fit the limit)
    ├── QuotaBackendUnavailable        503, code "quota_backend_unavailable" (fail closed)
    ├── InvalidGenerationField         400, code "invalid_request" (``n``, ``max_tokens``...
    │                                  that the backend would not read as a count)
    └── QuotaConfigError               code "quota_config_invalid"

The OpenAI error body shape is ``{"error": {"message", "type", "param", "code"}}``; the ``type``
of a rate-limit error names the limit that was hit (``requests``, ``tokens``, ``concurrency``,
``tokens_per_day``, ``tokens_per_month``) so clients can tell a key's limit from a saturated
backend (the gateway core answers the latter with code ``backend_saturated``). A refusal's
HTTP headers (``Retry-After``, ``x-ratelimit-*``) are rendered from its numbers by the quota
seam, :func:`gateway.quotas.hook.refusal_headers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.quotas.limiter import LimitKind


class QuotaError(Exception):
    """Base of every quota error.

    Attributes:
        code: stable machine-readable code.
        status: HTTP status the gateway answers with.
        error_type: the OpenAI error ``type`` field.
    """

    code = "quota_error"
    status = 500
    error_type = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def openai_error(self) -> dict[str, Any]:
        """Return the OpenAI-shaped error body ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": None,
                "code": self.code,
            }
        }


class RateLimited(QuotaError):
    """A limit of a key or team was reached; the request was not admitted.

    Args:
        kind: which limit was hit (``requests``, ``tokens``, ``concurrency``, ...).
        subject: the subject that hit it, e.g. ``key:team-a`` or ``team:search``.
        limit: the configured limit (requests, tokens or concurrent requests).
        remaining: what is left of that limit now (never negative).
        reset_s: seconds until the limit is back to its full initial state.
        retry_after_s: seconds after which this same request would be admitted (best estimate);
            ``None`` when retrying cannot help.
        requested: what this request asked for (1 request, N estimated tokens).
    """

    code = "rate_limit_exceeded"
    status = 429

    def __init__(
        self,
        *,
        kind: LimitKind,
        subject: str,
        limit: int,
        remaining: int,
        reset_s: float,
        retry_after_s: float | None,
        requested: int = 1,
        message: str | None = None,
    ) -> None:
        self.kind: LimitKind = kind
        self.subject = subject
        self.limit = limit
        self.remaining = max(0, remaining)
        self.reset_s = max(0.0, reset_s)
        self.retry_after_s = None if retry_after_s is None else max(0.0, retry_after_s)
        self.requested = requested
        self.error_type = kind
        super().__init__(message or self._default_message())

    def _default_message(self) -> str:
        unit = {
            "requests": "requests per minute",
            "tokens": "tokens per minute",
            "concurrency": "concurrent requests",
            "tokens_per_day": "tokens per day",
            "tokens_per_month": "tokens per month",
        }[self.kind]
        owner = self.subject.split(":", 1)
        who = f"{owner[0]} {owner[1]!r}" if len(owner) == 2 else self.subject
        text = f"Rate limit reached for {who} on {unit}: limit {self.limit}, "
        text += f"remaining {self.remaining}, requested {self.requested}."
        if self.retry_after_s is not None:
            text += f" Please try again in {self.retry_after_s:.3g}s."
        return text


class BudgetExhausted(RateLimited):
    """The daily or monthly token budget of a key or team is used up."""

    code = "insufficient_quota"

    def _default_message(self) -> str:
        period = "daily" if self.kind == "tokens_per_day" else "monthly"
        return (
            f"{self.subject} exceeded its {period} token budget of {self.limit} tokens "
            f"(remaining {self.remaining}, requested {self.requested}); "
            f"it resets in {self.reset_s:.0f}s."
        )


class RequestTooLarge(RateLimited):
    """The request alone needs more than the whole limit: retrying can never succeed."""

    code = "request_too_large"

    def _default_message(self) -> str:
        return (
            f"Request too large for {self.subject}: it needs an estimated {self.requested} "
            f"tokens but the {self.kind} limit is {self.limit}. Reduce the prompt or max_tokens."
        )


class QuotaBackendUnavailable(QuotaError):
    """The shared quota state (Redis) could not be reached and the policy is fail closed.

    Its message goes to the client: :data:`UNREACHABLE`, never the store's address or the
    redis client's exception text (log those).
    """

    code = "quota_backend_unavailable"
    status = 503
    error_type = "server_error"


class InvalidGenerationField(QuotaError):
    """A field that sizes the generation (``n``, ``best_of``, ``max_tokens``,
    ``max_completion_tokens``, ``max_output_tokens``) is not a count the backend accepts, so
    the request's tokens cannot be bounded before forwarding (vLLM would refuse it too).

    Args:
        param: the field at fault (the OpenAI error's ``param``).
        message: what is wrong, for the client.
    """

    code = "invalid_request"
    status = 400
    error_type = "invalid_request_error"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


UNREACHABLE = "The quota store is unreachable and the gateway fails closed; retry shortly."
"""The one client-facing message of :class:`QuotaBackendUnavailable`."""


class QuotaConfigError(QuotaError):
    """The quota configuration is invalid (raised when it is loaded)."""

    code = "quota_config_invalid"


def pick_denial(denials: Sequence[RateLimited]) -> RateLimited:
    """Choose which of several refusals to report.

    A request that can never fit (``RequestTooLarge``) wins; otherwise the refusal with the
    longest ``retry_after_s``, so that one retry after it has a chance with every limit.

    Args:
        denials: at least one ``RateLimited``.

    Returns:
        The ``RateLimited`` to raise.
    """
    for denial in denials:
        if isinstance(denial, RequestTooLarge):
            return denial
    return max(denials, key=lambda d: d.retry_after_s if d.retry_after_s is not None else 1e18)
