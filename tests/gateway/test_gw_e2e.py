"""End to end with the official openai SDK: gateway (real uvicorn) in front of the simulator."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.helpers import (
    KEY_A,
    KEY_B,
    SERVED,
    Clients,
    Recorder,
    Sim,
    settings,
    start_gateway,
    start_sim,
)

MESSAGES: Any = [{"role": "user", "content": "Say hello"}]
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — «unicode» 天気",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
SCHEMA: Any = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": {"type": "object",
                    "properties": {"model": {"type": "string"}, "n": {"type": "number"}}}},
}


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def gw(serve_asgi: Callable[..., Any], sim: Sim, recorder: Recorder) -> str:
    return start_gateway(serve_asgi, settings([sim.url]), observers=[recorder])


@pytest.fixture
def sdk(gw: str, clients: Clients) -> openai.OpenAI:
    return clients(gw)


def test_chat_non_stream(sdk: openai.OpenAI, sim: Sim, recorder: Recorder) -> None:
    r = sdk.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES, max_tokens=5)
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 5
    stats = sim.stats()
    assert stats["last_body"]["model"] == SERVED
    assert stats["last_body"]["max_tokens"] == 5
    (rec,) = recorder.wait(1)
    assert (rec.status, rec.outcome, rec.key_id, rec.team) == (200, "ok", "team-a", "a")
    assert (rec.input_tokens, rec.output_tokens) == (r.usage.prompt_tokens, 5)
    assert rec.served_model == SERVED and rec.replica_url == sim.url
    assert [r.request_id for r in recorder.started] == [rec.request_id]


def test_alias_resolves(sdk: openai.OpenAI, sim: Sim) -> None:
    sdk.chat.completions.create(model="default", messages=MESSAGES)
    assert sim.stats()["last_body"]["model"] == SERVED


def test_chat_stream_without_usage_hides_usage_but_accounts_it(
    sdk: openai.OpenAI, sim: Sim, recorder: Recorder
) -> None:
    chunks = list(sdk.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES,
                                              stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)  # no usage-only event reached the client
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "日本語" in text
    # Upstream was asked for usage, so the gateway could account the stream.
    assert sim.stats()["last_body"]["stream_options"] == {"include_usage": True}
    (rec,) = recorder.wait(1)
    assert rec.output_tokens == 16 and rec.input_tokens and rec.stream


def test_chat_stream_with_usage(sdk: openai.OpenAI, recorder: Recorder) -> None:
    chunks = list(sdk.chat.completions.create(
        model="llama-3.1-8b", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True}))
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    assert usage_chunks[0].usage is not None
    assert usage_chunks[0].usage.completion_tokens == recorder.wait(1)[0].output_tokens == 16


def test_completions_stream_and_non_stream(sdk: openai.OpenAI, recorder: Recorder) -> None:
    r = sdk.completions.create(model="llama-3.1-8b", prompt="Once upon", max_tokens=4)
    assert r.choices[0].text and r.usage is not None and r.usage.completion_tokens == 4
    chunks = list(sdk.completions.create(model="llama-3.1-8b", prompt="Once", stream=True,
                                         max_tokens=3))
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].text for c in chunks)
    assert [r.output_tokens for r in recorder.wait(2)] == [4, 3]


def test_embeddings(sdk: openai.OpenAI, recorder: Recorder) -> None:
    r = sdk.embeddings.create(model="llama-3.1-8b", input=["a b", "c"])
    assert len(r.data) == 2 and len(r.data[0].embedding) == 8
    assert recorder.wait(1)[0].input_tokens == r.usage.prompt_tokens


def test_models_list_only_allowed(gw: str, clients: Clients) -> None:
    a, b = clients(gw), clients(gw, KEY_B)
    assert [m.id for m in a.models.list()] == ["llama-3.1-8b"]
    assert [m.id for m in b.models.list()] == ["other-model"]
    assert a.models.retrieve("default").id == "llama-3.1-8b"
    with pytest.raises(openai.NotFoundError):
        a.models.retrieve("other-model")  # exists, but not for this key: no oracle
    with pytest.raises(openai.AuthenticationError):
        clients(gw, "wrong").models.list()


def test_tools_and_tool_calls_pass_through(sdk: openai.OpenAI, sim: Sim,
                                           clients: Clients) -> None:
    r = sdk.chat.completions.create(
        model="llama-3.1-8b", messages=MESSAGES, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        logprobs=True, extra_body={"guided_decoding_backend": "xgrammar", "top_k": 3})
    body = sim.stats()["last_body"]
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["guided_decoding_backend"] == "xgrammar" and body["top_k"] == 3
    assert body["logprobs"] is True
    call = r.choices[0].message.tool_calls
    assert call and call[0].function.name == "get_weather"
    json.loads(call[0].function.arguments)
    direct = clients(sim.url, "x")
    d = direct.chat.completions.create(
        model=SERVED, messages=MESSAGES, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert d.choices[0].message.tool_calls
    assert call[0].function.arguments == d.choices[0].message.tool_calls[0].function.arguments


def test_tool_call_stream(sdk: openai.OpenAI) -> None:
    chunks = list(sdk.chat.completions.create(
        model="llama-3.1-8b", messages=MESSAGES, tools=TOOLS, tool_choice="required",
        stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"


def test_response_format_passes_through(sdk: openai.OpenAI, sim: Sim) -> None:
    r = sdk.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES,
                                    response_format=SCHEMA)
    assert sim.stats()["last_body"]["response_format"] == SCHEMA
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_raw_body_bytes_reach_backend_unchanged(gw: str, sim: Sim) -> None:
    """Number spelling, escapes and key order survive; only the model value changes."""
    raw = ('{"messages":[{"role":"user","content":"\\u00e9t\\u00e9"}],"temperature":1.50,'
           '"model":"default","max_tokens":2,"seed":12345678901234567890}')
    r = httpx.post(gw + "/v1/chat/completions", content=raw,
                   headers={"authorization": f"Bearer {KEY_A}",
                            "content-type": "application/json"})
    assert r.status_code == 200, r.text
    stats = sim.stats()
    assert stats["last_body"] == json.loads(raw.replace('"default"', json.dumps(SERVED)))
    assert int(stats["last_headers"]["content-length"]) == len(
        raw.replace('"default"', json.dumps(SERVED)).encode())


def test_tokenize_and_other_endpoints_relayed(gw: str, sim: Sim) -> None:
    r = httpx.post(gw + "/tokenize", json={"model": "llama-3.1-8b", "prompt": "hello world"},
                   headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200, r.text
    assert "tokens" in r.json()
    last = sim.stats()["history"][-1]
    assert last["path"] == "/tokenize" and last["method"] == "POST"


def test_health_endpoints(gw: str) -> None:
    assert httpx.get(gw + "/healthz").json() == {"status": "ok"}
    r = httpx.get(gw + "/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_two_replicas_share_load(serve_asgi: Callable[..., Any], clients: Clients) -> None:
    a, b = start_sim(serve_asgi), start_sim(serve_asgi)
    gw = start_gateway(serve_asgi, settings([a.url, b.url]))
    sdk = clients(gw)
    for _ in range(6):
        sdk.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert a.stats()["received"] == 3 and b.stats()["received"] == 3


class ResponsesBackend:
    """A minimal stand-in for vLLM's ``/v1/responses`` (the simulator does not serve it).

    Streams Responses-API events (``event:`` + ``data:``) with usage inside
    ``response.completed``, and records the request body it received.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.bodies.append(json.loads(raw))
        events = [
            ("response.created", {"type": "response.created", "response": {"id": "r1"}}),
            ("response.output_text.delta", {"type": "response.output_text.delta",
                                            "delta": "héllo"}),
            ("response.completed", {"type": "response.completed", "response": {
                "id": "r1", "usage": {"input_tokens": 9, "output_tokens": 4,
                                      "total_tokens": 13}}}),
        ]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for name, data in events:
            chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def test_responses_stream_relayed_and_accounted(serve_asgi: Callable[..., Any]) -> None:
    backend = ResponsesBackend()
    url = serve_asgi(backend).url
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([url]), observers=[recorder])
    r = httpx.post(gw + "/v1/responses", headers={"authorization": f"Bearer {KEY_A}"},
                   json={"model": "llama-3.1-8b", "input": "hi", "stream": True})
    assert r.status_code == 200
    assert r.content.count(b"event: ") == 3 and b'"input_tokens": 9' in r.content
    # No chat-only stream_options forced onto the Responses API.
    assert backend.bodies == [{"model": SERVED, "input": "hi", "stream": True}]
    rec = recorder.wait(1)[0]
    assert (rec.input_tokens, rec.output_tokens) == (9, 4)
