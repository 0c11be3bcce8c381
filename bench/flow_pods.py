#!/usr/bin/env python3
"""Two gateway pods, one heavy key and one light key: the fleet-wide fair share (issue 32).

Starts one simulated replica (``vllm-sim``, ``--ttft-ms`` per request) and two ``gateway
serve`` processes in front of it that share flow control through Redis (``--redis``, a unique
key prefix per phase), with a fleet-wide ``in_flight`` threshold of ``--slots`` for the one
class both keys are in (weight 1 each). The heavy key sends from ``--heavy`` closed-loop workers
to pod 1; the light key, from ``--light-delay`` seconds on (when the heavy key already holds
the fleet: whichever pod holds a slot first keeps it without ``fair_share``), from ``--light``
workers to pod 2 (each worker sends its next request when the previous one ended). Two
phases of ``--window`` seconds, ``fair_share`` off then on (the gateways are restarted in
between), each measured after ``--warmup`` seconds.

Printed per phase: requests completed per key, the light key's share of them (the fair share is
0.5 as long as the light key has a request waiting: it has ``--light`` workers), and the light
key's p50 and p90 latency (queue wait plus the ~``--ttft-ms`` of service), milliseconds, and the
requests the fleet completed per second (what leaving a slot to the other pod costs).

Example (about one minute)::

    PYTHONPATH=$PWD .venv/bin/python bench/flow_pods.py
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from relay_procs import BIN, Proc, free_port

KEYS = {"heavy": "sg-bench-pods-heavy-key", "light": "sg-bench-pods-light-key"}


def gateway_config(sim_url: str, port: int, prefix: str, args: argparse.Namespace,
                   fair_share: bool) -> dict[str, Any]:
    """One pod's config: the shared flow control section, both keys in class ``batch``."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "served_model_name": "m", "replicas": [{"url": sim_url}]}],
        "keys": [{"id": k, "sha256": hashlib.sha256(v.encode()).hexdigest(), "models": ["*"]}
                 for k, v in KEYS.items()],
        "health": {"active": False},
        "logging": {"access_log": False},
        "flow_control": {
            "enabled": True,
            "classes": [{"name": "batch", "max_queue": 1000, "max_wait_s": 120}],
            "default_class": "batch",
            "share_cost": "requests",
            "saturation": {"in_flight": args.slots},
            "keys": {"heavy": {"class": "batch", "weight": 1},
                     "light": {"class": "batch", "weight": 1}},
            "shared": {"redis_url": args.redis, "key_prefix": prefix,
                       "interval_s": args.interval, "fair_share": fair_share},
        },
    }


async def worker(client: httpx.AsyncClient, url: str, key: str, stop_at: float,
                 out: list[tuple[float, float, int]], delay_s: float = 0.0) -> None:
    """After ``delay_s``, send one request after the other until ``stop_at``; record (start,
    latency, status)."""
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    await asyncio.sleep(delay_s)
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        try:
            r = await client.post(url + "/v1/chat/completions", json=body,
                                  headers={"authorization": f"Bearer {KEYS[key]}"})
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        out.append((t0, time.monotonic() - t0, status))
        if status != 200:
            await asyncio.sleep(0.5)


async def phase(pods: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Run both keys' workers for warmup + window; the figures of the window."""
    start = time.monotonic()
    stop_at = start + args.warmup + args.window
    calls: dict[str, list[tuple[float, float, int]]] = {"heavy": [], "light": []}
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0),
                                 limits=httpx.Limits(max_connections=200)) as client:
        await asyncio.gather(
            *(worker(client, pods[0], "heavy", stop_at, calls["heavy"])
              for _ in range(args.heavy)),
            *(worker(client, pods[1], "light", stop_at, calls["light"], args.light_delay)
              for _ in range(args.light)))
    after = start + args.warmup
    done = {k: [lat for t0, lat, st in v if st == 200 and t0 + lat >= after]
            for k, v in calls.items()}
    refused = {k: sum(1 for _, _, st in v if st != 200) for k, v in calls.items()}
    total = len(done["heavy"]) + len(done["light"])
    light = sorted(done["light"])
    return {
        "completed": {k: len(v) for k, v in done.items()},
        "not_200": refused,
        "light_share": len(light) / total if total else 0.0,
        "light_p50_ms": round(statistics.median(light) * 1000) if light else None,
        "light_p90_ms": (round(light[max(0, math.ceil(0.9 * len(light)) - 1)] * 1000)
                         if light else None),
        "fleet_per_s": round(total / args.window, 2),
        "heavy_p50_ms": (round(statistics.median(done["heavy"]) * 1000)
                         if done["heavy"] else None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--slots", type=int, default=2, help="fleet-wide in_flight threshold")
    ap.add_argument("--heavy", type=int, default=8, help="heavy key's workers (pod 1)")
    ap.add_argument("--light", type=int, default=2, help="light key's workers (pod 2)")
    ap.add_argument("--light-delay", type=float, default=1.0,
                    help="seconds before the light key starts (the heavy key holds the fleet)")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--interval", type=float, default=0.1, help="shared.interval_s")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-flow-pods-"))
    exe = BIN / "gateway"
    gw_argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "load_before": os.getloadavg()}
    port = free_port()
    sim = Proc(f"vllm-sim:{port}", [str(BIN / "vllm-sim"), "--port", str(port), "--model", "m",
                                    "--tokens", "4", "--ttft-ms", str(args.ttft_ms)],
               port, "/health")
    r = redis.Redis.from_url(args.redis)
    try:
        for fair in (False, True):
            prefix = f"sg:bench:pods:{uuid.uuid4().hex[:8]}:"
            pods: list[Proc] = []
            try:
                for i in range(2):
                    p = free_port()
                    path = workdir / f"pod{i + 1}-{'fair' if fair else 'plain'}.yaml"
                    path.write_text(yaml.safe_dump(gateway_config(sim.url, p, prefix, args,
                                                                  fair)))
                    pods.append(Proc(f"gateway:pod{i + 1}",
                                     [*gw_argv, "serve", "--config", str(path)], p, "/healthz",
                                     env=env))
                row = asyncio.run(phase([p.url for p in pods], args))
            finally:
                for p in pods:
                    p.stop()
                keys = list(r.scan_iter(match=prefix + "*"))
                if keys:
                    r.delete(*keys)
            name = "fair_share on" if fair else "fair_share off"
            report[name] = row
            print(f"{name:15s} completed heavy {row['completed']['heavy']:4d} light "
                  f"{row['completed']['light']:4d}  light share {row['light_share']:.2f}  "
                  f"light p50 {row['light_p50_ms']} ms p90 {row['light_p90_ms']} ms  "
                  f"heavy p50 {row['heavy_p50_ms']} ms  fleet {row['fleet_per_s']}/s  "
                  f"not-200 {row['not_200']}", flush=True)
    finally:
        sim.stop()
        r.close()
    report["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
