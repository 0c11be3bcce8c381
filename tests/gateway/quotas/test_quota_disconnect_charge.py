"""A non-streamed request whose client hangs up before the answer is charged its generation time.

Through a real gateway and vllm_sim on loopback, with the official ``openai`` SDK (its client
timeout is the hang-up): without usage and without relayed events, the request is charged
``max(estimate, prompt + min(disconnect_tokens_per_s * seconds, bound) * completions)``. It
used to be charged its prompt only when it set no ``max_tokens`` (tester2 finding 6).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.quotas.hook import QuotaHook
from tests.gateway.helpers import KEY_A, settings, start_sim
from tests.gateway.quotas.conftest import OPEN_CLIENTS

MODEL = "llama-3.1-8b"
MESSAGES: Any = [{"role": "user", "content": "hi"}]
PROMPT_ESTIMATE = 8  # ceil(len("hi") / 4) + 4 per message + 3
HANG_UP_S = 1.0
RATE = 100  # disconnect_tokens_per_s

def stack(serve_asgi: Callable[..., Any]) -> tuple[openai.OpenAI, Any, QuotaHook]:
    """(SDK client of key A that hangs up after HANG_UP_S, the simulator, the quota hook)."""
    sim = start_sim(serve_asgi, tokens_per_response=5000, itl_s=0.001)
    quotas = {"defaults": {"key": {"tokens_per_day": 100_000}},
              "disconnect_tokens_per_s": RATE}
    cfg = settings([sim.url], quotas=quotas)
    hook = QuotaHook.from_settings(cfg.quotas or {})
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[hook]))
    c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A, max_retries=0,
                      timeout=HANG_UP_S)
    OPEN_CLIENTS.append(c)
    return c, sim, hook


def settled(hook: QuotaHook) -> int:
    """The key's tokens of today once the request has ended in the gateway (bounded wait)."""
    deadline = time.monotonic() + 5
    while hook.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook.in_flight == 0
    return int(hook.service.limiter.used("key:team-a", "day"))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("n", "max_tokens", "low", "high"), [
    # no max_tokens: the time generated, per choice, up to completion_reserve_cap (1024); the
    # gateway counts from admission, after the client's connect and send (a few ms of HANG_UP_S)
    (1, None, PROMPT_ESTIMATE + RATE * HANG_UP_S * 0.9, PROMPT_ESTIMATE + 1024),
    (3, None, PROMPT_ESTIMATE + 3 * RATE * HANG_UP_S * 0.9, PROMPT_ESTIMATE + 3 * 1024),
    # max_tokens below what the time says: the reserve, as before
    (1, 20, PROMPT_ESTIMATE + 20, PROMPT_ESTIMATE + 20),
])
def test_a_hang_up_before_the_answer_is_charged_the_time_generated(
    serve_asgi: Callable[..., Any], n: int, max_tokens: int | None, low: float, high: float
) -> None:
    c, sim, hook = stack(serve_asgi)
    extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    if max_tokens is not None:
        sim.fault(mode="hang", count=1)  # 20 tokens would be answered in time: never answer
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, n=n, **extra)
    charged = settled(hook)
    assert low <= charged <= high, charged  # was PROMPT_ESTIMATE without max_tokens


def test_a_rate_of_zero_keeps_the_estimate(serve_asgi: Callable[..., Any]) -> None:
    sim = start_sim(serve_asgi, tokens_per_response=5000, itl_s=0.001)
    cfg = settings([sim.url], quotas={"defaults": {"key": {"tokens_per_day": 100_000}},
                                      "disconnect_tokens_per_s": 0})
    hook = QuotaHook.from_settings(cfg.quotas or {})
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[hook]))
    c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A, max_retries=0,
                      timeout=HANG_UP_S)
    OPEN_CLIENTS.append(c)
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert settled(hook) == PROMPT_ESTIMATE
