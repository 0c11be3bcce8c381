"""A request the backend failed, with no completion token relayed, is not charged its reserve.

Through a real gateway (assembled as ``gateway serve`` builds it) and vllm_sim on loopback,
with the official ``openai`` SDK: a backend 500 and a first-byte timeout are charged the prompt
estimate (the replica may have read the prompt), a busy backend's 429 nothing; a batch line
that the backend answered 429 many times is charged its real usage once. Each used to keep the
whole reservation (prompt + max_tokens) per attempt (tester2 finding 4).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from tests.gateway.helpers import KEY_A, Sim, settings, start_sim
from tests.gateway.quotas.conftest import OPEN_CLIENTS

MODEL = "llama-3.1-8b"
MESSAGES: Any = [{"role": "user", "content": "hi"}]
PROMPT_ESTIMATE = 8  # ceil(len("hi") / 4) + 4 per message + 3
H = {"authorization": f"Bearer {KEY_A}"}

def stack(serve_asgi: Callable[..., Any], quotas: dict[str, Any],
          **gw: Any) -> tuple[str, Sim, openai.OpenAI]:
    """(gateway url, simulator, SDK client of key A without retries)."""
    sim = start_sim(serve_asgi)
    s = settings([sim.url], quotas={"defaults": {"key": {"tokens_per_day": 50_000}}, **quotas},
                 **gw)
    url = str(serve_asgi(create_app(s, assemble(s))).url)
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0)
    OPEN_CLIENTS.append(c)
    return url, sim, c


def used_today(url: str, expected: int) -> int:
    """The key's tokens used today (the self-service usage endpoint), once it is ``expected``
    or after 5 s: a request settles just after its client got the answer."""
    deadline = time.monotonic() + 5
    while True:
        u = httpx.get(url + "/v1/usage", headers=H).json()
        now = int({e["subject"]: e for e in u["quotas"]}["key"]["tokens_used"]["day"])
        if now == expected or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def test_backend_500s_are_charged_their_prompt_not_their_reserve(
    serve_asgi: Callable[..., Any], backend: dict[str, Any]
) -> None:
    url, sim, c = stack(serve_asgi, backend)
    sim.fault(mode="status_500", count=3)
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1000)
    assert used_today(url, 3 * PROMPT_ESTIMATE) == 3 * PROMPT_ESTIMATE  # was 3 x (8 + 1000)
    ok = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1000)
    assert ok.usage is not None
    total = 3 * PROMPT_ESTIMATE + ok.usage.total_tokens
    assert used_today(url, total) == total


def test_a_busy_backend_costs_nothing(
    serve_asgi: Callable[..., Any], backend: dict[str, Any]
) -> None:
    url, sim, c = stack(serve_asgi, backend)
    sim.fault(mode="status_429", count=100, retry_after_s=0)
    for _ in range(3):
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1000)
        assert info.value.body["code"] == "upstream_429"  # type: ignore[index]
    assert sim.stats()["faults_applied"] >= 3
    assert used_today(url, 0) == 0  # was 3 x 1008


def test_a_first_byte_timeout_is_charged_its_prompt(serve_asgi: Callable[..., Any]) -> None:
    url, sim, c = stack(serve_asgi, {"backend": "memory"},
                        timeouts={"first_byte_s": 0.3}, retries={"max_attempts": 1})
    sim.fault(mode="hang", count=1)
    with pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1000)
    assert info.value.status_code == 504
    assert used_today(url, PROMPT_ESTIMATE) == PROMPT_ESTIMATE  # was 1008


def test_a_batch_line_retried_on_busy_answers_is_charged_once(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    flow = {"enabled": True, "default_class": "interactive",
            "classes": [{"name": "interactive"}, {"name": "batch"}]}
    url, sim, c = stack(serve_asgi, {"backend": "memory"},
                        batch={"database": str(tmp_path / "b.db"), "concurrency": 1},
                        flow_control=flow)
    sim.fault(mode="status_429", count=12, retry_after_s=0)
    line = json.dumps({"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": MESSAGES, "max_tokens": 1000}})
    f = c.files.create(file=("in.jsonl", io.BytesIO(line.encode() + b"\n")), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    deadline = time.monotonic() + 60
    while b.status not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.1)
        b = c.batches.retrieve(b.id)
    assert b.status == "completed" and b.output_file_id
    assert sim.stats()["faults_applied"] == 12
    out = json.loads(c.files.content(b.output_file_id).text)
    real = out["response"]["body"]["usage"]["total_tokens"]
    assert used_today(url, real) == real  # was real + several 1008-token reservations
