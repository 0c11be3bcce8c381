"""The relay benchmark's raw-socket load generator counts exactly what the simulator sends.

A benchmark whose client miscounts events or mis-frames responses reports fiction: these tests
check ``bench/relay_load.py`` against the simulator (counts, keep-alive reuse, chunked and
Content-Length framing, idle streams), without timing anything.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("relay_load", BENCH / "relay_load.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["relay_load"] = module
    spec.loader.exec_module(module)
    return module


load = _load()
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_stream_counts_every_event_with_and_without_keep_alive(start_sim: Any) -> None:
    sim = start_sim(tokens_per_response=50)
    host = f"127.0.0.1:{sim.port}"

    async def run() -> tuple[Any, Any]:
        close = load.request_bytes(host, "/v1/chat/completions", BODY, "k", False)
        keep = load.request_bytes(host, "/v1/chat/completions", BODY, "k", True)
        a = await load.run_streams("127.0.0.1", sim.port, close, 20, 4, False)
        b = await load.run_streams("127.0.0.1", sim.port, keep, 20, 4, True)
        return a, b

    per_conn, reused = asyncio.run(run())
    for totals in (per_conn, reused):
        assert len(totals.results) == 20 and totals.failures == 0
        assert {r.events for r in totals.results} == {52}  # role + 50 tokens + [DONE]
        assert totals.events == 20 * 52
    stats = sim.stats()
    assert stats["completed"] == 40 and stats["last_headers"]["authorization"] == "Bearer k"


def test_split_writes_do_not_change_the_count(start_sim: Any) -> None:
    sim = start_sim(tokens_per_response=10)
    sim.fault(mode="split_writes", split_delay_s=0.0)
    req = load.request_bytes(f"127.0.0.1:{sim.port}", "/v1/chat/completions", BODY, None, False)
    result = asyncio.run(load.one_stream("127.0.0.1", sim.port, req))
    assert result.complete and result.events == 12


def test_broken_stream_is_not_complete(start_sim: Any) -> None:
    sim = start_sim(tokens_per_response=10)
    sim.fault(mode="die_mid_stream", after_events=4)
    req = load.request_bytes(f"127.0.0.1:{sim.port}", "/v1/chat/completions", BODY, None, True)
    totals = asyncio.run(load.run_streams("127.0.0.1", sim.port, req, 3, 1, True))
    assert totals.failures == 3 and {r.events for r in totals.results} == {4}
    # [DONE] arrived but not the terminating chunk: still a broken response
    sim.fault(mode="die_mid_stream", after_events=1000)
    close = load.request_bytes(f"127.0.0.1:{sim.port}", "/v1/chat/completions", BODY, None,
                               False)
    result = asyncio.run(load.one_stream("127.0.0.1", sim.port, close))
    assert result.events == 12 and not result.complete


def test_keep_alive_latency_client_reads_whole_responses(start_sim: Any) -> None:
    sim = start_sim()
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}
    req = load.request_bytes(f"127.0.0.1:{sim.port}", "/v1/chat/completions", body, None, True)
    lat = asyncio.run(load.run_latency("127.0.0.1", sim.port, req, 30, 3))
    assert len(lat) == 30 and all(x > 0 for x in lat)
    assert sim.stats()["completed"] == 30


def test_idle_streams_stay_open_upstream(start_sim: Any) -> None:
    sim = start_sim(itl_s=600.0)

    async def run() -> tuple[int, int]:
        req = load.request_bytes(f"127.0.0.1:{sim.port}", "/v1/chat/completions", BODY, None,
                                 False)
        writers, ok = await load.open_idle_streams("127.0.0.1", sim.port, req, 25)
        running = await asyncio.to_thread(lambda: sim.stats()["running"])
        for w in writers:
            w.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        return ok, running

    ok, running = asyncio.run(run())
    assert (ok, running) == (25, 25)
    stats = sim.wait_stats(lambda s: s["cancelled"] == 25)
    assert stats["running"] == 0
