"""Quotas through the real gateway, with the official ``openai`` SDK as the client.

Simulator and gateway run on real uvicorn servers on loopback; the gateway is built by
``create_app`` with the :class:`QuotaHook` registered as admission hook and observer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.quotas.hook import QuotaHook
from tests.gateway.helpers import KEY_A, KEY_B, settings, start_sim

MODEL = "llama-3.1-8b"


def gateway(
    serve_asgi: Callable[..., Any], quotas: dict[str, Any], **sim: Any
) -> tuple[str, QuotaHook]:
    s = start_sim(serve_asgi, **sim)
    cfg = settings([s.url], quotas=quotas)
    hook = QuotaHook.from_settings(cfg.quotas or {})
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[hook]))
    return str(srv.url), hook


class Attempts:
    """Records each HTTP attempt the SDK makes (status and time)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, int, httpx.Headers]] = []

    def __call__(self, response: httpx.Response) -> None:
        self.items.append((time.monotonic(), response.status_code, response.headers))


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(url: str, key: str = KEY_A, max_retries: int = 0) -> tuple[openai.OpenAI, Attempts]:
    """An SDK client whose HTTP attempts are recorded (closed after the test)."""
    attempts = Attempts()
    http = httpx.Client(event_hooks={"response": [attempts]}, trust_env=False)
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=max_retries, http_client=http)
    _OPEN.append(c)
    return c, attempts


def wait_idle(hook: QuotaHook) -> None:
    """Wait until every request has ended in the gateway.

    A client has the whole response a moment before the gateway's ``on_end`` settles the usage
    and frees the slot.
    """
    deadline = time.monotonic() + 5
    while hook.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook.in_flight == 0


def chat(c: openai.OpenAI, **kw: Any) -> Any:
    return c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], **kw
    )


