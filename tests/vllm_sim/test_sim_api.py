"""The simulator's vLLM endpoints, exercised with the official openai SDK on a real uvicorn."""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from vllm_sim.tokens import OUTPUT_TOKENS

FULL_TEXT = "".join(OUTPUT_TOKENS)
MSG = [{"role": "user", "content": "Hello there, how are you?"}]  # 7 pieces


def test_models_are_labelled_as_simulator(start_sim: Any) -> None:
    sim = start_sim(models=["a", "b"], max_model_len=512)
    resp = sim.client.models.with_raw_response.list()
    assert resp.headers["x-simulator"] == "vllm-sim"
    models = resp.parse().data
    assert [m.id for m in models] == ["a", "b"]
    assert {m.owned_by for m in models} == {"vllm-sim"}
    assert models[0].model_extra is not None and models[0].model_extra["max_model_len"] == 512


def test_chat_non_streamed(sim: Any) -> None:
    resp = sim.client.chat.completions.create(model="sim-model", messages=MSG)
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == "sim-model"
    (choice,) = resp.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == FULL_TEXT
    assert choice.finish_reason == "stop"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (7, 16)
    assert resp.usage.total_tokens == 23


def test_chat_max_tokens_cuts_with_length(sim: Any) -> None:
    resp = sim.client.chat.completions.create(model="sim-model", messages=MSG, max_tokens=3)
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content == "".join(OUTPUT_TOKENS[:3])
    assert resp.usage is not None and resp.usage.completion_tokens == 3


def test_chat_stream_role_first_usage_last_done(sim: Any, raw_post: Any) -> None:
    body = {"model": "sim-model", "messages": MSG, "stream": True,
            "stream_options": {"include_usage": True}}
    raw = raw_post(sim.port, "/v1/chat/completions", json.dumps(body).encode())
    assert raw.status == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-simulator"] == "vllm-sim"
    text = raw.body.decode()
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    docs = [json.loads(e[6:]) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 16
    assert {d["object"] for d in docs} == {"chat.completion.chunk"}
    assert len({d["id"] for d in docs}) == 1
    content = "".join(d["choices"][0]["delta"].get("content", "") for d in docs[:-1])
    assert content == FULL_TEXT
    assert docs[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(d["choices"][0]["finish_reason"] is None for d in docs[:-2])
    # multi-byte UTF-8 travels raw, not as \\u escapes
    assert "日本".encode() in raw.body and "🚀".encode() in raw.body


def test_chat_stream_with_sdk_and_n(sim: Any) -> None:
    stream = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, stream=True, n=3, max_tokens=4,
        stream_options={"include_usage": True},
    )
    parts: dict[int, str] = {0: "", 1: "", 2: ""}
    finish: dict[int, str | None] = {}
    roles = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.index)
            parts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert roles == [0, 1, 2]
    assert parts[0] == "".join(OUTPUT_TOKENS[0:4])
    assert parts[1] == "".join(OUTPUT_TOKENS[1:5])
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert usage is not None and usage.completion_tokens == 12


def test_chat_n_non_streamed(sim: Any) -> None:
    resp = sim.client.chat.completions.create(model="sim-model", messages=MSG, n=2)
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.choices[0].message.content != resp.choices[1].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 32


def test_continuous_usage_stats(sim: Any) -> None:
    stream = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, stream=True, max_tokens=3,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    seen = [c.usage.completion_tokens for c in stream if c.usage is not None]
    assert seen == [0, 1, 2, 3, 3]


def test_completions(sim: Any) -> None:
    resp = sim.client.completions.create(model="sim-model", prompt="one two three")
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].text == FULL_TEXT  # vLLM's default max_tokens is 16
    assert resp.usage is not None and resp.usage.prompt_tokens == 3
    short = sim.client.completions.create(
        model="sim-model", prompt=["a", "b c"], max_tokens=2, n=2, echo=True
    )
    assert [c.index for c in short.choices] == [0, 1, 2, 3]
    assert short.choices[0].text == "a" + "".join(OUTPUT_TOKENS[:2])
    assert short.choices[2].text.startswith("b c")
    assert short.usage is not None
    assert (short.usage.prompt_tokens, short.usage.completion_tokens) == (3, 8)
    ids = sim.client.completions.create(model="sim-model", prompt=[1, 2, 3, 4], max_tokens=1)
    assert ids.usage is not None and ids.usage.prompt_tokens == 4


