"""Opt-in ``jwks_uri``: keys fetched through the egress policy's transport from a JWKS server on
loopback, at start and on a timer only (an unknown kid never fetches), a bad document refused
whole with the old fetched keys kept, a host outside the policy never reached, and a reload
that changes the fetch refused (restart_required)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.assembly import assemble, reassemble
from gateway.audit import generate_key_file
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.identity.auth import IdentityAuthenticator
from gateway.identity.errors import TokenRejected
from tests.gateway.egress_testdata import gateway_config, policy_text
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks


class JwksServer:
    """A JWKS endpoint on loopback that counts its hits; ``body`` is what it serves."""

    def __init__(self) -> None:
        self.body = b'{"keys": []}'
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    srv = JwksServer()
    yield srv
    srv.close()


def _settings(tmp: Path, pinned: SigningKey, idp_port: int, *, in_policy: bool = True,
              refresh_s: float = 10.0) -> GatewaySettings:
    ports = {"eu-a": 9001, "eu-b": 9002, "us": 9003}
    extra = (f"  - {{id: idp, host: 127.0.0.1, port: {idp_port}, region: eu-de-1, "
             "jurisdiction: EU, operator: acme}\n") if in_policy else ""
    policy = tmp / "policy.yaml"
    policy.write_text(policy_text(ports, extra_destinations=extra))
    cfg = gateway_config({n: f"http://127.0.0.1:{p}" for n, p in ports.items()}, policy)
    jwks = tmp / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, pinned))
    section["issuers"][0].update(jwks_uri=f"http://127.0.0.1:{idp_port}/jwks",
                                 jwks_refresh_s=refresh_s)
    pseudo = tmp / "pseudonym.key"
    section["pseudonym_key_file"] = str(pseudo if pseudo.exists() else generate_key_file(pseudo))
    section["rules"] = [{"id": "all", "match": {}, "team": "eng", "models": ["m"]}]
    cfg["identity"] = section
    return parse(cfg, {})


def _run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


def test_fetched_keys_verify_and_an_unknown_kid_never_fetches(
        tmp_path: Path, jwks_server: JwksServer) -> None:
    pinned, fetched_key = SigningKey("pinned-1"), SigningKey("rotated-2")
    jwks_server.body = json.dumps({"keys": [fetched_key.jwk]}).encode()
    auth = assemble(_settings(tmp_path, pinned, jwks_server.port)).authenticator
    assert isinstance(auth, IdentityAuthenticator)

    async def go() -> None:
        await auth.startup()
        try:
            assert jwks_server.hits == 1  # the start fetch
            principal = auth.authenticate(fetched_key.token())
            assert principal.identity is not None and principal.identity.kid == "rotated-2"
            assert principal.identity.jwks_sha256 == auth.fetchers[0].keyset.sha256  # type: ignore[union-attr]
            assert auth.authenticate(pinned.token()).identity is not None  # file keys too
            for i in range(50):  # random kids: refused, and no fetch
                with pytest.raises(TokenRejected) as info:
                    auth.authenticate(pinned.token(headers={"kid": f"random-{i}"}))
                assert info.value.code == "token_key_unknown"
            assert jwks_server.hits == 1
            # The next refresh serves garbage: refused whole, the fetched keys stay.
            jwks_server.body = b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "x"}]}'
            assert await auth.fetchers[0].refresh() is False
            assert "private or symmetric" in (auth.fetchers[0].last_error or "")
            assert auth.authenticate(fetched_key.token(sub="bob")).identity is not None
        finally:
            await auth.shutdown()

    _run(go)


def test_a_host_outside_the_policy_is_never_reached(
        tmp_path: Path, jwks_server: JwksServer) -> None:
    pinned, fetched_key = SigningKey("pinned-1"), SigningKey("rotated-2")
    jwks_server.body = json.dumps({"keys": [fetched_key.jwk]}).encode()
    s = _settings(tmp_path, pinned, jwks_server.port, in_policy=False)
    auth = assemble(s).authenticator
    assert isinstance(auth, IdentityAuthenticator)

    async def go() -> None:
        await auth.startup()
        try:
            assert jwks_server.hits == 0
            assert "no destination allows" in (auth.fetchers[0].last_error or "")
            with pytest.raises(TokenRejected):
                auth.authenticate(fetched_key.token())
        finally:
            await auth.shutdown()

    _run(go)


def test_no_policy_no_fetch_and_reload_changes_need_a_restart(
        tmp_path: Path, jwks_server: JwksServer) -> None:
    s = _settings(tmp_path, SigningKey("pinned-1"), jwks_server.port)
    without_policy = s.model_copy(update={"policy": None})
    with pytest.raises(ConfigError, match=r"jwks_uri: fetching keys needs the egress policy"):
        assemble(without_policy)
    running = assemble(s)
    assert reassemble(running, s).authenticator.fetchers == running.authenticator.fetchers  # type: ignore[attr-defined]
    faster = _settings(tmp_path, SigningKey("pinned-1"), jwks_server.port, refresh_s=20.0)
    with pytest.raises(ConfigError) as info:
        reassemble(running, faster)
    assert info.value.code == "restart_required"


def test_refreshes_keep_to_the_cap(jwks_server: JwksServer) -> None:
    import time

    import httpx

    from gateway.identity.fetch import JwksFetcher

    jwks_server.body = json.dumps({"keys": [SigningKey("k").jwk]}).encode()
    fetcher = JwksFetcher("iss", f"http://127.0.0.1:{jwks_server.port}/jwks", ("RS256",), 0.3,
                          httpx.AsyncClient)

    async def go() -> float:
        t0 = time.monotonic()
        await fetcher.start()
        try:
            deadline = time.monotonic() + 20
            while jwks_server.hits < 4:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            return time.monotonic() - t0
        finally:
            await fetcher.stop()

    elapsed = _run(go)
    assert elapsed >= 0.9  # start + three refreshes 0.3 s apart, never sooner
    assert fetcher.keyset is not None and fetcher.last_error is None


def test_a_key_dropped_from_the_fetched_jwks_stops_verifying_remembered_tokens(
        tmp_path: Path, jwks_server: JwksServer) -> None:
    """Removing a key from the provider's JWKS is how a compromised key is withdrawn; a token
    of that key verified (and remembered) before the refresh must not be served after it."""
    pinned, leaked = SigningKey("pinned-1"), SigningKey("leaked-2")
    jwks_server.body = json.dumps({"keys": [leaked.jwk]}).encode()
    auth = assemble(_settings(tmp_path, pinned, jwks_server.port)).authenticator
    assert isinstance(auth, IdentityAuthenticator)

    async def go() -> None:
        await auth.startup()
        try:
            token = leaked.token()
            assert auth.authenticate(token).identity is not None  # verified, remembered
            jwks_server.body = json.dumps({"keys": [SigningKey("next-3").jwk]}).encode()
            assert await auth.fetchers[0].refresh() is True
            with pytest.raises(TokenRejected) as info:
                auth.authenticate(leaked.token(sub="bob"))  # a new token of the key: refused
            assert info.value.code == "token_key_unknown"
            with pytest.raises(TokenRejected) as info:
                auth.authenticate(token)  # the remembered one too
            assert info.value.code == "token_key_unknown"
            assert auth.authenticate(pinned.token()).identity is not None
        finally:
            await auth.shutdown()

    _run(go)


@pytest.mark.parametrize("uri", ["http://kc.example.eu/realms/ai/certs",
                                 "http://10.0.0.7:8080/certs", "HTTP://kc.example.eu/certs",
                                 "http://127.0.0.1.evil.example/certs"])
def test_jwks_uri_in_plain_http_off_the_host_is_refused(
        tmp_path: Path, jwks_server: JwksServer, uri: str) -> None:
    """Fetched keys are not pinned: over plain HTTP anyone on the path could add a key and sign
    any identity. Only ``https://`` (or ``http://`` to loopback, a local sidecar) is accepted."""
    s = _settings(tmp_path, SigningKey("pinned-1"), jwks_server.port)
    raw = s.model_dump(mode="json", exclude_none=True)
    raw["identity"]["issuers"][0]["jwks_uri"] = uri
    with pytest.raises(ConfigError, match=r"identity\.issuers\.0\.jwks_uri|jwks_uri.*https"):
        parse(raw, {})
