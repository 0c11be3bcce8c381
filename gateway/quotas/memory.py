"""In-memory limiter: exact limits for a single gateway replica (the default), and the quota
arithmetic it does in Python: GCRA, the UTC budget periods and the tightest window.

All state lives in this object (no module globals). ``admit`` never awaits between checking
and charging, so on one event loop it is atomic without locks.

GCRA (generic cell rate algorithm, ITU-T I.371) keeps one number per bucket: the theoretical
arrival time ``tat``. With a limit of ``L`` units per ``W`` seconds each unit advances ``tat`` by
``T = W / L``; a request of cost ``c`` is admitted when ``max(tat, now) + c*T - W <= now``. The
bucket is full again at ``tat`` (the ``reset``); the burst is the whole limit. The Redis
backend's Lua scripts (:mod:`gateway.quotas.redis_lua`) do the same arithmetic.

The rest of the arithmetic the limits are made of is here too, in one implementation that the
Redis backend imports: the budgets' UTC calendar periods (:class:`Periods`, computed once per
day by :class:`PeriodCache`) and :func:`tightest` (which per-minute window an admission
reports). The limiter contract (:mod:`gateway.quotas.limiter`) holds only types.
"""

from __future__ import annotations

import datetime as dt
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.quotas.errors import BudgetExhausted, RateLimited, RequestTooLarge, pick_denial
from gateway.quotas.limiter import WINDOW_S, Admission, SubjectLimits, WindowState

_SWEEP_EVERY = 4096
_EPS = 1e-9


@dataclass(frozen=True)
class GcraResult:
    """Outcome of one GCRA check.

    Attributes:
        allowed: whether the cost fits now.
        new_tat: the tat to store when allowed (unchanged tat when refused).
        remaining: whole units left after the charge (or now, when refused).
        reset_s: seconds until the bucket is full again.
        retry_after_s: seconds until the cost would fit (0 when allowed, None if never).
    """

    allowed: bool
    new_tat: float
    remaining: int
    reset_s: float
    retry_after_s: float | None


def gcra_check(tat: float | None, now: float, limit: int, cost: int, window_s: float) -> GcraResult:
    """Check (without storing) whether ``cost`` units fit a GCRA bucket.

    Args:
        tat: stored theoretical arrival time in seconds, or None for an empty bucket.
        now: current time in seconds (same clock as ``tat``).
        limit: units per window (>= 1).
        cost: units this request needs (>= 0).
        window_s: window length in seconds.

    Returns:
        The result; ``retry_after_s`` is None when ``cost > limit`` (it can never fit).
    """
    interval = window_s / limit
    base = now if tat is None or tat < now else tat
    new_tat = base + cost * interval
    allow_at = new_tat - window_s
    if cost > limit:
        return GcraResult(False, base, _remaining(base, now, interval, window_s), base - now, None)
    if allow_at > now + _EPS:
        return GcraResult(
            False, base, _remaining(base, now, interval, window_s), base - now, allow_at - now
        )
    return GcraResult(
        True, new_tat, _remaining(new_tat, now, interval, window_s), new_tat - now, 0.0
    )


def gcra_adjust(
    tat: float | None, now: float, limit: int, delta: int, window_s: float
) -> float | None:
    """Apply a correction of ``delta`` units (positive: more used than estimated).

    A positive delta may push ``tat`` past the burst (debt that later requests wait for); a
    negative one gives units back but never below an empty bucket.

    Returns:
        The new tat, or None when the bucket is empty (nothing to store).
    """
    interval = window_s / limit
    if delta >= 0:
        base = now if tat is None or tat < now else tat
        return base + delta * interval
    if tat is None:
        return None
    new_tat = tat + delta * interval
    return None if new_tat <= now else new_tat


def _remaining(tat: float, now: float, interval: float, window_s: float) -> int:
    return max(0, math.floor((window_s - (tat - now)) / interval + _EPS))


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


