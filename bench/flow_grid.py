#!/usr/bin/env python3
"""Flow control over a grid of batch shapes: issue 32's target at every corner, not one point.

Target (issue 32): interactive p99 TTFT at most 1.5x its unloaded value for batch prompts of
64 to 4,096 tokens, batch outputs of 16 to 1,024 and interactive rates of 1 to 4 requests/s,
with batch throughput at or above its configured share. This runs the eight corners of that
grid and one middle point (``--prompts``, ``--outputs``, ``--rates``, ``--middle``) against
simulated replicas (``vllm-sim --profile``, as ``bench/routing.py --workload mixed`` starts
them: two replicas, ``max_num_seqs`` 8, time scale 10) behind one gateway process that serves
them as ``mixed-plain`` (no flow control) and ``mixed-fc`` (flow control,
``bench/routing_mixed.py``'s section).

Per point, three phases on the same replicas (reset in between), one after the other so that
the machine's load drifts little between them: ``unloaded`` (``--unloaded-window`` s of the
point's interactive traffic alone, ``mixed-plain``), then ``no-fc`` and ``fc`` (``--window`` s
each; both windows lengthened at low rates so that every phase measures at least
``--min-samples`` interactive requests, 100 by default: a p99 of fewer is their maximum):
the interactive traffic at the point's rate (one request every ``1/rate`` s) plus batch
work from two keys as a batch job sends it: a closed loop of ``--batch-concurrency`` workers
(default twice the fleet's sequence slots, two thirds of them the first key's), each sending
its next request when the previous one ended (one second later when it was refused). The
fleet is saturated from the first second whatever the batch shape, and the client holds a
bounded number of connections (an open-loop overload of short batch requests had the client
open hundreds, which it could not serve on two busy cores). At the end of the window every
request still open is cancelled (the client disconnects: the gateway and the simulator abort
it), so a 1,024-token answer does not hold the next phase back.

Measured per point, over the window after ``--warmup`` seconds:

* **interactive p99 TTFT** in ``fc`` over the point's unloaded p99 (target <= 1.5x);
  an interactive request without a first token by the end of the window counts with the time
  it waited; a refused one (429) counts as infinitely late;
* **batch throughput**: batch tokens streamed in the window per second (counted as the tokens
  arrive, so that answers longer than the window count too), ``fc`` over ``no-fc`` (target
  >= the configured share: ``--batch-in-flight`` / ``--max-num-seqs``, the fraction of each
  replica's sequence slots batch may hold).

**The unloaded reference** is the point's own interactive traffic (the same rate, prompts,
answers and send times) alone through the same gateway and the same replicas (``mixed-plain``,
least outstanding): interactive-only traffic at the same rate, which is what the issue's "its
unloaded value" names, not one request on an idle engine. Where the interactive requests
overlap each other (at time scale 10 a 16-token answer lasts about 1.19 s, so at 1 request/s
each arrival comes while the previous answer still runs), the reference spreads them over both
replicas and each arrival still finds an idle engine; a loaded arm that runs them on one
replica (a reserve of one) makes them wait for each other's steps. So the ratio counts what
an arm costs the interactive traffic, batch's interference and the engines it takes away
alike; batch's interference alone is the loaded p99 over the ``unloaded-reserve`` diagnostic
(the same traffic alone on the reserved replicas). This reference was kept (issue 32's words,
and a reference on one replica would hide what a reserve costs), and it sets a bound: a step
in progress is not interrupted (vLLM's nor the simulator's), so an arrival at a busy engine
waits up to one step (about 7 ms model time for this profile, 70 ms at time scale 10) beside
a reference TTFT of one step plus about 5 ms: at most about 2x, and 1.5x needs the arrivals to
find an idle engine nearly always. At 1 request/s on two replicas at time scale 10 the
interactive traffic alone keeps 1.19 engines busy, so only an arm that leaves batch almost
nothing meets 1.5x; at time scale 1 (answers of 0.12 s, 1 s apart) the reserve is idle at
arrivals and what is left is the host's CPU: with the interactive requests sent from the
batch job's event loop (``--interactive-client same``: runs 1 to 11, part of 12) that loop's lag
(``client_lag_p99_s`` per phase: 13-15 ms p99 under a 4,096-token batch job at time scale 1,
against 2-5 ms unloaded) was part of every interactive TTFT measured, so they are now sent
from a process of their own (``--interactive-client process``, the default); the lag is then
the batch client's alone.

``--reserve K`` adds an ``fc-reserve`` phase (``flow_control.reserve`` with K replicas), and
``--reserve-lower N`` beside it an ``fc-reserve-lower`` phase: the same traffic through a second
gateway process whose reserve also takes N batch requests per reserved replica once the others
are full (``reserve.lower_in_flight``; the reserve is one setting per gateway), so the two are
compared in one run on the same replicas. ``--reserve-busy S`` (with ``--reserve-lower``) adds an
``fc-reserve-busy`` phase through a third gateway process: ``lower_in_flight`` N with
``reserve.lower_busy_s`` S (the reserved replica takes batch only once interactive requests
have kept it busy for S seconds). ``--phases`` runs only the named phases of those (the
unloaded and ``no-fc`` phases always run), so that one point fits a short benchmark slot.

The replicas' scheduler follows vLLM's flags ``--long-prefill-token-threshold`` (at most that
many prompt tokens of one request per engine step) and ``--scheduling-policy priority`` (with
it the gateway sends each ``mixed-fc`` request's class as vLLM's ``priority``).

``--json`` writes every figure (drawn by ``bench/plots.py --grid``). Example (about 10
minutes)::

    .venv/bin/python bench/flow_grid.py --json .cache/bench/flow-grid.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from relay_procs import BIN, Proc, free_port
from routing_mixed import KEYS, SERVED
from routing_mixed import _config as mixed_config

from vllm_sim.profiles import get_profile


@dataclass
class Call:
    """One request of a phase and what the client saw (seconds from the phase start)."""

    cls: str
    key: str
    at_s: float
    prompt_tokens: int
    max_tokens: int
    status: int = 0
    code: str | None = None
    ttft_s: float | None = None
    token_at_s: list[float] = field(default_factory=list)


def _words(n: int, tag: str) -> str:
    # One simulator token per word: a hyphen would split ``batch-a00001w0`` into three.
    tag = tag.replace("-", "")
    return " ".join(f"{tag}{i}" for i in range(n))


def interactive_calls(rate: float, window_s: float, args: argparse.Namespace) -> list[Call]:
    """The interactive calls of one phase: one every ``1/rate`` seconds."""
    return [Call("interactive", "interactive", i / rate, args.interactive_prompt,
                 args.interactive_output) for i in range(int(window_s * rate))]


async def _batch_worker(client: httpx.AsyncClient, url: str, model: str, key: str,
                        prompt: int, output: int, calls: list[Call], t0: float,
                        window_s: float) -> None:
    """One worker of the batch job: the next request when the previous one ended."""
    while (at := time.monotonic() - t0) < window_s:
        call = Call("batch", key, at, prompt, output)
        calls.append(call)
        await _one(client, url, model, call, len(calls), t0)
        if call.status != 200:
            await asyncio.sleep(1.0)  # refused (429 queue_timeout): try again a bit later


async def _one(client: httpx.AsyncClient, url: str, model: str, call: Call, n: int,
               t0: float) -> None:
    await asyncio.sleep(max(0.0, t0 + call.at_s - time.monotonic()))
    tag = f"{call.key}{n:05d}w"
    body = {"model": model, "messages": [{"role": "user",
                                          "content": _words(call.prompt_tokens, tag)}],
            "max_tokens": call.max_tokens, "stream": True}
    headers = {"authorization": f"Bearer {KEYS[call.key]}"}
    start = time.monotonic()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 headers=headers) as resp:
            call.status = resp.status_code
            if resp.status_code != 200:
                data = json.loads(await resp.aread())
                call.code = (data.get("error") or {}).get("code")
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.monotonic()
                        if call.ttft_s is None:
                            call.ttft_s = now - start
                        call.token_at_s.append(now - t0)
    except (httpx.HTTPError, ValueError) as exc:
        call.code = type(exc).__name__


async def _loop_lag(lags: list[float], period_s: float = 0.01) -> None:
    """Append how late each ``period_s`` sleep of the client's event loop woke, seconds
    (until cancelled): the delay the client itself adds to a TTFT it measures."""
    while True:
        start = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append(time.monotonic() - start - period_s)


_Sent = tuple[int, "str | None", "float | None", list[float]]


def _interactive_client(gateway: str, model: str, plan: list[tuple[float, int, int]],
                        t0: float, window_s: float) -> list[_Sent]:
    """Send the interactive calls ``plan`` ((sent at, prompt tokens, max tokens) each) from
    this (child) process with its own event loop and client; cancel what is open at ``t0 +
    window_s`` (``time.monotonic()``: one clock for every process on Linux). Per call, what
    the client saw: (status, error code, TTFT, token arrival times), plain data to pickle."""
    calls = [Call("interactive", "interactive", at, p, o) for at, p, o in plan]

    async def send() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
            tasks = [asyncio.create_task(_one(client, gateway, model, c, n, t0))
                     for n, c in enumerate(calls)]
            if tasks:
                _done, pending = await asyncio.wait(
                    tasks, timeout=max(0.0, t0 + window_s - time.monotonic()))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    asyncio.run(send())
    return [(c.status, c.code, c.ttft_s, c.token_at_s) for c in calls]


async def run_phase(client: httpx.AsyncClient, gateway: str, urls: list[str], model: str,
                    calls: list[Call], window_s: float,
                    batch: tuple[int, int, int] | None = None, settle_s: float = 0.0,
                    prompt_tokens: list[float] | None = None,
                    lags: list[float] | None = None,
                    pool: ProcessPoolExecutor | None = None) -> float:
    """Send the interactive ``calls`` and, with ``batch`` = (workers, prompt, output), the batch
    job's (appended to ``calls``); cancel what is open at ``window_s``; reset the replicas.
    Then ``settle_s`` seconds more: an aborted request leaves at once, but the engine step it
    was in runs to its end (up to one full-budget prefill step, seconds at time scale 10), and
    the next phase must not start behind it. With ``prompt_tokens``, each replica's prompt
    tokens of the phase (``vllm:prompt_tokens_total`` before the reset) are appended to it:
    which replicas ran which work. With ``lags``, this process's event-loop lag every 10 ms
    of the window is appended to it (see :func:`_loop_lag`). With ``pool`` (one worker
    process), the interactive ``calls`` are sent from it, so that the batch job's client work
    does not delay the TTFTs the bench measures. The wall time, seconds."""
    t0 = time.monotonic()
    mine = len(calls)  # the interactive calls (the batch workers append theirs after them)
    child = None
    if pool is not None:
        plan = [(c.at_s, c.prompt_tokens, c.max_tokens) for c in calls]
        child = asyncio.get_running_loop().run_in_executor(
            pool, _interactive_client, gateway, model, plan, t0, window_s)
        tasks = []
    else:
        tasks = [asyncio.create_task(_one(client, gateway, model, c, n, t0))
                 for n, c in enumerate(calls)]
    probe = asyncio.create_task(_loop_lag(lags)) if lags is not None else None
    if batch is not None:
        workers, prompt, output = batch
        first = -(-2 * workers // 3)  # two thirds for the first key (it sends twice as much)
        tasks += [asyncio.create_task(_batch_worker(
                      client, gateway, model, "batch-a" if i < first else "batch-b", prompt,
                      output, calls, t0, window_s)) for i in range(workers)]
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=window_s)
    if child is not None:
        for c, seen in zip(calls[:mine], await child, strict=True):
            c.status, c.code, c.ttft_s, c.token_at_s = seen
    for task in [*pending, *([probe] if probe else [])]:
        task.cancel()
    await asyncio.gather(*pending, *([probe] if probe else []), return_exceptions=True)
    wall = time.monotonic() - t0
    for c in calls:  # still waiting for a first token when cancelled: count what it waited
        if c.cls == "interactive" and c.ttft_s is None and c.status in (0, 200):
            c.ttft_s = max(0.0, wall - c.at_s)
    await _reset(client, urls, prompt_tokens)
    await asyncio.sleep(settle_s)
    return wall


async def _reset(client: httpx.AsyncClient, urls: list[str],
                 prompt_tokens: list[float] | None = None) -> None:
    """Wait (bounded) until the aborted requests left every replica; empty the caches (and
    the counters: with ``prompt_tokens``, append each replica's prompt tokens before)."""
    deadline = time.monotonic() + 60
    for url in urls:
        while (await client.get(f"{url}/sim/stats")).json()["running"] and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.1)
        if prompt_tokens is not None:
            page = (await client.get(f"{url}/metrics")).text
            prompt_tokens.append(sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                                     if line.startswith("vllm:prompt_tokens_total")))
        await client.post(f"{url}/sim/reset")


