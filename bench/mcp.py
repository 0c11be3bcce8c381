"""MCP benchmark: the latency a tool call gains by going through the gateway, in one run.

An upstream MCP server (the official SDK's ``MCPServer`` with an ``echo`` tool, uvicorn) and a
``gateway serve`` in front of it (egress policy on, guard ``enforce``; ``--audit`` adds the
SQLite audit chain) run as separate processes. Each load sends ``--concurrency`` (32; and 1)
modern (2026-07-28) ``tools/call`` requests at a time through ``/mcp/echo`` AND as many
straight to the server, side by side (one load, the same server queue, the same machine), until
one path has its share of ``--calls`` (``--calls-c1``); loads repeat over ``--rounds`` rounds.
It prints p50/p99 of each path, the added latency (the gateway's percentile minus the direct
calls' of the same loads, pooled, and each round's, to show the spread), the CPU time per call
of the server, the gateway and this client (``/proc``) and how busy the machine's CPUs were
during the loads (``/proc/stat``). ``--alone`` also measures each path in a load of its own
(with a CPU-bound server on shared cores that difference counts the CPU the gateway takes from
the server as delay). ``--baseline DIR`` adds a second gateway from another checkout in front
of the same server, in loads of its own beside direct calls, alternating with the gateway's
(before/after in one run). Targets (issue 28): added p50 <= 1 ms, added p99 <= 3 ms at c=32.
``--profile FILE`` writes a CPU-time cProfile of the gateway's measured loads.
``--server-calls`` counts the Python function calls the server makes per call (cProfile inside
the server, started and stopped around each load): the work a request costs it, which unlike
its CPU time does not depend on how busy the machine is.
``--pin PLAN`` (repeatable) pins the gateway(s), the server and this client (the load
generator) to CPUs, e.g. ``g=1:s=0:c=0`` or ``free`` (:func:`mcp_timeline.parse_plan`): each
round then measures every plan in turn, the processes re-pinned between loads, so that the
plans are compared under the same background load: does the added latency come from the
processes competing for the cores, or from the gateway itself? ``--timeline`` adds one load
per plan at ``--concurrency`` with the gateway's socket reads and writes stamped, and prints
where a call's time goes (:mod:`mcp_timeline`).

Usage::

    .venv/bin/python bench/mcp.py [--calls 8000] [--concurrency 32] [--audit] [--alone]
    git archive REV gateway policy clishell | tar -x -C /tmp/base
    .venv/bin/python bench/mcp.py --baseline /tmp/base
    .venv/bin/python bench/mcp.py --pin free --pin g=1:s=0:c=0 --timeline
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from mcp_timeline import TIMED_MAIN, decompose, parse_plan, pin
from mcp_timeline import report as report_timeline

ROOT = Path(__file__).resolve().parents[1]
KEY = "sg-bench-mcp"
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}
UPSTREAM = """
import sys, uvicorn
from mcp.server.mcpserver import MCPServer
if len(sys.argv) > 2:  # --server-calls: count the server's Python calls per load
    import cProfile, pstats, signal
    prof = []
    def _start(*_):
        prof[:] = [cProfile.Profile()]
        prof[0].enable()
    def _stop(*_):
        prof[0].disable()
        with open(sys.argv[2], "a") as out:
            out.write(f"{pstats.Stats(prof[0]).total_calls}\\n")
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
server = MCPServer("bench")
@server.tool()
def echo(text: str) -> str:
    return text
uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]),
            log_level="warning", lifespan="on")
"""
# Run inside the gateway process with --profile: SIGUSR1 starts cProfile, SIGUSR2 stops it and
# writes the statistics, so only the measured loads are profiled (not imports and start-up).
# The clock is the process's CPU time: on a shared machine, wall time would charge a function
# for the time the process waited for a core.
PROFILED_MAIN = """
import cProfile, signal, sys, time
from gateway.cli import main
prof = cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def _dump(*_):
    prof.disable()
    prof.dump_stats(sys.argv[1])
