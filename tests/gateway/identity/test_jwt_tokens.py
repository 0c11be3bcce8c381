"""Bearer JWTs beside API keys, through a real uvicorn on loopback with the openai SDK: a good
token is served; every bad token of issue 27's list is a 401/403 in the OpenAI error shape with
its own code, never a 500; a JWKS that changes on reload is refused whole."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble, reassemble
from gateway.audit import generate_key_file
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.identity.auth import IdentityAuthenticator
from gateway.identity.errors import TokenRejected
from gateway.serving.reload import Reloader
from tests.gateway.gateway_server import GuardedServer
from tests.gateway.helpers import KEY_A, Sim, settings
from tests.gateway.identity.jwtkit import (
    ISSUER,
    SigningKey,
    b64,
    hmac_with_public_key,
    identity_section,
    unsigned,
    write_jwks,
)

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


class Idp:
    def __init__(self, tmp_path: Path) -> None:
        self.rsa = SigningKey("rsa-1")
        self.ec = SigningKey("ec-1", "EC")
        self.stranger = SigningKey("rsa-1")  # same kid, a key the JWKS does not hold
        self.jwks = tmp_path / "jwks.json"
        self.pin = write_jwks(self.jwks, self.rsa, self.ec)
        self.pseudo = generate_key_file(tmp_path / "pseudonym.key")

    def settings(self, sim_url: str, **issuer: Any) -> GatewaySettings:
        section = identity_section(self.jwks, self.pin, **issuer)
        section["pseudonym_key_file"] = str(self.pseudo)
        return settings([sim_url], identity=section)


@pytest.fixture
def idp(tmp_path: Path) -> Idp:
    return Idp(tmp_path)


@pytest.fixture
def gw(serve_asgi: Callable[..., Any], sim: Sim, idp: Idp) -> str:
    s = idp.settings(sim.url, revoked_kids=["old-kid"])
    return str(serve_asgi(create_app(s, assemble(s))).url)


def test_token_and_api_key_are_both_served(gw: str, idp: Idp) -> None:
    for credential in (idp.rsa.token(), idp.ec.token(), KEY_A):
        with openai.OpenAI(base_url=gw + "/v1", api_key=credential, max_retries=0) as client:
            reply = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            assert reply.choices[0].message.content


def _bad_tokens(idp: Idp) -> list[tuple[str, str, int, str]]:
    rsa = idp.rsa
    now = int(time.time())
    good = rsa.token()
    head, body, sig = good.split(".")
    return [
        ("alg none", unsigned("rsa-1"), 401, "token_alg_refused"),
        ("hs256 with the rsa public key", hmac_with_public_key(rsa), 401, "token_alg_refused"),
        ("expired", rsa.token(exp=now - 60, iat=now - 600), 401, "token_expired"),
        ("not yet valid", rsa.token(nbf=now + 600), 401, "token_not_yet_valid"),
        ("wrong issuer", rsa.token(iss="https://evil.test"), 401, "token_issuer_unknown"),
        ("wrong audience", rsa.token(aud="someone-else"), 401, "token_audience_invalid"),
        ("missing sub", rsa.token(sub=None), 401, "token_claim_missing"),
        ("missing exp", rsa.token(exp=None), 401, "token_claim_missing"),
        ("unknown kid", rsa.token(headers={"kid": "nope"}), 401, "token_key_unknown"),
        ("revoked kid", rsa.token(headers={"kid": "old-kid"}), 401, "token_key_revoked"),
        ("another key, same kid", idp.stranger.token(), 401, "token_signature_invalid"),
        ("jku header", rsa.token(headers={"jku": "http://evil.test/jwks"}), 401,
         "token_header_refused"),
        ("x5u header", rsa.token(headers={"x5u": "http://evil.test/c.pem"}), 401,
         "token_header_refused"),
        ("embedded jwk", rsa.token(headers={"jwk": idp.stranger.jwk}), 401,
         "token_header_refused"),
        ("malformed base64", "eyJ!!!." + body + "." + sig, 401, "token_malformed"),
        ("malformed json", b64(b'{"alg": "RS256",') + "." + body + "." + sig, 401,
         "token_malformed"),
        ("tampered payload", head + "." + b64(b'{"iss":"' + ISSUER.encode() + b'","sub":"x"}')
         + "." + sig, 401, "token_signature_invalid"),
        ("10 KB token", rsa.token(pad="x" * 10_000), 401, "token_too_large"),
        ("no rule matches", rsa.token(groups=["visitors"]), 403, "identity_not_mapped"),
        # RFC 7519 NumericDate is a JSON number: PyJWT int()s a string (or a bool) itself.
        ("exp as a numeric string", rsa.token(exp=str(now + 300)), 401, "token_malformed"),
        ("iat as a string", rsa.token(iat=str(now)), 401, "token_malformed"),
        ("nbf as a boolean", rsa.token(nbf=False), 401, "token_malformed"),
        # json.loads raised RecursionError (a 500) on a deep payload or header.
        ("deeply nested payload", head + "." + b64(b'{"a":' + b"[" * 2000 + b"]" * 2000 + b"}")
         + "." + sig, 401, "token_malformed"),
        ("deeply nested header", b64(b'{"alg":"RS256","x":' + b"[" * 2000 + b"]" * 2000 + b"}")
         + "." + body + "." + sig, 401, "token_malformed"),
    ]


def test_bad_tokens_are_clear_refusals(gw: str, idp: Idp) -> None:
    with httpx.Client(timeout=10) as http:
        for name, token, status, code in _bad_tokens(idp):
            r = http.post(gw + "/v1/chat/completions", json=CHAT,
                          headers={"authorization": f"Bearer {token}"})
            assert r.status_code == status, (name, r.text)
            error = r.json()["error"]
            assert error["code"] == code, (name, error)
            assert error["type"] == ("authentication_error" if status == 401
                                     else "permission_error")
            assert set(error) == {"message", "type", "param", "code"}


def test_a_100_kb_token_is_refused_before_the_app(sim: Sim, idp: Idp) -> None:
    # 100 KB of header exceeds the production server's request-head limit: refused there (431,
    # the OpenAI error shape, audited as http.refused), never parsed and never a 500.
    s = idp.settings(sim.url)
    srv = GuardedServer(s, create_app(s, assemble(s))).start()
    token = idp.rsa.token(pad="x" * 100_000)
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", json=CHAT,
                       headers={"authorization": f"Bearer {token}"}, timeout=10)
    finally:
        srv.stop()
    assert r.status_code == 431, r.text
    assert r.json()["error"]["code"] == "request_header_too_large"


def test_model_outside_the_rule_is_forbidden(gw: str, idp: Idp) -> None:
    with openai.OpenAI(base_url=gw + "/v1", api_key=idp.rsa.token(), max_retries=0) as client:
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model="other-model",
                                           messages=[{"role": "user", "content": "x"}])


def test_per_route_credentials(serve_asgi: Callable[..., Any], sim: Sim, idp: Idp) -> None:
    s = idp.settings(sim.url)
    section = s.identity.model_dump() if s.identity else {}
    s = settings([sim.url], identity={**section, "routes": {"/v1/chat/completions": ["jwt"]}})
    url = str(serve_asgi(create_app(s, assemble(s))).url)
    r = httpx.post(url + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": f"Bearer {KEY_A}"}, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "credential_not_accepted"
    r = httpx.post(url + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": f"Bearer {idp.rsa.token()}"}, timeout=10)
    assert r.status_code == 200, r.text


def test_jwks_changed_to_garbage_is_refused_and_old_keys_stay(
        sim: Sim, idp: Idp, tmp_path: Path) -> None:
    s = idp.settings(sim.url)
    running = assemble(s)
    assert isinstance(running.authenticator, IdentityAuthenticator)
    idp.jwks.write_bytes(b'{"keys": [garbage')
    with pytest.raises(ConfigError, match=r"identity\.issuers\[0\]\.jwks_sha256: .* pin"):
        reassemble(running, s)
    # Re-pinned to the garbage: refused as not JSON, naming the file.
    import hashlib

    repinned = idp.settings(sim.url)
    section = repinned.identity.model_dump() if repinned.identity else {}
    section["issuers"][0]["jwks_sha256"] = hashlib.sha256(idp.jwks.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match=r"identity\.issuers\[0\]\.jwks_file: .* not JSON"):
        reassemble(running, settings([sim.url], identity=section))
    # The running gateway still verifies with the keys it loaded.
    principal = running.authenticator.authenticate(idp.rsa.token())
    assert principal.identity is not None and principal.identity.kid == "rsa-1"
    assert principal.key_id.startswith("id:") and "alice" not in repr(principal)


def test_reload_watches_the_jwks_file(sim: Sim, idp: Idp, tmp_path: Path) -> None:
    s = idp.settings(sim.url)
    reloader = Reloader(tmp_path / "gateway.yaml", assemble(s))
    assert idp.jwks in reloader.files()


@pytest.mark.parametrize(("jwks", "problem"), [
    ({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}, "private or symmetric"),
    ({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}, "no kid"),
    ({"nokeys": []}, "no \"keys\" list"),
])
def test_bad_jwks_files_are_refused(sim: Sim, idp: Idp, jwks: dict[str, Any],
                                    problem: str) -> None:
    import hashlib
    import json

    data = json.dumps(jwks).encode()
    idp.jwks.write_bytes(data)
    s = idp.settings(sim.url)
    section = s.identity.model_dump() if s.identity else {}
    section["issuers"][0]["jwks_sha256"] = hashlib.sha256(data).hexdigest()
    with pytest.raises(ConfigError, match=problem):
        assemble(settings([sim.url], identity=section))


def test_symmetric_algorithms_are_refused_in_config(sim: Sim, idp: Idp) -> None:
    with pytest.raises(ConfigError, match=r"identity\.issuers\.0\.algorithms|HS256"):
        idp.settings(sim.url, algorithms=["HS256"])


def test_a_remembered_token_still_expires(sim: Sim, idp: Idp) -> None:
    auth = assemble(idp.settings(sim.url, clock_skew_s=0)).authenticator
    assert isinstance(auth, IdentityAuthenticator)
    exp = int(time.time()) + 2
    token = idp.rsa.token(exp=exp)
    first = auth.authenticate(token)
    assert auth.authenticate(token) is first  # the second use is remembered
    deadline = time.monotonic() + 10
    while time.time() < exp + 0.05:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(TokenRejected) as info:
        auth.authenticate(token)
    assert info.value.code == "token_expired"
