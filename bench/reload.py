"""Live reload under load: paced streams through ``gateway serve`` with and without SIGHUPs.

One run, same simulator and gateway process, two phases of ``--streams`` concurrent streams of
``--tokens`` tokens ``--itl-ms`` apart:

* ``quiet``: no reload;
* ``reloading``: a SIGHUP every ``--every-s`` seconds while the streams run, alternating between
  the config with and without an extra key (each one a real reload: new revision, new key ring,
  audit-free so only the reload itself is timed).

Reported per phase: streams complete (``[DONE]`` received), the share without a gap over
100 ms, the p99 inter-event gap, and for the reloading phase the reloads applied and their
duration as the gateway logs it (load, check, build, swap). The ratio reloading/quiet of the
p99 gap is what a reload costs the streams in flight.

Usage::

    .venv/bin/python bench/reload.py --streams 200 --tokens 200 --itl-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from relay_load import StreamTotals, request_bytes, run_streams
from relay_procs import BENCH_KEY, Proc, bind_config, default_config, free_port, start_sim

BIN = Path(sys.executable).parent
_DURATION = re.compile(r"reloaded .* in ([0-9.]+) ms")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _summary(name: str, totals: StreamTotals, stall_s: float = 0.1) -> dict[str, float]:
    done = [r for r in totals.results if r.complete]
    gaps = [g for r in totals.results for g in r.gaps_s]
    smooth = [r for r in done if r.max_gap_s <= stall_s]
    out = {"streams": len(totals.results), "complete": len(done),
           "stall_free": len(smooth) / max(1, len(totals.results)),
           "p99_gap_ms": _p(gaps, 0.99) * 1000.0, "max_gap_ms": max(gaps, default=0.0) * 1000}
    print(f"{name:10s} complete {len(done)}/{len(totals.results)}  stall-free "
          f"{out['stall_free']:.1%}  p99 gap {out['p99_gap_ms']:.1f} ms  max gap "
          f"{out['max_gap_ms']:.1f} ms")
    return out


async def _phase(gw: Proc, args: argparse.Namespace, reload_paths: list[Path] | None,
                 config: Path) -> StreamTotals:
    body = {"model": "m", "stream": True, "max_tokens": args.tokens,
            "messages": [{"role": "user", "content": "hi"}]}
    req = request_bytes(f"127.0.0.1:{gw.port}", "/v1/chat/completions", body, BENCH_KEY, False)
    task = asyncio.create_task(run_streams("127.0.0.1", gw.port, req, args.streams, args.streams))
    i = 0
    while reload_paths is not None and not task.done():
        await asyncio.sleep(args.every_s)
        config.write_text(reload_paths[i % 2].read_text())
        gw.proc.send_signal(signal.SIGHUP)
        i += 1
    return await task


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--every-s", type=float, default=0.5)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    sim = start_sim("m", args.tokens, itl_ms=args.itl_ms)
    work = Path(tempfile.mkdtemp(prefix="sg-bench-reload-"))
    port = free_port()
    base = bind_config(default_config(), sim.url, port)
    other = dict(base, keys=[*base["keys"], {"id": "extra", "sha256": hashlib.sha256(
        b"extra").hexdigest(), "models": ["m"]}])
    variants = [work / "a.yaml", work / "b.yaml"]
    variants[0].write_text(yaml.safe_dump(other))
    variants[1].write_text(yaml.safe_dump(base))
    config = work / "gateway.yaml"
    config.write_text(yaml.safe_dump(base))
    exe = BIN / "gateway"
    argv_ = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    gw = Proc("gateway", [*argv_, "serve", "--config", str(config)], port, "/healthz")
    try:
        quiet = _summary("quiet", asyncio.run(_phase(gw, args, None, config)))
        t0 = time.monotonic()
        loud = _summary("reloading", asyncio.run(_phase(gw, args, variants, config)))
        time.sleep(1.0)  # the last reload's log line
        durations = [float(m[1]) for m in _DURATION.finditer(gw.log())]
        print(f"reloads applied {len(durations)} in {time.monotonic() - t0:.1f} s; duration "
              f"median {statistics.median(durations) if durations else 0:.1f} ms, max "
              f"{max(durations, default=0):.1f} ms")
        print(f"p99 gap reloading/quiet: {loud['p99_gap_ms'] / max(quiet['p99_gap_ms'], 1e-9):.2f}"
              f"x; incomplete streams: {quiet['streams'] - quiet['complete']} quiet, "
              f"{loud['streams'] - loud['complete']} reloading")
    finally:
        gw.stop()
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
