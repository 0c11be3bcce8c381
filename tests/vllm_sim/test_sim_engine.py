"""The engine model (``SimConfig.profile``): prefix caching, the waiting queue, pacing, metrics."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_sim import SimConfig, create_app
from vllm_sim.engine import Engine, SeqHandle
from vllm_sim.kv_cache import block_hashes
from vllm_sim.profiles import PROFILES, ProfileError, load_profile


def _metric(page: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", page, re.M)
    assert match, f"{name} not on the metrics page"
    return float(match.group(1))


def _chat(system: str, question: str, history: list[dict[str, str]] | None = None) -> Any:
    messages = [{"role": "system", "content": system}, *(history or [])]
    messages.append({"role": "user", "content": question})
    return {"model": "sim-model", "messages": messages, "max_tokens": 8}


def _words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def test_unknown_profile_and_bad_profile_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"unknown profile 'nope'.*tiny-test"):
        create_app(SimConfig(profile="nope"))
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({**PROFILES["tiny-test"].model_dump(), "max_num_seqs": 0}))
    with pytest.raises(ProfileError, match=r"p\.json: max_num_seqs: Input should be greater"):
        load_profile(bad)


def test_repeated_prefix_is_a_cache_hit_in_metrics_and_prefix_probe(start_sim: Any) -> None:
    sim = start_sim(profile="tiny-test")
    system = _words(200, "s")
    body = _chat(system, "first question")
    probe = httpx.post(f"{sim.url}/sim/prefix", json=body).json()
    assert probe["cached_tokens"] == 0 and probe["prompt_tokens"] > 200
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=body).status_code == 200
    page = httpx.get(f"{sim.url}/metrics").text
    assert _metric(page, "vllm:prefix_cache_hits_total") == 0
    queries = _metric(page, "vllm:prefix_cache_queries_total")
    assert queries == probe["prompt_tokens"]
    assert re.search(r'vllm:cache_config_info\{block_size="16",.*num_gpu_blocks="64"', page)

    other = _chat(system, "another question")
    cached = httpx.post(f"{sim.url}/sim/prefix", json=other).json()["cached_tokens"]
    assert cached >= 192 and cached % 16 == 0  # the system prompt's full blocks
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=other).status_code == 200
    page = httpx.get(f"{sim.url}/metrics").text
    assert _metric(page, "vllm:prefix_cache_hits_total") == cached

    httpx.post(f"{sim.url}/sim/reset")
    assert httpx.post(f"{sim.url}/sim/prefix", json=other).json()["cached_tokens"] == 0


def test_next_turn_reuses_the_previous_answer(start_sim: Any) -> None:
    sim = start_sim(profile="tiny-test")
    first = _chat(_words(40, "s"), _words(30, "q"))
    first["max_tokens"] = 40
    answer = httpx.post(f"{sim.url}/v1/chat/completions", json=first).json()
    text = answer["choices"][0]["message"]["content"]
    history = [first["messages"][1], {"role": "assistant", "content": text}]
    second = _chat(_words(40, "s"), "next", history)
    prompt_1 = httpx.post(f"{sim.url}/sim/prefix", json=first).json()["prompt_tokens"]
    cached = httpx.post(f"{sim.url}/sim/prefix", json=second).json()["cached_tokens"]
    assert cached > prompt_1  # blocks of the answer are cached too


def test_requests_beyond_max_num_seqs_wait(start_sim: Any) -> None:
    sim = start_sim(profile="tiny-test", time_scale=20.0)  # steps of 40 ms and more
    body = _chat("short", "q")
    body["max_tokens"] = 30
    threads = [
        threading.Thread(target=httpx.post, args=(f"{sim.url}/v1/chat/completions",),
                         kwargs={"json": body, "timeout": 60})
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    page = ""
    while time.monotonic() < deadline:  # the queue as /metrics reports it, one page at a time
        page = httpx.get(f"{sim.url}/metrics").text
        if (_metric(page, "vllm:num_requests_running"), _metric(page, "vllm:num_requests_waiting")
                ) == (4.0, 2.0):
            break
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert _metric(page, "vllm:num_requests_running") == 4.0
    assert _metric(page, "vllm:num_requests_waiting") == 2.0
    assert 0.0 < _metric(page, "vllm:kv_cache_usage_perc") <= 1.0
    assert sim.wait_stats(lambda s: s["completed"] == 6)["completed"] == 6
    assert sim.stats()["engine"]["kv_blocks_used"] == 0


def test_prefill_time_follows_uncached_tokens(start_sim: Any, tmp_path: Path) -> None:
    slow = {**PROFILES["tiny-test"].model_dump(), "name": "slow-prefill",
            "num_gpu_blocks": 256, "prefill_tokens_per_s": 200.0}
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    sim = start_sim(profile=str(path))
    system = _words(600, "s")  # ~3 s of prefill when nothing is cached

    def ttft(body: dict[str, Any]) -> float:
        t0 = time.monotonic()
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions",
                          json={**body, "stream": True}, timeout=30) as resp:
            for line in resp.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    return time.monotonic() - t0
        raise AssertionError("no token")

    cold = ttft(_chat(system, "one"))
    warm = ttft(_chat(system, "two"))
    assert cold >= 3.0
    assert warm < cold / 2  # ~2 tokens to compute; the margin absorbs a loaded machine


def _seq(tokens: list[str], output: int = 2) -> SeqHandle:
    hashes = block_hashes(tokens, 16)
    return SeqHandle(prompt_hashes=hashes, prompt_tokens=len(tokens), output_tokens=output,
                     final_hashes=hashes)


def _engine(budget: int) -> Engine:
    profile = PROFILES["tiny-test"].model_copy(update={"max_num_batched_tokens": budget})
    return Engine(profile)


async def _until(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0)


def test_a_request_reuses_blocks_another_is_still_prefilling() -> None:
    """vLLM V1 hashes a chunk's full blocks when it is scheduled, not when it is computed."""

    async def run() -> tuple[int, int, int]:
        engine = _engine(budget=512)
        prompt = [f"p{i}" for i in range(64)]  # 4 full blocks
        first, second = _seq(prompt), _seq(prompt)
        engine.submit(first)
        engine.submit(second)  # same step: scheduled after the first
        await asyncio.wait_for(second.wait_tokens(2), 5)
        await engine.close()
        return first.cached_tokens, second.cached_tokens, engine.hits_total

    first, second, hits = asyncio.run(run())
    # 3 blocks, not 63 tokens: a hit is whole blocks of at most prompt - 1 tokens.
    assert (first, second, hits) == (0, 48, 48)


