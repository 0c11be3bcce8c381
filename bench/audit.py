"""Audit log micro-benchmark: appends/s and append latency (p50/p99) with group commit.

Runs the real writer against SQLite (a temporary file, WAL + synchronous=FULL) and PostgreSQL
(a temporary database on --pg-admin, dropped afterwards), with C concurrent appenders each
awaiting its own durable append, as gateway requests do. Prints one line per backend and
concurrency, and the ratio of group-committed throughput to one-at-a-time throughput.

    .venv/bin/python bench/audit.py [--records 4000] [--concurrency 1,16,64] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from gateway.audit import AuditLog, Signer, open_store, verify_store

EVENT: dict[str, Any] = {
    "type": "request.started",
    "key_id": "team-a",
    "team": "a",
    "client": "hmac-sha256:" + "ab" * 32,
    "model": "llama-3.1-8b",
    "destination": "eu-west-vllm",
    "region": "eu-west-1",
    "policy_rule": "eu-only",
    "data_class": "internal",
    "bytes_in": 812,
}


async def run_one(url: str, records: int, concurrency: int) -> dict[str, float]:
    log = AuditLog(open_store(url), Signer.generate(), replica_id="bench")
    await log.start()
    latencies: list[float] = []
    per_worker = records // concurrency

    async def worker(w: int) -> None:
        for i in range(per_worker):
            t = time.perf_counter()
            await log.append({**EVENT, "request_id": f"{w}-{i}"})
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - t0
    await log.close()
    store = open_store(url, read_only=True)
    await store.open()
    try:
        report = await verify_store(store, verifiers=[])
    finally:
        await store.close()
    assert report.ok, report.errors
    q = statistics.quantiles(latencies, n=100)
    return {"rate": len(latencies) / elapsed, "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3}


async def with_pg_database(admin: str, records: int, concurrency: int) -> dict[str, float]:
    name = f"sg_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        return await run_one(admin.rsplit("/", 1)[0] + "/" + name, records, concurrency)
    finally:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    backends = ["sqlite"] + ([] if args.no_postgres else ["postgresql"])
    print(f"{'backend':<11} {'conc':>5} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for backend in backends:
        base: float | None = None
        for c in levels:
            n = max(args.records // 10, 200) if c == 1 else args.records
            if backend == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    res = asyncio.run(run_one(f"sqlite://{Path(tmp) / 'a.db'}", n, c))
            else:
                res = asyncio.run(with_pg_database(args.pg_admin, n, c))
            base = base or res["rate"]
            print(
                f"{backend:<11} {c:>5} {res['rate']:>10.0f} {res['p50_ms']:>8.2f} "
                f"{res['p99_ms']:>8.2f}   x{res['rate'] / base:.1f} vs 1 appender"
            )


if __name__ == "__main__":
    main()
