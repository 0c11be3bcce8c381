"""The relay benchmark's harness: the backend it relays from and the load client, C or Python.

``bench/relay.py`` measures proxies (the gateway, nginx) between a backend and a load client
on the same machine. When the harness itself needs a core, the proxies are measured against
the harness: with 512 paced streams the Python simulator and the asyncio client use about two
cores between them, so on two cores even *direct* streams stall. Two harnesses:

* ``c`` (default when built): ``bench/csrc/sse_backend.c``, a single-threaded epoll + timerfd
  backend writing vllm-sim's paced SSE bytes, and ``bench/csrc/sse_load.c``, an epoll client
  recording TTFT and every inter-event gap per stream (CLOCK_MONOTONIC, microseconds). Built
  by ``make bench-tools`` (``cc -O2``) into ``.cache/bench``.
* ``python``: ``vllm-sim`` (uvicorn) and ``bench/relay_load.py`` (asyncio, uvloop).

``relay.py`` uses the chosen harness for (b), (d) and (e); (a) and (c) keep the Python one.
Both give the same results types (:class:`relay_load.StreamTotals`, latencies in seconds), so
``relay.py`` computes its percentiles from the raw values either way.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relay_load import StreamResult, StreamTotals
from relay_load import run_latency as py_run_latency
from relay_load import run_streams as py_run_streams
from relay_procs import Proc, free_port, start_sim

ROOT = Path(__file__).resolve().parents[1]
BIN_DIR = ROOT / ".cache" / "bench"
BACKEND = BIN_DIR / "sse_backend"
LOAD = BIN_DIR / "sse_load"


def build_c_tools() -> str | None:
    """Build the C harness with ``make bench-tools`` (a no-op when up to date).

    Returns:
        None when built, else why not (no C compiler, no make, a compiler error).
    """
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler (cc) on PATH (Debian: apt-get install -y gcc)"
    if shutil.which("make") is None:
        return "make is not installed"
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "bench-tools"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        return f"make bench-tools failed:\n{done.stdout}{done.stderr}"
    return None


def parse_load_output(text: str) -> tuple[StreamTotals, list[float]]:
    """Parse ``sse_load``'s output (see bench/csrc/sse_load.c).

    Returns:
        The streams (``S`` lines; wall time and client CPU from the ``T`` line) and the
        latencies in seconds (``L`` lines, completed requests only).

    Raises:
        RuntimeError: a latency request did not complete with status 200 (like the Python
            client's ``run_latency``), or the output has no ``T`` line.
    """
    results: list[StreamResult] = []
    latencies: list[float] = []
    totals: StreamTotals | None = None
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "S":
            ttft, total = int(f[5]) / 1e6, int(f[6]) / 1e6
            results.append(StreamResult(int(f[3]), ttft, total, f[1] == "1",
                                        [int(g) / 1e6 for g in f[7:]]))
        elif f[0] == "L":
            if f[1] != "1":
                raise RuntimeError(f"a request failed (HTTP {f[2]})")
            latencies.append(int(f[3]) / 1e6)
        elif f[0] == "T":
            totals = StreamTotals(int(f[1]) / 1e6, client_cpu_s=int(f[2]) / 1e6)
    if totals is None:
        raise RuntimeError("sse_load wrote no totals line")
    totals.results = results
    return totals, latencies


class Harness:
    """The Python harness: ``vllm-sim`` and the asyncio client of ``relay_load``."""

    name = "python"

    def start_backend(self, model: str, tokens: int, itl_ms: float = 0.0,
                      ttft_ms: float = 0.0) -> Proc:
        """Start a backend serving ``model``: ``tokens`` per response, ``itl_ms`` apart.

        The first byte of a response waits ``ttft_ms``. Raises RuntimeError if it does not
        start.
        """
        return start_sim(model, tokens=tokens, itl_ms=itl_ms, ttft_ms=ttft_ms)

    async def run_streams(self, host: str, port: int, request: bytes, total: int,
                          concurrency: int, keep_alive: bool = False) -> StreamTotals:
        """``total`` streamed requests, ``concurrency`` at once (see ``relay_load``)."""
        return await py_run_streams(host, port, request, total, concurrency, keep_alive)

    async def run_latency(self, host: str, port: int, request: bytes, total: int,
                          concurrency: int) -> list[float]:
        """``total`` non-streamed requests, closed loop at ``concurrency``; seconds each."""
        return await py_run_latency(host, port, request, total, concurrency)


class CHarness(Harness):
    """The C harness: ``sse_backend`` and ``sse_load`` (build them first: ``build_c_tools``)."""

    name = "c"

    def start_backend(self, model: str, tokens: int, itl_ms: float = 0.0,
                      ttft_ms: float = 0.0) -> Proc:
        port = free_port()
        argv = [str(BACKEND), "--port", str(port), "--model", model, "--tokens", str(tokens),
                "--itl-ms", str(itl_ms), "--ttft-ms", str(ttft_ms)]
        return Proc(f"sse_backend:{port}", argv, port, "/health")

    async def _load(self, args: list[str], request: bytes) -> str:
        with tempfile.TemporaryDirectory(prefix="sse-load-") as tmp:
            req, out = Path(tmp, "request"), Path(tmp, "out")
            req.write_bytes(request)
            proc = await asyncio.create_subprocess_exec(
                str(LOAD), *args, "--request", str(req), "--out", str(out),
                stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"sse_load failed ({proc.returncode}): {err.decode()}")
            return out.read_text()

    async def run_streams(self, host: str, port: int, request: bytes, total: int,
                          concurrency: int, keep_alive: bool = False) -> StreamTotals:
        args = ["--host", host, "--port", str(port), "--mode", "stream", "--total", str(total),
                "--concurrency", str(concurrency)] + (["--keep-alive"] if keep_alive else [])
        t0 = time.perf_counter()
        totals, _ = parse_load_output(await self._load(args, request))
        if not totals.wall_s:
            totals.wall_s = time.perf_counter() - t0
        return totals

    async def run_latency(self, host: str, port: int, request: bytes, total: int,
                          concurrency: int) -> list[float]:
        args = ["--host", host, "--port", str(port), "--mode", "latency", "--total", str(total),
                "--concurrency", str(concurrency), "--keep-alive"]
        _, latencies = parse_load_output(await self._load(args, request))
        return latencies


def select_harness(choice: str) -> Harness:
    """The harness for ``--harness`` ``auto`` (C when it builds), ``c`` or ``python``.

    Raises:
        SystemExit: ``c`` was asked for and cannot be built.
    """
    if choice == "python":
        return Harness()
    why = build_c_tools()
    if why is None:
        return CHarness()
    if choice == "c":
        raise SystemExit(f"--harness c: {why}")
    print(f"# C harness not built ({why.splitlines()[0]}): using the Python harness",
          file=sys.stderr)
    return Harness()
