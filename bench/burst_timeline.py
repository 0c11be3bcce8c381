"""Where a burst of new streams spends its time: the ranked timeline inside the gateway.

Starts the C harness's backend (first token after ``--ttft-ms``) and one gateway whose own
classes are wrapped (in its process only, for this diagnostic) to stamp ``CLOCK_MONOTONIC`` at
each step of every new stream: the connection accepted (``connection_made``), its request head
parsed (the request task created), the request written upstream, the upstream response head
parsed, and the first bytes written back to the client; and it counts the event loop's
iterations (each return of the epoll selector's ``select``).
Sends ``--rounds`` bursts of ``--burst`` new streams (the C load client, all at once) and
prints, per step, when the k-th stream (ranked by that step's time) reached it, in ms from the
burst's first accept, at the 10th, 50th and 90th percentile, and the loop turn the median reached
it in; then the client's TTFT (from its own request) and the loop turns per burst. A step's p50
minus the previous one's is the time the median stream waited between them. Needs the C
harness (``make bench-tools``).

Usage::

    .venv/bin/python bench/burst_timeline.py                       # this checkout
    .venv/bin/python bench/burst_timeline.py --source /tmp/base    # another build's packages
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from relay_harness import BACKEND, LOAD, CHarness
from relay_load import request_bytes
from relay_procs import BENCH_KEY, Proc, bind_config, default_config, free_port

# Runs inside the gateway process. SIGUSR1 clears the stamps (the warm-up is left out), SIGUSR2
# writes them to argv[1] as JSON.
_TIMELINE_MAIN = r"""
import json, signal, sys, time, asyncio
from gateway.cli import main
from gateway.h1 import client as hc, server as hs
now = time.monotonic_ns
marks = {"accept": [], "head": [], "upstream": [], "upstream_head": [], "first_write": []}
loop_turns = []  # (monotonic ns when the selector returned, ready events)
import selectors
orig_select = selectors.EpollSelector.select
def select(self, timeout=None):
    ready = orig_select(self, timeout)
    loop_turns.append((now(), len(ready)))
    return ready
selectors.EpollSelector.select = select
def stamp(name):
    marks[name].append((now(), len(loop_turns)))
orig_made = hs.ServerProtocol.connection_made
def made(self, transport):
    stamp("accept")
    write = transport.write
    first = [True]
    def w(data):
        if first[0] and data:
            first[0] = False
            stamp("first_write")
        return write(data)
    transport.write = w
    return orig_made(self, transport)
hs.ServerProtocol.connection_made = made
orig_start = hs.ServerProtocol._start
def start(self, head):
    stamp("head")
    return orig_start(self, head)
hs.ServerProtocol._start = start
orig_begin = hc.H1Connection.begin
def begin(self):  # every exchange starts here (send() calls it, a new connection before it)
    stamp("upstream")
    return orig_begin(self)
hc.H1Connection.begin = begin
orig_parse = hc.parse_head
def parse(data):
    stamp("upstream_head")
    return orig_parse(data)
hc.parse_head = parse
def reset(*_):
    for v in marks.values():
        v.clear()
    loop_turns.clear()
def dump(*_):
    with open(sys.argv[1], "w") as f:
        json.dump({"marks": marks, "turns": loop_turns}, f)
def install():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, reset)
    loop.add_signal_handler(signal.SIGUSR2, dump)
import gateway.serving.server as gs
orig_startup = gs.GatewayServer.startup
async def startup(self, *a, **k):
    install()
    return await orig_startup(self, *a, **k)
