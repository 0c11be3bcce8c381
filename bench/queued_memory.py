"""Memory held by queued requests, as a multiple of their body size, in one run.

One vLLM simulator (uvicorn) and one gateway served by the production server
(:class:`gateway.serving.server.GatewayServer`, as ``gateway serve`` serves it) on loopback in this
process; flow control with ``in_flight: 1``. One request the simulator never answers holds the
replica; then ``--requests`` chat requests of ``--body-mb`` MB each are sent on raw sockets
(their bytes built before measuring) and wait in the queue. Measured once all of them are
queued: the Python heap the process holds beyond the baseline (``tracemalloc``, current and
peak) and the resident set (``VmRSS``), each divided by the bodies' total size. Prints one JSON
object.

Usage::

    .venv/bin/python bench/queued_memory.py [--requests 20] [--body-mb 8] [--text ascii]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import socket
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.loopback import ThreadServer  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.assembly import Gateway  # noqa: E402
from gateway.config.loader import parse  # noqa: E402
from gateway.serving.server import GatewayServer, ServerConfig, server_limits  # noqa: E402
from vllm_sim import SimConfig  # noqa: E402
from vllm_sim import create_app as create_sim  # noqa: E402

KEY = "sg-bench-queued-memory"
SERVED = "sim-model"
TEXTS = {"ascii": "lorem ipsum ", "latin": "grüße aus köln ", "cjk": "北京大学的图书馆 "}
"""Content filler by ``--text``: UTF-8 is 1, ~1.1 and ~2.9 bytes per character."""


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def request_bytes(body: bytes, port: int) -> bytes:
    """One HTTP/1.1 chat request with ``body``."""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def chat_body(size: int, text: str, i: int) -> bytes:
    """A chat request body of about ``size`` bytes (one user message)."""
    filler = TEXTS[text]
    unit = len(filler.encode())
    content = f"{i} " + filler * (size // unit)
    return json.dumps({"model": "m", "max_tokens": 4,
                       "messages": [{"role": "user", "content": content}]},
                      ensure_ascii=False).encode()


class _Served:
    """The gateway on the production server, in a thread."""

    def __init__(self, settings: Any, gw: Gateway) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        max_body = settings.limits.max_body_bytes
        self.server = GatewayServer(ServerConfig(
            create_app(settings, gw), host="127.0.0.1", port=self.port,
            limits=server_limits(settings.limits), body_limit=lambda: max_body))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _wait(cond: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting: {what}")
        time.sleep(0.02)


def run(requests: int, body_mb: float, text: str) -> dict[str, Any]:
    """Queue the requests; return the figures."""
    size = int(body_mb * 1024 * 1024)
    sim = ThreadServer(create_sim(SimConfig(models=[SERVED])))
    settings = parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim.url}]}],
        "keys": [{"id": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["*"]}],
        "limits": {"max_body_bytes": size + 1024 * 1024},
        "health": {"active": False},
        "logging": {"access_log": False},
        "flow_control": {"enabled": True, "default_class": "standard",
                         "saturation": {"in_flight": 1},
                         "max_queued_body_bytes": (requests + 2) * (size + 4096),
                         "classes": [{"name": "standard", "max_queue": requests + 1,
                                      "max_wait_s": 300}]},
    }, {})
    gw = Gateway.of(settings)
    assert gw.flow is not None
    gate = gw.flow
    server = _Served(settings, gw)
    socks: list[socket.socket] = []
    try:
        httpx.post(sim.url + "/sim/faults", json={"mode": "hang", "count": 1},
                   timeout=10).raise_for_status()
        hold = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        socks.append(hold)
        hold.sendall(request_bytes(chat_body(64, "ascii", -1), server.port))
        _wait(lambda: httpx.get(sim.url + "/sim/stats", timeout=10).json()["received"] >= 1,
              "the holder reaches the simulator")
        wires = [request_bytes(chat_body(size, text, i), server.port) for i in range(requests)]
        body_total = sum(len(w) - w.index(b"\r\n\r\n") - 4 for w in wires)
        gc.collect()
        tracemalloc.start()
        rss0 = _rss_bytes()
        heap0, _ = tracemalloc.get_traced_memory()
        t0 = time.perf_counter()
        for wire in wires:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            socks.append(sock)
            sock.sendall(wire)
        _wait(lambda: sum(n for _, _, n in gate.queue_lengths()) == requests,
              f"{requests} requests queued")
        queued_s = time.perf_counter() - t0
        time.sleep(0.5)  # let the server finish with its read buffers
        gc.collect()
        heap, peak = tracemalloc.get_traced_memory()
        rss = _rss_bytes()
        tracemalloc.stop()
    finally:
        for sock in socks:
            sock.close()
        server.stop()
        sim.stop()
    return {
        "requests": requests, "body_bytes": body_total // requests, "text": text,
        "queued_s": round(queued_s, 2),
        "heap_held_mb": round((heap - heap0) / 1e6, 1),
        "heap_multiple": round((heap - heap0) / body_total, 2),
        "heap_peak_multiple": round((peak - heap0) / body_total, 2),
        "rss_growth_mb": round((rss - rss0) / 1e6, 1),
        "rss_multiple": round((rss - rss0) / body_total, 2),
    }


def main(argv: list[str]) -> int:
    """Parse the options, run, print one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--body-mb", type=float, default=8.0)
    ap.add_argument("--text", choices=sorted(TEXTS), default="ascii")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.requests, args.body_mb, args.text), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
