"""The ``mixed`` workload of ``bench/routing.py``: flow control with and without, in one run.

Two simulated replicas (``vllm-sim --profile``; the profile is ``--profile`` with
``max_num_seqs`` set to ``--max-num-seqs``, as a vLLM started with ``--max-num-seqs``) behind one
gateway process that serves the same replicas as two models: ``mixed-plain`` (no flow control)
and ``mixed-fc`` (flow control). Traffic:

* **interactive**: one key, short prompts and answers, one request every ``1/--interactive-rate``
  seconds (a steady rate);
* **batch**: two keys of equal weight, long answers, Poisson arrivals at ``--overload`` x the
  fleet's batch capacity (estimated from the profile), the first key sending twice as many as
  the second.

Phases, one after the other on the same replicas (drained and reset in between): ``baseline``
(interactive only, ``mixed-plain``), ``idle-fc`` (interactive only, ``mixed-fc``: no regression
below saturation), ``no-fc`` (interactive + batch, ``mixed-plain``), ``fc`` (interactive + batch,
``mixed-fc``). Printed: interactive TTFT p50/p99 and their ratio to the baseline (target
<= 1.5x under batch load with flow control), batch output tokens/s in the arrival window and
its share of the fleet's slots, the two batch keys' served ratio (target within +-10 %), and
whether every flow-controlled request was served or refused within its class's maximum wait.

**Configured share** of batch: its ``in_flight`` threshold over ``max_num_seqs``
(``--batch-in-flight`` / ``--max-num-seqs``), the fraction of each replica's sequence slots
that batch requests may hold. The target is batch output tokens/s with flow control (``fc``) of
at least that share of batch output tokens/s without it (``no-fc``, where batch may hold every
slot the interactive requests leave), both counted for the requests that ended within the
arrival window of the same run. Also printed: the time-averaged requests in flight per replica
and class (response head to end, as the client sees them), to compare with the threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from relay_procs import BIN, Proc, free_port

from vllm_sim.profiles import get_profile, load_profile

SERVED = "sim-model"
KEYS = {"interactive": "sg-mixed-interactive", "batch-a": "sg-mixed-batch-a",
        "batch-b": "sg-mixed-batch-b"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of the ``mixed`` workload (added to ``bench/routing.py``'s parser)."""
    g = ap.add_argument_group("mixed workload")
    g.add_argument("--mixed-duration", type=float, default=90.0, help="arrival window, s")
    g.add_argument("--mixed-baseline-duration", type=float, default=20.0)
    g.add_argument("--max-num-seqs", type=int, default=8)
    g.add_argument("--interactive-rate", type=float, default=2.0, help="requests/s")
    g.add_argument("--interactive-prompt", type=int, default=32, help="tokens")
    g.add_argument("--interactive-output", type=int, default=16, help="tokens")
    g.add_argument("--batch-prompt", type=int, default=64, help="tokens")
    g.add_argument("--batch-output", type=int, default=128, help="tokens")
    g.add_argument("--overload", type=float, default=1.5,
                   help="batch arrival rate / fleet batch capacity")
    g.add_argument("--batch-in-flight", type=int, default=4,
                   help="flow control: batch requests per replica at most (its configured "
                   "share is this over --max-num-seqs)")
    g.add_argument("--batch-max-wait", type=float, default=15.0, help="s")
    g.add_argument("--interactive-max-wait", type=float, default=10.0, help="s")


@dataclass
class Shot:
    """One request of the mixed workload and what the client saw (seconds from phase start)."""

    cls: str
    key: str
    at_s: float
    prompt: str
    max_tokens: int
    status: int = 0
    code: str | None = None
    head_s: float = 0.0  # until the response status line
    ttft_s: float = 0.0  # until the first content token
    end_s: float = 0.0
    tokens: int = 0


def _words(n: int, tag: str) -> str:
    # Tags of one length (zero-padded): the requests of both batch keys cost the same tokens,
    # so their fair share in tokens is also one in requests. No hyphen: the simulator counts
    # ``batch-a00001w0`` as three tokens, which made the batch prompts three times as long.
    tag = tag.replace("-", "")
    return " ".join(f"{tag}{i}" for i in range(n))


