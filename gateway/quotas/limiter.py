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
The response headers of an admission and of a refusal are built in
:mod:`gateway.quotas.headers`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.quotas.errors import RateLimited, RequestTooLarge
from gateway.quotas.headers import WindowState, window_headers
from gateway.quotas.settings import Limits

#: Callback receiving admin/security events (e.g. the audit log's ``AuditLog.append``).
EventSink = Callable[[Mapping[str, Any]], Awaitable[Any]]

WINDOW_S = 60.0


@dataclass(frozen=True)
class SubjectLimits:
    """One subject to charge: ``name`` like ``key:team-a`` or ``team:search``, and its limits."""

    name: str
    limits: Limits


@dataclass
class Admission:
    """A request admitted by a limiter (the handle for ``settle`` and ``release``).

    Attributes:
        lease_id: unique id of this admission (also the concurrency lease member).
        subjects: the subjects that were charged.
        estimated_tokens: tokens charged at admission (prompt estimate + completion reserve).
        prompt_tokens: the prompt part of ``estimated_tokens`` (charged with an estimated
            completion when the backend reported no usage).
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


@dataclass(frozen=True)
class Periods:
    """The UTC calendar periods of the budgets at one instant.

    Attributes:
        day: ``YYYYMMDD`` of the current UTC day.
        month: ``YYYYMM`` of the current UTC month.
        day_reset_s: seconds until the next UTC midnight.
        month_reset_s: seconds until the first instant of the next UTC month.
    """

    day: str
    month: str
    day_reset_s: float
    month_reset_s: float

    @classmethod
    def at(cls, unix_s: float) -> Periods:
        """Compute the periods at the given Unix time (seconds)."""
        now = dt.datetime.fromtimestamp(unix_s, tz=dt.UTC)
        next_day = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        if now.month == 12:
            next_month = now.replace(year=now.year + 1, month=1, day=1)
        else:
            next_month = now.replace(month=now.month + 1, day=1)
        next_month = next_month.replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(
            day=now.strftime("%Y%m%d"),
            month=now.strftime("%Y%m"),
            day_reset_s=(next_day - now).total_seconds(),
            month_reset_s=(next_month - now).total_seconds(),
        )


def tightest(states: Sequence[WindowState]) -> WindowState | None:
    """Return the snapshot with the fewest remaining units (ties: the later reset)."""
    if not states:
        return None
    return min(states, key=lambda s: (s.remaining, -s.reset_s))


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


class PeriodCache:
    """:meth:`Periods.at` computed once per UTC day (the calendar math costs ~10 us a call)."""

    def __init__(self) -> None:
        self._day = ""
        self._month = ""
        self._day_start = 0.0
        self._day_end = 0.0
        self._month_end = 0.0

    def at(self, unix_s: float) -> Periods:
        """Return the periods at ``unix_s`` (same result as ``Periods.at``)."""
        if not self._day_start <= unix_s < self._day_end:
            fresh = Periods.at(unix_s)
            self._day, self._month = fresh.day, fresh.month
            self._day_end = unix_s + fresh.day_reset_s
            self._month_end = unix_s + fresh.month_reset_s
            self._day_start = self._day_end - 86400.0
        return Periods(self._day, self._month, self._day_end - unix_s, self._month_end - unix_s)


def admission_headers(admission: Admission) -> dict[str, str]:
    """Return the ``x-ratelimit-*`` headers to add to a successful response."""
    return window_headers(admission.requests, admission.tokens)
