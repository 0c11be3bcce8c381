"""The policy-checked aiohttp transport against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from policy import (
    EgressBlocked,
    EgressDenied,
    EgressEvent,
    EgressGuard,
    PinStore,
    Policy,
    RedirectRefused,
    make_connector,
    make_session,
)

Scope = dict[str, Any]


def recording_app(seen: list[dict[str, str]]) -> Callable[..., Any]:
    """ASGI app: records path and Host; /redirect answers 302 to /target."""

    async def app(scope: Scope, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        target = scope["path"] + (("?" + scope["query_string"].decode())
                                  if scope.get("query_string") else "")
        seen.append({"path": target, "host": headers.get("host", "")})
        status, extra = (302, [(b"location", b"/target")]) if scope["path"] == "/redirect" else (
            200, [])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain"), *extra]})
        await send({"type": "http.response.body", "body": headers.get("host", "").encode()})

    return app


class ScriptedResolver(AbstractResolver):
    """A resolver that answers from a script and records every question."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append(host)
        ips = self.answers[host].pop(0)
        return [{"hostname": host, "host": ip, "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": 0} for ip in ips]

    async def close(self) -> None:
        return None


def _policy(port: int) -> Policy:
    dest = "region: lo, jurisdiction: EU, operator: me"
    return Policy.from_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: ip, url: 'http://127.0.0.1:{port}', {dest}}}\n"
        f"  - {{id: model, url: 'http://Model.Internal:{port}', {dest},"
        " resolves_to: [127.0.0.0/8]}\n"
        f"  - {{id: open, host: open.example, port: {port}, {dest}}}\n"
    )