def _schedule(args: argparse.Namespace, duration: float, batch_rate: float,
              seed: int) -> list[Shot]:
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    shots: list[Shot] = []
    n = int(duration * args.interactive_rate)
    for i in range(n):
        shots.append(Shot("interactive", "interactive", i / args.interactive_rate,
                          _words(args.interactive_prompt, f"i{i:05d}w"), args.interactive_output))
    for key, share in (("batch-a", 2 / 3), ("batch-b", 1 / 3)):
        t, i = 0.0, 0
        rate = batch_rate * share
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= duration:
                break
            shots.append(Shot("batch", key, t, _words(args.batch_prompt, f"{key}{i:05d}w"),
                              args.batch_output))
            i += 1
    return sorted(shots, key=lambda s: s.at_s)


async def _one(client: httpx.AsyncClient, url: str, model: str, shot: Shot, t0: float) -> None:
    await asyncio.sleep(max(0.0, t0 + shot.at_s - time.monotonic()))
    body = {"model": model, "messages": [{"role": "user", "content": shot.prompt}],
            "max_tokens": shot.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"authorization": f"Bearer {KEYS[shot.key]}"}
    start = time.monotonic()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 headers=headers) as resp:
            shot.status = resp.status_code
            shot.head_s = time.monotonic() - start
            if resp.status_code != 200:
                data = json.loads(await resp.aread())
                shot.code = (data.get("error") or {}).get("code")
                shot.end_s = time.monotonic() - t0
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content") and not shot.ttft_s:
                        shot.ttft_s = time.monotonic() - start
                if event.get("usage"):
                    shot.tokens = int(event["usage"].get("completion_tokens") or 0)
    except (httpx.HTTPError, ValueError) as exc:
        shot.code = type(exc).__name__
    shot.end_s = time.monotonic() - t0


async def _drain(client: httpx.AsyncClient, urls: list[str]) -> None:
    deadline = time.monotonic() + 300
    for url in urls:
        while (await client.get(f"{url}/sim/stats")).json()["running"] and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.1)
        await client.post(f"{url}/sim/reset")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _occupancy(shots: list[Shot], start: float, end: float) -> float:
    """Time-averaged number of ``shots`` in flight (response started, not ended) in
    ``[start, end]`` seconds from the phase start (a served request holds a sequence slot of a
    replica from its response head to its end, give or take the loopback hops)."""
    held = 0.0
    for s in shots:
        if s.status != 200:
            continue
        a, b = max(start, s.at_s + s.head_s), min(end, s.end_s)
        held += max(0.0, b - a)
    return held / (end - start)


def _summary(shots: list[Shot], duration: float, max_wait: dict[str, float],
             flow: bool) -> dict[str, Any]:
    inter = [s for s in shots if s.cls == "interactive"]
    batch = [s for s in shots if s.cls == "batch"]
    ok_i = [s.ttft_s for s in inter if s.status == 200 and s.ttft_s]
    done_b = [s for s in batch if s.status == 200 and s.tokens and s.end_s <= duration]
    # Dispatched (response started) in the steady part of the arrival window, after its first
    # quarter: both keys have requests waiting then, and their share is the fair-share ratio.
    served = {k: sum(1 for s in batch if s.key == k and s.status == 200
                     and duration / 4 <= s.at_s + s.head_s <= duration)
              for k in ("batch-a", "batch-b")}
    heads = [s.head_s for s in batch if s.status == 200]
    late = [s for s in shots if flow and s.head_s > max_wait[s.cls] + 2.0]
    codes: dict[str, int] = {}
    for s in shots:
        if s.status != 200:
            codes[s.code or str(s.status)] = codes.get(s.code or str(s.status), 0) + 1
    return {
        "interactive": len(inter), "interactive_ok": len(ok_i),
        "ttft_p50_s": _pct(ok_i, 50), "ttft_p99_s": _pct(ok_i, 99),
        "batch": len(batch),
        "batch_tok_s": sum(s.tokens for s in done_b) / duration,
        "batch_served": served,
        "key_ratio": served["batch-a"] / served["batch-b"] if served["batch-b"] else None,
        "refused": codes,
        "batch_head_p50_s": _pct(heads, 50), "batch_head_max_s": max(heads, default=0.0),
        "late": len(late),
        # Mean requests in flight over the steady part of the window, fleet-wide.
        "interactive_in_flight": _occupancy(inter, duration / 4, duration),
        "batch_in_flight": _occupancy(batch, duration / 4, duration),
    }


