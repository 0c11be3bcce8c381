"""Token usage of a non-streamed answer longer than the part the relay keeps whole (1 MiB).

The relay keeps a JSON body up to 1 MiB to read its ``usage`` (after ``choices``, at the end).
A longer body (easy for a client to ask for: ``logprobs`` with ``top_logprobs: 20`` adds about
a kilobyte per token) lost its usage: the audit record had no tokens and the quota kept its
admission estimate (``completion_reserve_tokens``, 0 by default) instead of the real count.
The end of the body is now kept as well, and the usage read from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway.helpers import KEY_A, Recorder, settings, start_gateway
from tests.gateway.test_h1_client import RawBackend


@pytest.mark.parametrize("content_bytes", [1000, 3 * 1024 * 1024], ids=["small", "3MiB"])
def test_usage_of_a_long_json_answer_is_accounted(
    serve_asgi: Callable[..., Any], content_bytes: int,
) -> None:
    body = json.dumps({
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * content_bytes},
                     "logprobs": {"content": [{"token": "usage", "logprob": -0.1}]}}],
        "usage": {"prompt_tokens": 5, "total_tokens": 70005, "completion_tokens": 70000},
        "prompt_logprobs": None,
    }, separators=(",", ":")).encode()
    backend = RawBackend(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
    recorder = Recorder()
    try:
        url = start_gateway(serve_asgi, settings([backend.url]), observers=[recorder])
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {KEY_A}"},
                       json={"model": "llama-3.1-8b", "logprobs": True,
                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.content == body
        record = recorder.wait(1)[0]
        assert (record.input_tokens, record.output_tokens) == (5, 70000)
    finally:
        backend.stop()
