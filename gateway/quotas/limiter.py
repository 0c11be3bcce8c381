"""The limiter contract shared by the in-memory and the Redis backends, and its headers.

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

The windows of an admission and of a refusal are reported in the rate-limit response headers
that OpenAI clients read. Header names and value formats follow OpenAI's documented rate-limit
headers (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and the same with ``-tokens``; reset values are durations in
the Go ``time.Duration`` style that OpenAI sends (``"1s"``, ``"6m0s"``, ``"120ms"``,
``"8.64s"``, ``"1h2m3s"``). ``Retry-After`` is delay-seconds (RFC 9110 section 10.2.3, an
integer, rounded up); ``retry-after-ms`` (read first by the ``openai`` SDK) is milliseconds.
"""

from __future__ import annotations

import datetime as dt
import math
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


def format_duration(seconds: float) -> str:
    """Format a duration like Go's ``time.Duration.String`` at millisecond precision.

    Args:
        seconds: a duration in seconds (negative values count as 0).

    Returns:
        ``"0s"``, ``"120ms"``, ``"8.64s"``, ``"6m0s"``, ``"1h2m3s"`` ...
    """
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, frac = divmod(rest, 1000)
    sec_text = str(secs) if frac == 0 else f"{secs}.{frac:03d}".rstrip("0")
    if hours:
        return f"{hours}h{minutes}m{sec_text}s"
    if minutes:
        return f"{minutes}m{sec_text}s"
    return f"{sec_text}s"


def window_headers(requests: WindowState | None, tokens: WindowState | None) -> dict[str, str]:
    """Return the ``x-ratelimit-*`` headers for the given per-minute snapshots.

    Args:
        requests: tightest requests-per-minute snapshot, or None when no such limit applies.
        tokens: tightest tokens-per-minute snapshot, or None.

    Returns:
        Header name (lower case) -> value; empty when neither limit applies.
    """
    out: dict[str, str] = {}
    for suffix, state in (("requests", requests), ("tokens", tokens)):
        if state is None:
            continue
        out[f"x-ratelimit-limit-{suffix}"] = str(state.limit)
        out[f"x-ratelimit-remaining-{suffix}"] = str(state.remaining)
        out[f"x-ratelimit-reset-{suffix}"] = format_duration(state.reset_s)
    return out


def admission_headers(admission: Admission) -> dict[str, str]:
    """Return the ``x-ratelimit-*`` headers to add to a successful response."""
    return window_headers(admission.requests, admission.tokens)


def rate_limited_headers(
    kind: LimitKind, state: WindowState, retry_after_s: float | None
) -> dict[str, str]:
    """Return the headers of a 429 answer for ``exc``.

    ``Retry-After`` and ``retry-after-ms`` are present when waiting helps; otherwise
    ``x-should-retry: false`` tells the ``openai`` SDK not to retry (a request larger than the
    limit, or a budget that only resets in hours). The limit that refused is reported in the
    ``x-ratelimit-*`` headers of its kind (requests or tokens); concurrency and budget refusals
    use ``x-ratelimit-*-concurrency`` / ``-tokens-day`` / ``-tokens-month`` names.

    Args:
        kind: The limit that refused.
        state: That limit's configured value, what is left of it, and seconds until it resets.
        retry_after_s: Seconds after which the same request would be admitted; ``None`` when
            retrying cannot help.

    Returns:
        Header name (lower case) -> value.
    """
    suffix = {
        "requests": "requests",
        "tokens": "tokens",
        "concurrency": "concurrency",
        "tokens_per_day": "tokens-day",
        "tokens_per_month": "tokens-month",
    }[kind]
    headers = {
        f"x-ratelimit-limit-{suffix}": str(state.limit),
        f"x-ratelimit-remaining-{suffix}": str(state.remaining),
        f"x-ratelimit-reset-{suffix}": format_duration(state.reset_s),
    }
    retry = retry_after_s
    # openai SDKs honour server delays only up to 60 s (1.x) or 120 s (3.x) and fall back to
    # short backoff retries past that: say "do not retry" instead.
    if retry is None or retry > 60:
        headers["x-should-retry"] = "false"
        if retry is not None:
            headers["retry-after"] = str(math.ceil(retry))
        return headers
    headers["retry-after"] = str(max(1, math.ceil(retry)))
    headers["retry-after-ms"] = str(max(1, math.ceil(retry * 1000)))
    return headers
