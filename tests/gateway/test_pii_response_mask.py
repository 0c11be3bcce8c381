"""``pii.responses: mask``: what a model answers is masked before it reaches the client.

A real gateway on loopback, the official openai SDK as the client, and a backend whose answer
holds an IBAN split across SSE events (``"... DE89 37"`` + ``"04 0044 0532"`` + ``" 0130 00
..."``). :class:`gateway.pii.response.StreamMask` is also driven directly with the real
detector: at every split point of the text, nothing of the IBAN leaves, and at most the hold
(``response_hold_chars``) of text is ever held back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.pii.response import StreamMask
from policy import PiiPolicy
from policy.pii.config import PiiSection
from tests.gateway.egress_testdata import KEYS
from tests.gateway.test_pii_gateway import (
    IBAN,
    PII,
    SPLIT,
    Stack,
    _build,
    _chat,
    _gateway_serve,
)
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

MASK_PII = PII.replace("responses: record", "responses: mask") % ("2.0", 16384)
MASKED = "Your IBAN is <IBAN_CODE> and all is well."


def _answering(pieces: list[str]) -> Starlette:
    """A backend streaming ``pieces`` as chat deltas, then a finish event, usage (when asked
    for: the gateway always asks upstream) and ``[DONE]``; whole in JSON otherwise."""

    async def chat(request: Request) -> Any:
        body = await request.json()
        usage = {"prompt_tokens": 3, "completion_tokens": len(pieces),
                 "total_tokens": 3 + len(pieces)}
        if not body.get("stream"):
            return JSONResponse({
                "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(pieces)}}],
                "usage": usage})
        include_usage = (body.get("stream_options") or {}).get("include_usage")

        def chunk(choices: list[Any], **more: Any) -> str:
            return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk",
                                          "created": 0, "model": "m", "choices": choices,
                                          **more}) + "\n\n"

        async def events() -> Any:
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None}])
            for piece in pieces:
                yield chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
            if include_usage:
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.received = 0
    return app


@pytest.fixture
def stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Stack:
    return _build(serve_asgi, tmp_path, eu_a=_answering(SPLIT), pii=MASK_PII)


@pytest.mark.parametrize("stream", [True, False])
def test_an_iban_split_across_events_is_masked_before_the_client_sees_it(
        stack: Stack, stream: bool) -> None:
    answer = _chat(stack.client("conf"), "what is my IBAN?", stream=stream)
    assert answer == MASKED
    records = [r["pii"] for r in stack.audit_requests()
               if r.get("pii") and "response_entities" in r["pii"]]
    assert [(r["response_entities"], r["response_action"]) for r in records] == [
        ({"IBAN_CODE": 1}, "mask")]
    assert b"DE89 37" not in stack.audit_text()


@pytest.mark.parametrize("include_usage", [True, False])
def test_the_masked_stream_keeps_sse_framing_usage_and_done(
        stack: Stack, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "my IBAN?"}]}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {KEYS['conf']}"}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    assert "3704" not in raw and "0532" not in raw
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    objs = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["delta"].get("content") or "" for o in objs for c in o["choices"])
    assert text == MASKED
    finish = [i for i, o in enumerate(objs) if o["choices"] and o["choices"][0]["finish_reason"]]
    texts = [i for i, o in enumerate(objs) if o["choices"]
             and o["choices"][0]["delta"].get("content")]
    assert len(finish) == 1 and max(texts) < finish[0]  # held text comes before the finish
    usage = [o for o in objs if o.get("usage")]
    if include_usage:
        assert len(usage) == 1 and usage[0] is objs[-1] and usage[0]["usage"]["total_tokens"]
    else:
        assert usage == []


@pytest.fixture(scope="module")
def pii() -> PiiPolicy:
    policy = PiiPolicy(PiiSection(responses="mask", response_hold_chars=48),
                       ["public", "internal", "personal", "confidential"])
    policy.load()
    return policy


def _event(piece: str) -> bytes:
    return ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece},
                                                "finish_reason": None}]}) + "\n\n").encode()


def _texts(out: bytes) -> list[str]:
    return ["".join(c["delta"].get("content", "") for c in json.loads(e[6:])["choices"])
            for e in out.decode().split("\n\n") if e.startswith("data: {")]


def test_every_split_point_of_an_iban_is_masked(pii: PiiPolicy) -> None:
    text = "".join(SPLIT)
    for i in range(1, len(text)):
        for j in (i + 1, i + 3, i + 11):
            if j >= len(text):
                continue
            mask = StreamMask(pii, 48)
            out = b"".join(mask.feed(_event(p)) for p in (text[:i], text[i:j], text[j:]))
            out += mask.feed(b"data: [DONE]\n\n") + mask.finish()
            assert "".join(_texts(out)) == MASKED, (i, j)
            assert out.endswith(b"data: [DONE]\n\n")


def test_at_most_the_hold_is_held_back_and_events_are_split_at_any_byte(
        pii: PiiPolicy) -> None:
    words = [f"word{i} " for i in range(200)]
    full = "".join(words)
    mask = StreamMask(pii, 48)
    sent = ""
    for n, word in enumerate(words, 1):  # one event at a time: never more than the hold late
        out = _texts(mask.feed(_event(word)))
        assert len(out) == 1  # one event out per event in: the pacing is kept
        sent += out[0]
        received = "".join(words[:n])
        assert received.startswith(sent) and len(received) - len(sent) <= 48
    assert sent + "".join(_texts(mask.finish())) == full
    # The same stream cut anywhere (inside events and lines) gives the same text.
    mask = StreamMask(pii, 48)
    stream = b"".join(_event(w) for w in words)
    out = b"".join(mask.feed(stream[k:k + 37]) for k in range(0, len(stream), 37))
    assert "".join(_texts(out + mask.finish())) == full
    assert mask.counts == {}


def test_the_simulators_echo_of_a_completions_prompt_is_masked(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    stack = _build(serve_asgi, tmp_path, pii=MASK_PII)
    client = stack.client("conf")  # raise: forwarded as is, the echo carries the IBAN back
    resp = client.completions.create(model="m", prompt=f"Pay to {IBAN} today.", max_tokens=2,
                                     extra_body={"echo": True})
    text = resp.choices[0].text
    assert text.startswith("Pay to <IBAN_CODE> today.") and "3704" not in text
    assert resp.usage is not None and resp.usage.completion_tokens == 2


def test_gateway_serve_masks_a_split_iban_streamed_and_not(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    # The gateway's own server (its synchronous SSE writer: the relay's sink path).
    sims = {"eu-a": _answering(SPLIT), **{n: create_sim(SimConfig(models=["m"]))
                                          for n in ("eu-b", "us")}}
    servers = {n: serve_asgi(app) for n, app in sims.items()}
    with _gateway_serve(tmp_path, sims, servers, MASK_PII) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["conf"], max_retries=0,
                               timeout=30)
        for stream in (True, False, True):
            assert _chat(client, "what is my IBAN?", stream=stream) == MASKED


def test_a_responses_api_stream_is_masked_deltas_and_full_texts(pii: PiiPolicy) -> None:
    def named(kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()

    full = "".join(SPLIT)
    stream = [named("response.output_text.delta", output_index=0, content_index=0, delta=p)
              for p in SPLIT]
    stream += [named("response.output_text.done", output_index=0, content_index=0, text=full),
               named("response.completed", response={"output": [
                   {"type": "message", "content": [{"type": "output_text", "text": full}]}]})]
    mask = StreamMask(pii, 48)
    out = (b"".join(mask.feed(e) for e in stream) + mask.finish()).decode()
    assert "3704" not in out and "0532" not in out
    events = [e.split("\n") for e in out[:-2].split("\n\n")]
    assert all(lines[0].startswith("event: ") and lines[1].startswith("data: ")
               for lines in events)
    objs = [json.loads(lines[1][6:]) for lines in events]
    deltas = [o["delta"] for o in objs if o["type"] == "response.output_text.delta"]
    assert "".join(deltas) == MASKED
    assert [o["type"] for o in objs][-2:] == ["response.output_text.done", "response.completed"]
    assert objs[-2]["text"] == MASKED
    assert objs[-1]["response"]["output"][0]["content"][0]["text"] == MASKED
