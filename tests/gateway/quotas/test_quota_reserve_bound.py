"""The completion reserve bounds what the backend may generate for one request.

Through a real gateway and vllm_sim on loopback, with the official ``openai`` SDK: a request is
reserved ``max_tokens x max(n, best_of) x prompts`` (every choice, every candidate, one
completion per prompt of a ``/v1/completions`` list), with ``max_tokens`` the largest of the
max-tokens fields present, and counts read as vLLM reads them (``"3"``, ``3.0``) or refused
with 400 naming the field. Each case used to be admitted and then generated many times its
token budget in one request (tester2 findings 1 and 2).
"""

from __future__ import annotations

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

def gateway(serve_asgi: Callable[..., Any], quotas: dict[str, Any],
            **sim: Any) -> tuple[openai.OpenAI, Any, QuotaHook]:
    """(SDK client of key A without retries, the simulator, the quota hook)."""
    s = start_sim(serve_asgi, **sim)
    cfg = settings([s.url], quotas=quotas)
    hook = QuotaHook.from_settings(cfg.quotas or {})
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[hook]))
    c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A, max_retries=0)
    OPEN_CLIENTS.append(c)
    return c, s, hook


def budget(tokens_per_day: int, **more: Any) -> dict[str, Any]:
    return {"defaults": {"key": {"tokens_per_day": tokens_per_day}}, **more}


def test_every_choice_above_128_is_reserved(
    serve_asgi: Callable[..., Any], backend: dict[str, Any]
) -> None:
    c, sim, _ = gateway(serve_asgi, {**budget(1000), **backend}, tokens_per_response=50)
    with pytest.raises(openai.RateLimitError) as info:
        # 500 choices x 50 tokens: was counted as one choice (reserve 50) and generated 25000.
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50, n=500)
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    assert sim.stats()["received"] == 0
    ok = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50, n=2)
    assert len(ok.choices) == 2


def test_every_prompt_of_a_completions_list_is_reserved(
    serve_asgi: Callable[..., Any], backend: dict[str, Any]
) -> None:
    c, sim, _ = gateway(serve_asgi, {**budget(1000), **backend}, tokens_per_response=50)
    with pytest.raises(openai.RateLimitError) as info:
        # 200 prompts, one completion each: was reserved as one and generated 10000 tokens.
        c.completions.create(model=MODEL, prompt=["hi"] * 200, max_tokens=50)
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    with pytest.raises(openai.RateLimitError):
        c.completions.create(model=MODEL, prompt=[[1, 2]] * 10, max_tokens=50, n=2)  # 1000
    assert sim.stats()["received"] == 0
    ok = c.completions.create(model=MODEL, prompt=["hi", "ho"], max_tokens=50, n=2)
    assert len(ok.choices) == 4
    one = c.completions.create(model=MODEL, prompt=[1, 2, 3] * 100, max_tokens=50)  # 1 prompt
    assert len(one.choices) == 1


def test_completions_without_max_tokens_reserve_the_backend_default(
    serve_asgi: Callable[..., Any]
) -> None:
    c, sim, _ = gateway(serve_asgi, budget(1000), tokens_per_response=50)
    with pytest.raises(openai.RateLimitError):
        # vLLM generates 16 tokens per completion when max_tokens is left out: 100 x 16.
        c.completions.create(model=MODEL, prompt=["hi"] * 100)
    assert sim.stats()["received"] == 0
    ok = c.completions.create(model=MODEL, prompt=["hi"] * 10)
    assert ok.usage is not None and ok.usage.completion_tokens == 160


def test_best_of_candidates_are_reserved(serve_asgi: Callable[..., Any]) -> None:
    c, sim, _ = gateway(serve_asgi, budget(1000), tokens_per_response=50)
    with pytest.raises(openai.RateLimitError):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=50, best_of=30)
    assert sim.stats()["received"] == 0


@pytest.mark.parametrize("n", ["3", 3.0, " 3 "])
def test_n_is_read_as_vllm_reads_it(serve_asgi: Callable[..., Any], n: Any) -> None:
    c, sim, _ = gateway(serve_asgi, budget(1000))
    with pytest.raises(openai.RateLimitError) as info:
        # vLLM (pydantic, lax) reads n "3" / 3.0 as 3: 3 x 400 does not fit 1000.
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=400,
                                  extra_body={"n": n})
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    assert sim.stats()["received"] == 0
    with pytest.raises(openai.BadRequestError):  # "1" fits: admitted and forwarded (the
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=400,  # simulator
                                  extra_body={"n": "1"})  # refuses a string n; vLLM does not)
    assert sim.stats()["received"] == 1


@pytest.mark.parametrize(("field", "value"), [
    ("n", "three"), ("n", 2.5), ("n", 0), ("n", -4), ("n", [3]), ("best_of", "x"),
    ("max_tokens", "lots"), ("max_tokens", -1), ("max_completion_tokens", 1.5),
])
def test_a_count_the_backend_cannot_read_is_refused(
    serve_asgi: Callable[..., Any], field: str, value: Any
) -> None:
    c, sim, hook = gateway(serve_asgi, budget(100_000))
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={field: value})
    assert info.value.status_code == 400
    body: Any = info.value.body
    assert (body["code"], body["param"], body["type"]) == (
        "invalid_request", field, "invalid_request_error")
    assert sim.stats()["received"] == 0
    assert hook.service.limiter.used("key:team-a", "day") == 0  # type: ignore[attr-defined]


def test_completions_reserve_the_largest_max_tokens_field(
    serve_asgi: Callable[..., Any], backend: dict[str, Any]
) -> None:
    c, sim, _ = gateway(serve_asgi, {**budget(300), **backend}, tokens_per_response=400)
    with pytest.raises(openai.RateLimitError) as info:
        # /v1/completions generates max_tokens (400) and ignores max_completion_tokens (1):
        # this was reserved 1.
        c.completions.create(model=MODEL, prompt="hi", max_tokens=400,
                             extra_body={"max_completion_tokens": 1})
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1,
                                  extra_body={"max_completion_tokens": 400})
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=1,
                                  extra_body={"max_tokens": 400})
    assert sim.stats()["received"] == 0
    ok = c.completions.create(model=MODEL, prompt="hi", max_tokens=200,
                              extra_body={"max_completion_tokens": 1})
    assert ok.usage is not None and ok.usage.completion_tokens == 200
