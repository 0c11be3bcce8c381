"""The gateway in front of a second engine: llama.cpp's server (``llama-cpp-python[server]``).

Opt-in (``make test-llamacpp``): ``run_llamacpp.py`` starts the server with a tiny random GGUF
Llama (``make_tiny_gguf.py``) and sets ``SG_LLAMACPP_URL``; without it these tests are skipped.
The official openai SDK talks to llama.cpp directly and through the gateway (``create_app``
on a real uvicorn, a request observer recording what the gateway accounted); decoding is greedy
(``temperature: 0``, fixed seed) so both routes produce the same tokens.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.settings import parse
from tests.gateway.helpers import Recorder, sse_events

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.skipif(not os.environ.get("SG_LLAMACPP_URL"),
                       reason="llama.cpp server not configured: set SG_LLAMACPP_URL "
                              "(make test-llamacpp)"),
]
KEY = "sg-llamacpp-key"
CHAT = [{"role": "user", "content": "hello tiny model"}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0, "max_tokens": 12}


@dataclass
class Routes:
    direct: openai.OpenAI
    gateway: openai.OpenAI
    gateway_url: str
    backend_url: str
    model: str
    recorder: Recorder


@pytest.fixture
def routes(serve_asgi: Callable[..., Any]) -> Iterator[Routes]:
    url = os.environ["SG_LLAMACPP_URL"].rstrip("/")
    model = os.environ.get("SG_LLAMACPP_MODEL", "tiny")
    settings = parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "tiny", "served_model_name": model, "replicas": [{"url": url}]}],
        "keys": [{"id": "llamacpp", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["tiny"]}],
        "timeouts": {"connect_s": 5, "first_byte_s": 120, "idle_s": 120},
        "health": {"active": False},
        "logging": {"access_log": False},
    })
    recorder = Recorder()
    gw_url = str(serve_asgi(create_app(settings, observers=[recorder])).url)
    direct = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    gateway = openai.OpenAI(base_url=gw_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    yield Routes(direct, gateway, gw_url, url, model, recorder)
    direct.close()
    gateway.close()


def test_non_streamed_completion_relays_and_accounts_usage(routes: Routes) -> None:
    want = routes.direct.chat.completions.create(model=routes.model, messages=CHAT, **GREEDY)
    got = routes.gateway.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage is not None and want.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens)
    assert got.usage.completion_tokens > 0
    [record] = routes.recorder.wait(1)
    assert (record.input_tokens, record.output_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens)
    assert record.usage_estimated is False
    assert record.outcome == "ok"


def test_stream_relays_the_same_text_and_accounts_usage(routes: Routes) -> None:
    want = routes.direct.chat.completions.create(model=routes.model, messages=CHAT, **GREEDY)
    assert want.usage is not None
    chunks = list(routes.gateway.chat.completions.create(
        model="tiny", messages=CHAT, stream=True, stream_options={"include_usage": True},
        **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == want.usage.completion_tokens
    [record] = routes.recorder.wait(1)
    assert record.output_tokens == want.usage.completion_tokens
    assert record.outcome == "ok"


def test_stream_without_usage_request_gets_no_usage_chunk_and_ends_with_done(
    routes: Routes,
) -> None:
    body = {"model": "tiny", "messages": CHAT, "stream": True, **GREEDY}
    r = httpx.post(routes.gateway_url + "/v1/chat/completions", json=body, timeout=120,
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e or e["usage"] is None for e in events[:-1])
    [record] = routes.recorder.wait(1)
    assert record.output_tokens is not None and record.output_tokens > 0
    assert record.outcome == "ok"