signal.signal(signal.SIGUSR2, _dump)
sys.exit(main(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up")
            await asyncio.sleep(0.1)


HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo"}


async def load(url: str, calls: int, concurrency: int, key: str | None) -> list[float]:
    """Latencies (ms) of ``calls`` tools/call requests, ``concurrency`` at a time."""
    return (await side_by_side({"one": (url, key)}, calls, concurrency))["one"]


async def side_by_side(targets: dict[str, tuple[str, str | None]], calls: int,
                       concurrency: int,
                       trace: tuple[str, list[tuple[int, float, float]]] | None = None,
                       ) -> dict[str, list[float]]:
    """Latencies (ms) of tools/call requests sent to every target of ``targets`` (name ->
    (url, bearer key or ``None``)) in ONE load: ``concurrency`` workers per target, all
    running at once against the same server, each calling its target back to back.

    The load ends for every target as soon as one target has had ``calls`` calls answered
    (the calls then in flight still count): no target runs its last calls alone on a machine
    the others have left, and a slower target has fewer calls (each call counted was sent
    under the same load). Every answer is checked (200, the echoed text). ``trace``
    ``(target, out)``: each call of that target appends ``(its key N ("hi N"), sent, answered)``
    (``time.perf_counter`` seconds) to ``out``.
    """
    out: dict[str, list[float]] = {name: [] for name in targets}
    done = asyncio.Event()
    sessions: list[aiohttp.ClientSession] = []

    async def worker(name: str, url: str, session: aiohttp.ClientSession,
                     headers: dict[str, str], first: int) -> None:
        got, i = out[name], first
        stamps = trace[1] if trace is not None and trace[0] == name else None
        while not done.is_set():
            i += concurrency
            text_in = f"hi {i}"
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                               "params": {"name": "echo", "arguments": {"text": text_in},
                                          "_meta": META}})
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                text = await resp.read()
                if resp.status != 200 or text_in.encode() not in text:
                    raise SystemExit(f"{name}: bad answer {resp.status}: {text[:200]!r}")
            t1 = time.perf_counter()
            got.append((t1 - t0) * 1000)
            if stamps is not None:
                stamps.append((i, t0, t1))
            if len(got) >= calls:
                done.set()

    try:
        jobs: list[Coroutine[Any, Any, None]] = []
        for name, (url, key) in targets.items():
            headers = dict(HEADERS)
            if key:
                headers["authorization"] = f"Bearer {key}"
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
            sessions.append(session)
            jobs.extend(worker(name, url, session, headers, w) for w in range(concurrency))
        await asyncio.gather(*jobs)
    finally:
        for session in sessions:
            await session.close()
    return out