def test_completions_stream(sim: Any) -> None:
    stream = sim.client.completions.create(
        model="sim-model", prompt="x", stream=True, max_tokens=5,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "".join(OUTPUT_TOKENS[:5])
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 6


def test_embeddings_float_and_base64(start_sim: Any) -> None:
    sim = start_sim(embedding_dim=16)
    resp = sim.client.embeddings.create(model="sim-model", input=["hello world", "other"])
    assert resp.object == "list"
    vecs = [d.embedding for d in resp.data]
    assert [d.index for d in resp.data] == [0, 1]
    assert all(len(v) == 16 for v in vecs)
    assert sum(x * x for x in vecs[0]) == pytest.approx(1.0, abs=1e-5)  # float32 via base64
    assert vecs[0] != vecs[1]
    assert resp.usage.prompt_tokens == 3
    again = sim.client.embeddings.create(model="sim-model", input="hello world")
    assert again.data[0].embedding == vecs[0]  # deterministic
    raw = httpx.post(f"{sim.url}/v1/embeddings",
                     json={"model": "sim-model", "input": "hello world",
                           "encoding_format": "base64"}).json()
    decoded = struct.unpack("<16f", base64.b64decode(raw["data"][0]["embedding"]))
    assert decoded == pytest.approx(vecs[0], rel=1e-6)


def _weather_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                               "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }


def test_tool_calls_non_streamed(sim: Any) -> None:
    resp = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, tools=[_weather_tool()], tool_choice="required"
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "café 日本 🚀", "days": 1, "unit": "c"}


def test_tool_call_deltas_streamed(sim: Any) -> None:
    stream = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, tools=[_weather_tool()], stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    deltas = [c.choices[0] for c in stream if c.choices]
    assert deltas[0].delta.role == "assistant"
    first = (deltas[1].delta.tool_calls or [])[0]
    assert first.id and first.type == "function" and first.function is not None
    assert first.function.name == "get_weather" and first.function.arguments is None
    frags = [(d.delta.tool_calls or [])[0].function.arguments for d in deltas[2:-1]]
    assert len(frags) > 3
    assert json.loads("".join(f or "" for f in frags))["city"] == "café 日本 🚀"
    assert deltas[-1].finish_reason == "tool_calls" and deltas[-1].delta.tool_calls is None


