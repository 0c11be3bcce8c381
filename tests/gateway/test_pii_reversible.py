"""Reversible masking: the request's values leave as numbered placeholders (``<IBAN_CODE_1>``)
and are mapped back in that request's answer only.

A real gateway on loopback (uvicorn), the official openai SDK, and a backend that records what
it received and answers the user's message back (streamed in 5-character events, so a
placeholder is split across events, or whole in JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.pii.response import StreamMask
from tests.gateway.test_pii_gateway import IBAN, PII, Stack, _build, _chat

REVERSIBLE = PII.replace("{id: research-masks, teams: [research], action: mask}",
                         "{id: research-masks, teams: [research], action: mask, "
                         "reversible: true}") % ("2.0", 16384)
OTHER_IBAN = "FR14 2004 1010 0505 0001 3M02 606"


def _parrot(seen: list[str]) -> Starlette:
    """Answers the last user message back; keeps every message it received in ``seen``."""

    async def chat(request: Request) -> Any:
        body = await request.json()
        text = body["messages"][-1]["content"]
        seen.append(text)
        if not body.get("stream"):
            return JSONResponse({
                "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})

        async def events() -> Any:
            for k in range(0, len(text), 5):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                         "model": "m", "choices": [{"index": 0,
                                                    "delta": {"content": text[k:k + 5]},
                                                    "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.received = 0
    return app


SEEN: list[str] = []


@pytest.fixture
def stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Stack:
    # research's requests stay public (mask, not raise): any replica; every one is a parrot
    SEEN.clear()
    return _build(serve_asgi, tmp_path, pii=REVERSIBLE,
                  apps={n: _parrot(SEEN) for n in ("eu-a", "eu-b", "us")})


def _parrot_chat(stack: Stack, text: str, stream: bool) -> str:
    return _chat(stack.client("research"), text, stream=stream)


@pytest.mark.parametrize("stream", [True, False])
def test_values_leave_as_numbered_placeholders_and_come_back_in_the_answer(
        stack: Stack, stream: bool) -> None:
    text = f"Pay {IBAN}, not {OTHER_IBAN}, again {IBAN}; mail jane.doe@example.org"
    answer = _parrot_chat(stack, text, stream)
    assert SEEN[-1] == ("Pay <IBAN_CODE_1>, not <IBAN_CODE_2>, again <IBAN_CODE_1>; "
                        "mail <EMAIL_ADDRESS_1>")
    assert answer == text
    raw = stack.audit_text()
    for secret in (b"DE89 3704", b"2004 1010 0505", b"jane.doe"):
        assert secret not in raw
    records = [r["pii"] for r in stack.audit_requests() if r.get("pii")]
    assert any(r.get("reversible") == ["EMAIL_ADDRESS", "IBAN_CODE"] and r.get("restored") == 4
               for r in records)


def test_a_placeholder_is_mapped_back_only_for_the_request_that_made_it(stack: Stack) -> None:
    assert _parrot_chat(stack, f"Pay {IBAN}", True) == f"Pay {IBAN}"
    # A later request that itself contains the placeholder text gets it back unchanged.
    assert _parrot_chat(stack, "What is <IBAN_CODE_1>?", True) == "What is <IBAN_CODE_1>?"
    assert _parrot_chat(stack, "What is <IBAN_CODE_1>?", False) == "What is <IBAN_CODE_1>?"


@pytest.mark.parametrize("size", range(1, 16))
def test_a_placeholder_split_anywhere_in_a_stream_is_mapped_back(size: int) -> None:
    restore = {"<IBAN_CODE_1>": IBAN, "<IBAN_CODE_2>": OTHER_IBAN}
    text = "a <b <IBAN_CODE_1> and <IBAN_CODE_2>< <IBAN_CODE_3> <IBAN_CODE_1"
    mask = StreamMask(None, 64, restore)
    out = b""
    for k in range(0, len(text), size):
        event = {"choices": [{"index": 0, "delta": {"content": text[k:k + size]},
                              "finish_reason": None}]}
        out += mask.feed(f"data: {json.dumps(event)}\n\n".encode())
    out += mask.feed(b"data: [DONE]\n\n") + mask.finish()
    got = "".join(json.loads(e[6:])["choices"][0]["delta"]["content"]
                  for e in out.decode().split("\n\n") if e.startswith("data: {"))
    assert got == f"a <b {IBAN} and {OTHER_IBAN}< <IBAN_CODE_3> <IBAN_CODE_1"
    assert out.endswith(b"data: [DONE]\n\n") and mask.restored == 2