def phase_windows(rate: float, args: argparse.Namespace) -> tuple[float, float]:
    """``(unloaded, loaded)`` window of a point at ``rate`` interactive requests/s, seconds:
    ``--unloaded-window`` and ``--window``, lengthened so that each phase measures at least
    ``--min-samples`` interactive requests (after the warm-up in a loaded phase). The p99 of
    n samples is the ``round(0.99 n)``-th smallest: below 100 samples it is the largest one,
    and comparing the largest of 12 unloaded samples with the largest of 21 loaded ones (the
    1 request/s points at the default windows) compares maxima of different sample sizes,
    not p99s."""
    need = args.min_samples / rate
    return (max(args.unloaded_window, need),
            max(args.window, args.warmup + need))


def _each(calls: list[Call]) -> list[list[float | None]]:
    """(sent at, TTFT) of every interactive call, seconds (``None``: no first token)."""
    return [[round(c.at_s, 3), c.ttft_s and round(c.ttft_s, 4)]
            for c in calls if c.cls == "interactive"]


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]


def interactive_p99(calls: list[Call], since_s: float) -> tuple[float, int, int]:
    """p99 TTFT of the interactive calls sent at or after ``since_s`` (refused: infinite);
    with how many were counted and how many were refused."""
    mine = [c for c in calls if c.cls == "interactive" and c.at_s >= since_s]
    refused = sum(1 for c in mine if c.status not in (0, 200))
    values = [c.ttft_s if c.ttft_s is not None and c.status in (0, 200) else float("inf")
              for c in mine]
    return _p99(values), len(values), refused