class MemoryLimiter:
    """Limits kept in this process.

    Args:
        clock: wall clock in Unix seconds (injectable for tests).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._periods = PeriodCache()
        self._tat_requests: dict[str, float] = {}
        self._tat_tokens: dict[str, float] = {}
        self._in_flight: dict[str, int] = {}
        self._used_day: dict[str, int] = {}
        self._used_month: dict[str, int] = {}
        self._day = ""
        self._month = ""
        self._since_sweep = 0

    async def start(self) -> None:
        """Nothing to start (present for the Limiter protocol)."""

    async def aclose(self) -> None:
        """Nothing to close (present for the Limiter protocol)."""

    def in_flight(self, subject: str) -> int:
        """Return the number of admitted, unreleased requests of a subject."""
        return self._in_flight.get(subject, 0)

    def used(self, subject: str, period: str) -> int:
        """Return tokens charged to a subject in the current ``day`` or ``month``."""
        table = self._used_day if period == "day" else self._used_month
        return table.get(subject, 0)

    async def used_tokens(self, subject: str) -> dict[str, int]:
        """Tokens charged to ``subject`` in the current UTC day and month."""
        self._roll_periods(self._periods.at(self._clock()))
        return {"day": self.used(subject, "day"), "month": self.used(subject, "month")}

    async def admit(self, subjects: Sequence[SubjectLimits], estimated_tokens: int) -> Admission:
        """Admit one request against every subject or raise (see ``Limiter.admit``)."""
        now = self._clock()
        periods = self._periods.at(now)
        self._roll_periods(periods)
        cost = max(0, int(estimated_tokens))
        denials: list[RateLimited] = []
        req_results: list[tuple[str, int, GcraResult]] = []
        tok_results: list[tuple[str, int, GcraResult]] = []
        for subject in subjects:
            lim = subject.limits
            if lim.requests_per_minute is not None:
                res = gcra_check(
                    self._tat_requests.get(subject.name), now, lim.requests_per_minute, 1, WINDOW_S
                )
                req_results.append((subject.name, lim.requests_per_minute, res))
                if not res.allowed:
                    denials.append(
                        _window_denial("requests", subject.name, lim.requests_per_minute, res, 1)
                    )
            if lim.tokens_per_minute is not None:
                res = gcra_check(
                    self._tat_tokens.get(subject.name), now, lim.tokens_per_minute, cost, WINDOW_S
                )
                tok_results.append((subject.name, lim.tokens_per_minute, res))
                if not res.allowed:
                    denials.append(
                        _window_denial("tokens", subject.name, lim.tokens_per_minute, res, cost)
                    )
            if lim.max_concurrent is not None:
                held = self._in_flight.get(subject.name, 0)
                if held >= lim.max_concurrent:
                    denials.append(
                        RateLimited(
                            kind="concurrency",
                            subject=subject.name,
                            limit=lim.max_concurrent,
                            remaining=0,
                            reset_s=1.0,
                            retry_after_s=1.0,
                        )
                    )
            for kind, budget, table, reset_s in (
                ("tokens_per_day", lim.tokens_per_day, self._used_day, periods.day_reset_s),
                ("tokens_per_month", lim.tokens_per_month, self._used_month, periods.month_reset_s),
            ):
                if budget is None:
                    continue
                used = table.get(subject.name, 0)
                if used + cost > budget:
                    cls = RequestTooLarge if cost > budget else BudgetExhausted
                    denials.append(
                        cls(
                            kind=kind,  # type: ignore[arg-type]
                            subject=subject.name,
                            limit=budget,
                            remaining=budget - used,
                            reset_s=reset_s,
                            retry_after_s=None if cost > budget else reset_s,
                            requested=cost,
                        )
                    )
        if denials:
            raise pick_denial(denials)
        # Every limit has room: charge all of them (no await in between: atomic on the loop).
        for name, _limit, res in req_results:
            self._tat_requests[name] = res.new_tat
        for name, _limit, res in tok_results:
            self._tat_tokens[name] = res.new_tat
        for subject in subjects:
            lim = subject.limits
            if lim.max_concurrent is not None:
                self._in_flight[subject.name] = self._in_flight.get(subject.name, 0) + 1
            if lim.tokens_per_day is not None:
                self._used_day[subject.name] = self._used_day.get(subject.name, 0) + cost
            if lim.tokens_per_month is not None:
                self._used_month[subject.name] = self._used_month.get(subject.name, 0) + cost
        self._maybe_sweep(now)
        return Admission(
            lease_id=uuid.uuid4().hex,
            subjects=tuple(subjects),
            estimated_tokens=cost,
            requests=tightest(
                [WindowState(lim, r.remaining, r.reset_s) for _, lim, r in req_results]
            ),
            tokens=tightest(
                [WindowState(lim, r.remaining, r.reset_s) for _, lim, r in tok_results]
            ),
            period_keys={"day": periods.day, "month": periods.month},
        )

    async def settle(self, admission: Admission, actual_tokens: int) -> None:
        """Correct the token charge of an admission with the real usage (idempotent)."""
        if admission.settled or admission.fail_open:
            admission.settled = True
            return
        admission.settled = True
        delta = max(0, int(actual_tokens)) - admission.estimated_tokens
        if delta == 0:
            return
        now = self._clock()
        self._roll_periods(self._periods.at(now))
        for subject in admission.subjects:
            lim = subject.limits
            if lim.tokens_per_minute is not None:
                tat = gcra_adjust(
                    self._tat_tokens.get(subject.name), now, lim.tokens_per_minute, delta, WINDOW_S
                )
                if tat is None:
                    self._tat_tokens.pop(subject.name, None)
                else:
                    self._tat_tokens[subject.name] = tat
            if lim.tokens_per_day is not None and admission.period_keys.get("day") == self._day:
                self._used_day[subject.name] = max(0, self._used_day.get(subject.name, 0) + delta)
            if (
                lim.tokens_per_month is not None
                and admission.period_keys.get("month") == self._month
            ):
                self._used_month[subject.name] = max(
                    0, self._used_month.get(subject.name, 0) + delta
                )

    async def release(self, admission: Admission) -> None:
        """Free the concurrency slots of an admission (idempotent)."""
        if admission.released:
            return
        admission.released = True
        if admission.fail_open:
            return
        for subject in admission.subjects:
            if subject.limits.max_concurrent is None:
                continue
            held = self._in_flight.get(subject.name, 0) - 1
            if held > 0:
                self._in_flight[subject.name] = held
            else:
                self._in_flight.pop(subject.name, None)

    async def finish(self, admission: Admission, actual_tokens: int) -> None:
        """``settle`` then ``release`` (one call, as in the Redis backend)."""
        await self.settle(admission, actual_tokens)
        await self.release(admission)

    def _roll_periods(self, periods: Periods) -> None:
        if periods.day != self._day:
            self._used_day.clear()
            self._day = periods.day
        if periods.month != self._month:
            self._used_month.clear()
            self._month = periods.month

    def _maybe_sweep(self, now: float) -> None:
        # Full buckets carry no information: drop them so memory stays bounded by the number
        # of subjects active in the last minute.
        self._since_sweep += 1
        if self._since_sweep < _SWEEP_EVERY:
            return
        self._since_sweep = 0
        for table in (self._tat_requests, self._tat_tokens):
            for name in [n for n, tat in table.items() if tat <= now]:
                del table[name]


def _window_denial(
    kind: str, subject: str, limit: int, res: GcraResult, requested: int
) -> RateLimited:
    cls = RequestTooLarge if res.retry_after_s is None else RateLimited
    return cls(
        kind=kind,  # type: ignore[arg-type]
        subject=subject,
        limit=limit,
        remaining=res.remaining,
        reset_s=res.reset_s,
        retry_after_s=res.retry_after_s,
        requested=requested,
    )
