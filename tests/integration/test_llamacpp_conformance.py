"""The gateway in front of a second engine: llama.cpp's server (``llama-cpp-python[server]``).

Opt-in (``make test-llamacpp``): ``run_llamacpp.py`` starts the server with a tiny random GGUF
Llama (``make_tiny_gguf.py``) and sets ``SG_LLAMACPP_URL``; without it these tests are skipped.
The official openai SDK talks to llama.cpp directly and through the gateway (``create_app``
on a real uvicorn, a request observer recording what the gateway accounted); decoding is greedy
(``temperature: 0``, fixed seed) so both routes produce the same tokens.

Differences from vLLM found here (llama-cpp-python 0.3.36):

* Streams carry no usage event: ``stream_options.include_usage`` is ignored. A client that
  asks for usage gets none, and the gateway accounts the stream with its estimate from the
  relayed events (``usage_estimated``), which for llama.cpp is the completion tokens + 2 (a
  role event and a finish event that carry no token; vLLM's estimate is off by 1).
* A streamed completion can lose text the non-streamed one has: a multi-byte UTF-8 character
  split over byte-fallback tokens becomes empty deltas (the engine's streaming, seen in its own
  stream without the gateway). So streams are compared with the engine's own stream, not with
  the non-streamed text.
* Streams do end with ``data: [DONE]``, after a finish event with an empty delta.
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
from gateway.config.loader import parse
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


def _raw_stream(url: str, key: str, model: str, **extra: Any) -> list[Any]:
    body = {"model": model, "messages": CHAT, "stream": True, **GREEDY, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120,
                   headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return sse_events(r.content)


def test_stream_relays_the_engine_events_and_the_gateway_estimates_usage(routes: Routes) -> None:
    want = routes.direct.chat.completions.create(model=routes.model, messages=CHAT, **GREEDY)
    assert want.usage is not None
    direct = _raw_stream(routes.backend_url, "none", routes.model,
                         stream_options={"include_usage": True})
    chunks = list(routes.gateway.chat.completions.create(
        model="tiny", messages=CHAT, stream=True, stream_options={"include_usage": True},
        **GREEDY))
    # the same deltas as the engine's own stream (the gateway relays events byte-for-byte)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert deltas == [e["choices"][0]["delta"].get("content") for e in direct[:-1]
                      if e["choices"]]
    # Difference 1: llama.cpp ignores stream_options: no usage event, even when asked for, so
    # the client gets none and the gateway estimates the completion tokens from the events:
    # role event + one event per token + the finish event = tokens + 2.
    assert direct[-1] == "[DONE]"
    assert all(e.get("usage") is None for e in direct[:-1])
    assert all(c.usage is None for c in chunks)
    [record] = routes.recorder.wait(1)
    assert record.usage_estimated is True
    assert record.input_tokens is None
    assert record.output_tokens == want.usage.completion_tokens + 2
    assert record.outcome == "ok"


def test_stream_without_usage_request_ends_with_done(routes: Routes) -> None:
    events = _raw_stream(routes.gateway_url, KEY, "tiny")
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all(e.get("usage") is None for e in events[:-1])
    [record] = routes.recorder.wait(1)
    assert record.output_tokens is not None and record.output_tokens > 0
    assert record.outcome == "ok"
