"""One "replica" of the multi-process burst test: runs a RedisLimiter against a shared Redis.

Usage: python _burst_worker.py URL PREFIX DURATION_S ATTEMPTS MODE
Prints "ready", waits for a line on stdin (so all workers burst together), then tries at
most ATTEMPTS admissions for DURATION_S seconds with 8 concurrent tasks (5 ms apart) and
prints one JSON line:
{"admitted": N, "refused": M, "max_seen": K}.
MODE ``rate``: 1 request each against key rpm/tpm limits. MODE ``concurrency``: holds each
admitted slot for 20 ms while counting, in Redis, how many are held at once across processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import redis.asyncio as redis_async

from gateway.quotas import Limits, RateLimited, RedisLimiter, SubjectLimits


async def main(url: str, prefix: str, duration_s: float, attempts: int, mode: str) -> None:
    client = redis_async.Redis.from_url(url)
    limiter = RedisLimiter(url, key_prefix=prefix, client=client)
    await limiter.start()
    if mode == "rate":
        subjects = [
            SubjectLimits("key:shared", Limits(requests_per_minute=120)),
            SubjectLimits("team:shared", Limits(tokens_per_minute=24_000)),
        ]
    else:
        subjects = [SubjectLimits("key:conc", Limits(max_concurrent=5))]
    counts = {"admitted": 0, "refused": 0, "max_seen": 0}
    todo = list(range(attempts))
    await client.ping()  # connected before the start signal
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    deadline = time.time() + duration_s

    async def run() -> None:
        while todo and time.time() < deadline:
            todo.pop()
            try:
                adm = await limiter.admit(subjects, 100)
            except RateLimited:
                counts["refused"] += 1
                await asyncio.sleep(0.005)
                continue
            counts["admitted"] += 1
            if mode == "concurrency":
                held = int(await client.incr(prefix + "held"))
                counts["max_seen"] = max(counts["max_seen"], held)
                await asyncio.sleep(0.02)
                await client.decr(prefix + "held")
                await limiter.release(adm)
            else:
                await asyncio.sleep(0.005)

    await asyncio.gather(*(run() for _ in range(8)))
    await limiter.aclose()
    await client.aclose()
    print(json.dumps(counts))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