def _config(urls: list[str], port: int, args: argparse.Namespace) -> dict[str, Any]:
    models = [{"name": name, "served_model_name": SERVED, "replicas": [{"url": u} for u in urls]}
              for name in ("mixed-plain", "mixed-fc")]
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": models,
        "keys": [{"id": k, "sha256": hashlib.sha256(v.encode()).hexdigest(), "models": ["*"]}
                 for k, v in KEYS.items()],
        "health": {"active": False},
        "logging": {"access_log": False},
        "timeouts": {"first_byte_s": 600, "idle_s": 600},
        "routing": {"metrics_interval_s": 0.1, "metrics_stale_s": 1.0},
        "flow_control": {
            "enabled": True,
            "models": ["mixed-fc"],
            "classes": [
                {"name": "interactive", "max_queue": 100,
                 "max_wait_s": args.interactive_max_wait},
                {"name": "batch", "max_queue": 10000, "max_wait_s": args.batch_max_wait,
                 "saturation": {"queue_depth": 2, "in_flight": args.batch_in_flight}},
            ],
            "default_class": "batch",
            "saturation": {"queue_depth": 4, "in_flight": args.max_num_seqs},
            "keys": {"interactive": {"class": "interactive"},
                     "batch-a": {"class": "batch", "weight": 1},
                     "batch-b": {"class": "batch", "weight": 1}},
        },
    }


async def bench_mixed(args: argparse.Namespace) -> dict[str, Any]:
    """Run the four phases; print the table; return the report."""
    base = (load_profile(Path(args.profile)) if args.profile.endswith(".json")
            else get_profile(args.profile))
    profile = base.model_copy(update={"name": f"{base.name}-seqs{args.max_num_seqs}",
                                      "max_num_seqs": args.max_num_seqs})
    workdir = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    profile_file = workdir / "profile.json"
    profile_file.write_text(profile.model_dump_json())
    step = profile.step_time_s(0, args.max_num_seqs, args.max_num_seqs
                               * (args.batch_prompt + args.batch_output // 2))
    batch_cost_s = (args.batch_output * step + args.batch_prompt / profile.prefill_tokens_per_s)
    capacity = args.replicas * args.max_num_seqs / (batch_cost_s * args.time_scale)
    batch_rate = args.overload * capacity
    procs: list[Proc] = []
    load0 = os.getloadavg()
    report: dict[str, Any] = {}
    try:
        for _ in range(args.replicas):
            port = free_port()
            procs.append(Proc(f"vllm-sim:{port}", [
                str(BIN / "vllm-sim"), "--port", str(port), "--model", SERVED, "--profile",
                str(profile_file), "--time-scale", str(args.time_scale), "--tokens",
                str(max(args.batch_output, args.interactive_output))], port, "/health"))
        urls = [p.url for p in procs]
        port = free_port()
        cfg_path = workdir / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(urls, port, args)))
        exe = BIN / "gateway"
        gw_argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
        procs.append(Proc("gateway", [*gw_argv, "serve", "--config", str(cfg_path)], port,
                          "/healthz"))
        gateway = procs[-1].url
        max_wait = {"interactive": args.interactive_max_wait, "batch": args.batch_max_wait}
        phases = [("baseline", "mixed-plain", args.mixed_baseline_duration, 0.0),
                  ("idle-fc", "mixed-fc", args.mixed_baseline_duration, 0.0),
                  ("no-fc", "mixed-plain", args.mixed_duration, batch_rate),
                  ("fc", "mixed-fc", args.mixed_duration, batch_rate)]
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0),
                                     limits=httpx.Limits(max_connections=4000)) as client:
            for name, model, duration, rate in phases:
                await _drain(client, urls)
                shots = _schedule(args, duration, rate, args.seed)
                t0 = time.monotonic()
                await asyncio.gather(*(_one(client, gateway, model, s, t0) for s in shots))
                wall = time.monotonic() - t0
                report[name] = _summary(shots, duration, max_wait, model == "mixed-fc")
                report[name]["wall_s"] = wall
                print(f"  mixed {name}: {len(shots)} requests in {wall:.1f}s", file=sys.stderr)
    finally:
        for p in reversed(procs):
            p.stop()
    params = {"replicas": args.replicas, "profile": profile.name,
              "time_scale": args.time_scale, "batch_capacity_rps": round(capacity, 2),
              "batch_rate_rps": round(batch_rate, 2),
              "interactive_rps": args.interactive_rate,
              "interactive_prompt/output": f"{args.interactive_prompt}/{args.interactive_output}",
              "batch_prompt/output": f"{args.batch_prompt}/{args.batch_output}",
              "batch_in_flight": f"{args.batch_in_flight} of {args.max_num_seqs}",
              "max_wait_s": f"interactive {args.interactive_max_wait}, batch {args.batch_max_wait}",
              "loadavg_start": tuple(round(x, 2) for x in load0),
              "loadavg_end": tuple(round(x, 2) for x in os.getloadavg())}
    _print(report, params, args)
    return {"params": params, "results": report}


