"""Where the gateway's CPU goes per relayed SSE event: cProfile of a gateway under paced streams.

Starts a paced simulator (tokens ``--itl-ms`` apart, so they arrive one at a time) and one
gateway process with :mod:`cProfile` inside it, switched on by SIGUSR1 after a warm-up and
written on SIGUSR2 after the load (start-up is left out); relays ``--streams`` concurrent
streams (or ``--requests`` non-streamed requests at concurrency 1, or ``--burst`` new streams
at once against a replica with ``--ttft-ms`` of service time) through it and prints the
process's CPU per relayed event (per new stream for ``--burst``, with the TTFT p50) and the
functions with the most own time, in microseconds per event (per stream). cProfile measures
wall time and roughly doubles the cost of each Python call, so read the shares and call counts,
not the absolute numbers; ``--no-profile`` gives the plain CPU per event and ``--nginx`` the
same for nginx in front of the same simulator.

Usage::

    .venv/bin/python bench/relay_profile.py --streams 128
    .venv/bin/python bench/relay_profile.py --source /tmp/main-build --no-profile
    .venv/bin/python bench/relay_profile.py --nginx
    .venv/bin/python bench/relay_profile.py --burst 256 --rounds 4  # per new stream
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml
from relay_load import request_bytes, run_latency, run_streams
from relay_procs import (
    BENCH_KEY,
    Proc,
    bind_config,
    default_config,
    free_port,
    start_nginx,
    start_sim,
)

# Run inside the gateway process: SIGUSR1 starts the profiler, SIGUSR2 stops it and writes the
# profile, so only the load is profiled (not the imports and start-up).
_PROFILED_MAIN = """
import cProfile, signal, sys
from gateway.cli import main
prof = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def _dump(*_):
    prof.disable()
    prof.dump_stats(sys.argv[1])
