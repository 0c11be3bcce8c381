"""In-memory limiter: exact limits for a single gateway replica (the default).

All state lives in this object (no module globals). ``admit`` never awaits between checking
and charging, so on one event loop it is atomic without locks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from gateway.quotas import gcra
from gateway.quotas.errors import BudgetExhausted, RateLimited, RequestTooLarge
from gateway.quotas.limiter import (
    WINDOW_S,
    Admission,
    PeriodCache,
    Periods,
    SubjectLimits,
    WindowState,
    pick_denial,
    tightest,
)

_SWEEP_EVERY = 4096


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

    async def admit(self, subjects: Sequence[SubjectLimits], estimated_tokens: int) -> Admission:
        """Admit one request against every subject or raise (see ``Limiter.admit``)."""
        now = self._clock()
        periods = self._periods.at(now)
        self._roll_periods(periods)
        cost = max(0, int(estimated_tokens))
        denials: list[RateLimited] = []
        req_results: list[tuple[str, int, gcra.GcraResult]] = []
        tok_results: list[tuple[str, int, gcra.GcraResult]] = []
        for subject in subjects:
            lim = subject.limits
            if lim.requests_per_minute is not None:
                res = gcra.check(
                    self._tat_requests.get(subject.name), now, lim.requests_per_minute, 1, WINDOW_S
                )
                req_results.append((subject.name, lim.requests_per_minute, res))
                if not res.allowed:
                    denials.append(
                        _window_denial("requests", subject.name, lim.requests_per_minute, res, 1)
                    )
            if lim.tokens_per_minute is not None:
                res = gcra.check(
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
                tat = gcra.adjust(
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
    kind: str, subject: str, limit: int, res: gcra.GcraResult, requested: int
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
