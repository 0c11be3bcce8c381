"""Batch API throughput against the same requests sent interactively, in one run.

One vLLM simulator (``--ttft-s`` per request) and one gateway on loopback in this process
(flow control with an ``interactive`` and a ``batch`` class, ``batch.concurrency`` =
``--concurrency``). The same ``--requests`` chat requests are sent (1) interactively by
``--concurrency`` client threads with the ``openai`` SDK, (2) as one batch (``files.create``,
``batches.create``, polled with ``batches.retrieve`` every 50 ms). Prints requests per second
of both and their ratio (batch / interactive; the batch figure includes upload, validation and
the output file).

Usage::

    .venv/bin/python bench/batch.py [--requests 200] [--concurrency 4] [--ttft-s 0.02]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.loopback import ThreadServer  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config.loader import parse  # noqa: E402
from vllm_sim import SimConfig  # noqa: E402
from vllm_sim import create_app as create_sim  # noqa: E402

KEY = "sg-bench-batch"
SERVED = "sim-model"


def _body(i: int) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8,
            "messages": [{"role": "user", "content": f"question number {i}"}]}


def run(requests: int, concurrency: int, ttft_s: float) -> dict[str, Any]:
    """Both runs; returns their figures."""
    sim = ThreadServer(create_sim(SimConfig(models=[SERVED], ttft_s=ttft_s)))
    with tempfile.TemporaryDirectory() as tmp:
        settings = parse({
            "listen": {"host": "127.0.0.1", "port": 0},
            "models": [{"name": "m", "served_model_name": SERVED,
                        "replicas": [{"url": sim.url}]}],
            "keys": [{"id": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                      "models": ["*"]}],
            "health": {"active": False},
            "logging": {"access_log": False},
            "flow_control": {"enabled": True, "default_class": "interactive",
                             "classes": [{"name": "interactive"}, {"name": "batch"}]},
            "batch": {"database": str(Path(tmp) / "batch.db"), "concurrency": concurrency},
        }, {})
        gw = ThreadServer(create_app(settings))
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        try:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(lambda i: client.chat.completions.create(**_body(i)),
                              range(requests)))
            interactive_s = time.perf_counter() - t0
            content = b"".join(json.dumps({"custom_id": str(i), "method": "POST",
                                           "url": "/v1/chat/completions",
                                           "body": _body(i)}).encode() + b"\n"
                               for i in range(requests))
            t0 = time.perf_counter()
            f = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
            b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
            while b.status not in ("completed", "failed", "cancelled"):
                time.sleep(0.05)
                b = client.batches.retrieve(b.id)
            out = client.files.content(b.output_file_id or "").text.splitlines()
            batch_s = time.perf_counter() - t0
            assert b.request_counts is not None and b.request_counts.completed == requests
            assert len(out) == requests
        finally:
            client.close()
            gw.stop()
            sim.stop()
    return {"requests": requests, "concurrency": concurrency, "ttft_s": ttft_s,
            "interactive_rps": round(requests / interactive_s, 1),
            "batch_rps": round(requests / batch_s, 1),
            "ratio_batch_over_interactive": round(interactive_s / batch_s, 2)}


def main(argv: list[str]) -> int:
    """Parse the options, run, print one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--ttft-s", type=float, default=0.02)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.requests, args.concurrency, args.ttft_s), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
