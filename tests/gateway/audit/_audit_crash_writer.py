"""Subprocess for the crash test: append forever (8 concurrent appenders) until SIGKILLed.

Usage: python _audit_crash_writer.py STORE_URL SIGNING_KEY_FILE READY_AFTER
Prints "ready" once READY_AFTER records are durable.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gateway.audit import AuditLog, load_signer, open_store


async def main(url: str, key: Path, ready_after: int) -> None:
    log = AuditLog(
        open_store(url), load_signer(key), replica_id="crash", checkpoint_every_records=50
    )
    await log.start()
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while True:
            await log.append(
                {"type": "request.started", "request_id": f"w{w}-{i}", "pad": "x" * 300}
            )
            i += 1
            done += 1
            if done == ready_after:
                print("ready", flush=True)

    await asyncio.gather(*(worker(w) for w in range(8)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