def test_a_fully_cached_prompt_recomputes_its_last_block() -> None:
    async def run() -> int:
        engine = _engine(budget=512)
        prompt = [f"q{i}" for i in range(32)]  # exactly 2 full blocks
        warm = _seq(prompt)
        engine.submit(warm)
        await asyncio.wait_for(warm.wait_tokens(2), 5)
        again = _seq(prompt)
        engine.submit(again)
        await asyncio.wait_for(again.wait_tokens(2), 5)
        await engine.close()
        assert engine.cached_tokens(again.prompt_hashes, 32) == 16
        return again.cached_tokens

    assert asyncio.run(run()) == 16


def test_waiting_requests_are_admitted_only_while_the_step_has_token_budget() -> None:
    async def run() -> tuple[int, int, int, int]:
        engine = _engine(budget=64)
        a = _seq([f"a{i}" for i in range(80)])
        b = _seq([f"b{i}" for i in range(80)])
        engine.submit(a)
        engine.submit(b)
        await asyncio.sleep(0)  # the step loop plans step 1 and sleeps through it
        during_first_step = (len(engine.waiting), engine.queries_total)
        await asyncio.wait_for(b.wait_tokens(2), 5)
        await engine.close()
        return *during_first_step, a.computed, b.computed

    # a takes the whole budget of step 1, so b is neither admitted nor looked up yet.
    assert asyncio.run(run()) == (1, 80, 80, 80)


def test_a_step_mixing_prefill_and_decodes_hides_the_weight_read_under_the_prefill() -> None:
    p = PROFILES["qwen3-32b-h100"]
    prefill = 400 / p.prefill_tokens_per_s  # ~66 ms of compute, longer than one weight read
    assert prefill > p.decode_base_s
    decode_only = p.step_time_s(0, 4, 4 * 2400)
    mixed = p.step_time_s(400, 4, 4 * 2400)
    assert decode_only == pytest.approx(
        p.decode_base_s + 4 * p.decode_per_seq_s + 4 * 2400 * p.decode_per_ctx_token_s)
    assert mixed == pytest.approx(decode_only - p.decode_base_s + prefill)
    assert p.step_time_s(400, 0, 0) == pytest.approx(prefill)
    assert p.step_time_s(10, 0, 0) == p.decode_base_s  # a tiny chunk still reads the weights
    assert p.step_time_s(0, 0, 0) == 0.0
