"""In-memory limiter behaviour over time, with an injected clock (no sleeping)."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.quotas import BudgetExhausted, Limits, MemoryLimiter, RateLimited, SubjectLimits

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


async def test_requests_refill_at_the_configured_rate() -> None:
    clock = Clock(at("2026-03-10T12:00:00"))
    lim = MemoryLimiter(clock=clock)
    key = SubjectLimits("key:a", Limits(requests_per_minute=6))  # one per 10 s
    for _ in range(6):
        await lim.admit([key], 0)
    with pytest.raises(RateLimited) as info:
        await lim.admit([key], 0)
    assert info.value.retry_after_s == pytest.approx(10.0)
    clock.now += 9.9
    with pytest.raises(RateLimited):
        await lim.admit([key], 0)
    clock.now += 0.1
    adm = await lim.admit([key], 0)
    assert adm.requests is not None and adm.requests.remaining == 0
    clock.now += 60
    adm = await lim.admit([key], 0)
    assert adm.requests is not None and adm.requests.remaining == 5


async def test_over_any_interval_at_most_burst_plus_rate() -> None:
    """GCRA bound: in t seconds at most limit + limit * t / 60 are admitted."""
    clock = Clock(at("2026-03-10T12:00:00"))
    lim = MemoryLimiter(clock=clock)
    key = SubjectLimits("key:a", Limits(requests_per_minute=30))
    admitted = 0
    for _ in range(1200):  # 120 s of attempts every 100 ms
        try:
            await lim.admit([key], 0)
            admitted += 1
        except RateLimited:
            pass
        clock.now += 0.1
    # Attempts span 119.9 s: the burst of 30, then one every 2 s from t=2 to t=118.
    assert admitted <= 30 + 30 * 119.9 / 60
    assert admitted == 30 + 59


async def test_daily_budget_resets_at_utc_midnight_and_monthly_at_month_start() -> None:
    clock = Clock(at("2026-01-31T23:59:00"))
    lim = MemoryLimiter(clock=clock)
    day = SubjectLimits("team:t", Limits(tokens_per_day=100))
    month = SubjectLimits("team:m", Limits(tokens_per_month=100))
    await lim.admit([day], 100)
    await lim.admit([month], 100)
    with pytest.raises(BudgetExhausted) as info:
        await lim.admit([day], 1)
    assert info.value.reset_s == pytest.approx(60.0)
    with pytest.raises(BudgetExhausted) as info:
        await lim.admit([month], 1)
    assert info.value.reset_s == pytest.approx(60.0)
    clock.now += 60
    await lim.admit([day], 100)
    await lim.admit([month], 100)
    assert lim.used("team:t", "day") == 100 and lim.used("team:m", "month") == 100


async def test_settle_after_period_rollover_does_not_touch_the_new_period() -> None:
    clock = Clock(at("2026-01-31T23:59:59"))
    lim = MemoryLimiter(clock=clock)
    day = SubjectLimits("team:t", Limits(tokens_per_day=1000))
    adm = await lim.admit([day], 100)
    clock.now += 2  # a long stream crosses midnight
    await lim.admit([day], 10)
    await lim.settle(adm, 900)
    assert lim.used("team:t", "day") == 10


async def test_idle_buckets_are_swept() -> None:
    clock = Clock(at("2026-03-10T12:00:00"))
    lim = MemoryLimiter(clock=clock)
    for i in range(5000):
        await lim.admit([SubjectLimits(f"key:{i}", Limits(requests_per_minute=100))], 0)
        clock.now += 0.1
    # Only keys seen in the last minute (600 admits x 0.1 s) can still hold state.
    assert len(lim._tat_requests) < 5000 - 4096 + 700


def test_period_cache_matches_the_calendar() -> None:
    from gateway.quotas.memory import PeriodCache, Periods

    cache = PeriodCache()
    t = at("2026-12-31T23:59:58")
    for step in range(0, 5000, 7):  # crosses midnight and the year's last month boundary
        now = t + step * 0.5
        assert cache.at(now) == Periods.at(now)
