"""Helpers for the audit tests: raw SQL for tampering, log writers, verify shortcuts."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg

from gateway.audit import AuditLog, Signer, VerifyReport, open_store, verify_store


def raw_sql(url: str, sql: str, *args: Any) -> list[Sequence[Any]]:
    """Run one statement directly against the store (the attacker's view); ``?`` placeholders."""
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url[len("sqlite://") :], isolation_level=None)
        try:
            return list(conn.execute(sql, args).fetchall())
        finally:
            conn.close()
    parts = sql.split("?")
    pg_sql = parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], 1))

    async def run() -> list[Sequence[Any]]:
        conn = await asyncpg.connect(url)
        try:
            return [tuple(r) for r in await conn.fetch(pg_sql, *args)]
        finally:
            await conn.close()

    # A fresh loop on a worker thread, so this also works inside a running event loop.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def write_log(
    url: str,
    signer: Signer,
    n: int,
    *,
    replica: str = "r1",
    close: bool = True,
    checkpoint_dir: Path | None = None,
    checkpoint_every_records: int = 10,
    prefix: str = "req",
) -> str:
    """Write ``n`` request records in batches of 4 (so checkpoints land mid-chain); return chain."""

    async def run() -> str:
        log = AuditLog(
            open_store(url),
            signer,
            replica_id=replica,
            checkpoint_every_records=checkpoint_every_records,
            checkpoint_dir=checkpoint_dir,
        )
        await log.start()
        for start in range(0, n, 4):
            await asyncio.gather(
                *(
                    log.append({"type": "request.started", "request_id": f"{prefix}-{i}"})
                    for i in range(start, min(n, start + 4))
                )
            )
        if close:
            await log.close()
        else:
            await log.checkpoint()
            await log.store.close()
        return log.chain_id

    return asyncio.run(run())


def verify(url: str, signer: Signer | None, **kw: Any) -> VerifyReport:
    async def run() -> VerifyReport:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            return await verify_store(store, verifiers=[signer.verifier] if signer else [], **kw)
        finally:
            await store.close()

    return asyncio.run(run())


def codes_at(report: VerifyReport) -> set[tuple[str, str | None, int | None]]:
    return {(f.code, f.chain, f.seq) for f in report.errors}
