"""The optional observer hooks the relay calls (gateway.relay.records), against a real uvicorn
gateway.

``on_request`` sees the request headers, ``on_response_start`` may add response headers,
``end_recorded`` decides whether the held-back end of a response is sent; the lifespan starts
each component once however often it is registered; ``create_app`` takes either an assembled
gateway or its parts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.assembly import Gateway
from gateway.relay.records import Headers, RequestRecord
from tests.gateway.helpers import KEY_A, Sim, settings, start_gateway, start_sim

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4}
AUTH = {"authorization": f"Bearer {KEY_A}"}


class Hooks:
    """An observer with every optional hook; ``recorded`` is what ``end_recorded`` answers."""

    def __init__(self, recorded: bool = True) -> None:
        self.recorded = recorded
        self.probes: list[bytes | None] = []
        self.ended: list[str] = []
        self.asked: list[str] = []
        self.starts = 0

    async def startup(self) -> None:
        self.starts += 1

    def on_request(self, record: RequestRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self.probes.append(dict(headers).get(b"x-probe"))

    async def admit(self, record: RequestRecord, body: Any) -> None:
        pass

    async def on_start(self, record: RequestRecord) -> None:
        pass

    def on_response_start(self, record: RequestRecord, headers: Headers) -> None:
        headers.append((b"x-observed", record.request_id.encode()))

    async def on_end(self, record: RequestRecord) -> None:
        self.ended.append(record.request_id)

    def end_recorded(self, record: RequestRecord) -> bool:
        # on_end ran before the gate is asked: the end waits for the record.
        assert record.request_id in self.ended
        self.asked.append(record.request_id)
        return self.recorded


def _gateway(serve_asgi: Callable[..., Any], sim: Sim, hooks: Hooks) -> str:
    return start_gateway(serve_asgi, settings([sim.url]), observers=[hooks], admission=[hooks])


def test_hooks_see_the_request_and_add_a_response_header(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    hooks = Hooks()
    url = _gateway(serve_asgi, sim, hooks)
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={**AUTH, "x-probe": "1"})
    assert r.status_code == 200
    assert r.headers["x-observed"] == r.headers["x-request-id"]
    assert r.json()["choices"]
    assert hooks.probes == [b"1"]
    assert hooks.asked == [r.headers["x-request-id"]]
    assert hooks.starts == 1  # registered as observer and admission hook, started once


def test_stream_end_is_sent_only_when_recorded(serve_asgi: Callable[..., Any], sim: Sim) -> None:
    hooks = Hooks(recorded=True)
    url = _gateway(serve_asgi, sim, hooks)
    with httpx.stream("POST", url + "/v1/chat/completions", json={**CHAT, "stream": True},
                      headers=AUTH) as r:
        body = r.read()
    assert body.rstrip().endswith(b"data: [DONE]")


def test_unrecorded_stream_never_gets_its_done_event(serve_asgi: Callable[..., Any]) -> None:
    hooks = Hooks(recorded=False)
    slow = start_sim(serve_asgi, itl_s=0.02)  # events arrive one by one, [DONE] last
    url = _gateway(serve_asgi, slow, hooks)
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
    ) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            received += chunk
    assert b"data: {" in received  # earlier events flowed at once
    assert b"[DONE]" not in received
    assert len(hooks.asked) == 1


def test_unrecorded_sized_body_is_cut_short(serve_asgi: Callable[..., Any], sim: Sim) -> None:
    hooks = Hooks(recorded=False)
    url = _gateway(serve_asgi, sim, hooks)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    assert len(hooks.asked) == 1


def test_refused_request_is_answered_whatever_the_gate(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    hooks = Hooks(recorded=True)
    url = _gateway(serve_asgi, sim, hooks)
    r = httpx.post(url + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert len(hooks.ended) == 1


def test_create_app_takes_a_gateway_or_its_parts_not_both(sim: Sim) -> None:
    s = settings([sim.url])
    hooks = Hooks()
    gw = Gateway.of(s, observers=[hooks], admission=[hooks])
    assert gw.lifespan_components().count(hooks) == 1
    assert next(name for name, _ in gw.stages()) == "authenticate"
    create_app(s, gw)
    with pytest.raises(TypeError, match="either an assembled gateway or its parts"):
        create_app(s, gw, observers=[hooks])


def test_request_ids_are_random_version_4_uuids_in_32_hex_digits() -> None:
    scope = {"method": "POST", "path": "/v1/chat/completions", "client": ("127.0.0.1", 5)}
    ids = [RequestRecord.for_scope(scope).request_id for _ in range(200)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert len(rid) == 32 and rid == parsed.hex
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
