"""The limiter contract shared by the in-memory and the Redis backends.

A request is admitted against every *subject* it belongs to (its key and its team) in one
atomic step: either every limit of every subject has room and all of them are charged, or
nothing is charged and :class:`~gateway.quotas.errors.RateLimited` names the limit that
refused (the one whose ``retry_after_s`` is longest, so one retry after it has a chance).

Lifecycle of one request::

    adm = await limiter.admit(subjects, estimated_tokens)   # may raise RateLimited / 503
    try:
        ... forward ...
        await limiter.settle(adm, actual_tokens)            # correct the token estimate
    finally:
        await limiter.release(adm)                          # free the concurrency slot

Algorithms (both backends, same arithmetic): requests and tokens per minute use GCRA
(the generic cell rate algorithm, a token bucket with burst = the per-minute limit, so over
any interval of ``t`` seconds at most ``limit + limit * t / 60`` units are admitted); daily
and monthly budgets are counters per UTC calendar period; concurrency is a set of leases.

What a backend reports (:class:`WindowState` snapshots in the :class:`Admission`, the
numbers of a :class:`~gateway.quotas.errors.RateLimited`) is rendered as HTTP headers by the
quota seam, :mod:`gateway.quotas.hook`; the UTC budget periods and the tightest-window pick
that both backends use live with the in-memory backend (:mod:`gateway.quotas.memory`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.quotas.settings import Limits

#: Callback receiving admin/security events (e.g. the audit log's ``AuditLog.append``).
EventSink = Callable[[Mapping[str, Any]], Awaitable[Any]]

WINDOW_S = 60.0

#: Which limit refused a request (the OpenAI error ``type`` of the 429).
LimitKind = Literal["requests", "tokens", "concurrency", "tokens_per_day", "tokens_per_month"]


@dataclass(frozen=True)
class SubjectLimits:
    """One subject to charge: ``name`` like ``key:team-a`` or ``team:search``, and its limits."""

    name: str
    limits: Limits


@dataclass(frozen=True)
class WindowState:
    """A snapshot of one per-minute limit, as reported in ``x-ratelimit-*`` headers.

    Attributes:
        limit: the configured per-minute limit.
        remaining: units left right now (never negative).
        reset_s: seconds until the bucket is full again.
    """

    limit: int
    remaining: int
    reset_s: float


@dataclass
class Admission:
    """A request admitted by a limiter (the handle for ``settle`` and ``release``).

    Attributes:
        lease_id: unique id of this admission (also the concurrency lease member).
        subjects: the subjects that were charged.
        estimated_tokens: tokens charged at admission (prompt estimate + completion reserve).
        prompt_tokens: the prompt part of ``estimated_tokens`` (charged with an estimated
            completion when the backend reported no usage).
        completions: completions the backend may generate (``max(n, best_of) * prompts``).
        completion_bound: tokens one completion may be charged without usage (its
            ``max_tokens`` within ``completion_reserve_cap``, else the cap).
        admitted_at: ``time.monotonic()`` of the admission, seconds (0: tokens not estimated).
        requests: tightest requests-per-minute snapshot after admission (for headers).
        tokens: tightest tokens-per-minute snapshot after admission (for headers).
        fail_open: True when admitted without accounting because the backend was down.
        settled: set once ``settle`` has run (a second settle is ignored).
        released: set once ``release`` has run (a second release is ignored).
    """

    lease_id: str
    subjects: tuple[SubjectLimits, ...]
    estimated_tokens: int
    requests: WindowState | None = None
    tokens: WindowState | None = None
    fail_open: bool = False
    settled: bool = False
    released: bool = False
    period_keys: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    completions: int = 1
    completion_bound: int = 0
    admitted_at: float = 0.0


class Limiter(Protocol):
    """What the gateway needs from a quota backend."""

    async def start(self) -> None:
        """Start background work (lease renewal); idempotent."""

    async def aclose(self) -> None:
        """Stop background work and close connections."""

    async def admit(self, subjects: Sequence[SubjectLimits], estimated_tokens: int) -> Admission:
        """Admit one request or raise.

        Args:
            subjects: every subject the request is charged to (usually key and team).
            estimated_tokens: prompt estimate plus completion reserve, >= 0.

        Returns:
            The admission handle.

        Raises:
            RateLimited: a limit has no room (BudgetExhausted / RequestTooLarge subclasses).
            QuotaBackendUnavailable: the shared state is unreachable and the policy fails closed.
        """
        ...

    async def settle(self, admission: Admission, actual_tokens: int) -> None:
        """Replace the token estimate by the real usage (idempotent, never raises)."""
        ...

    async def used_tokens(self, subject: str) -> dict[str, int]:
        """Tokens charged to ``subject`` (``key:...``) in the current UTC ``day`` and ``month``.

        Raises:
            QuotaBackendUnavailable: the shared state is unreachable.
        """
        ...

    async def release(self, admission: Admission) -> None:
        """Free the concurrency slot of an admission (idempotent, never raises)."""
        ...

    async def finish(self, admission: Admission, actual_tokens: int) -> None:
        """``settle`` and ``release`` together (one round trip with Redis)."""
        ...