def _print(report: dict[str, Any], params: dict[str, Any], args: argparse.Namespace) -> None:
    base = report["baseline"]["ttft_p99_s"]
    full = report["no-fc"]["batch_tok_s"]
    print(f"\n## mixed  ({', '.join(f'{k}={v}' for k, v in params.items())})")
    print("| phase | interactive TTFT p50 | TTFT p99 (x baseline) | batch out tok/s (x no-fc) "
          "| batch dispatched a/b (ratio) | refused | later than max wait |")
    print("|---|---|---|---|---|---|---|")
    for name, row in report.items():
        served = row["batch_served"]
        ratio = f"{row['key_ratio']:.2f}" if row["key_ratio"] else "-"
        tok = (f"{row['batch_tok_s']:.0f} ({row['batch_tok_s'] / full:.2f}x)"
               if row["batch"] and full else "-")
        print(f"| {name} | {row['ttft_p50_s']:.3f} | {row['ttft_p99_s']:.3f} "
              f"({row['ttft_p99_s'] / base:.2f}x) | {tok} | "
              f"{served['batch-a']}/{served['batch-b']} ({ratio}) | "
              f"{json.dumps(row['refused'])} | {row['late']} |")
    fc = report["fc"]
    share = args.batch_in_flight / args.max_num_seqs  # the configured share (module docstring)
    print(f"\ninteractive p99 TTFT under batch load with flow control: "
          f"{fc['ttft_p99_s'] / base:.2f}x baseline (target <= 1.5x); without: "
          f"{report['no-fc']['ttft_p99_s'] / base:.2f}x")
    print(f"batch throughput with flow control: {fc['batch_tok_s'] / full:.2f}x of the batch "
          f"throughput without (target >= its configured share: in_flight "
          f"{args.batch_in_flight} / max_num_seqs {args.max_num_seqs} = {share:.2f})")
    if fc["key_ratio"]:
        print(f"batch keys dispatched a/b with flow control (last 3/4 of the window): "
              f"{fc['key_ratio']:.2f} (target 1 +- 0.10; arrivals 2 : 1)")
    print(f"flow-controlled requests answered later than their class's max wait (+2 s): "
          f"{fc['late'] + report['idle-fc']['late']}")
    n = args.replicas
    for name in ("no-fc", "fc"):
        row = report[name]
        batch, inter = row["batch_in_flight"] / n, row["interactive_in_flight"] / n
        print(f"{name}: mean requests in flight per replica (last 3/4 of the window): batch "
              f"{batch:.2f}, interactive {inter:.2f} (batch in_flight threshold "
              f"{args.batch_in_flight}, max_num_seqs {args.max_num_seqs})")
