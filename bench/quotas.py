"""Quota benchmarks: the limiter alone (in-memory vs Redis) and the gateway with limits on/off.

1. Limiter: admit + finish (settle + release) of one request (a key and a team subject, all five
   limits set high enough never to refuse), sequential latency p50/p99 and throughput with
   64 concurrent tasks, for ``MemoryLimiter`` and ``RedisLimiter`` (Redis on 127.0.0.1:6379,
   keys under a unique prefix, deleted afterwards).
2. Relay: the vLLM simulator and one ``gateway serve`` process per variant (limits off,
   in-memory, Redis), driven with concurrent non-streaming chat completions over loopback;
   prints requests/s, p50/p99 latency and the ratio against "off", in one run. Targets:
   in-memory >= 0.90 of off, Redis >= 0.80.

    .venv/bin/python bench/quotas.py [--requests 1500] [--concurrency 16] [--skip-relay]

The same variants can be given to the shared relay benchmark (``bench/relay.py --variant
NAME=CONFIG_YAML``): ``--write-configs DIR`` writes ``quotas-off.yaml``,
``quotas-memory.yaml`` and ``quotas-redis.yaml`` for a simulator URL.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from gateway.quotas import Limits, MemoryLimiter, RedisLimiter, SubjectLimits

ROOT = Path(__file__).resolve().parents[1]
KEY = "sg-bench-quota-key"
REDIS_URL = "redis://127.0.0.1:6379/0"
BIG = 10**12
SUBJECTS = [
    SubjectLimits(
        "key:bench",
        Limits(
            requests_per_minute=BIG,
            tokens_per_minute=BIG,
            max_concurrent=100_000,
            tokens_per_day=BIG,
            tokens_per_month=BIG,
        ),
    ),
    SubjectLimits("team:bench", Limits(tokens_per_minute=BIG, tokens_per_day=BIG)),
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def limiter_bench(limiter: Any, n_seq: int, n_conc: int) -> dict[str, float]:
    await limiter.start()
    lat: list[float] = []
    for _ in range(n_seq):
        t0 = time.perf_counter()
        adm = await limiter.admit(SUBJECTS, 120)
        await limiter.finish(adm, 80)
        lat.append((time.perf_counter() - t0) * 1e6)
    todo = list(range(n_conc))

    async def worker() -> None:
        while todo:
            todo.pop()
            adm = await limiter.admit(SUBJECTS, 120)
            await limiter.finish(adm, 80)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    elapsed = time.perf_counter() - t0
    await limiter.aclose()
    return {
        "p50_us": statistics.median(lat),
        "p99_us": pct(lat, 0.99),
        "req_per_s": n_conc / elapsed,
    }


def run_limiter_bench(n_seq: int, n_conc: int) -> None:
    prefix = f"sg:q:bench:{uuid.uuid4().hex[:8]}:"
    results = {
        "memory": asyncio.run(limiter_bench(MemoryLimiter(), n_seq, n_conc)),
        "redis": asyncio.run(
            limiter_bench(RedisLimiter(REDIS_URL, key_prefix=prefix), n_seq, n_conc)
        ),
    }
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
    print("limiter (admit + finish (settle + release), key + team, 5 limits)")
    print(f"  {'backend':8} {'p50 us':>9} {'p99 us':>9} {'req/s (64 tasks)':>18}")
    for name, r in results.items():
        print(f"  {name:8} {r['p50_us']:9.1f} {r['p99_us']:9.1f} {r['req_per_s']:18.0f}")


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
                raise RuntimeError(f"{url} did not become ready") from None
            time.sleep(0.1)


def gateway_config(sim_url: str, port: int, quotas: dict[str, Any] | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [
            {"name": "bench", "served_model_name": "sim-model", "replicas": [{"url": sim_url}]}
        ],
        "keys": [
            {
                "id": "bench",
                "team": "bench",
                "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                "models": ["*"],
            }
        ],
        "health": {"active": False},
        "logging": {"access_log": False},
    }
    if quotas is not None:
        cfg["quotas"] = quotas
    return cfg


def variants(prefix: str) -> dict[str, dict[str, Any] | None]:
    limits = {
        "key": {"requests_per_minute": BIG, "tokens_per_minute": BIG, "max_concurrent": 10_000},
        "team": {"tokens_per_day": BIG},
    }
    return {
        "off": None,
        "memory": {"backend": "memory", "defaults": limits},
        "redis": {
            "backend": "redis",
            "redis_url": REDIS_URL,
            "key_prefix": prefix,
            "defaults": limits,
        },
    }


async def load(url: str, n: int, concurrency: int) -> dict[str, float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    lat: list[float] = []
    todo = list(range(n))
    async with httpx.AsyncClient(
        timeout=30,
        headers={"authorization": f"Bearer {KEY}"},
        trust_env=False,
        limits=httpx.Limits(max_connections=concurrency),
    ) as client:

        async def worker() -> None:
            while todo:
                todo.pop()
                t0 = time.perf_counter()
                r = await client.post(url + "/v1/chat/completions", json=body)
                r.raise_for_status()
                lat.append((time.perf_counter() - t0) * 1000)

        for _ in range(min(50, n)):  # warm-up (connections, tokenizer, scripts)
            r = await client.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"rps": n / elapsed, "p50_ms": statistics.median(lat), "p99_ms": pct(lat, 0.99)}


def run_relay_bench(n: int, concurrency: int, rounds: int) -> None:
    prefix = f"sg:q:bench:{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sim_port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "vllm_sim.cli", "--port", str(sim_port), "--model", "sim-model"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs: list[subprocess.Popen[bytes]] = [sim]
    results: dict[str, list[dict[str, float]]] = {}
    try:
        sim_url = f"http://127.0.0.1:{sim_port}"
        wait_ready(sim_url + "/health", sim)
        with tempfile.TemporaryDirectory() as tmp:
            urls: dict[str, str] = {}
            for name, quotas in variants(prefix).items():
                port = free_port()
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(yaml.safe_dump(gateway_config(sim_url, port, quotas)))
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import sys; from gateway.cli import main; sys.exit(main())",
                        "serve",
                        "--config",
                        str(path),
                    ],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                procs.append(proc)
                urls[name] = f"http://127.0.0.1:{port}"
                wait_ready(urls[name] + "/healthz", proc)
            # Interleave the variants over several rounds so machine noise hits all of them.
            for _ in range(rounds):
                for name, url in urls.items():
                    results.setdefault(name, []).append(asyncio.run(load(url, n, concurrency)))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
    base = statistics.median(r["rps"] for r in results["off"])
    print(
        f"\nrelay through `gateway serve` ({n} chat completions x {rounds} rounds, "
        f"concurrency {concurrency}; medians)"
    )
    print(f"  {'variant':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'ratio vs off':>13}")
    for name, rs in results.items():
        rps = statistics.median(r["rps"] for r in rs)
        p50 = statistics.median(r["p50_ms"] for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        print(f"  {name:8} {rps:9.0f} {p50:8.2f} {p99:8.2f} {rps / base:13.3f}")


def write_configs(directory: Path, sim_url: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, quotas in variants("sg:q:relaybench:").items():
        path = directory / f"quotas-{name}.yaml"
        path.write_text(yaml.safe_dump(gateway_config(sim_url, 0, quotas)))
        print(f"--variant {name}={path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limiter-requests", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-relay", action="store_true")
    parser.add_argument("--write-configs", type=Path, default=None)
    parser.add_argument("--sim-url", default="http://127.0.0.1:8000")
    args = parser.parse_args()
    if args.write_configs is not None:
        write_configs(args.write_configs, args.sim_url)
        return
    run_limiter_bench(args.limiter_requests, args.limiter_requests)
    if not args.skip_relay:
        run_relay_bench(args.requests, args.concurrency, args.rounds)


if __name__ == "__main__":
    main()
