"""Per-key and per-team limits and budgets.

Public API::

    QuotaSettings, Limits                 the ``quotas:`` configuration section
    QuotaService                          admit / settle / release for the gateway
    MemoryLimiter, RedisLimiter           the two backends (Limiter protocol)
    TokenEstimator, TokenEstimate         prompt token estimation
    Admission, SubjectLimits, WindowState
    QuotaError, RateLimited, BudgetExhausted, RequestTooLarge, QuotaBackendUnavailable

The ``x-ratelimit-*`` and ``Retry-After`` headers of admissions and refusals are rendered by
the quota seam, :mod:`gateway.quotas.hook` (``admission_headers``, ``refusal_headers``).
"""

from gateway.quotas.errors import (
    BudgetExhausted,
    InvalidGenerationField,
    QuotaBackendUnavailable,
    QuotaConfigError,
    QuotaError,
    RateLimited,
    RequestTooLarge,
)
from gateway.quotas.limiter import (
    Admission,
    Limiter,
    SubjectLimits,
    WindowState,
)
from gateway.quotas.memory import MemoryLimiter
from gateway.quotas.service import QuotaService
from gateway.quotas.settings import Limits, QuotaSettings
from gateway.quotas.tokens import TokenEstimate, TokenEstimator


def __getattr__(name: str) -> object:
    # RedisLimiter is imported on first use: importing redis costs ~0.3 s, which the CLI
    # commands that never touch Redis (check-config, keys) should not pay.
    if name == "RedisLimiter":
        from gateway.quotas.redis_backend import RedisLimiter

        return RedisLimiter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Admission",
    "BudgetExhausted",
    "InvalidGenerationField",
    "Limiter",
    "Limits",
    "MemoryLimiter",
    "QuotaBackendUnavailable",
    "QuotaConfigError",
    "QuotaError",
    "QuotaService",
    "QuotaSettings",
    "RateLimited",
    "RedisLimiter",
    "RequestTooLarge",
    "SubjectLimits",
    "TokenEstimate",
    "TokenEstimator",
    "WindowState",
]
