"""Python calls and event-loop iterations per request inside the gateway, base beside change.

CPU per request is noisy on a shared machine (±5 %); the number of Python function calls and
of event-loop iterations the gateway makes per request is not, so it shows what a change to
the request path saves before the CPU figures can. For each source (``--base DIR``, e.g.
``git archive <base> | tar -x -C /tmp/base``, and this checkout) the script starts one gateway
process (``gateway serve``, the bench config of ``bench/relay.py``) in front of a simulator
with a ``sys.setprofile`` hook on the gateway's loop thread, switched on by SIGUSR1 after a
warm-up and read on SIGUSR2, and counts for

- a small request: ``--requests`` non-streamed chat completions (``max_tokens`` 1) at
  concurrency 1 over one keep-alive connection;
- a new stream: ``--streams`` streamed chat completions (5 tokens, ``--itl-ms`` apart) one
  after another, one new connection each (a burst's coalesced reads and writes, or tokens
  sent back to back, vary the counts by ±5 % from run to run);

the Python function calls (``call`` events), the builtin calls (``c_call``) and the loop
iterations (calls of the standard asyncio loop's per-iteration method; the gateway never runs
uvloop). Then, with the hook off, ``--rounds`` interleaved rounds measure both gateways' CPU
per small request (``--cpu-requests`` each) and per new stream (``--cpu-streams`` at once),
read from ``/proc/<pid>/stat`` (10 ms ticks: keep the rounds large); wrap the run in
``flock /work/bench.lock``.

Usage::

    git archive HEAD~1 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    flock /work/bench.lock .venv/bin/python bench/relay_calls.py --base /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from relay_load import request_bytes, run_latency, run_streams
from relay_procs import BENCH_KEY, Proc, bind_config, default_config, free_port, start_sim

ROOT = Path(__file__).resolve().parents[1]

# Run inside the gateway process. The hook only counts; SIGUSR2 appends one line
# "python_calls builtin_calls loop_iterations" to the file named by argv[1].
_COUNTING_MAIN = """
import signal, sys
from gateway.cli import main
counts = [0, 0, 0]
def hook(frame, event, arg):
    if event == "call":
        counts[0] += 1
        if frame.f_code.co_name == "_run_once":
            counts[2] += 1
    elif event == "c_call":
        counts[1] += 1
def start(*_):
    counts[:] = [0, 0, 0]
    sys.setprofile(hook)
