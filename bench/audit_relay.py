"""Gateway throughput and latency with the audit log off, on SQLite and on PostgreSQL.

Starts the vLLM simulator and, per variant, a real ``gateway serve`` process (subprocesses on
loopback), drives it with concurrent clients (httpx, non-streaming and streaming chat
completions), and prints requests/s, p50/p99 latency and the ratios against "off", in one run.

    .venv/bin/python bench/audit_relay.py [--requests 600] [--concurrency 1,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair

ROOT = Path(__file__).resolve().parents[1]
KEY = "sg-bench-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.1)


def gateway_config(sim_url: str, port: int, audit: dict[str, Any] | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "served_model_name": "m", "replicas": [{"url": sim_url}]}],
        "keys": [
            {
                "id": "bench",
                "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                "models": ["m"],
                "team": "bench",
            }
        ],
        "health": {"active": False},
        "logging": {"access_log": False},
    }
    if audit is not None:
        cfg["audit"] = audit
    return cfg


async def load(url: str, n: int, concurrency: int) -> dict[str, float]:
    lat: list[float] = []
    headers = {"authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as c:

        async def one(i: int) -> None:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": i % 2 == 1,
                "max_tokens": 16,
            }
            t = time.perf_counter()
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            lat.append(time.perf_counter() - t)

        for i in range(min(10, n)):  # warm up connections and code paths
            await one(i)
        lat.clear()
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100)
    return {"rate": n / elapsed, "p50": q[49] * 1e3, "p99": q[98] * 1e3}


async def pg_db(admin: str, create: bool, name: str) -> None:
    conn = await asyncpg.connect(admin)
    try:
        if create:
            await conn.execute(f'CREATE DATABASE "{name}"')
        else:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--ttft-ms", type=float, default=10.0)
    parser.add_argument("--itl-ms", type=float, default=1.0)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sg-bench-audit-"))
    key, _ = write_key_pair(Signer.generate(), tmp / "audit.key")
    pseudo = generate_key_file(tmp / "pseudonym.key")
    pg_name = f"sg_bench_{uuid.uuid4().hex[:10]}"
    variants: list[tuple[str, dict[str, Any] | None]] = [("off", None)]
    common = {
        "signing_key_file": str(key),
        "pseudonym_key_file": str(pseudo),
        "replica_id": "bench",
    }
    variants.append(("sqlite", {**common, "store": f"sqlite://{tmp / 'audit.db'}"}))
    if not args.no_postgres:
        asyncio.run(pg_db(args.pg_admin, True, pg_name))
        pg_url = args.pg_admin.rsplit("/", 1)[0] + "/" + pg_name
        variants.append(("postgresql", {**common, "store": pg_url}))
    sim_port = free_port()
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_sim.cli",
            "--port",
            str(sim_port),
            "--model",
            "m",
            "--ttft-ms",
            str(args.ttft_ms),
            "--itl-ms",
            str(args.itl_ms),
        ],
        cwd=ROOT,
    )
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    gateways: list[tuple[str, int, subprocess.Popen[bytes]]] = []
    try:
        wait_ready(f"http://127.0.0.1:{sim_port}/health", sim)
        for name, audit in variants:
            port = free_port()
            cfg_file = tmp / f"{name}.yaml"
            cfg = gateway_config(f"http://127.0.0.1:{sim_port}", port, audit)
            cfg_file.write_text(yaml.safe_dump(cfg))
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)]
            gateways.append((name, port, subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ))))
        for _, port, gw in gateways:
            wait_ready(f"http://127.0.0.1:{port}/healthz", gw)
        # Interleave variants round by round so load from elsewhere on the machine hits all
        # of them alike; report the median round.
        for c in levels:
            n = args.requests if c > 1 else max(args.requests // 4, 100)
            for _ in range(args.rounds):
                for name, port, _gw in gateways:
                    res = asyncio.run(load(f"http://127.0.0.1:{port}", n // args.rounds, c))
                    samples.setdefault((name, c), []).append(res)
    finally:
        for _, _, gw in gateways:
            gw.send_signal(signal.SIGTERM)
            gw.wait(30)
        sim.send_signal(signal.SIGTERM)
        sim.wait(30)
        if not args.no_postgres:
            asyncio.run(pg_db(args.pg_admin, False, pg_name))
    results = {
        k: {m: statistics.median(x[m] for x in v) for m in ("rate", "p50", "p99")}
        for k, v in samples.items()
    }
    print(
        f"{'audit':<11} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'req/s vs off':>13} {'p50 +ms':>8}"
    )
    for (name, c), r in results.items():
        off = results[("off", c)]
        print(
            f"{name:<11} {c:>4} {r['rate']:>8.0f} {r['p50']:>8.2f} {r['p99']:>8.2f} "
            f"{r['rate'] / off['rate']:>13.2f} {r['p50'] - off['p50']:>8.2f}"
        )


if __name__ == "__main__":
    main()
