"""The relay's request edge cases against a real uvicorn gateway and the simulator."""

from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest

from tests.gateway.helpers import KEY_A, Sim

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


def _post(url: str, body: dict[str, object], path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY_A}"}
    return httpx.post(url + path, json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("value", ["true", 1, "false", 0, [True], {"x": True}])
def test_non_boolean_stream_is_refused_before_forwarding(
    gateway_url: str, sim: Sim, value: object
) -> None:
    """vLLM's pydantic models coerce ``"true"``/``1`` to a stream, but the gateway would not
    force ``include_usage`` on it: the stream would go unaccounted (quota and audit bypass)."""
    before = sim.stats()
    r = _post(gateway_url, {**CHAT, "stream": value})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "'stream' must be a boolean.",
            "type": "invalid_request_error",
            "param": "stream",
            "code": "invalid_request",
        }
    }
    assert sim.stats() == before  # nothing went upstream


def test_null_stream_is_a_normal_request(gateway_url: str) -> None:
    r = _post(gateway_url, {**CHAT, "stream": None})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("value", ["true", 1])
def test_non_boolean_include_usage_is_refused(gateway_url: str, value: object) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": value}}
    r = _post(gateway_url, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream_options.include_usage"
    assert r.json()["error"]["code"] == "invalid_request"


def test_stream_options_not_an_object_is_refused(gateway_url: str) -> None:
    r = _post(gateway_url, {**CHAT, "stream": True, "stream_options": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream_options"


def test_boolean_stream_with_sdk_still_counts_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="llama-3.1-8b", stream=True, messages=[{"role": "user", "content": "hi"}],
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize(
    "path", ["/v1%2Fchat/completions", "/v1%2fchat%2Fcompletions", "/v1/chat%2Fcompletions",
             "/v1/chat/complet%69ons"]
)
def test_percent_encoded_relay_path_is_not_found(gateway_url: str, sim: Sim, path: str) -> None:
    """An encoded slash must not reach the relay: a proxy or WAF in front that matches
    ``/v1/chat/completions`` literally would otherwise be bypassed."""
    before = sim.stats()
    body = json.dumps(CHAT).encode()
    raw = _raw(
        gateway_url,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode() + body,
    )
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 "), head
    assert json.loads(payload)["error"]["code"] == "not_found"
    assert sim.stats() == before


def test_plain_relay_path_with_query_still_works(gateway_url: str) -> None:
    r = httpx.post(
        gateway_url + "/v1/chat/completions?x=1", json=CHAT,
        headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10,
    )
    assert r.status_code == 200