gs.GatewayServer.startup = startup
sys.exit(main(sys.argv[2:]))
"""

STEPS = ("accept", "head", "upstream", "upstream_head", "first_write")


def _start_gateway(backend_url: str, workdir: Path, source: str | None) -> Proc:
    port = free_port()
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(bind_config(default_config(), backend_url, port)))
    argv = [sys.executable, "-P", "-c", _TIMELINE_MAIN, str(workdir / "marks.json"), "serve",
            "--config", str(path)]
    return Proc("gateway", argv, port, "/healthz", env={"PYTHONPATH": source} if source else None)


def _wait_for(path: Path, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
            return doc
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"no timeline written to {path}")


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _run(args: argparse.Namespace) -> None:
    h = CHarness()
    backend = h.start_backend("m", args.tokens, args.itl_ms, args.ttft_ms)
    with tempfile.TemporaryDirectory(prefix="burst-timeline-") as tmp:
        work = Path(tmp)
        gw = _start_gateway(backend.url, work, args.source)
        try:
            body = {"model": "m", "stream": True, "max_tokens": args.tokens,
                    "messages": [{"role": "user", "content": "Hello there!"}]}
            req = request_bytes(f"127.0.0.1:{gw.port}", "/v1/chat/completions", body, BENCH_KEY,
                                False)
            await h.run_streams("127.0.0.1", gw.port, req, 32, 32)  # warm-up
            # Per step: (ms after the round's first accept, loop turns after it) of each stamp.
            per_step: dict[str, list[tuple[float, int]]] = {s: [] for s in STEPS}
            ttft: list[float] = []
            turns = events = 0
            for r in range(args.rounds):
                out = work / "marks.json"
                out.unlink(missing_ok=True)
                await asyncio.sleep(0.5)  # the previous round's connections close
                gw.proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(0.1)
                tot = await h.run_streams("127.0.0.1", gw.port, req, args.burst, args.burst)
                ttft += [x.ttft_s * 1000 for x in tot.results if x.complete]
                gw.proc.send_signal(signal.SIGUSR2)
                doc = _wait_for(out)
                marks = doc["marks"]
                assert isinstance(marks, dict)
                t0, i0 = min(marks["accept"])
                for s in STEPS:
                    per_step[s] += [((t - t0) / 1e6, i - i0) for t, i in sorted(marks[s])
                                    ][: args.burst]
                last = max(t for t, _ in marks["first_write"])
                window = [n for t, n in doc["turns"] if t0 <= t <= last]
                turns += len(window)
                events += sum(window)
                print(f"# round {r + 1}: {len(marks['accept'])} accepted, "
                      f"{len(marks['upstream'])} sent upstream", file=sys.stderr)
        finally:
            gw.stop()
            backend.stop()
    print(f"burst of {args.burst} new streams x {args.rounds} rounds, replica TTFT "
          f"{args.ttft_ms:g} ms; build {args.source or 'this checkout'}")
    print(f"{'step of the k-th stream to reach it':<36}{'ms p10':>8}{'p50':>8}{'p90':>8}"
          f"{'turns p50':>11}")
    for s in STEPS:
        v = per_step[s]
        if v:
            ms = [t for t, _ in v]
            print(f"{s:<36}{_pct(ms, .1):8.1f}{_pct(ms, .5):8.1f}{_pct(ms, .9):8.1f}"
                  f"{_pct([float(i) for _, i in v], .5):11.0f}")
    print(f"{'client TTFT (from its request)':<36}{_pct(ttft, .1):8.1f}{_pct(ttft, .5):8.1f}"
          f"{_pct(ttft, .9):8.1f}")
    print(f"event loop turns from the first accept to the last first write: "
          f"{turns / args.rounds:.0f} per burst, {events / max(turns, 1):.1f} ready events each")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--burst", type=int, default=256, help="new streams at once")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=5, help="tokens per stream")
    p.add_argument("--itl-ms", type=float, default=20.0, help="ms between tokens")
    p.add_argument("--ttft-ms", type=float, default=20.0, help="the replica's service time")
    p.add_argument("--source", help="run another checkout's packages from this directory")
    args = p.parse_args(argv)
    if not (BACKEND.exists() and LOAD.exists()):
        raise SystemExit("the C harness is needed: build it with `make bench-tools`")
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
