"""Fleet-aware routing against two real vLLM replicas (opt-in, marker ``vllm``).

Needs two running vLLM servers serving the same model with prefix caching on (the V1 default):
``SG_VLLM_URL`` and ``SG_VLLM_URL_2`` (``SG_VLLM_MODEL``: served name, default ``tiny``).
``make test-vllm`` starts two CPU replicas of a tiny random-weight Llama
(``tests/integration/run_vllm.py --replicas 2``) and sets both.

Checks: the gateway's parser reads the real ``/metrics`` page; repeating a long prompt raises the
real ``vllm:prefix_cache_hits_total``; ``prefix_affinity`` sends a repeated prefix to the replica
that holds it.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config.loader import parse
from gateway.fleet.replica_metrics import parse_metrics
from gateway.relay.records import RequestRecord
from gateway.routing import Router

pytestmark = pytest.mark.vllm

KEY = "sg-vllm-routing-key"
URLS = [u.rstrip("/") for u in (os.environ.get("SG_VLLM_URL"), os.environ.get("SG_VLLM_URL_2"))
        if u]
MODEL = os.environ.get("SG_VLLM_MODEL", "tiny")
needs_two = pytest.mark.skipif(len(URLS) < 2, reason="set SG_VLLM_URL and SG_VLLM_URL_2")

# About 200 tokens with a Llama tokenizer: 12 full blocks of 16, inside a 512-token context.
PREFIX = " ".join(f"item{i}" for i in range(60))


def _hits(url: str) -> float:
    page = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in re.finditer(
        r"^vllm:(?:gpu_)?prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", page, re.M))


def _chat(question: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": PREFIX},
                         {"role": "user", "content": question}]}


@needs_two
def test_gateway_parses_real_vllm_metrics() -> None:
    for url in URLS:
        signals = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text, time.monotonic())
        assert signals.running is not None and signals.waiting is not None
        assert signals.kv_usage is not None and 0.0 <= signals.kv_usage <= 1.0
        assert signals.prefix_queries is not None and signals.prefix_hits is not None
        assert signals.kv_tokens is not None and signals.kv_tokens > 0


@needs_two
def test_repeated_long_prompt_raises_the_real_hit_counter() -> None:
    url = URLS[0]
    before = _hits(url)
    for q in ("first", "second"):
        resp = httpx.post(f"{url}/v1/chat/completions", json=_chat(f"{q} {time.time()}"),
                          timeout=120)
        assert resp.status_code == 200, resp.text
    assert _hits(url) - before >= 16  # at least one full block of the shared prefix


@needs_two
def test_prefix_affinity_sends_a_repeated_prefix_to_its_holder(
    serve_asgi: Callable[..., Any],
) -> None:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": MODEL, "strategy": "prefix_affinity",
                    "replicas": [{"url": u} for u in URLS]}],
        "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["m"]}],
        "health": {"active": False},
        "logging": {"access_log": False},
        "routing": {"metrics_interval_s": 0.2},
    }
    settings = parse(cfg, {})
    router = Router(settings)
    ended: list[RequestRecord] = []

    class Keep:
        async def on_start(self, record: RequestRecord) -> None:
            return None

        async def on_end(self, record: RequestRecord) -> None:
            ended.append(record)

    gw = str(serve_asgi(create_app(settings, router=router, observers=[Keep()])).url)
    replicas = router.pools["m"].replicas
    deadline = time.monotonic() + 30
    while not all(r.signals is not None for r in replicas):
        assert time.monotonic() < deadline, "metrics never scraped"
        time.sleep(0.1)
    hits = {u: _hits(u) for u in URLS}
    for i in range(4):
        body = {**_chat(f"question {i} {time.time()}"), "model": "m"}
        resp = httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=120,
                          headers={"authorization": f"Bearer {KEY}"})
        assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 10
    while len(ended) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    holder = ended[0].replica_url
    assert all(r.replica_url == holder for r in ended)
    assert all(r.route and r.route["matched_blocks"] > 0 for r in ended[1:])
    assert holder is not None and _hits(holder) - hits[holder] >= 3 * 16
