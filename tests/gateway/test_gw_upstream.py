"""Upstream client hardening: no redirects followed, proxy variables ignored, no cookies kept."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, Sim, settings, start_gateway

CHAT: Any = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
AUTH_A = {"authorization": f"Bearer {KEY_A}"}


class Redirector:
    """A backend that answers every request with a redirect to ``target`` and sets a cookie."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.cookies_seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        if b"cookie" in headers:
            self.cookies_seen.append(headers[b"cookie"].decode())
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 307, "headers": [
            (b"location", (self.target + scope["path"]).encode()),
            (b"set-cookie", b"backend_session=abc; Path=/"),
            (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"redirect": true}'})


def test_redirects_are_not_followed(serve_asgi: Any, sim: Sim) -> None:
    redirector = Redirector(sim.url)
    backend = serve_asgi(redirector).url
    gw = start_gateway(serve_asgi, settings([backend]))
    for _ in range(2):
        r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
        assert r.status_code == 307
        assert "location" not in r.headers and "set-cookie" not in r.headers
    assert sim.stats()["received"] == 0  # the redirect target was never contacted
    assert redirector.cookies_seen == []  # the backend's cookie was not stored and replayed


def test_proxy_environment_is_ignored(serve_asgi: Any, sim: Sim,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    gw = start_gateway(serve_asgi, settings([sim.url]))
    with httpx.Client(trust_env=False) as client:
        r = client.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert r.status_code == 200, r.text
    monkeypatch.undo()  # the test's own stats client honours proxy variables
    assert sim.stats()["received"] == 1


class Status:
    """A backend that answers every request with one status (counts requests)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.received = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.received += 1
        while (await receive()).get("more_body"):
            pass
        body = b'{"error": {"message": "overloaded", "type": "x", "param": null, "code": 1}}'
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("status", [502, 503])
def test_502_503_retried_on_another_replica(serve_asgi: Any, sim: Sim, status: int) -> None:
    bad = Status(status)
    gw = start_gateway(serve_asgi, settings([serve_asgi(bad).url, sim.url]))
    for _ in range(3):
        r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
        assert r.status_code == 200, r.text
    assert bad.received == 1  # tried once, then ejected for the cool-down
    assert sim.stats()["received"] == 3


@pytest.mark.parametrize("status", [502, 503])
def test_502_503_everywhere_relayed(serve_asgi: Any, status: int) -> None:
    bad = [Status(status), Status(status)]
    gw = start_gateway(serve_asgi, settings([serve_asgi(b).url for b in bad]))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert r.status_code == status
    assert r.json()["error"]["code"] == f"upstream_{status}"
    assert [b.received for b in bad] == [1, 1]
