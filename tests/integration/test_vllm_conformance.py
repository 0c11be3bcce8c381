"""Conformance: the same openai-SDK checks against the simulator and a real vLLM, directly and
through the gateway. Content is never compared with fixed text (a real model writes what it
writes); shapes, usage arithmetic, stream framing and determinism at temperature 0 are.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from conftest import Target

MSG = [{"role": "user", "content": "Hello there, how are you today?"}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}


def test_models_list(target: Target) -> None:
    models = target.client.models.list().data
    assert target.model in [m.id for m in models]
    assert {m.object for m in models} == {"model"}


def test_chat_non_streamed_shape_and_usage(target: Target) -> None:
    resp = target.client.chat.completions.create(
        model=target.model, messages=MSG, max_tokens=5, **GREEDY
    )
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert isinstance(resp.created, int)
    (choice,) = resp.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 5
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 5


def test_chat_stream_equals_non_streamed(target: Target) -> None:
    full = target.client.chat.completions.create(
        model=target.model, messages=MSG, max_tokens=8, **GREEDY
    )
    stream = target.client.chat.completions.create(
        model=target.model, messages=MSG, max_tokens=8, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    finishes = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert full.usage is not None
    assert usage_chunk.usage.completion_tokens == full.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == full.usage.prompt_tokens


def test_stream_wire_format(target: Target) -> None:
    body = {"model": target.model, "messages": MSG, "max_tokens": 4, "stream": True, **GREEDY}
    with httpx.stream("POST", f"{target.base_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {target.api_key}"}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read()
    events = [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events)
    assert events[-1] == b"data: [DONE]"
    for e in events[:-1]:
        doc = json.loads(e[6:])
        assert set(doc) >= {"id", "object", "created", "model", "choices"}


def test_n2_stream_role_per_choice(target: Target) -> None:
    stream = target.client.chat.completions.create(
        model=target.model, messages=MSG, max_tokens=3, n=2, stream=True,
        stream_options={"include_usage": True}, temperature=0.8, seed=1,
    )
    chunks = list(stream)
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == [0, 1]
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens <= 6


def test_completions_stream_equals_non_streamed(target: Target) -> None:
    full = target.client.completions.create(
        model=target.model, prompt="The quick brown fox", max_tokens=6, **GREEDY
    )
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    stream = target.client.completions.create(
        model=target.model, prompt="The quick brown fox", max_tokens=6, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert "".join(c.choices[0].text for c in chunks[:-1]) == full.choices[0].text
    assert full.usage is not None and chunks[-1].usage.total_tokens == full.usage.total_tokens


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    return dict(body["error"])


def test_unknown_model_is_404(target: Target) -> None:
    with pytest.raises(openai.NotFoundError):
        target.client.chat.completions.create(model="no-such-model", messages=MSG)


def test_client_errors_are_400(target: Target) -> None:
    url = "/v1/chat/completions"
    long_text = "word " * (target.max_model_len + 10)
    too_long = target.post(url, {"model": target.model,
                                 "messages": [{"role": "user", "content": long_text}]})
    assert too_long.status_code == 400
    assert "maximum context length" in _error(too_long)["message"]
    too_many = target.post(url, {"model": target.model, "messages": MSG,
                                 "max_tokens": target.max_model_len + 1})
    assert too_many.status_code == 400 and _error(too_many)["param"] == "max_tokens"
    opts = target.post(url, {"model": target.model, "messages": MSG,
                             "stream_options": {"include_usage": True}})
    assert opts.status_code == 400
    bad_n = target.post(url, {"model": target.model, "messages": MSG, "n": 0})
    assert bad_n.status_code == 400


def test_prompt_plus_max_tokens_beyond_context_is_clamped(target: Target) -> None:
    resp = target.client.chat.completions.create(
        model=target.model, messages=MSG, max_tokens=target.max_model_len - 1, **GREEDY
    )
    usage = resp.usage
    assert usage is not None and usage.total_tokens <= target.max_model_len


def test_tokenize_detokenize(target: Target) -> None:
    tok = target.post("/tokenize", {"model": target.model, "prompt": "Hello café 日本"}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == target.max_model_len
    back = target.post("/detokenize", {"model": target.model, "tokens": tok["tokens"]}).json()
    assert isinstance(back["prompt"], str)


def _gauge(metrics: str, name: str, model: str) -> float:
    pattern = re.compile(rf'^{re.escape(name)}\{{([^}}]*)\}} ([0-9.e+-]+)$', re.M)
    for labels, value in pattern.findall(metrics):
        if f'model_name="{model}"' in labels:
            return float(value)
    raise AssertionError(f"{name} for {model} not in /metrics")


def _metric_with(metrics: str, name: str, model: str, extra: str) -> float:
    pattern = re.compile(rf'^{re.escape(name)}\{{([^}}]*)\}} ([0-9.e+-]+)$', re.M)
    for labels, value in pattern.findall(metrics):
        if f'model_name="{model}"' in labels and extra in labels:
            return float(value)
    raise AssertionError(f"{name}{{{extra}}} for {model} not in /metrics")


def test_metrics_gauges(target: Target) -> None:
    if target.route == "gateway":
        pytest.skip("backend metrics are read from the backend")
    page = httpx.get(f"{target.backend_url}/metrics", timeout=10).text
    model = target.model
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc"):
        assert f"# TYPE {gauge} gauge" in page
        assert _gauge(page, gauge, model) >= 0


def _counters(target: Target) -> tuple[float, float, float]:
    """(running, successes of any reason, generated tokens) from the backend's /metrics."""
    page = httpx.get(f"{target.backend_url}/metrics", timeout=10).text
    success = sum(
        _metric_with(page, "vllm:request_success_total", target.model, f'reason="{r}"')
        for r in ("stop", "length", "abort")
    )
    generated = _gauge(page, "vllm:generation_tokens_total", target.model)
    return _gauge(page, "vllm:num_requests_running", target.model), success, generated


def _settled(target: Target) -> tuple[float, float, float]:
    """Counters once nothing runs and they stop moving (vLLM records stats asynchronously)."""
    deadline = time.monotonic() + 30
    last = _counters(target)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _counters(target)
        if now == last and now[0] == 0:
            return now
        last = now
    return last


def test_client_disconnect_aborts_backend_request(target: Target) -> None:
    # vLLM 0.32 stops generating when the client goes and counts no success for the request.
    max_tokens = target.max_model_len - 40
    _, success0, generated0 = _settled(target)
    body = {"model": target.model, "messages": MSG, "max_tokens": max_tokens,
            "stream": True, "temperature": 0, "ignore_eos": True}
    with httpx.stream("POST", f"{target.base_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {target.api_key}"}) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
    running, success, generated = _settled(target)
    assert running == 0
    assert success == success0
    assert generated - generated0 < max_tokens


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}


def test_named_tool_call(target: Target) -> None:
    kwargs: dict[str, Any] = {
        "model": target.model, "messages": MSG, "tools": [WEATHER], "max_tokens": 120,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, **GREEDY,
    }
    try:
        resp = target.client.chat.completions.create(**kwargs)
    except openai.BadRequestError as exc:
        if "tool-call-parser" in str(exc):
            pytest.skip("vLLM started without --tool-call-parser")
        raise
    # A random-weight model writes arbitrary arguments: check shapes, not JSON validity.
    (call,) = resp.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(call.function.arguments, str)
    stream = target.client.chat.completions.create(stream=True, **kwargs)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    assert calls[0].id and calls[0].type == "function"
    assert all(tc.index == 0 and tc.id is None for tc in calls[1:])
    assert deltas[-1].finish_reason is not None
