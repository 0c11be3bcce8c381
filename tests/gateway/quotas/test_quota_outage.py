"""Redis stopped mid-test: fail closed refuses (503) and admits nothing unaccounted; fail open
admits and records it. Uses a private redis-server, never the shared one on 6379."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import redis.asyncio as redis_async

from gateway.quotas import (
    Limits,
    QuotaBackendUnavailable,
    RateLimited,
    RedisLimiter,
    SubjectLimits,
)
from gateway.quotas.hook import refusal_headers

pytestmark = pytest.mark.anyio

KEY = [SubjectLimits("key:o", Limits(requests_per_minute=1000, max_concurrent=100))]


class Events:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    async def __call__(self, event: Mapping[str, Any]) -> None:
        self.items.append(dict(event))


async def admitted_in_redis(url: str, lim: RedisLimiter) -> int:
    client = redis_async.Redis.from_url(url)
    try:
        return int(await client.zcard(lim.key("c", "key:o")))
    finally:
        await client.aclose()


async def test_fail_closed_refuses_with_503_and_recovers(
    throwaway_redis: Callable[..., Any],
) -> None:
    srv = throwaway_redis()
    events = Events()
    lim = RedisLimiter(srv.url, key_prefix="sg:q:outage:", timeout_s=0.3, on_event=events)
    try:
        held = [await lim.admit(KEY, 0) for _ in range(3)]
        assert await admitted_in_redis(srv.url, lim) == 3  # every admission is accounted
        srv.stop()
        for _ in range(5):
            with pytest.raises(QuotaBackendUnavailable) as info:
                await lim.admit(KEY, 0)
        exc = info.value
        assert exc.status == 503 and exc.code == "quota_backend_unavailable"
        assert exc.openai_error()["error"]["code"] == "quota_backend_unavailable"
        assert refusal_headers(exc) == {"retry-after": "1"}
        assert not lim.healthy
        # Releasing while Redis is down neither raises nor blocks.
        await lim.release(held[0])
        await lim.settle(held[1], 10)
        assert [e["type"] for e in events.items] == ["quota.backend_unavailable"]
        assert events.items[0]["policy"] == "fail_closed"

        # Redis comes back (empty: it kept no state) on the same port.
        srv.start()
        adm = await lim.admit(KEY, 0)
        assert not adm.fail_open and lim.healthy
        assert await admitted_in_redis(srv.url, lim) == 1
        assert [e["type"] for e in events.items][-1] == "quota.backend_recovered"
        assert events.items[-1]["refused"] == 5
        assert events.items[-1]["admitted_unaccounted"] == 0
    finally:
        await lim.aclose()


async def test_fail_open_admits_unaccounted_and_audits(throwaway_redis: Callable[..., Any]) -> None:
    srv = throwaway_redis()
    events = Events()
    lim = RedisLimiter(
        srv.url, key_prefix="sg:q:outage:", timeout_s=0.3, fail_open=True, on_event=events
    )
    tight = [SubjectLimits("key:o", Limits(requests_per_minute=2, max_concurrent=100))]
    try:
        await lim.admit(tight, 0)
        await lim.admit(tight, 0)
        with pytest.raises(RateLimited):
            await lim.admit(tight, 0)  # limits apply while Redis is up
        srv.stop()
        admissions = [await lim.admit(tight, 0) for _ in range(4)]
        assert all(a.fail_open for a in admissions)
        for a in admissions:
            await lim.settle(a, 100)
            await lim.release(a)
        assert events.items == [
            {
                "type": "quota.backend_unavailable",
                "policy": "fail_open",
                "error": events.items[0]["error"],
            }
        ]
        assert "Error" in events.items[0]["error"]
    finally:
        await lim.aclose()


async def test_scripts_are_reloaded_after_a_script_flush(
    throwaway_redis: Callable[..., Any],
) -> None:
    srv = throwaway_redis()
    lim = RedisLimiter(srv.url, key_prefix="sg:q:noscript:")
    client = redis_async.Redis.from_url(srv.url)
    try:
        await lim.admit(KEY, 0)
        await client.script_flush()  # as after a Redis restart or failover
        adm = await lim.admit(KEY, 0)
        assert not adm.fail_open
        await lim.finish(adm, 0)
        assert await admitted_in_redis(srv.url, lim) == 1  # the first one is still held
    finally:
        await lim.aclose()
        await client.aclose()
