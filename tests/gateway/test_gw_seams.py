"""The seams of create_app: routing policy, connector, admission hooks, observers."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.auth import Principal
from gateway.errors import RateLimited
from gateway.fleet.model_settings import ModelSettings
from gateway.h1 import resolver_dialer
from gateway.relay.records import RequestRecord
from gateway.routing import Replica, RouteDecision
from tests.gateway.helpers import KEY_A, Clients, Recorder, Sim, settings, start_gateway, start_sim

CHAT: Any = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
AUTH_A = {"authorization": f"Bearer {KEY_A}"}


class OnlyDestination:
    """A routing policy that allows replicas of one destination id."""

    def __init__(self, destination: str | None) -> None:
        self.destination = destination
        self.calls: list[tuple[str, str]] = []

    def decide(self, principal: Principal, model: ModelSettings,
               replicas: Sequence[Replica]) -> RouteDecision:
        self.calls.append((principal.key_id, model.name))
        allowed = tuple(r for r in replicas if r.destination == self.destination)
        return RouteDecision(allowed, rule_id="eu-only")


def _with_destinations(urls: list[str], dests: list[str]) -> Any:
    s = settings(urls)
    model = s.models[0]
    replicas = [r.model_copy(update={"destination": d}) for r, d in zip(model.replicas, dests,
                                                                       strict=True)]
    models = [model.model_copy(update={"replicas": replicas}), *s.models[1:]]
    return s.model_copy(update={"models": models})


def test_policy_filters_candidates(serve_asgi: Any) -> None:
    a, b = start_sim(serve_asgi), start_sim(serve_asgi)
    policy = OnlyDestination("eu-2")
    recorder = Recorder()
    gw = start_gateway(serve_asgi, _with_destinations([a.url, b.url], ["us-1", "eu-2"]),
                       policy=policy, observers=[recorder])
    for _ in range(3):
        assert httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A).is_success
    assert a.stats()["received"] == 0 and b.stats()["received"] == 3
    assert policy.calls == [("team-a", "llama-3.1-8b")] * 3
    rec = recorder.wait(3)[0]
    assert (rec.destination, rec.policy_rule) == ("eu-2", "eu-only")


def test_policy_allowing_nothing_is_403_with_rule(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]), policy=OnlyDestination("nowhere"))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert r.status_code == 403
    assert "rule eu-only" in r.json()["error"]["message"]
    assert sim.stats()["received"] == 0


class StaticResolver(AbstractResolver):
    """Resolves one made-up host name to loopback (stands in for a policy resolver)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        if host != "vllm.internal.test":
            raise OSError(f"refused by test resolver: {host}")
        return [ResolveResult(hostname=host, host="127.0.0.1", port=port, family=socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass


def test_connector_factory_and_dialer_are_used_for_backend_calls(
    serve_asgi: Any, sim: Sim,
) -> None:
    resolver = StaticResolver()
    port = sim.url.rsplit(":", 1)[1]
    s = settings([f"http://vllm.internal.test:{port}"])
    gw = start_gateway(serve_asgi, s,
                       connector_factory=lambda: aiohttp.TCPConnector(resolver=resolver),
                       dialer=resolver_dialer(resolver))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert r.status_code == 200, r.text
    assert resolver.asked == ["vllm.internal.test"]
    assert sim.stats()["last_headers"]["host"] == f"vllm.internal.test:{port}"


class Quota:
    def __init__(self) -> None:
        self.seen: list[Mapping[str, Any]] = []

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        self.seen.append(body)
        if len(self.seen) > 1:
            raise RateLimited("Token budget exhausted for team a.", headers={"retry-after": "7"})


def test_admission_hook_can_refuse_with_429(serve_asgi: Any, sim: Sim,
                                            clients: Clients) -> None:
    quota = Quota()
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([sim.url]), admission=[quota],
                       observers=[recorder])
    client = clients(gw)
    client.chat.completions.create(model="llama-3.1-8b", messages=CHAT["messages"])
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="llama-3.1-8b", messages=CHAT["messages"])
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.code == "rate_limit_exceeded"
    assert quota.seen[0]["messages"] == CHAT["messages"]
    assert sim.stats()["received"] == 1
    ended = recorder.wait(2)
    assert len(recorder.started) == 1  # the refused request was never started
    assert ended[1].outcome == "denied" and ended[1].status == 429


class Broken:
    def __init__(self, where: str) -> None:
        self.where = where

    async def on_start(self, record: RequestRecord) -> None:
        if self.where == "start":
            raise KeyError("bug in an observer")

    async def on_end(self, record: RequestRecord) -> None:
        if self.where == "end":
            raise KeyError("bug in an observer")


def test_observer_bug_on_start_is_500_and_not_forwarded(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]), observers=[Broken("start")])
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert "bug in an observer" not in r.text
    assert sim.stats()["received"] == 0


def test_observer_bug_on_end_does_not_affect_client(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]), observers=[Broken("end")])
    for _ in range(2):
        r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
        assert r.status_code == 200


class Lifecycle(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    async def startup(self) -> None:
        self.events.append("startup")

    async def shutdown(self) -> None:
        self.events.append("shutdown")


def test_observer_lifecycle_hooks(serve_asgi: Any, sim: Sim) -> None:
    obs = Lifecycle()
    from gateway.app import create_app
    from tests.conftest import ServerThread

    srv = ServerThread(create_app(settings([sim.url]), observers=[obs])).start()
    assert obs.events == ["startup"]
    srv.stop()
    assert obs.events == ["startup", "shutdown"]


def test_unknown_path_has_openai_error_shape(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]))
    r = httpx.get(gw + "/v1/nothing-here", headers=AUTH_A)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(gw + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_request_id_on_every_endpoint(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]))  # access log off in the test config
    ids = {httpx.get(gw + path, headers=AUTH_A).headers["x-request-id"]
           for path in ("/v1/models", "/v1/models/default", "/v1/unknown")}
    ids.add(httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
            .headers["x-request-id"])
    assert len(ids) == 4 and all(len(i) == 32 for i in ids)