def stop(*_):
    sys.setprofile(None)
    with open(sys.argv[1], "a") as f:
        f.write(" ".join(map(str, counts)) + "\\n")
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.exit(main(sys.argv[2:]))
"""


def _start_gateway(sim_url: str, workdir: Path, out: Path, source: Path) -> Proc:
    port = free_port()
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(bind_config(default_config(), sim_url, port)))
    # -P: the working directory is not put first on sys.path, so PYTHONPATH decides the source.
    argv = [sys.executable, "-P", "-c", _COUNTING_MAIN, str(out), "serve", "--config", str(path)]
    return Proc(f"gateway:{source}", argv, port, "/healthz", env={"PYTHONPATH": str(source)})


def _requests(port: int) -> tuple[bytes, bytes]:
    """The small request (keep-alive) and the stream request (connection: close)."""
    host = f"127.0.0.1:{port}"
    small = request_bytes(host, "/v1/chat/completions",
                          {"model": "m", "stream": False, "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}]}, BENCH_KEY, True)
    stream = request_bytes(host, "/v1/chat/completions",
                           {"model": "m", "stream": True, "max_tokens": 5,
                            "messages": [{"role": "user", "content": "hi"}]}, BENCH_KEY, False)
    return small, stream


async def _burst(port: int, req: bytes, n: int) -> int:
    tot = await run_streams("127.0.0.1", port, req, n, n)
    await asyncio.sleep(0.3)  # the connections close before the next phase
    return sum(1 for r in tot.results if r.complete)


async def _count(gw: Proc, out: Path, args: argparse.Namespace) -> tuple[list[float], ...]:
    """Counts per small request and per new stream: (calls, builtin calls, iterations) each."""
    small, stream = _requests(gw.port)
    await run_latency("127.0.0.1", gw.port, small, 50, 1)  # warm-up
    await _burst(gw.port, stream, 16)
    rows: list[list[float]] = []
    for phase in ("small", "stream"):
        before = len(out.read_text().splitlines()) if out.exists() else 0
        gw.proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.2)
        if phase == "small":
            n = len(await run_latency("127.0.0.1", gw.port, small, args.requests, 1))
        else:  # one after another: a burst's coalesced reads and writes vary run to run
            tot = await run_streams("127.0.0.1", gw.port, stream, args.streams, 1)
            n = sum(1 for r in tot.results if r.complete)
        gw.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.exists() or len(out.read_text().splitlines()) <= before:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no counts from {gw.name}")
            await asyncio.sleep(0.05)
        line = out.read_text().splitlines()[before]
        rows.append([int(x) / max(n, 1) for x in line.split()])
    return tuple(rows)


async def _cpu(gws: list[Proc], args: argparse.Namespace) -> list[tuple[list[float], list[float]]]:
    """Interleaved rounds: CPU µs per small request and per new stream for each gateway."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in gws]
    for _ in range(args.rounds):
        for i, gw in enumerate(gws):
            small, stream = _requests(gw.port)
            c0 = gw.cpu_s
            n = len(await run_latency("127.0.0.1", gw.port, small, args.cpu_requests, 1))
            out[i][0].append((gw.cpu_s - c0) / n * 1e6)
            c0 = gw.cpu_s
            n = await _burst(gw.port, stream, args.cpu_streams)
            out[i][1].append((gw.cpu_s - c0) / max(n, 1) * 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base", type=Path, required=True, help="the base checkout's directory")
    p.add_argument("--change", type=Path, default=ROOT,
                   help="the changed checkout's directory (default: this one)")
    p.add_argument("--requests", type=int, default=1000, help="small requests counted")
    p.add_argument("--streams", type=int, default=300,
                   help="new streams counted (one after another)")
    p.add_argument("--itl-ms", type=float, default=2.0,
                   help="ms between a stream's tokens: each arrives in its own read, so the "
                        "counts per stream do not depend on how the reads coalesce")
    p.add_argument("--rounds", type=int, default=3, help="interleaved CPU rounds (0: none)")
    p.add_argument("--cpu-requests", type=int, default=2000, help="small requests per round")
    p.add_argument("--cpu-streams", type=int, default=512,
                   help="new streams per round (/proc counts CPU in 10 ms ticks: 20 µs per "
                        "stream at 512)")
    args = p.parse_args(argv)
    sources = [("base", args.base.resolve()), ("change", args.change.resolve())]
    sim = start_sim("m", tokens=5, itl_ms=args.itl_ms)
    with tempfile.TemporaryDirectory(prefix="relay-calls-") as tmp:
        gws: list[Proc] = []
        try:
            for name, src in sources:
                gws.append(_start_gateway(sim.url, Path(tmp), Path(tmp) / f"{name}.txt", src))
            counts = [asyncio.run(_count(gw, Path(tmp) / f"{name}.txt", args))
                      for gw, (name, _) in zip(gws, sources, strict=True)]
            cpu = asyncio.run(_cpu(gws, args)) if args.rounds else []
        finally:
            for gw in gws:
                gw.stop()
            sim.stop()
    print(f"load {os.getloadavg()[0]:.2f}; counts per small request ({args.requests} at c=1) "
          f"and per new stream ({args.streams} one after another)")
    print(f"{'':8s}{'py calls':>10s}{'C calls':>9s}{'loop it':>9s}  |{'py calls':>10s}"
          f"{'C calls':>9s}{'loop it':>9s}")
    for (name, _), (small, stream) in zip(sources, counts, strict=True):
        print(f"{name:8s}" + "".join(f"{v:>{w}.1f}" for v, w in zip(small, (10, 9, 9), strict=True))
              + "  |" + "".join(f"{v:>{w}.1f}" for v, w in zip(stream, (10, 9, 9), strict=True)))
    if cpu:
        med = [(statistics.median(s), statistics.median(t)) for s, t in cpu]
        print(f"CPU µs, median of {args.rounds} interleaved rounds: small request "
              f"base {med[0][0]:.0f} change {med[1][0]:.0f} (x{med[1][0] / med[0][0]:.2f}); "
              f"new stream base {med[0][1]:.0f} change {med[1][1]:.0f} "
              f"(x{med[1][1] / med[0][1]:.2f})")
        for (name, _), (s, t) in zip(sources, cpu, strict=True):
            print(f"  {name}: small {[round(x) for x in s]} stream {[round(x) for x in t]}")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