def test_tool_choice_auto_answers_text_and_unknown_tool_is_400(sim: Any) -> None:
    resp = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, tools=[_weather_tool()], tool_choice="auto"
    )
    assert resp.choices[0].message.content == FULL_TEXT
    with pytest.raises(openai.BadRequestError) as exc:
        sim.client.chat.completions.create(
            model="sim-model", messages=MSG, tools=[_weather_tool()],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert exc.value.status_code == 400


def test_json_response_format(sim: Any) -> None:
    resp = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(resp.choices[0].message.content or ""), dict)
    stream = sim.client.chat.completions.create(
        model="sim-model", messages=MSG, response_format={"type": "json_object"}, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(text)["text"]


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_errors_are_openai_shaped(start_sim: Any) -> None:
    sim = start_sim(max_model_len=10)
    with pytest.raises(openai.NotFoundError) as nf:
        sim.client.chat.completions.create(model="gpt-4", messages=MSG)
    assert nf.value.status_code == 404
    url = f"{sim.url}/v1/chat/completions"
    err = _error(httpx.post(url, json={"model": "gpt-4", "messages": MSG}))
    assert err == {"message": "The model `gpt-4` does not exist. Valid aliases: sim-model.",
                   "type": "NotFoundError", "param": "model", "code": 404}
    long_msg = [{"role": "user", "content": "word " * 11}]
    resp = httpx.post(url, json={"messages": long_msg})
    assert resp.status_code == 400 and "maximum context length is 10" in _error(resp)["message"]
    resp = httpx.post(url, json={"messages": MSG, "max_tokens": 11})
    assert resp.status_code == 400 and _error(resp)["type"] == "BadRequestError"
    assert _error(resp)["param"] == "max_tokens"
    # prompt + max_tokens beyond the context: clamped like vLLM 0.32, not an error
    clamped = httpx.post(url, json={"messages": MSG, "max_tokens": 10}).json()
    assert clamped["usage"]["completion_tokens"] == 3  # 10 - 7 prompt tokens
    assert clamped["choices"][0]["finish_reason"] == "length"
    resp = httpx.post(url, json={"messages": MSG, "stream_options": {"include_usage": True}})
    assert resp.status_code == 400
    resp = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and _error(resp)["code"] == 400
    assert _error(resp)["type"] == "Bad Request"
    for bad in ({"messages": []}, {"messages": MSG, "n": 0}, {"messages": MSG, "temperature": -1},
                {"messages": MSG, "max_tokens": "x"}, [1, 2]):
        resp = httpx.post(url, json=bad)
        assert resp.status_code == 400, bad
    assert httpx.get(f"{sim.url}/v1/nothing").status_code == 404
    assert httpx.get(url).status_code == 405
    assert sim.stats()["errors"] == 11  # the 404 and 405 above are not inference requests


def test_model_defaults_to_first_served(start_sim: Any) -> None:
    sim = start_sim(models=["first", "second"])
    resp = httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": MSG})
    assert resp.json()["model"] == "first"


def test_tokenize_detokenize_round_trip(sim: Any) -> None:
    text = "Grüße aus 日本, ok? 🚀 "
    tok = httpx.post(f"{sim.url}/tokenize", json={"model": "sim-model", "prompt": text}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 2048
    back = httpx.post(f"{sim.url}/detokenize", json={"model": "sim-model",
                                                      "tokens": tok["tokens"]}).json()
    assert back == {"prompt": text}
    chat = sim.client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": text}], max_tokens=1
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == tok["count"]
    msgs = httpx.post(f"{sim.url}/tokenize", json={"messages": MSG}).json()
    assert msgs["count"] == 7
    assert httpx.post(f"{sim.url}/detokenize", json={"tokens": ["x"]}).status_code == 400


def test_health_version_and_metrics_gauges(start_sim: Any) -> None:
    sim = start_sim(models=["m"], ttft_s=1.0)
    health = httpx.get(f"{sim.url}/health")
    assert health.status_code == 200 and health.headers["x-simulator"] == "vllm-sim"
    assert httpx.get(f"{sim.url}/version").json() == {"version": "vllm-sim"}
    done = threading.Event()

    def slow() -> None:
        sim.client.chat.completions.create(model="m", messages=MSG)
        done.set()

    worker = threading.Thread(target=slow)
    worker.start()
    sim.wait_stats(lambda s: s["running"] == 1)
    page = httpx.get(f"{sim.url}/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    assert '\nvllm:num_requests_running{engine="0",model_name="m"} 1.0\n' in page.text
    assert '# TYPE vllm:num_requests_waiting gauge' in page.text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"}' in page.text
    worker.join(10)
    assert done.is_set()
    page = httpx.get(f"{sim.url}/metrics").text
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 0.0' in page
    assert 'vllm:generation_tokens_total{engine="0",model_name="m"} 16.0' in page
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0' \
        in page


def test_stats_record_last_request(sim: Any) -> None:
    sim.client.chat.completions.create(
        model="sim-model", messages=MSG, extra_headers={"X-Request-Id": "abc"}
    )
    stats = sim.stats()
    assert stats["received"] == 1 and stats["completed"] == 1 and stats["running"] == 0
    assert stats["last_headers"]["x-request-id"] == "abc"
    assert stats["last_headers"]["authorization"] == "Bearer sk-test"
    assert stats["last_body"] == {"model": "sim-model", "messages": MSG}
    assert stats["last_path"] == "/v1/chat/completions"
    httpx.post(f"{sim.url}/sim/reset")
    assert sim.stats()["received"] == 0 and sim.stats()["last_body"] is None


def test_timing_is_applied(start_sim: Any) -> None:
    sim = start_sim(ttft_s=0.2, itl_s=0.01, tokens_per_response=11)
    t0 = time.monotonic()
    stream = sim.client.chat.completions.create(model="sim-model", messages=MSG, stream=True)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - t0
    total = time.monotonic() - t0
    # lower bounds only: the delays are sleeps, so they can't be shorter than configured
    assert first is not None and first >= 0.2
    assert total >= 0.2 + 10 * 0.01


def test_usage_event_is_not_delayed_by_itl(start_sim: Any) -> None:
    # vLLM sends the usage event right after the last token: a relay waiting for it must not
    # wait an inter-token latency (here 60 s, far beyond the client timeout).
    sim = start_sim(itl_s=60.0)
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, timeout=20)
    chat = client.chat.completions.create(
        model="sim-model", messages=MSG, max_tokens=1, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(chat)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 1
    comp = client.completions.create(model="sim-model", prompt="x", max_tokens=1, stream=True,
                                      stream_options={"include_usage": True})
    assert list(comp)[-1].usage is not None
    client.close()
