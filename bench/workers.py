"""``gateway serve --workers N``: the same paced streams through 1 and 2 workers, in one run.

    python bench/workers.py [--streams 1024] [--tokens 200] [--itl-ms 20] [--workers 1,2]
                            [--harness auto|c|python]

One backend paces tokens (``--itl-ms`` apart, ``--tokens`` per stream, one token per SSE
event); ``--streams`` streams are opened at once, each on its own connection, directly against
the simulator and through a gateway with each worker count (same config, telemetry on for
both so the pod's ``/metrics`` tells when every worker serves). Reported per target: streams
completed, stall-free streams (no gap between events above 100 ms), p99 inter-event gap,
events/s, and CPU seconds of the whole process tree (supervisor + workers) per relayed event.
With ``--harness c`` (the default ``auto`` when ``cc`` builds it) the backend and the load
client are the C harness of ``bench/csrc`` (``sse_backend``, ``sse_load``: a fraction of a
core at 1,024 streams), else vllm-sim and the asyncio client in this process. The load average
before and after is printed, since on a small shared machine the client, the backend and the
gateway compete for the same cores (read the ratios, not the absolute figures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from relay_harness import Harness, select_harness
from relay_load import request_bytes
from relay_procs import (
    BENCH_KEY,
    BIN,
    Proc,
    bind_config,
    cpu_s,
    default_config,
    free_port,
)

STALL_GAP_S = 0.100


def tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of every live descendant, by pid (scans ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            out[p] = cpu_s(p)
        except OSError:
            continue
        todo.extend(children.get(p, []))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def start_pod(workers: int, sim_url: str, workdir: Path) -> Proc:
    """``gateway serve --workers N``; returns once the admin port counts N workers serving."""
    port, admin = free_port(), free_port()
    cfg: dict[str, Any] = bind_config(default_config(), sim_url, port)
    cfg["telemetry"] = {"admin": {"host": "127.0.0.1", "port": admin}}
    # 1,024 upstream connections opened at once to one simulator on a loaded machine: its
    # accept queue can take longer than the default 2 s connect timeout.
    cfg["timeouts"] = {"connect_s": 10}
    path = workdir / f"workers-{workers}-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    exe = BIN / "gateway"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    proc = Proc(f"gateway:{workers}w", [*argv, "serve", "--config", str(path), "--workers",
                                        str(workers)], port, "/healthz")
    want = f"sg_gateway_workers {float(workers)}" if workers > 1 else None
    deadline = time.monotonic() + 120
    while want is not None:
        try:
            if want in httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} workers did not all start:\n{proc.log()}")
        time.sleep(0.2)
    return proc


async def measure(name: str, port: int, api_key: str | None, proc: Proc,
                  args: argparse.Namespace, h: Harness, round_: int = 0) -> dict[str, Any]:
    body = {"model": "m", "stream": True, "max_tokens": args.tokens,
            "messages": [{"role": "user", "content": "hi"}]}
    req = request_bytes(f"127.0.0.1:{port}", "/v1/chat/completions", body, api_key, False)
    await h.run_streams("127.0.0.1", port, req, 32, 32)  # warm-up
    c0 = tree_cpu_s(proc.proc.pid)
    tot = await h.run_streams("127.0.0.1", port, req, args.streams, args.streams)
    c1 = tree_cpu_s(proc.proc.pid)
    per_pid = {pid: c1[pid] - c0.get(pid, 0.0) for pid in c1}
    used = sum(per_pid.values())
    # the share of each process that did work (> 5% of the total): supervisor + workers
    shares = sorted((v / used * 100 for v in per_pid.values() if used and v > 0.05 * used),
                    reverse=True)
    done = [r for r in tot.results if r.complete]
    gaps = [g for r in done for g in r.gaps_s]
    free = sum(1 for r in done if r.max_gap_s <= STALL_GAP_S)
    row = {
        "target": name, "round": round_, "completed": len(done), "streams": len(tot.results),
        "no_event": sum(1 for r in tot.results if not r.complete and r.events == 0),
        "cpu_split": "/".join(f"{x:.0f}" for x in shares),
        "stall_free_pct": 100.0 * free / max(len(tot.results), 1),
        "gap_p99_ms": pct(gaps, 0.99) * 1000, "gap_max_ms": max(gaps, default=0.0) * 1000,
        "events_per_s": tot.events_per_s, "wall_s": tot.wall_s,
        "cpu_us_per_event": used / max(tot.events, 1) * 1e6, "cpu_s": used,
    }
    print(f"# {name}: {free}/{len(tot.results)} stall-free, {tot.events_per_s:.0f} events/s",
          file=sys.stderr)
    return row


async def run(args: argparse.Namespace, h: Harness) -> list[dict[str, Any]]:
    sim = h.start_backend("m", tokens=args.tokens, itl_ms=args.itl_ms)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sg-bench-workers-") as tmp:
        try:
            rows.append(await measure("direct", sim.port, None, sim, args, h))
            for round_ in range(args.rounds):
                for n in args.workers:
                    pod = start_pod(n, f"http://127.0.0.1:{sim.port}", Path(tmp))
                    try:
                        rows.append(await measure(f"gateway {n} worker(s)", pod.port,
                                                  BENCH_KEY, pod, args, h, round_))
                    finally:
                        pod.stop()
        finally:
            sim.stop()
    return rows


def render(rows: list[dict[str, Any]], load: tuple[float, ...], load_after: tuple[float, ...]
           ) -> str:
    head = (f"{'target':<22}{'done':>11}{'no event':>9}{'stall-free %':>13}{'gap p99 ms':>11}"
            f"{'gap max ms':>11}{'events/s':>10}{'us CPU/event':>13}{'CPU s':>8}"
            f"  CPU split %")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['target']:<22}{r['completed']:>5}/{r['streams']:<5}{r['no_event']:>9}"
                   f"{r['stall_free_pct']:>13.1f}{r['gap_p99_ms']:>11.1f}{r['gap_max_ms']:>11.0f}"
                   f"{r['events_per_s']:>10.0f}{r['cpu_us_per_event']:>13.1f}{r['cpu_s']:>8.1f}"
                   f"  {r['cpu_split']}")
    for r in rows:
        one = next((x for x in rows if x["target"].startswith("gateway 1 ")
                    and x["round"] == r["round"]), None)
        if one is not None and r is not one and r["target"].startswith("gateway"):
            rate = r["events_per_s"] / max(one["events_per_s"], 1e-9)
            gap = r["gap_p99_ms"] / max(one["gap_p99_ms"], 1e-9)
            out.append(f"round {r['round'] + 1}: {r['target']} / 1 worker: events/s "
                       f"x{rate:.2f}, stall-free "
                       f"{r['stall_free_pct']:.1f}% vs {one['stall_free_pct']:.1f}%, "
                       f"gap p99 x{gap:.2f}")
    out.append(f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after "
               f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
               f"{os.cpu_count()} CPUs")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--rounds", type=int, default=1, help="Repeat the worker counts (A B A B).")
    p.add_argument("--harness", choices=["auto", "c", "python"], default="auto",
                   help="backend and load client: the C harness (auto: when it builds) or "
                        "vllm-sim with the asyncio client")
    args = p.parse_args(argv)
    h = select_harness(args.harness)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    load = os.getloadavg()
    rows = asyncio.run(run(args, h))
    print(f"# harness {h.name}", file=sys.stderr)
    print(render(rows, load, os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
