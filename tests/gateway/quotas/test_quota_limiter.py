"""Each limit, run against both backends (in-memory and the real Redis on 127.0.0.1:6379)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.quotas import (
    BudgetExhausted,
    Limits,
    RateLimited,
    RequestTooLarge,
    SubjectLimits,
)
from gateway.quotas.hook import refusal_headers

pytestmark = pytest.mark.anyio


def subj(name: str, **limits: int) -> SubjectLimits:
    return SubjectLimits(name, Limits(**limits))


async def test_requests_per_minute_admits_exactly_the_limit_then_refuses(limiter: Any) -> None:
    key = subj("key:a", requests_per_minute=5)
    remaining = []
    for _ in range(5):
        adm = await limiter.admit([key], 0)
        remaining.append(adm.requests.remaining)
        assert adm.requests.limit == 5
    assert remaining == [4, 3, 2, 1, 0]
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 0)
    exc = info.value
    assert type(exc) is RateLimited
    assert (exc.kind, exc.code, exc.status, exc.subject) == (
        "requests",
        "rate_limit_exceeded",
        429,
        "key:a",
    )
    assert exc.limit == 5 and exc.remaining == 0
    # One request frees up every 60/5 = 12 s; the bucket is full again after ~60 s.
    assert exc.retry_after_s is not None and 11.0 < exc.retry_after_s <= 12.0
    assert 59.0 < exc.reset_s <= 60.0
    body = exc.openai_error()["error"]
    assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
    headers = refusal_headers(exc)
    assert headers["retry-after"] == "12"
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_tokens_per_minute_charges_the_estimate(limiter: Any) -> None:
    key = subj("key:t", tokens_per_minute=1000)
    adm = await limiter.admit([key], 600)
    assert adm.tokens.limit == 1000 and adm.tokens.remaining == 400
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 500)
    # Tokens refill at 1000/60 per second: allow for time passing on a loaded machine (Redis
    # uses its own clock).
    assert info.value.kind == "tokens" and 400 <= info.value.remaining <= 420
    assert info.value.requested == 500
    # 100 tokens missing at 1000/60 tokens per second: 6 s.
    assert info.value.retry_after_s == pytest.approx(6.0, abs=1.0)
    # Something smaller still fits.
    adm2 = await limiter.admit([key], 400)
    assert 0 <= adm2.tokens.remaining <= 20


async def test_settle_with_lower_usage_gives_tokens_back(limiter: Any) -> None:
    key = subj("key:s", tokens_per_minute=1000)
    adm = await limiter.admit([key], 900)
    with pytest.raises(RateLimited):
        await limiter.admit([key], 200)
    await limiter.settle(adm, 100)  # really used 100: 800 come back
    adm2 = await limiter.admit([key], 800)
    assert 99 <= adm2.tokens.remaining <= 120
    await limiter.settle(adm, 0)  # second settle is ignored
    with pytest.raises(RateLimited):
        await limiter.admit([key], 200)


async def test_settle_with_higher_usage_puts_the_key_in_debt(limiter: Any) -> None:
    key = subj("key:d", tokens_per_minute=1000)
    adm = await limiter.admit([key], 100)
    await limiter.settle(adm, 1500)  # the completion was much longer than reserved
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 1)
    assert info.value.kind == "tokens" and info.value.remaining == 0
    # 500 tokens of debt + 1 at 1000/60 per second: about 30 s before one token fits.
    assert info.value.retry_after_s == pytest.approx(30.06, abs=1.0)


async def test_request_larger_than_the_limit_is_never_admitted(limiter: Any) -> None:
    key = subj("key:big", tokens_per_minute=1000, requests_per_minute=10)
    with pytest.raises(RequestTooLarge) as info:
        await limiter.admit([key], 1001)
    exc = info.value
    assert exc.code == "request_too_large" and exc.retry_after_s is None
    assert refusal_headers(exc)["x-should-retry"] == "false"
    assert "retry-after" not in refusal_headers(exc)
    # Nothing was charged: the full request budget is still there.
    adm = await limiter.admit([key], 1000)
    assert adm.requests.remaining == 9 and adm.tokens.remaining == 0


async def test_concurrency_limit_and_release(limiter: Any) -> None:
    key = subj("key:c", max_concurrent=2)
    a1 = await limiter.admit([key], 0)
    a2 = await limiter.admit([key], 0)
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 0)
    assert info.value.kind == "concurrency" and info.value.limit == 2
    await limiter.release(a1)
    await limiter.release(a1)  # idempotent: must not free a second slot
    a3 = await limiter.admit([key], 0)
    with pytest.raises(RateLimited):
        await limiter.admit([key], 0)
    await limiter.release(a2)
    await limiter.release(a3)
    await limiter.admit([key], 0)
    await limiter.admit([key], 0)


@pytest.mark.parametrize(
    ("field", "kind"),
    [("tokens_per_day", "tokens_per_day"), ("tokens_per_month", "tokens_per_month")],
)
async def test_budgets(limiter: Any, field: str, kind: str) -> None:
    key = subj("key:b", **{field: 1000})
    adm = await limiter.admit([key], 700)
    with pytest.raises(BudgetExhausted) as info:
        await limiter.admit([key], 400)
    exc = info.value
    assert exc.kind == kind and exc.code == "insufficient_quota" and exc.remaining == 300
    assert exc.retry_after_s is not None and exc.retry_after_s == pytest.approx(exc.reset_s)
    assert refusal_headers(exc).get("x-should-retry") == ("false" if exc.reset_s > 60 else None)
    await limiter.settle(adm, 500)  # 200 fewer than estimated
    await limiter.admit([key], 500)
    with pytest.raises(BudgetExhausted):
        await limiter.admit([key], 1)
    with pytest.raises(RequestTooLarge):
        await limiter.admit([key], 1001)


async def test_team_limit_is_shared_by_its_keys(limiter: Any) -> None:
    team = subj("team:search", requests_per_minute=3)
    k1 = subj("key:k1", requests_per_minute=100)
    k2 = subj("key:k2", requests_per_minute=100)
    await limiter.admit([k1, team], 0)
    await limiter.admit([k2, team], 0)
    adm = await limiter.admit([k1, team], 0)
    assert adm.requests.limit == 3 and adm.requests.remaining == 0  # the tightest is reported
    with pytest.raises(RateLimited) as info:
        await limiter.admit([k2, team], 0)
    assert info.value.subject == "team:search"
    # A key of another team is not affected.
    other = [subj("key:k3", requests_per_minute=1), subj("team:other", requests_per_minute=1)]
    await limiter.admit(other, 0)


async def test_refusal_charges_nothing_on_any_subject(limiter: Any) -> None:
    team = subj("team:t", tokens_per_minute=100)
    key = subj("key:x", requests_per_minute=2, tokens_per_minute=10_000)
    await limiter.admit([key, team], 100)
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key, team], 50)
    assert info.value.subject == "team:t"
    # The refused request did not use a request of the key: two fit, the second now.
    adm = await limiter.admit([key], 0)
    assert adm.requests.remaining == 0


async def test_longest_wait_is_reported_when_several_limits_refuse(limiter: Any) -> None:
    key = subj("key:w", requests_per_minute=60, tokens_per_minute=600)
    await limiter.admit([key], 600)
    # Both a request (1 s) and the tokens (10 s) are short: the longer wait is reported.
    for _ in range(59):
        await limiter.admit([subj("key:w", requests_per_minute=60)], 0)
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 100)
    assert info.value.kind == "tokens"
    assert info.value.retry_after_s == pytest.approx(10.0, abs=1.0)


async def test_unlimited_subject_and_zero_cost(limiter: Any) -> None:
    adm = await limiter.admit([subj("key:free")], 10**9)
    assert adm.requests is None and adm.tokens is None
    await limiter.settle(adm, 10**9)
    await limiter.release(adm)


async def test_finish_settles_and_releases_in_one_call(limiter: Any) -> None:
    key = subj("key:f", tokens_per_minute=1000, max_concurrent=1, tokens_per_day=5000)
    adm = await limiter.admit([key], 900)
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 10)
    assert info.value.kind in ("concurrency", "tokens")
    await limiter.finish(adm, 100)  # 800 tokens back and the slot freed
    adm2 = await limiter.admit([key], 800)
    assert 99 <= adm2.tokens.remaining <= 120
    await limiter.finish(adm, 0)  # idempotent: no second correction, no second release
    with pytest.raises(RateLimited) as info:
        await limiter.admit([key], 10)
    assert info.value.kind == "concurrency"
    await limiter.finish(adm2, 800)
    await limiter.admit([key], 10)