def plan_label(text: str) -> str:
    """``--pin``'s value, checked (:func:`mcp_timeline.parse_plan`)."""
    try:
        parse_plan(text)
    except (KeyError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"not a CPU plan: {text!r} ({exc})") from exc
    return text


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` (``/proc/<pid>/stat`` fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(all, idle) clock ticks of all CPUs so far (``/proc/stat`` line ``cpu``; idle + iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(ticks), ticks[3] + ticks[4]


def measure(targets: dict[str, tuple[str, str | None]], calls: int, concurrency: int,
            pids: dict[str, int]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Latencies (ms) per target of one load (:func:`side_by_side`); CPU microseconds per call
    of each process in ``pids`` (the server and this client (``client``) per call of the
    load, a gateway per call it carried) and the machine's busy share during the load in %
    (``busy``)."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    client, (total, idle) = time.process_time(), machine_ticks()
    values = asyncio.run(side_by_side(targets, calls, concurrency))
    total2, idle2 = machine_ticks()
    n_all = sum(len(v) for v in values.values())
    out = {name: (cpu_s(pid) - before[name]) * 1e6
           / (len(values[name]) if name in values else n_all) for name, pid in pids.items()}
    out["client"] = (time.process_time() - client) * 1e6 / n_all
    out["busy"] = 100 * (1 - (idle2 - idle) / max(1, total2 - total))
    return values, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=8000,
                    help="calls per path at --concurrency (over all rounds)")
    ap.add_argument("--calls-c1", type=int, default=1000,
                    help="calls per path at concurrency 1 (over all rounds)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--audit", action="store_true", help="audit chain on (SQLite)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds per concurrency (direct, gateway, baseline)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="also run the gateway of another checkout (git archive REV gateway "
                         "policy | tar -x -C DIR) in front of the same server")
    ap.add_argument("--alone", action="store_true",
                    help="also measure each path by itself (a load of its own per path)")
    ap.add_argument("--server-calls", action="store_true",
                    help="count the server's Python calls per call (direct vs gateway)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run the gateway under cProfile and write its stats to this file")
    ap.add_argument("--pin", type=plan_label, action="append", default=None,
                    dest="pin_labels", metavar="PLAN",
                    help="CPU pinning plan, repeatable: free, or e.g. g=1:s=0:c=0 (g gateway, "
                    "s server, c this client); plans alternate within each round")
    ap.add_argument("--timeline", action="store_true",
                    help="one more load at --concurrency with the gateway's socket calls "
                         "stamped: where a call's time goes")
    args = ap.parse_args()
    if args.profile and args.timeline:
        ap.error("--profile and --timeline both run the gateway under their own main")
    plans = [(label, parse_plan(label)) for label in (args.pin_labels or [""])]
    tmp = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    up_port, gw_port, model_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (tmp / "policy.yaml").write_text(
        "version: 1\ndata_classes: [internal]\ndestinations:\n"
        f"  - {{id: model, host: 127.0.0.1, port: {model_port}, region: r, jurisdiction: EU, "
        "operator: o}\n"
        f"  - {{id: tools, host: 127.0.0.1, port: {up_port}, region: r, jurisdiction: EU, "
        "operator: o, purpose: tool}\n"
        "rules:\n  - {id: all, classes: [internal]}\n")
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": gw_port},
        "models": [{"name": "m", "replicas": [{"url": f"http://127.0.0.1:{model_port}",
                                               "destination": "model"}]}],
        "keys": [{"id": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "team": "bench", "data_class": "internal"}],
        "health": {"active": False}, "logging": {"access_log": False},
        "policy": {"file": str(tmp / "policy.yaml"), "guard": "enforce"},
        "mcp": {"servers": [{"name": "echo", "url": f"http://127.0.0.1:{up_port}/mcp",
                             "destination": "tools"}],
                "access": [{"teams": ["bench"], "allow": ["*"]}]},
    }
    if args.audit:
        from gateway.audit import Signer, generate_key_file, write_key_pair

        key, _ = write_key_pair(Signer.generate(), tmp / "audit.key")
        cfg["audit"] = {"store": f"sqlite://{tmp / 'audit.db'}", "signing_key_file": str(key),
                        "replica_id": "bench",
                        "pseudonym_key_file": str(generate_key_file(tmp / "p.key"))}
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    entry = (["-c", PROFILED_MAIN, str(args.profile)] if args.profile
             else ["-c", TIMED_MAIN, str(tmp / "timeline.json"), str(gw_port), str(up_port)]
             if args.timeline else ["-m", "gateway.cli"])
    counts = tmp / "server-calls.txt"
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port),
                                 *([str(counts)] if args.server_calls else [])], env=env)
    procs = {"gateway": subprocess.Popen([sys.executable, *entry, "serve", "--config",
                                          str(tmp / "gateway.yaml")], env=env, cwd=ROOT)}
    urls = {"direct": f"http://127.0.0.1:{up_port}/mcp",
            "gateway": f"http://127.0.0.1:{gw_port}/mcp/echo"}
    if args.baseline is not None:
        base_port = free_port()
        (tmp / "baseline.yaml").write_text(yaml.safe_dump(
            {**cfg, "listen": {"host": "127.0.0.1", "port": base_port}}))
        procs["baseline"] = subprocess.Popen(
            [sys.executable, "-P", "-m", "gateway.cli", "serve", "--config",
             str(tmp / "baseline.yaml")], cwd=args.baseline,
            env={**os.environ, "PYTHONPATH": str(args.baseline)})
        urls["baseline"] = f"http://127.0.0.1:{base_port}/mcp/echo"
    pids = {"server": upstream.pid, **{name: proc.pid for name, proc in procs.items()}}
    keys = {name: None if name == "direct" else KEY for name in urls}
    gateways = [name for name in urls if name != "direct"]
    levels = ((1, args.calls_c1), (args.concurrency, args.calls))
    # side by side: concurrency -> gateway -> round -> ({"direct"|gateway: latencies ms}, CPU)
    paired: dict[int, dict[str, list[tuple[dict[str, list[float]], dict[str, float]]]]] = {}
    # alone (--alone): concurrency -> target -> round -> (latencies ms, CPU)
    alone: dict[int, dict[str, list[tuple[list[float], dict[str, float]]]]] = {}
    # --timeline, per plan: the gateway calls' stamps, the direct calls' latencies (ms)
    timelines: dict[str, tuple[list[tuple[int, float, float]], list[float]]] = {}
    every = os.sched_getaffinity(0)
    roles = {"gateway": [proc.pid for proc in procs.values()], "server": [upstream.pid],
             "client": [os.getpid()]}
    try:
        asyncio.run(wait_up(urls["direct"], upstream))
        for name, proc in procs.items():
            asyncio.run(wait_up(urls[name].replace("/mcp/echo", "/healthz"), proc))
        for name, url in urls.items():  # warm up every path
            asyncio.run(load(url, 200, args.concurrency, keys[name]))
        if args.profile:
            procs["gateway"].send_signal(signal.SIGUSR1)
        for conc, calls in levels:
            per_round = max(1, calls // args.rounds)
            paired[conc] = {}
            alone[conc] = {name: [] for name in urls}
            for _ in range(args.rounds):  # interleaved: each load sees the same machine
                for name in gateways:
                    for label, plan in plans:
                        pin(plan, roles, every)
                        values, cpu = measure(
                            {"direct": (urls["direct"], None), name: (urls[name], KEY)},
                            per_round, conc, pids)
                        shown = f"{name} {label}".strip()
                        values[shown], cpu[shown] = values.pop(name), cpu.pop(name)
                        paired[conc].setdefault(shown, []).append((values, cpu))
                pin({}, roles, every)
                if not (args.alone or args.server_calls):
                    continue
                for name, url in urls.items():
                    if args.server_calls:
                        upstream.send_signal(signal.SIGUSR1)
                        time.sleep(0.2)
                    values, cpu = measure({name: (url, keys[name])}, per_round, conc, pids)
                    if args.server_calls:
                        seen = len(counts.read_text().split()) if counts.exists() else 0
                        upstream.send_signal(signal.SIGUSR2)
                        deadline = time.monotonic() + 10
                        while (len(counts.read_text().split()) if counts.exists() else 0) == seen:
                            if time.monotonic() > deadline:
                                raise SystemExit("the server wrote no call count")
                            time.sleep(0.05)
                        cpu["server_calls"] = (int(counts.read_text().split()[-1])
                                               / len(values[name]))
                    alone[conc][name].append((values[name], cpu))
        if args.profile:
            procs["gateway"].send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not args.profile.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        for label, plan in plans if args.timeline else ():
            pin(plan, roles, every)
            stamped = tmp / "timeline.json"
            stamped.unlink(missing_ok=True)
            procs["gateway"].send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            stamps: list[tuple[int, float, float]] = []
            values = asyncio.run(side_by_side(
                {"direct": (urls["direct"], None), "gateway": (urls["gateway"], KEY)},
                max(1, args.calls // args.rounds), args.concurrency, ("gateway", stamps)))
            procs["gateway"].send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not stamped.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            timelines[label] = (stamps, values["direct"])
            stamped.rename(tmp / f"timeline-{len(timelines)}.json")
        pin({}, roles, every)
    finally:
        for proc in (*procs.values(), upstream):
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    report(args, paired, alone)
    for n, (label, (stamps, direct)) in enumerate(timelines.items(), 1):
        print(f" {label or 'as started'}:", end="")
        report_timeline(decompose(tmp / f"timeline-{n}.json", stamps), len(stamps), direct)


def added(path: list[float], direct: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``path`` minus those of ``direct``, in ms."""
    return pct(path, 0.5) - pct(direct, 0.5), pct(path, 0.99) - pct(direct, 0.99)


def mean_cpu(rounds: list[Any]) -> dict[str, float]:
    """The CPU figures of :func:`measure` averaged over rounds."""
    cpu: dict[str, float] = {}
    for _, one in rounds:
        for name, us in one.items():
            cpu[name] = cpu.get(name, 0.0) + us / len(rounds)
    return cpu


def report(args: argparse.Namespace,
           paired: dict[int, dict[str, list[tuple[dict[str, list[float]], dict[str, float]]]]],
           alone: dict[int, dict[str, list[tuple[list[float], dict[str, float]]]]]) -> None:
    """Print the side-by-side figures (the target's measure) and, if run, the alone ones."""
    pins = ", ".join(args.pin_labels or [])
    print(f"tools/call{' (audit on)' if args.audit else ''}"
          f"{' (gateway under cProfile)' if args.profile else ''}, {args.rounds} interleaved "
          f"rounds{'; CPU plans (g gateway, s server, c client) ' + pins if pins else ''}")
    for conc, by_gateway in paired.items():
        print(f" concurrency {conc}, side by side (each load: {conc} callers through the "
              f"gateway and {conc} straight to the same server at once)")
        for name, rounds in by_gateway.items():
            path = [v for values, _ in rounds for v in values[name]]
            direct = [v for values, _ in rounds for v in values["direct"]]
            add50, add99 = added(path, direct)
            per_round = [added(values[name], values["direct"]) for values, _ in rounds
                         if min(len(values[name]), len(values["direct"])) >= 2]
            cpu = mean_cpu(rounds)
            target = conc == args.concurrency and name.startswith("gateway")
            print(f"  {name:8} {len(path):6} calls p50 {pct(path, 0.5):7.2f} ms p99 "
                  f"{pct(path, 0.99):7.2f} ms | direct beside {len(direct):6} calls p50 "
                  f"{pct(direct, 0.5):7.2f} ms p99 {pct(direct, 0.99):7.2f} ms")
            print(f"  added by {name:8} p50 {add50:6.2f} ms{' (target <= 1)' if target else ''}"
                  f" p99 {add99:6.2f} ms{' (target <= 3)' if target else ''}; rounds p50 "
                  + " ".join(f"{a:.2f}" for a, _ in per_round) + ", p99 "
                  + " ".join(f"{b:.2f}" for _, b in per_round))
            print(f"  CPU/call server {cpu['server']:5.0f} us {name} {cpu[name]:5.0f} us client "
                  f"{cpu['client']:5.0f} us  machine busy {cpu['busy']:3.0f}%")
            # Each round's load beside its added latency: a drift of the added p50 over the
            # rounds is then seen with the direct path's latency, the gateway's own CPU per
            # call and how busy the machine was in the same load (what else ran on it).
            print("  rounds direct p50 " + " ".join(
                f"{pct(values['direct'], 0.5):.1f}" for values, _ in rounds
                if len(values["direct"]) >= 2) + f" ms, {name} CPU/call "
                + " ".join(f"{one[name]:.0f}" for _, one in rounds) + " us, machine busy "
                + " ".join(f"{one['busy']:.0f}" for _, one in rounds) + "%")
    for conc, by_target in alone.items():
        if not any(by_target.values()):
            continue
        print(f" concurrency {conc}, alone (each path by itself in its own load; with a "
              "CPU-bound server on shared cores this counts the gateway's CPU as server delay)")
        direct = [v for values, _ in by_target["direct"] for v in values]
        for name, loads in by_target.items():
            lat = [v for one, _ in loads for v in one]
            cpu = mean_cpu(loads)
            own = f" {name} {cpu[name]:5.0f} us" if name != "direct" else ""
            print(f"  {name:8} p50 {pct(lat, 0.5):7.2f} ms  p99 {pct(lat, 0.99):7.2f} ms"
                  f"  CPU/call server {cpu['server']:5.0f} us{own} client {cpu['client']:5.0f} us"
                  f"  machine busy {cpu['busy']:3.0f}%"
                  + (f"  server Python calls/call {cpu['server_calls']:6.0f}"
                     if args.server_calls else ""))
            if name != "direct":
                add50, add99 = added(lat, direct)
                print(f"  added by {name:8} alone p50 {add50:7.2f} ms  p99 {add99:7.2f} ms")


if __name__ == "__main__":
    main()
