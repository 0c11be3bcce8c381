"""End to end through the real gateway: the policy plugged into its public seams only
(``create_app(settings, connector_factory=..., policy=...)``), the process guard on, three
vLLM simulators on loopback as replicas, the official openai SDK as client.

A ``confidential`` key is routed only to the EU replica tagged ``no-retention``; a contractor's
key gets 403 naming the rule; nothing in the process reaches an address the policy does not name.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.config.loader import parse
from gateway.egress import PolicyRoutes
from gateway.h1 import resolver_dialer
from policy import (
    EgressEvent,
    EgressGuard,
    Policy,
    PolicyResolver,
    check_binding,
    checked_socket_factory,
    make_connector,
    start_guard,
)
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

KEYS = {"conf": "sg-key-conf", "pub": "sg-key-pub", "contractor": "sg-key-contractor"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _policy(ports: dict[str, int], gateway_port: int) -> Policy:
    d = "{id: %s, host: 127.0.0.1, port: %d, region: %s, jurisdiction: %s, operator: %s%s}"
    return Policy.from_text(
        "version: 1\ndata_classes: [public, internal, confidential]\ndestinations:\n"
        + "".join(f"  - {line}\n" for line in (
            d % ("eu-a", ports["eu-a"], "eu-de-1", "EU", "acme", ", tags: [no-retention]"),
            d % ("eu-b", ports["eu-b"], "eu-fr-1", "EU", "acme", ""),
            d % ("us", ports["us"], "us-east-1", "non-EU", "other", ""),
            # The test's own client talks to the gateway on loopback: a destination too.
            d % ("gateway", gateway_port, "lo", "EU", "test", ", purpose: other"),
        ))
        + "rules:\n"
        "  - {id: block-contractor, effect: deny, principals: {teams: [contractors]}}\n"
        "  - id: confidential-eu-no-retention\n"
        "    classes: [confidential]\n"
        "    constraints: {jurisdiction: EU, require_tags: [no-retention]}\n"
        "  - {id: public-anywhere, classes: [public]}\n"
    )


@pytest.fixture
def stack(serve_asgi: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    sims = {name: create_sim(SimConfig(models=["m"])) for name in ("eu-a", "eu-b", "us")}
    servers = {name: serve_asgi(app) for name, app in sims.items()}
    ports = {name: srv.port for name, srv in servers.items()}
    gateway_port = _port()
    policy = _policy(ports, gateway_port)
    settings = parse({
        "listen": {"host": "127.0.0.1", "port": gateway_port},
        "models": [{"name": "m", "replicas": [
            {"url": servers[n].url, "destination": n} for n in ("us", "eu-b", "eu-a")]}],
        "keys": [
            {"id": "k-conf", "sha256": hashlib.sha256(KEYS["conf"].encode()).hexdigest(),
             "models": ["m"], "team": "eng", "data_class": "confidential"},
            {"id": "k-pub", "sha256": hashlib.sha256(KEYS["pub"].encode()).hexdigest(),
             "models": ["m"], "team": "eng", "data_class": "public"},
            {"id": "k-contractor",
             "sha256": hashlib.sha256(KEYS["contractor"].encode()).hexdigest(),
             "models": ["m"], "team": "contractors", "data_class": "public"},
        ],
        "health": {"active": False},
        "logging": {"access_log": False},
    })
    for model in settings.models:
        for r in model.replicas:
            assert r.destination is not None
            check_binding(policy, r.url, r.destination)
    events: list[EgressEvent] = []
    guard = start_guard(policy, "enforce", on_event=events.append,
                        self_test_target=("127.0.0.1", _port()))
    assert isinstance(guard, EgressGuard)
    try:
        app = create_app(
            settings,
            connector_factory=lambda: make_connector(guard.matcher),
            dialer=resolver_dialer(PolicyResolver(guard.matcher),
                                   checked_socket_factory(guard.matcher)),
            policy=PolicyRoutes(policy),
        )
        gw = serve_asgi(app, port=gateway_port)
        yield {"url": gw.url, "sims": sims, "events": events, "guard": guard}
    finally:
        guard.uninstall()


def _client(url: str, who: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEYS[who], max_retries=0, timeout=20)


def _ask(client: openai.OpenAI) -> str:
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return resp.choices[0].message.content or ""


def test_confidential_goes_only_to_eu_no_retention(stack: dict[str, Any]) -> None:
    client = _client(stack["url"], "conf")
    for _ in range(6):
        assert _ask(client)
    received = {name: app.state.received for name, app in stack["sims"].items()}
    assert received == {"eu-a": 6, "eu-b": 0, "us": 0}
    assert stack["events"] == []


def test_public_may_use_every_replica(stack: dict[str, Any]) -> None:
    client = _client(stack["url"], "pub")
    for _ in range(6):
        assert _ask(client)
    received = {name: app.state.received for name, app in stack["sims"].items()}
    assert sum(received.values()) == 6 and all(received.values())
    assert stack["events"] == []


def test_denied_key_gets_403_naming_the_rule(stack: dict[str, Any]) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(_client(stack["url"], "contractor"))
    assert info.value.status_code == 403
    assert "block-contractor" in str(info.value)
    assert all(app.state.received == 0 for app in stack["sims"].values())


def test_guard_blocks_the_gateway_process_elsewhere(stack: dict[str, Any]) -> None:
    with pytest.raises(PermissionError):
        socket.create_connection(("127.0.0.1", _port()), timeout=1)
    assert [e.decision for e in stack["events"]] == ["deny"]