signal.signal(signal.SIGUSR2, _dump)
sys.exit(main(sys.argv[2:]))
"""


def _start_profiled_gateway(sim_url: str, workdir: Path, out: Path, source: str | None) -> Proc:
    port = free_port()
    cfg = bind_config(default_config(), sim_url, port)
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # -P: the working directory (a checkout's root) is not put first on sys.path, so that
    # PYTHONPATH=source (another checkout's packages) is what the gateway imports.
    argv = [sys.executable, "-P", "-c", _PROFILED_MAIN, str(out), "serve", "--config", str(path)]
    return Proc("gateway", argv, port, "/healthz", env={"PYTHONPATH": source} if source else None)


def _wait_for(path: Path, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    time.sleep(0.2)  # the write may still be in progress: dump_stats writes in one call
    return True


async def _load(gw: Proc, streams: int, tokens: int, rounds: int,
                profile: bool, requests: int, burst: int = 0) -> tuple[int, float, list[float]]:
    """Relay the streams (or ``requests`` non-streamed requests at concurrency 1, or
    ``rounds`` bursts of ``burst`` new streams, one connection each, all at once).

    Returns:
        The events (requests, new streams) relayed, the gateway's CPU seconds for them, and
        the first-token times of the burst streams (seconds; empty without ``burst``).
    """
    port = gw.port
    body = {"model": "m", "stream": not requests, "max_tokens": 1 if requests else tokens,
            "messages": [{"role": "user", "content": "hi"}]}
    req = request_bytes(f"127.0.0.1:{port}", "/v1/chat/completions", body, BENCH_KEY,
                        bool(requests))
    ttfts: list[float] = []
    if requests:
        await run_latency("127.0.0.1", port, req, 50, 1)  # warm-up
    elif burst:
        await run_streams("127.0.0.1", port, req, 32, 32)  # warm-up: some pooled connections
    else:
        await run_streams("127.0.0.1", port, req, 16, 16)
    if profile:
        gw.proc.send_signal(signal.SIGUSR1)
    c0 = gw.cpu_s
    events = 0
    for _ in range(rounds):
        if requests:
            events += len(await run_latency("127.0.0.1", port, req, requests, 1))
            continue
        if burst:
            tot = await run_streams("127.0.0.1", port, req, burst, burst)
            events += sum(1 for r in tot.results if r.complete)
            ttfts += [r.ttft_s for r in tot.results if r.complete]
            await asyncio.sleep(0.5)  # the round's connections close before the next burst
            continue
        tot = await run_streams("127.0.0.1", port, req, streams, streams)
        events += tot.events
    used = gw.cpu_s - c0
    if profile:
        gw.proc.send_signal(signal.SIGUSR2)
    return events, used, ttfts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--streams", type=int, default=128, help="concurrent paced streams")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--itl-ms", type=float, default=20.0, help="milliseconds between tokens")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--top", type=int, default=30, help="functions to print")
    p.add_argument("--min-calls", type=float, default=0.0,
                   help="leave out functions called fewer times per event (start-up work)")
    p.add_argument("--source", help="run another checkout's packages from this directory")
    p.add_argument("--requests", type=int, default=0,
                   help="profile this many non-streamed requests at concurrency 1 instead "
                        "(per request, not per event)")
    p.add_argument("--nginx", action="store_true",
                   help="measure nginx as the relay instead (plain CPU per event, no profile)")
    p.add_argument("--no-profile", action="store_true", help="plain CPU per event only")
    p.add_argument("--burst", type=int, default=0,
                   help="profile --rounds bursts of this many new streams at once instead "
                        "(per new stream, not per event; --tokens defaults to 5 then)")
    p.add_argument("--ttft-ms", type=float, default=None,
                   help="the replica's time to first token in ms (default 20 with --burst)")
    p.add_argument("--save", help="also write the profile (pstats) to this file")
    args = p.parse_args(argv)
    if args.burst and args.tokens == p.get_default("tokens"):
        args.tokens = 5
    ttft_ms = args.ttft_ms if args.ttft_ms is not None else (20.0 if args.burst else 0.0)
    sim = start_sim("m", tokens=args.tokens, itl_ms=args.itl_ms, ttft_ms=ttft_ms)
    profile = not (args.no_profile or args.nginx)
    with tempfile.TemporaryDirectory(prefix="relay-profile-") as tmp:
        out = Path(tmp) / "gateway.prof"
        try:
            gw = (start_nginx(sim.port, Path(tmp)) if args.nginx
                  else _start_profiled_gateway(sim.url, Path(tmp), out, args.source))
            try:
                events, used, ttfts = asyncio.run(
                    _load(gw, args.streams, args.tokens, args.rounds, profile,
                          args.requests, args.burst))
                written = profile and _wait_for(out)
            finally:
                gw.stop()
        finally:
            sim.stop()
        unit = "new streams" if args.burst else "events"
        print(f"{events} {unit} relayed, gateway CPU {used:.2f} s, "
              f"{used / max(events, 1) * 1e6:.1f} us per {unit[:-1]}"
              f"{' (under cProfile)' if profile else ''}")
        if ttfts:
            ttfts.sort()
            print(f"burst TTFT p50 {ttfts[len(ttfts) // 2] * 1000:.1f} ms "
                  f"(replica {ttft_ms:g} ms, {args.burst} at once, {args.rounds} rounds)")
        if not profile:
            return 0
        if not written:
            print("no profile written", file=sys.stderr)
            return 1
        if args.save:
            Path(args.save).write_bytes(out.read_bytes())
        stats = pstats.Stats(str(out))
        raw = stats.stats  # type: ignore[attr-defined]
        # Per-event work only: start-up (imports, compiles) and the idle poll are left out.
        per_event = {k: v for k, v in raw.items()
                     if v[1] >= args.min_calls * events and "epoll" not in k[2]}
        rows = sorted(per_event.items(), key=lambda kv: kv[1][2], reverse=True)[: args.top]
        total = sum(v[2] for v in per_event.values())
        print(f"functions called >= {args.min_calls} times per event: "
              f"{total / max(events, 1) * 1e6:.1f} us own time per event in all")
        print(f"{'own us/event':>12} {'share':>6} {'calls/event':>11}  function")
        for (file, line, func), (_cc, nc, tt, _ct, _callers) in rows:
            where = f"{Path(file).name}:{line}" if line else file
            print(f"{tt / max(events, 1) * 1e6:12.2f} {100 * tt / total:5.1f}% "
                  f"{nc / max(events, 1):11.2f}  {func} ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