def test_requests_per_minute_429_body_and_headers(serve_asgi: Callable[..., Any]) -> None:
    url, _ = gateway(serve_asgi, {"defaults": {"key": {"requests_per_minute": 2}}})
    c, attempts = client(url)
    chat(c)
    chat(c)
    with pytest.raises(openai.RateLimitError) as info:
        chat(c)
    err = info.value
    assert err.status_code == 429
    assert err.body == {
        "message": err.body["message"],  # type: ignore[index]
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert "key 'team-a'" in err.body["message"]  # type: ignore[index]
    h = err.response.headers
    assert int(h["retry-after"]) == 30 and 29_000 < int(h["retry-after-ms"]) <= 30_000
    assert h["x-ratelimit-limit-requests"] == "2"
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    assert [status for _, status, _ in attempts.items] == [200, 200, 429]
    # Another key (no team) is not limited by team-a's key limit of its own.
    other, _ = client(url, KEY_B)
    other.chat.completions.create(model="other-model", messages=[{"role": "user", "content": "x"}])


def test_sdk_retry_honours_retry_after(serve_asgi: Callable[..., Any]) -> None:
    url, _ = gateway(serve_asgi, {"defaults": {"key": {"requests_per_minute": 60}}})
    c, attempts = client(url, max_retries=2)
    for _ in range(60):
        chat(c)
    result = chat(c)  # refused once, then retried by the SDK after the advertised delay
    assert result.choices[0].message.content
    statuses = [s for _, s, _ in attempts.items[60:]]
    assert statuses == [429, 200]
    (t429, _, h429), (t200, _, _) = attempts.items[60:]
    advertised_s = int(h429["retry-after-ms"]) / 1000
    assert 0 < advertised_s <= 1.0
    assert t200 - t429 >= advertised_s * 0.9


def test_tokens_per_minute_and_request_too_large(serve_asgi: Callable[..., Any]) -> None:
    url, hook = gateway(
        serve_asgi,
        {"defaults": {"team": {"tokens_per_minute": 300}}, "completion_reserve_cap": 10_000},
    )
    c, attempts = client(url, max_retries=2)
    with pytest.raises(openai.RateLimitError) as info:
        chat(c, max_tokens=400)  # estimate > the whole limit: never admissible, not retried
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    assert info.value.body["type"] == "tokens"  # type: ignore[index]
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(attempts.items) == 1
    r1 = chat(c, max_tokens=250)  # charged ~258 at admission, settled to the real usage
    wait_idle(hook)
    r2 = chat(client(url)[0], max_tokens=250)  # fits only because r1 was settled
    wait_idle(hook)
    used = r1.usage.total_tokens + r2.usage.total_tokens
    with pytest.raises(openai.RateLimitError) as info:
        chat(client(url)[0], max_tokens=280)
    body: Any = info.value.body
    assert (body["type"], body["code"]) == ("tokens", "rate_limit_exceeded")
    h = info.value.response.headers
    assert h["x-ratelimit-limit-tokens"] == "300"
    # What is left is the limit minus the real usage (plus a few tokens refilled meanwhile).
    assert 300 - used <= int(h["x-ratelimit-remaining-tokens"]) <= 300 - used + 40
    assert 0 < float(h["retry-after-ms"]) <= 60_000
    wait_idle(hook)


def test_settles_real_usage_into_the_daily_budget(serve_asgi: Callable[..., Any]) -> None:
    url, hook = gateway(serve_asgi, {"defaults": {"team": {"tokens_per_day": 1000}}})
    c, _ = client(url)
    r1 = chat(c, max_tokens=50)
    r2 = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    (usage2,) = [ch.usage for ch in r2 if ch.usage is not None]  # reads the whole stream
    wait_idle(hook)
    limiter: Any = hook.service.limiter
    expected = r1.usage.total_tokens + usage2.total_tokens
    assert limiter.used("team:a", "day") == expected
    wait_idle(hook)


def test_daily_budget_exhausted(serve_asgi: Callable[..., Any]) -> None:
    url, hook = gateway(serve_asgi, {"defaults": {"team": {"tokens_per_day": 100}}})
    c, attempts = client(url, max_retries=2)
    used = chat(c, max_tokens=20).usage.total_tokens
    wait_idle(hook)
    assert 100 - used < 88
    with pytest.raises(openai.RateLimitError) as info:
        chat(c, max_tokens=80)  # estimate 80 + 8 > what is left of the budget
    assert info.value.body["code"] == "insufficient_quota"  # type: ignore[index]
    assert info.value.body["type"] == "tokens_per_day"  # type: ignore[index]
    h = info.value.response.headers
    assert h["x-ratelimit-limit-tokens-day"] == "100"
    assert h["x-ratelimit-remaining-tokens-day"] == str(100 - used)
    assert h["x-should-retry"] == "false" or int(h["retry-after"]) <= 60
    assert attempts.items[-1][1] == 429


def test_concurrency_limit_across_streams(serve_asgi: Callable[..., Any]) -> None:
    url, hook = gateway(
        serve_asgi, {"defaults": {"key": {"max_concurrent": 1}}}, itl_s=0.05, tokens_per_response=20
    )
    c, _ = client(url)
    started = threading.Event()
    done: list[str] = []

    def slow() -> None:
        stream = chat(c, stream=True)
        for i, chunk in enumerate(stream):
            if i == 1:
                started.set()
            done.append(chunk.id)

    t = threading.Thread(target=slow)
    t.start()
    assert started.wait(10)
    c2, _ = client(url)
    with pytest.raises(openai.RateLimitError) as info:
        chat(c2)
    assert info.value.body["type"] == "concurrency"  # type: ignore[index]
    assert info.value.response.headers["retry-after"] == "1"
    t.join(20)
    assert done
    wait_idle(hook)
    chat(c2)  # the slot was released when the stream ended


def test_backend_saturation_is_distinguishable(serve_asgi: Callable[..., Any]) -> None:
    s = start_sim(serve_asgi)
    cfg = settings([s.url], quotas={"defaults": {"key": {"requests_per_minute": 100}}})
    hook = QuotaHook.from_settings(cfg.quotas or {})
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[hook]))
    s.fault(mode="status_429", retry_after_s=1)
    c, _ = client(str(srv.url))
    with pytest.raises(openai.RateLimitError) as info:
        chat(c)
    assert info.value.body["code"] != "rate_limit_exceeded"  # type: ignore[index]
    assert info.value.body["type"] not in ("requests", "tokens")  # type: ignore[index]
    wait_idle(hook)


def test_successful_responses_carry_rate_limit_headers(serve_asgi: Callable[..., Any]) -> None:
    url, _ = gateway(
        serve_asgi,
        {"defaults": {"key": {"requests_per_minute": 10}, "team": {"tokens_per_minute": 5000}}},
    )
    c, _ = client(url)
    msgs: Any = [{"role": "user", "content": "hello"}]
    first = c.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=5)
    second = c.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=5)
    assert first.headers["x-ratelimit-limit-requests"] == "10"
    assert first.headers["x-ratelimit-remaining-requests"] == "9"
    assert second.headers["x-ratelimit-remaining-requests"] == "8"
    assert first.headers["x-ratelimit-limit-tokens"] == "5000"
    assert int(second.headers["x-ratelimit-remaining-tokens"]) < 5000
    assert second.headers["x-ratelimit-reset-requests"].endswith("s")
    assert first.parse().choices  # the body is untouched