@pytest.fixture
def server(serve_asgi: Callable[..., Any]) -> tuple[Any, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []
    return serve_asgi(recording_app(seen)), seen


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


def test_hostname_destination_pins_and_keeps_host_header(server: Any) -> None:
    srv, seen = server
    resolver = ScriptedResolver({"model.internal": [["127.0.0.1"], ["127.0.0.66"]]})

    async def run() -> list[tuple[int, str]]:
        async with make_session(_policy(srv.port), resolver=resolver) as s:
            return [await _get(s, f"http://MODEL.internal.:{srv.port}/a"),
                    await _get(s, f"http://model.internal:{srv.port}/b")]

    results = asyncio.run(run())
    assert [r[0] for r in results] == [200, 200]
    assert resolver.calls == ["model.internal"]  # resolved once; the rebound answer unused
    assert seen[1] == {"path": "/b", "host": f"model.internal:{srv.port}"}


@pytest.mark.parametrize(
    ("host", "answer", "reason"),
    [
        ("open.example", ["127.0.0.1"], "loopback"),
        ("open.example", ["203.0.113.9", "169.254.169.254"], "cloud metadata"),
        ("open.example", ["::ffff:169.254.169.254"], "cloud metadata"),
        ("model.internal", ["192.0.2.5"], "outside resolves_to"),
        ("model.internal", ["not-an-ip"], "non-address"),
    ],
)
def test_resolution_to_a_forbidden_address_is_refused(
    server: Any, host: str, answer: list[str], reason: str
) -> None:
    srv, seen = server
    resolver = ScriptedResolver({host: [answer]})
    pins = PinStore()

    async def run() -> None:
        async with make_session(_policy(srv.port), resolver=resolver, pins=pins) as s:
            await _get(s, f"http://{host}:{srv.port}/")

    with pytest.raises(EgressDenied, match=reason):
        asyncio.run(run())
    assert seen == [] and pins.get(host) is None


def test_unnamed_host_is_refused_without_a_lookup(server: Any) -> None:
    srv, _ = server
    resolver = ScriptedResolver({})

    async def run() -> None:
        async with make_session(_policy(srv.port), resolver=resolver) as s:
            await _get(s, f"http://elsewhere.example:{srv.port}/")

    with pytest.raises(EgressDenied, match=r"no destination names elsewhere\.example"):
        asyncio.run(run())
    assert resolver.calls == []


def _connector_only_session(policy: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=make_connector(policy), trust_env=False,
                                 timeout=aiohttp.ClientTimeout(total=10))


@pytest.mark.parametrize("session", [make_session, _connector_only_session],
                         ids=["session", "connector-only"])
def test_address_destinations_are_checked_before_connecting(
    server: Any, session: Callable[[Any], aiohttp.ClientSession],
) -> None:
    """Checked whether or not the session has the policy middleware: the gateway's upstream
    session has none, and its connector checks every address when it opens a connection
    (address literals, which aiohttp never resolves)."""
    srv, seen = server
    other = socket.create_server(("127.0.0.1", 0))
    other_port = other.getsockname()[1]

    async def run() -> tuple[int, str]:
        async with session(_policy(srv.port)) as s:
            ok = await _get(s, f"http://127.0.0.1:{srv.port}/ok")
            with pytest.raises(EgressDenied, match=f"127.0.0.1:{other_port}"):
                await _get(s, f"http://127.0.0.1:{other_port}/")
            with pytest.raises(EgressDenied, match="always denied"):
                await _get(s, "http://169.254.169.254/latest/meta-data/")
            return ok

    try:
        assert asyncio.run(run())[0] == 200
        other.settimeout(0.2)
        with pytest.raises(TimeoutError):
            other.accept()  # nothing ever connected to the refused port
    finally:
        other.close()
    assert [s["path"] for s in seen] == ["/ok"]


def test_redirect_is_not_followed(server: Any) -> None:
    srv, seen = server

    async def run() -> None:
        async with make_session(_policy(srv.port)) as s:
            await _get(s, f"http://127.0.0.1:{srv.port}/redirect")

    with pytest.raises(RedirectRefused, match="302 redirect to '/target'") as info:
        asyncio.run(run())
    assert info.value.code == "redirect_refused"
    assert [s["path"] for s in seen] == ["/redirect"]


def test_proxy_environment_is_ignored(
    server: Any, serve_asgi: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, seen = server
    proxy_seen: list[dict[str, str]] = []
    proxy = serve_asgi(recording_app(proxy_seen))
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(var, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def run() -> int:
        async with make_session(_policy(srv.port)) as s:
            status = (await _get(s, f"http://127.0.0.1:{srv.port}/direct"))[0]
            with pytest.raises(EgressDenied, match="never use a proxy"):
                async with s.get(f"http://127.0.0.1:{srv.port}/", proxy=proxy.url):
                    pass
            return status

    assert asyncio.run(run()) == 200
    assert [s["path"] for s in seen] == ["/direct"] and proxy_seen == []
    with pytest.raises(ValueError, match="trust_env"):
        asyncio.run(_make_with_trust_env(srv.port))


async def _make_with_trust_env(port: int) -> None:
    make_session(_policy(port), trust_env=True)


def test_transport_and_guard_share_pins(server: Any) -> None:
    srv, seen = server
    resolver = ScriptedResolver({"model.internal": [["127.0.0.1"]]})
    events: list[EgressEvent] = []
    guard = EgressGuard(_policy(srv.port), on_event=events.append)

    async def run() -> None:
        async with make_session(guard.matcher, resolver=resolver) as s:
            assert (await _get(s, f"http://model.internal:{srv.port}/via-pin"))[0] == 200
        # A client without the policy transport is still stopped by the guard.
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientConnectorError) as info:
                await _get(plain, f"http://127.0.0.1:{srv.port + 1}/")
            assert isinstance(info.value.__cause__, EgressBlocked)

    with guard:
        asyncio.run(run())
    assert [s["path"] for s in seen] == ["/via-pin"]
    assert {str(ip) for ip in guard.pins.get("model.internal") or ()} == {"127.0.0.1"}
    assert [e.port for e in events] == [srv.port + 1]