def batch_tok_s(calls: list[Call], start_s: float, end_s: float) -> float:
    """Batch tokens that arrived in ``[start_s, end_s]`` per second."""
    n = sum(1 for c in calls if c.cls == "batch" for t in c.token_at_s if start_s <= t <= end_s)
    return n / (end_s - start_s)


def grid_points(args: argparse.Namespace) -> list[tuple[int, int, float]]:
    """``(batch prompt, batch output, interactive rate)``: the corners, then the middle."""
    points = [(p, o, r) for p in args.prompts for o in args.outputs for r in args.rates]
    if args.middle:
        points.append(args.middle)
    return points


async def bench_grid(args: argparse.Namespace) -> dict[str, Any]:
    """Start the replicas and the gateway, run the unloaded phases and the grid; the report."""
    base = get_profile(args.profile)
    # The engine's scheduler options as vLLM's flags would set them (``--max-num-seqs``,
    # ``--long-prefill-token-threshold``, ``--scheduling-policy``).
    profile = base.model_copy(update={
        "name": f"{base.name}-seqs{args.max_num_seqs}", "max_num_seqs": args.max_num_seqs,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "scheduling_policy": args.scheduling_policy})
    workdir = Path(tempfile.mkdtemp(prefix="bench-flow-grid-"))
    (workdir / "profile.json").write_text(profile.model_dump_json())
    points = grid_points(args)
    longest = max(max(o for _, o, _ in points), args.interactive_output)
    # The simulator refuses a prompt plus max_tokens above its context (default 2,048) with a
    # 400, as vLLM does: give it room for the longest prompt and answer (and the template).
    context = max(p for p, _, _ in points) + longest + 256
    procs: list[Proc] = []
    pool: ProcessPoolExecutor | None = None
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report: dict[str, Any] = {"points": []}
    try:
        for _ in range(args.replicas):
            port = free_port()
            procs.append(Proc(f"vllm-sim:{port}", [
                str(BIN / "vllm-sim"), "--port", str(port), "--model", SERVED, "--profile",
                str(workdir / "profile.json"), "--time-scale", str(args.time_scale),
                "--tokens", str(longest), "--max-model-len", str(context)], port, "/health"))
        urls = [p.url for p in procs]
        port = free_port()
        cfg = gateway_config(urls, port, args)
        (workdir / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        exe = BIN / "gateway"
        gw_argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
        procs.append(Proc("gateway", [*gw_argv, "serve", "--config",
                                      str(workdir / "gateway.yaml")], port, "/healthz"))
        gateway = procs[-1].url
        # The ``fc-reserve-lower`` arm: the same replicas behind a second gateway whose
        # reserve takes ``--reserve-lower`` batch requests per reserved replica (the reserve
        # is one setting per gateway, so the arm with it needs its own process).
        gateway_lower = None
        if args.reserve and args.reserve_lower and "fc-reserve-lower" in args.phases:
            port = free_port()
            cfg_lower = gateway_config(urls, port, args)
            # lower_busy_s null: no streak (its default, 5 s, is the fc-reserve-busy arm).
            cfg_lower["flow_control"]["reserve"].update(lower_in_flight=args.reserve_lower,
                                                        lower_busy_s=None)
            (workdir / "gateway-lower.yaml").write_text(yaml.safe_dump(cfg_lower))
            procs.append(Proc("gateway-lower", [*gw_argv, "serve", "--config",
                                                str(workdir / "gateway-lower.yaml")],
                              port, "/healthz"))
            gateway_lower = procs[-1].url
        # The ``fc-reserve-busy`` arm: ``lower_in_flight`` with ``lower_busy_s`` (a third
        # gateway process, for the same reason).
        gateway_busy = None
        if (args.reserve and args.reserve_lower and args.reserve_busy is not None
                and "fc-reserve-busy" in args.phases):
            port = free_port()
            cfg_busy = gateway_config(urls, port, args)
            cfg_busy["flow_control"]["reserve"].update(
                lower_in_flight=args.reserve_lower, lower_busy_s=args.reserve_busy)
            (workdir / "gateway-busy.yaml").write_text(yaml.safe_dump(cfg_busy))
            procs.append(Proc("gateway-busy", [*gw_argv, "serve", "--config",
                                               str(workdir / "gateway-busy.yaml")],
                              port, "/healthz"))
            gateway_busy = procs[-1].url
        share = args.batch_in_flight / args.max_num_seqs
        workers = args.batch_concurrency or 2 * args.replicas * args.max_num_seqs
        # The longest engine step (a full token budget of prefill), seconds, plus a margin.
        settle = (profile.step_time_s(profile.max_num_batched_tokens, args.max_num_seqs,
                                      args.max_num_seqs * context) * args.time_scale + 0.5)
        if args.interactive_client == "process":
            # One worker process for the interactive client, started (and its imports done)
            # before the first phase.
            pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            await asyncio.get_running_loop().run_in_executor(pool, time.monotonic)
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0),
                                     limits=httpx.Limits(max_connections=1000)) as client:
            await _reset(client, urls)
            for prompt, output, rate in points:
                row: dict[str, Any] = {"batch_prompt": prompt, "batch_output": output,
                                       "interactive_rps": rate, "batch_workers": workers}
                unloaded_s, window_s = phase_windows(rate, args)
                calls = interactive_calls(rate, unloaded_s, args)
                lags: list[float] = []
                await run_phase(client, gateway, urls, "mixed-plain", calls, unloaded_s,
                                lags=lags, pool=pool)
                p99, n, refused = interactive_p99(calls, 0.0)
                row["unloaded"] = {"ttft_p99_s": p99, "interactive": n,
                                   "interactive_refused": refused, "window_s": unloaded_s,
                                   "interactive_each": _each(calls),
                                   "client_lag_p99_s": _p99(lags),
                                   "client_lag_max_s": max(lags or [0.0])}
                if args.reserve and "unloaded-reserve" in args.phases:
                    # Diagnostic, not the target's baseline: the interactive traffic alone on
                    # the reserved replicas only (what the reserve can give it at best).
                    calls = interactive_calls(rate, unloaded_s, args)
                    await run_phase(client, gateway, urls, "mixed-one", calls, unloaded_s,
                                    pool=pool)
                    p99, n, refused = interactive_p99(calls, 0.0)
                    row["unloaded-reserve"] = {"ttft_p99_s": p99, "interactive": n,
                                               "interactive_refused": refused,
                                               "window_s": unloaded_s,
                                               "interactive_each": _each(calls)}
                phases = [("no-fc", "mixed-plain", gateway)]
                if "fc" in args.phases:
                    phases.append(("fc", "mixed-fc", gateway))
                if args.reserve and "fc-reserve" in args.phases:
                    phases.append(("fc-reserve", "mixed-fcr", gateway))
                if gateway_lower is not None:
                    phases.append(("fc-reserve-lower", "mixed-fcr", gateway_lower))
                if gateway_busy is not None:
                    phases.append(("fc-reserve-busy", "mixed-fcr", gateway_busy))
                for phase, model, via in phases:
                    calls = interactive_calls(rate, window_s, args)
                    replica_tokens: list[float] = []
                    lags = []
                    await run_phase(client, via, urls, model, calls, window_s,
                                    (workers, prompt, output), settle, replica_tokens, lags,
                                    pool)
                    p99, n, refused = interactive_p99(calls, args.warmup)
                    batch = [c for c in calls if c.cls == "batch"]
                    row[phase] = {
                        "ttft_p99_s": p99, "interactive": n, "interactive_refused": refused,
                        "batch_tok_s": batch_tok_s(calls, args.warmup, window_s),
                        "window_s": window_s,
                        "batch_requests": len(batch),
                        "replica_prompt_tokens": replica_tokens,
                        "batch_refused": sum(1 for c in batch if c.status not in (0, 200)),
                        "interactive_each": _each(calls),
                        # This process's event-loop lag (a floor under the TTFTs it
                        # measures with --interactive-client same).
                        "client_lag_p99_s": _p99(lags), "client_lag_max_s": max(lags or [0.0]),
                    }
                unloaded = row["unloaded"]["ttft_p99_s"]
                row["ttft_ratio_no_fc"] = row["no-fc"]["ttft_p99_s"] / unloaded
                full = row["no-fc"]["batch_tok_s"]
                row["share"] = share
                line = f"  point {prompt}/{output} @ {rate:g} req/s: unloaded p99 {unloaded:.3f} s"
                for phase, suffix in (("fc", ""), ("fc-reserve", "_reserve"),
                                      ("fc-reserve-lower", "_lower"),
                                      ("fc-reserve-busy", "_busy")):
                    if phase not in row:
                        continue
                    ratio = row[f"ttft_ratio{suffix}"] = row[phase]["ttft_p99_s"] / unloaded
                    tput = row[f"batch_ratio{suffix}"] = (row[phase]["batch_tok_s"] / full
                                                          if full else float("nan"))
                    row[f"pass{suffix}"] = bool(ratio <= args.target and tput >= share)
                    line += (f"; {phase} TTFT x{ratio:.2f}, batch x{tput:.3f}, client lag "
                             f"p99 {row[phase]['client_lag_p99_s'] * 1000:.1f} ms")
                report["points"].append(row)
                print(line, file=sys.stderr)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        for p in reversed(procs):
            p.stop()
    report["params"] = {
        "replicas": args.replicas, "profile": profile.name, "time_scale": args.time_scale,
        "max_num_seqs": args.max_num_seqs, "batch_in_flight": args.batch_in_flight,
        "batch_prefill_tokens": args.batch_prefill_tokens, "strategy": args.strategy,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "scheduling_policy": args.scheduling_policy, "reserve": args.reserve,
        "reserve_lower": args.reserve_lower if args.reserve else 0,
        "reserve_busy_s": args.reserve_busy, "phases": args.phases,
        "window_s": args.window, "warmup_s": args.warmup, "unloaded_window_s":
        args.unloaded_window, "min_samples": args.min_samples, "batch_workers": workers,
        "target": args.target, "interactive_client": args.interactive_client,
        "interactive_prompt/output": f"{args.interactive_prompt}/{args.interactive_output}",
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "started": started,
        "ended": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return report


def gateway_config(urls: list[str], port: int, args: argparse.Namespace) -> dict[str, Any]:
    """``bench/routing_mixed.py``'s config, with the grid's strategy and token threshold."""
    cfg = mixed_config(urls, port, args)
    for model in cfg["models"]:
        model["strategy"] = args.strategy
    if args.strategy == "prefix_affinity":
        # Its prompt-token estimate (prefill_tokens) is characters / chars_per_token: the
        # workload's words are ~16 characters per simulator token, not English's ~4.
        cfg["routing"]["chars_per_token"] = round(len(_words(512, "batch-a00000w")) / 512, 2)
    if args.scheduling_policy == "priority":
        # The replicas run vLLM's priority scheduling: the flow-controlled model sends each
        # request's class as ``priority`` (interactive 0, batch 1); ``mixed-plain`` sends none.
        cfg["flow_control"]["vllm_priority_models"] = ["mixed-fc"]
    if args.batch_prefill_tokens is not None:
        batch = cfg["flow_control"]["classes"][1]
        batch["saturation"]["prefill_tokens"] = args.batch_prefill_tokens
    if args.reserve:
        # The A/B arm: ``mixed-fcr`` is ``mixed-fc`` with ``args.reserve`` replicas kept free
        # of batch (flow_control.reserve, applied to that model only).
        fcr = dict(cfg["models"][-1], name="mixed-fcr")
        one = dict(cfg["models"][0], name="mixed-one",
                   replicas=cfg["models"][0]["replicas"][: args.reserve])
        cfg["models"] += [fcr, one]
        flow = cfg["flow_control"]
        flow["models"] = [*flow["models"], "mixed-fcr"]
        if "vllm_priority_models" in flow:
            flow["vllm_priority_models"] = [*flow["vllm_priority_models"], "mixed-fcr"]
        flow["reserve"] = {"replicas": args.reserve, "models": ["mixed-fcr"],
                           "widen_at": args.reserve_widen_at, "hold_s": args.reserve_hold}
    return cfg


_ARMS = (("fc", ""), ("fc-reserve", "_reserve"), ("fc-reserve-lower", "_lower"),
         ("fc-reserve-busy", "_busy"))


def print_phases(report: dict[str, Any]) -> None:
    """The grid as a markdown table, one row per point and loaded phase (any ``--phases``)."""
    params = report["params"]
    warm = params["warmup_s"]
    print(f"\n## flow-control grid  ({', '.join(f'{k}={v}' for k, v in params.items())})")
    print("| batch prompt | batch output | interactive req/s | phase | unloaded p99 | p50 | "
          "p99 (x unloaded) | batch / no-fc | prompt tokens per replica | result |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---|---|")
    for row in report["points"]:
        un = row["unloaded"]["ttft_p99_s"]
        for phase, suffix in (("no-fc", None), *_ARMS):
            if phase not in row:
                continue
            ph = row[phase]
            ratio = ph["ttft_p99_s"] / un
            tput = "1.000x" if suffix is None else f"{row[f'batch_ratio{suffix}']:.3f}x"
            verdict = "-" if suffix is None else ("PASS" if row[f"pass{suffix}"] else "FAIL")
            print(f"| {row['batch_prompt']} | {row['batch_output']} "
                  f"| {row['interactive_rps']:g} | {phase} | {un:.3f} s "
                  f"| {_p50_each(ph, warm):.3f} s | {ph['ttft_p99_s']:.3f} s ({ratio:.2f}x) "
                  f"| {tput} | {_tokens(ph)} | {verdict} |")


def print_table(report: dict[str, Any]) -> None:
    """The grid as a markdown table, one row per point (:func:`print_phases` when
    ``--phases`` left out a phase these tables show, or with ``--reserve-busy``)."""
    params = report["params"]
    if set(params.get("phases") or ()) != {"unloaded-reserve", "fc", "fc-reserve",
                                           "fc-reserve-lower", "fc-reserve-busy"} or (
            params.get("reserve_busy_s") is not None):
        print_phases(report)
        return
    print(f"\n## flow-control grid  ({', '.join(f'{k}={v}' for k, v in params.items())})")
    print("| batch prompt | batch output | interactive req/s | unloaded p99 TTFT | fc p99 TTFT "
          "(x unloaded) | no-fc p99 (x) | batch tok/s fc / no-fc (x) | share | result |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    reserve = params.get("reserve")
    for row in report["points"]:
        un = row["unloaded"]["ttft_p99_s"]
        fc, nofc = row["fc"], row["no-fc"]
        print(f"| {row['batch_prompt']} | {row['batch_output']} | {row['interactive_rps']:g} "
              f"| {un:.3f} s | {fc['ttft_p99_s']:.3f} s ({row['ttft_ratio']:.2f}x) "
              f"| {nofc['ttft_p99_s']:.3f} s ({row['ttft_ratio_no_fc']:.1f}x) "
              f"| {fc['batch_tok_s']:.0f} / {nofc['batch_tok_s']:.0f} "
              f"({row['batch_ratio']:.2f}x) | {row['share']:.2f} "
              f"| {'PASS' if row['pass'] else 'FAIL'} |")
    if reserve:
        print(f"\nfc-reserve (reserve.replicas {reserve}) in the same run:\n")
        print("| batch prompt | batch output | interactive req/s | unloaded p99 TTFT | "
              "unloaded on the reserve alone p99 | fc-reserve p99 TTFT (x unloaded) | "
              "fc-reserve p50 | fc p50 | batch tok/s fc-reserve / no-fc (x) | prompt tokens "
              "per replica fc-reserve (fc) | result |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for row in report["points"]:
            fcr = row["fc-reserve"]
            warm = params["warmup_s"]
            print(f"| {row['batch_prompt']} | {row['batch_output']} "
                  f"| {row['interactive_rps']:g} | {row['unloaded']['ttft_p99_s']:.3f} s "
                  f"| {row['unloaded-reserve']['ttft_p99_s']:.3f} s "
                  f"| {fcr['ttft_p99_s']:.3f} s ({row['ttft_ratio_reserve']:.2f}x) "
                  f"| {_p50_each(fcr, warm):.3f} s | {_p50_each(row['fc'], warm):.3f} s "
                  f"| {fcr['batch_tok_s']:.0f} / {row['no-fc']['batch_tok_s']:.0f} "
                  f"({row['batch_ratio_reserve']:.2f}x) "
                  f"| {_tokens(fcr)} ({_tokens(row['fc'])}) "
                  f"| {'PASS' if row['pass_reserve'] else 'FAIL'} |")
        passed_r = sum(1 for r in report["points"] if r["pass_reserve"])
        print(f"\nfc-reserve: {passed_r} of {len(report['points'])} points pass")
    if params.get("reserve_lower"):
        print(f"\nfc-reserve-lower (reserve.lower_in_flight {params['reserve_lower']}) beside "
              "fc-reserve in the same run:\n")
        print("| batch prompt | batch output | interactive req/s | unloaded p99 TTFT | "
              "fc-reserve p99 (x) | fc-reserve-lower p99 (x) | fc-reserve / -lower p50 | "
              "batch fc-reserve / no-fc | batch fc-reserve-lower / no-fc | prompt tokens "
              "per replica, -lower | fc-reserve | fc-reserve-lower |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
        for row in report["points"]:
            fcr, low = row["fc-reserve"], row["fc-reserve-lower"]
            warm = params["warmup_s"]
            print(f"| {row['batch_prompt']} | {row['batch_output']} "
                  f"| {row['interactive_rps']:g} | {row['unloaded']['ttft_p99_s']:.3f} s "
                  f"| {fcr['ttft_p99_s']:.3f} s ({row['ttft_ratio_reserve']:.2f}x) "
                  f"| {low['ttft_p99_s']:.3f} s ({row['ttft_ratio_lower']:.2f}x) "
                  f"| {_p50_each(fcr, warm):.3f} / {_p50_each(low, warm):.3f} s "
                  f"| {row['batch_ratio_reserve']:.3f}x | {row['batch_ratio_lower']:.3f}x "
                  f"| {_tokens(low)} "
                  f"| {'PASS' if row['pass_reserve'] else 'FAIL'} "
                  f"| {'PASS' if row['pass_lower'] else 'FAIL'} |")
        passed_l = sum(1 for r in report["points"] if r["pass_lower"])
        print(f"\nfc-reserve-lower: {passed_l} of {len(report['points'])} points pass")
    passed = sum(1 for r in report["points"] if r["pass"])
    print(f"\n{passed} of {len(report['points'])} points pass (interactive p99 TTFT <= "
          f"{params['target']}x unloaded and batch >= its share)")


def _p50_each(phase: dict[str, Any], warmup_s: float) -> float:
    """p50 TTFT of a phase's interactive requests sent after the warm-up, seconds."""
    values = sorted(t for at, t in phase["interactive_each"] if t is not None and at >= warmup_s)
    return values[len(values) // 2] if values else float("nan")


def _tokens(phase: dict[str, Any]) -> str:
    """Each replica's prompt tokens in a phase, thousands (``12.3k / 0.9k``)."""
    return " / ".join(f"{t / 1000:.1f}k" for t in phase["replica_prompt_tokens"])


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _middle(text: str) -> tuple[int, int, float] | None:
    if text in ("", "none"):
        return None
    p, o, r = text.split(",")
    return int(p), int(o), float(r)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (``--help``).

    Raises:
        SystemExit: A flag is malformed (argparse's usage error, exit status 2).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=_ints, default=[64, 4096], help="batch prompt tokens")
    ap.add_argument("--outputs", type=_ints, default=[16, 1024], help="batch output tokens")
    ap.add_argument("--rates", type=_floats, default=[1.0, 4.0], help="interactive req/s")
    ap.add_argument("--middle", type=_middle, default=(512, 128, 2.0),
                    help="PROMPT,OUTPUT,RATE of the middle point ('none': no middle)")
    ap.add_argument("--window", type=float, default=25.0, help="s per loaded phase")
    ap.add_argument("--warmup", type=float, default=4.0, help="s not measured at the start")
    ap.add_argument("--unloaded-window", type=float, default=12.0, help="s per unloaded phase")
    ap.add_argument("--min-samples", type=int, default=100,
                    help="interactive requests measured per phase at least (lengthens the "
                         "windows at low rates: a p99 of fewer than 100 is the maximum)")
    ap.add_argument("--target", type=float, default=1.5, help="p99 TTFT ratio at most")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--batch-in-flight", type=int, default=4)
    ap.add_argument("--batch-prefill-tokens", type=float, default=None,
                    help="flow control: the batch class's prefill_tokens threshold")
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0,
                    help="the replicas' vLLM --long-prefill-token-threshold (0: no cap)")
    ap.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                    help="the replicas' vLLM --scheduling-policy (priority: the gateway sends "
                         "the class's priority for mixed-fc)")
    ap.add_argument("--strategy", default="least_outstanding",
                    choices=["least_outstanding", "round_robin", "prefix_affinity"])
    ap.add_argument("--batch-concurrency", type=int, default=None,
                    help="batch workers (closed loop); default 2 x replicas x max_num_seqs")
    ap.add_argument("--interactive-prompt", type=int, default=32)
    ap.add_argument("--interactive-output", type=int, default=16)
    ap.add_argument("--batch-max-wait", type=float, default=15.0)
    ap.add_argument("--interactive-max-wait", type=float, default=10.0)
    ap.add_argument("--reserve", type=int, default=0,
                    help="also run an fc-reserve phase: flow_control.reserve with this many "
                         "replicas kept free of batch (0: no such phase)")
    ap.add_argument("--reserve-lower", type=int, default=0,
                    help="with --reserve, also run an fc-reserve-lower phase through a second "
                         "gateway whose reserve takes this many batch requests per reserved "
                         "replica (reserve.lower_in_flight; 0: no such phase)")
    ap.add_argument("--reserve-busy", type=float, default=None,
                    help="with --reserve-lower, also run an fc-reserve-busy phase through a "
                         "third gateway: lower_in_flight with reserve.lower_busy_s this many "
                         "seconds")
    ap.add_argument("--phases", type=lambda t: t.split(","),
                    default=["unloaded-reserve", "fc", "fc-reserve", "fc-reserve-lower",
                             "fc-reserve-busy"],
                    help="the optional phases to run, comma-separated (default all that the "
                         "other flags enable); unloaded and no-fc always run")
    ap.add_argument("--reserve-widen-at", type=float, default=1.0)
    ap.add_argument("--reserve-hold", type=float, default=10.0)
    ap.add_argument("--interactive-client", default="process", choices=["process", "same"],
                    help="send the interactive requests from a process of their own (default) "
                         "or from the batch job's event loop (runs 1 to 11, part of 12: the "
                         "batch client's work then delays the TTFTs measured)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the grid, print the table (and write ``--json``); 0 whatever the verdicts."""
    args = parse_args(argv)
    report = asyncio.run(bench_grid(args))
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
