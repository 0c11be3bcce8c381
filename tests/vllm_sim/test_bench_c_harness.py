"""The relay benchmark's C harness speaks vllm-sim's protocol and counts what it is sent.

``bench/csrc/sse_backend.c`` must write the Python simulator's bytes (the gateway parses its
usage event; the official SDK must read its streams) and ``bench/csrc/sse_load.c`` must count
SSE events, detect broken streams and time the first event like the Python client
(``bench/relay_load.py``). Built with ``make bench-tools``; skipped without a C compiler.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import openai
import pytest

from vllm_sim.tokens import OUTPUT_TOKENS

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


load = _load("relay_load")
_load("relay_procs")
harness = _load("relay_harness")


@pytest.fixture(scope="module")
def c_tools() -> Any:
    why = harness.build_c_tools()
    if why is not None:
        pytest.skip(f"C harness not built: {why}")
    return harness.CHarness()


@pytest.fixture
def backend(c_tools: Any) -> Iterator[Any]:
    """Factory: ``backend(tokens, itl_ms=0, ttft_ms=0) -> Proc`` serving model ``sim-model``."""
    procs: list[Any] = []

    def start(tokens: int, itl_ms: float = 0.0, ttft_ms: float = 0.0) -> Any:
        proc = c_tools.start_backend("sim-model", tokens, itl_ms, ttft_ms)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


def _normalised(text: str) -> str:
    text = re.sub(r'"id":"chatcmpl-[0-9a-f]{16}"', '"id":"ID"', text)
    return re.sub(r'"created":\d+', '"created":0', text)


@pytest.mark.parametrize("body", [
    {"stream": True, "max_tokens": 20, "stream_options": {"include_usage": True}},
    {"stream": True},
    {"stream": True, "max_tokens": 3},
    {"stream": False, "max_tokens": 1},
    {"stream": False},
])
def test_backend_writes_the_simulators_bytes(backend: Any, start_sim: Any,
                                             body: dict[str, Any]) -> None:
    sim = start_sim(tokens_per_response=18)
    proc = backend(18)
    request = {"model": "sim-model", **body, "messages": [
        {"role": "system", "content": "Be brief, please."},
        {"role": "user", "content": "Hello there! What's 2+2?"}]}
    python = httpx.post(f"{sim.url}/v1/chat/completions", json=request)
    c = httpx.post(f"{proc.url}/v1/chat/completions", json=request)
    assert c.status_code == python.status_code == 200
    assert c.headers["content-type"] == python.headers["content-type"]
    assert _normalised(c.text) == _normalised(python.text)


def test_backend_stream_reads_with_the_openai_sdk(backend: Any) -> None:
    proc = backend(8, itl_ms=1.0)
    client = openai.OpenAI(base_url=f"{proc.url}/v1", api_key="sk-test", max_retries=0)
    try:
        assert [m.id for m in client.models.list()] == ["sim-model"]
        chunks = list(client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello there!"}],
            stream=True, max_tokens=5, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(OUTPUT_TOKENS[:5])
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
        usage = chunks[-1].usage
        assert usage is not None and not chunks[-1].choices
        assert (usage.prompt_tokens, usage.completion_tokens) == (3, 5)
        whole = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello there!"}])
        assert whole.choices[0].message.content == "".join(OUTPUT_TOKENS[:8])
        assert whole.choices[0].finish_reason == "stop"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other", messages=[
                {"role": "user", "content": "hi"}])
    finally:
        client.close()


def test_backend_serves_health_and_replica_metrics(backend: Any) -> None:
    proc = backend(4)
    assert httpx.get(f"{proc.url}/health").status_code == 200
    metrics = httpx.get(f"{proc.url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        assert re.search(rf'^{name}\{{[^}}]*model_name="sim-model"[^}}]*\}} 0\.0$', metrics,
                         re.M), name
    assert httpx.get(f"{proc.url}/sim/stats").json() == {"running": 0}


BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _request(port: int, body: dict[str, Any], keep_alive: bool) -> bytes:
    return bytes(load.request_bytes(f"127.0.0.1:{port}", "/v1/chat/completions", body, "k",
                                    keep_alive))


@pytest.mark.parametrize("mode", ["none", "split_writes", "crlf"])
def test_client_counts_events_like_the_python_client(c_tools: Any, start_sim: Any,
                                                     mode: str) -> None:
    sim = start_sim(tokens_per_response=30)
    if mode != "none":
        sim.fault(mode=mode, split_delay_s=0.0)

    async def run() -> list[Any]:
        out = []
        for keep in (False, True):
            req = _request(sim.port, BODY, keep)
            out.append(await c_tools.run_streams("127.0.0.1", sim.port, req, 12, 4, keep))
            out.append(await load.run_streams("127.0.0.1", sim.port, req, 12, 4, keep))
        return out

    for totals in asyncio.run(run()):
        assert len(totals.results) == 12 and totals.failures == 0
        assert {r.events for r in totals.results} == {32}  # role + 30 tokens + [DONE]
        assert {len(r.gaps_s) for r in totals.results} == {31}
    assert sim.stats()["completed"] == 48


def test_client_reports_a_cut_stream_as_incomplete(c_tools: Any, start_sim: Any) -> None:
    sim = start_sim(tokens_per_response=10)
    sim.fault(mode="die_mid_stream", after_events=4)
    totals = asyncio.run(c_tools.run_streams("127.0.0.1", sim.port,
                                             _request(sim.port, BODY, True), 3, 1, True))
    assert totals.failures == 3 and {r.events for r in totals.results} == {4}
    # [DONE] arrived but not the terminating chunk: still a broken response
    sim.fault(mode="die_mid_stream", after_events=1000)
    totals = asyncio.run(c_tools.run_streams("127.0.0.1", sim.port,
                                             _request(sim.port, BODY, False), 2, 2, False))
    assert totals.failures == 2 and {r.events for r in totals.results} == {12}


def test_client_ttft_and_gaps_agree_with_the_python_client(c_tools: Any, backend: Any) -> None:
    """Both clients read the same paced backend at the same time: same machine, same load."""
    ttft_ms, itl_ms, tokens = 80.0, 10.0, 10
    proc = backend(tokens, itl_ms=itl_ms, ttft_ms=ttft_ms)
    req = _request(proc.port, BODY, False)

    async def run() -> tuple[Any, Any]:
        c_run = c_tools.run_streams("127.0.0.1", proc.port, req, 8, 8)
        py_run = load.run_streams("127.0.0.1", proc.port, req, 8, 8)
        c_totals, py_totals = await asyncio.gather(c_run, py_run)
        return c_totals, py_totals

    c_totals, py_totals = asyncio.run(run())
    for totals in (c_totals, py_totals):
        assert totals.failures == 0 and {r.events for r in totals.results} == {tokens + 2}
        # nothing arrives before the backend's TTFT; the paced tokens span (tokens - 1) ITLs
        assert min(r.ttft_s for r in totals.results) >= ttft_ms / 1000
        assert all(r.total_s >= (ttft_ms + (tokens - 1) * itl_ms) / 1000
                   for r in totals.results)
    c_ttft = statistics.median(r.ttft_s for r in c_totals.results)
    py_ttft = statistics.median(r.ttft_s for r in py_totals.results)
    assert abs(c_ttft - py_ttft) < 0.05, (c_ttft, py_ttft)
    assert c_totals.client_cpu_s is not None and c_totals.client_cpu_s >= 0


def test_latency_client_reads_whole_responses(c_tools: Any, start_sim: Any) -> None:
    sim = start_sim()
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}
    lat = asyncio.run(c_tools.run_latency("127.0.0.1", sim.port,
                                          _request(sim.port, body, True), 30, 3))
    assert len(lat) == 30 and all(x > 0 for x in lat)
    assert sim.stats()["completed"] == 30
    with pytest.raises(RuntimeError, match="HTTP 404"):
        asyncio.run(c_tools.run_latency("127.0.0.1", sim.port, _request(
            sim.port, {**body, "model": "other"}, True), 3, 1))


def test_backend_delays_a_whole_answer_by_its_service_time(c_tools: Any, backend: Any) -> None:
    """``--ttft-ms`` delays a non-streamed answer too (relay.py's ``--replica-ms`` reading).

    With ``max_tokens: 1`` the answer waits the TTFT alone; with ``max_tokens: 3`` two token
    intervals more. The inter-token interval is long, so an answer that waited for every token of
    ``--tokens`` (not the ``max_tokens`` cut) or none would miss its bounds.
    """
    ttft_ms, itl_ms = 150.0, 1000.0
    proc = backend(16, itl_ms=itl_ms, ttft_ms=ttft_ms)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}
    lat = asyncio.run(c_tools.run_latency("127.0.0.1", proc.port,
                                          _request(proc.port, body, True), 4, 2))
    assert len(lat) == 4
    assert all(ttft_ms / 1000 <= x < (ttft_ms + itl_ms) / 1000 for x in lat), lat
    lat = asyncio.run(c_tools.run_latency("127.0.0.1", proc.port, _request(
        proc.port, {**body, "max_tokens": 3}, True), 2, 2))
    assert all((ttft_ms + 2 * itl_ms) / 1000 <= x < (ttft_ms + 3 * itl_ms) / 1000 for x in lat)
    whole = httpx.post(f"{proc.url}/v1/chat/completions", json=body, timeout=10).json()
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 1
