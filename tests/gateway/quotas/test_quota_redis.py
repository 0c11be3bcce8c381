"""Redis-only behaviour: several OS processes sharing limits, leases, refill, real time."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio as redis_async

from gateway.quotas import Limits, RateLimited, RedisLimiter, SubjectLimits

REDIS_URL = "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("_burst_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def redis_time() -> float:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        sec, usec = client.time()
        return float(sec) + usec / 1e6
    finally:
        client.close()


def run_workers(
    prefix: str, n: int, attempts: int, mode: str
) -> tuple[list[dict[str, int]], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), REDIS_URL, prefix, "2.0", str(attempts), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(n)
    ]
    for proc in procs:  # every process is up and connected ...
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready", proc.stderr
    t0 = redis_time()
    for proc in procs:  # ... before any of them starts the burst
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results, redis_time() - t0


def test_three_processes_never_admit_more_than_the_limit(redis_prefix: str) -> None:
    results, elapsed_s = run_workers(redis_prefix, 3, 5000, "rate")
    admitted = sum(r["admitted"] for r in results)
    # requests_per_minute=120 on the key, tokens_per_minute=24000 on the team (240 requests
    # of 100 tokens): the key is the tighter. GCRA bound over the whole run, tolerance 0:
    bound = 120 + 120 * elapsed_s / 60
    assert 120 <= admitted <= bound, (admitted, bound, results)
    # The processes really competed: each got a share of the burst and saw refusals.
    assert all(r["admitted"] > 0 and r["refused"] > 0 for r in results), results


def test_three_processes_share_one_concurrency_limit(redis_prefix: str) -> None:
    results, _ = run_workers(redis_prefix, 3, 5000, "concurrency")
    assert max(r["max_seen"] for r in results) <= 5
    assert max(r["max_seen"] for r in results) >= 2  # they really overlapped
    assert sum(r["admitted"] for r in results) >= 10


async def test_requests_refill_in_real_time(redis_prefix: str) -> None:
    lim = RedisLimiter(REDIS_URL, key_prefix=redis_prefix)
    key = [SubjectLimits("key:r", Limits(requests_per_minute=200))]  # one per 0.3 s
    try:
        for _ in range(200):
            await lim.admit(key, 0)
        with pytest.raises(RateLimited) as info:
            await lim.admit(key, 0)
        assert info.value.retry_after_s is not None and info.value.retry_after_s <= 0.3
        await asyncio.sleep(info.value.retry_after_s + 0.05)
        await lim.admit(key, 0)
    finally:
        await lim.aclose()


async def test_leases_of_a_crashed_replica_expire_and_renewed_leases_do_not(
    redis_prefix: str,
) -> None:
    key = [SubjectLimits("key:l", Limits(max_concurrent=2))]
    crashed = RedisLimiter(REDIS_URL, key_prefix=redis_prefix, lease_s=1.5)
    alive = RedisLimiter(REDIS_URL, key_prefix=redis_prefix, lease_s=1.5)
    try:
        await crashed.admit(key, 0)  # never released, never renewed: the replica "died"
        held = await alive.admit(key, 0)
        with pytest.raises(RateLimited):
            await alive.admit(key, 0)
        for _ in range(8):
            await asyncio.sleep(0.25)
            assert await alive.renew_leases() == 1
        # 2.0 s later the crashed replica's lease (1.5 s) has expired; the renewed one has not.
        await alive.admit(key, 0)
        with pytest.raises(RateLimited):
            await alive.admit(key, 0)
        await alive.release(held)
        await alive.admit(key, 0)
    finally:
        await crashed.aclose()
        await alive.aclose()


async def test_keys_are_namespaced_and_expire(redis_prefix: str) -> None:
    client = redis_async.Redis.from_url(REDIS_URL)
    lim = RedisLimiter(REDIS_URL, key_prefix=redis_prefix)
    try:
        subject = SubjectLimits(
            "key:n",
            Limits(
                requests_per_minute=10,
                tokens_per_minute=1000,
                max_concurrent=3,
                tokens_per_day=10_000,
                tokens_per_month=100_000,
            ),
        )
        adm = await lim.admit([subject], 10)
        keys = sorted(k.decode() for k in await client.keys(redis_prefix + "*"))
        assert len(keys) == 5 and all(k.startswith(redis_prefix) for k in keys)
        for k in keys:
            ttl = await client.pttl(k)
            assert 0 < ttl <= 33 * 86400 * 1000, (k, ttl)
        day_key = next(k for k in keys if ":d:" in k)
        assert int(await client.get(day_key)) == 10
        await lim.settle(adm, 25)
        assert int(await client.get(day_key)) == 25
        await lim.release(adm)
        assert await client.zcard(lim.key("c", "key:n")) == 0
    finally:
        await lim.aclose()
        await client.aclose()
