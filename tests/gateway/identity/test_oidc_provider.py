"""Real parts end to end: panva's ``oidc-provider`` (npm) on loopback issues client-credentials
JWT access tokens; the official ``openai`` SDK sends one as its API key to a real
``gateway serve`` process (audit log on); the provider's signing key is rotated (both keys in
the gateway's JWKS, then the old one removed) with SIGHUP reloads; the audit records carry the
verified identity, pseudonymised."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.audit.pseudonym import load_pseudonymizer
from gateway.identity.auth import subject_pseudonym
from tests.conftest import free_port, wait_until
from tests.gateway.helpers import KEY_A, Sim, config
from tests.gateway.test_live_reload import Served

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
PROVIDER_DIR = ROOT / ".cache" / "npm" / "oidc-provider"  # Makefile: oidc-provider
NODE = shutil.which("node")



def _installed() -> None:
    # Not a skip: CI installs it (make tools), and a missing real part must not pass silently.
    assert NODE is not None, "node is needed for the real OpenID provider"
    assert (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir(), (
        "oidc-provider is not installed: make .cache/npm/oidc-provider/.installed-9.13.3")


def _private_jwk(kid: str) -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


class Provider:
    """``node oidc_provider.mjs PORT JWKS`` on loopback; restartable on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.proc: subprocess.Popen[str] | None = None

    def start(self, *keys: dict[str, Any]) -> None:
        _installed()
        self.stop()
        path = self.tmp / "provider-jwks.json"
        path.write_text(json.dumps({"keys": list(keys)}))
        self.proc = subprocess.Popen(
            [str(NODE), str(HERE / "oidc_provider.mjs"), str(self.port), str(path),
             str(PROVIDER_DIR)],
            cwd=PROVIDER_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={"PATH": "/usr/bin:/bin"})
        wait_until(self._up, 30, "oidc-provider to listen")

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (
            self.proc.stdout.read() if self.proc and self.proc.stdout else "")
        try:
            return httpx.get(self.issuer + "/.well-known/openid-configuration",
                             timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def public_jwks(self) -> bytes:
        """The provider's published JWKS (``jwks_uri``), as an operator saves it to a file."""
        meta = httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=5).json()
        return httpx.get(meta["jwks_uri"], timeout=5).content

    def token(self, client: str = "ci-bot") -> str:
        r = httpx.post(self.issuer + "/token", timeout=10,
                       data={"grant_type": "client_credentials", "scope": "chat",
                             "resource": "urn:sovereign-gateway"},
                       auth=(client, f"{client}-secret-of-the-test"))
        assert r.status_code == 200, r.text
        return str(r.json()["access_token"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Served]]:
    started: list[Served] = []

    def start(cfg: dict[str, Any]) -> Served:
        srv = Served(tmp_path, cfg)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    p = Provider(tmp_path)
    yield p
    p.stop()


def _gateway_config(sim: Sim, issuer: str, jwks: Path, pin: str) -> dict[str, Any]:
    cfg = config([sim.url])
    cfg["identity"] = {
        "issuers": [{"issuer": issuer, "audiences": ["urn:sovereign-gateway"],
                     "algorithms": ["RS256"], "jwks_file": str(jwks), "jwks_sha256": pin,
                     "required_claims": ["exp", "iat", "sub", "client_id"]}],
        "rules": [{"id": "ml", "match": {"groups": "ml-engineers"}, "team": "ml",
                   "models": ["llama-3.1-8b"]}],
    }
    return cfg


def _save(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _chat(url: str, token: str) -> str:
    with openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=30) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hello"}])
        assert raw.parse().choices[0].message.content
        return str(raw.headers["x-request-id"])


def _refused(url: str, token: str) -> dict[str, Any]:
    r = httpx.post(url + "/v1/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {token}"},
                   json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code in (401, 403), r.text
    error: dict[str, Any] = r.json()["error"]
    return error


def test_provider_tokens_rotation_and_audit(
    provider: Provider, sim: Sim, tmp_path: Path,
    serve: Callable[..., Served],
) -> None:
    old, new = _private_jwk("key-2026-a"), _private_jwk("key-2026-b")
    provider.start(old)
    jwks = tmp_path / "idp-jwks.json"
    pin = _save(jwks, provider.public_jwks())
    gw = serve(_gateway_config(sim, provider.issuer, jwks, pin))

    token_old = provider.token()
    assert jwt.get_unverified_header(token_old)["kid"] == "key-2026-a"
    rid = _chat(gw.url, token_old)
    _chat(gw.url, KEY_A)  # API keys still work beside tokens
    assert _refused(gw.url, provider.token("intruder"))["code"] == "identity_not_mapped"

    # Rotation, step 1: the provider signs with the new key and still publishes the old one;
    # the gateway gets both (new file, new pin, SIGHUP). Old and new tokens verify.
    provider.start(new, old)
    token_new = provider.token()
    assert jwt.get_unverified_header(token_new)["kid"] == "key-2026-b"
    assert _refused(gw.url, token_new)["code"] == "token_key_unknown"  # not reloaded yet
    cfg = gw.cfg
    cfg["identity"]["issuers"][0]["jwks_sha256"] = _save(jwks, provider.public_jwks())
    gw.write(cfg)
    gw.hup_and_wait("config.reloaded")
    _chat(gw.url, token_old)
    rid_new = _chat(gw.url, token_new)

    # A JWKS that changes to garbage is refused whole; both keys keep verifying.
    jwks.write_bytes(b'{"keys": [')
    refused = gw.hup_and_wait("config.reload_refused")
    assert "jwks_sha256" in json.dumps(refused)
    _chat(gw.url, token_old)

    # Rotation, step 2: the old key is removed from the provider and the gateway.
    provider.start(new)
    cfg["identity"]["issuers"][0]["jwks_sha256"] = _save(jwks, provider.public_jwks())
    gw.write(cfg)
    gw.hup_and_wait("config.reloaded")
    assert _refused(gw.url, token_old)["code"] == "token_key_unknown"
    _chat(gw.url, token_new)

    # The audit log: who (pseudonymised, recomputable with the pseudonym key) and what verified.
    started = {r["request_id"]: r for r in gw.records("request.started")}
    pseudo = load_pseudonymizer(Path(gw.cfg["audit"]["pseudonym_key_file"]))
    expected = subject_pseudonym(pseudo, provider.issuer, "ci-bot")
    for request_id, kid in ((rid, "key-2026-a"), (rid_new, "key-2026-b")):
        identity = started[request_id]["identity"]
        assert identity["issuer"] == provider.issuer
        assert identity["subject"] == expected
        assert identity["kid"] == kid
        assert identity["decided_by"] == {"groups": "ml-engineers"}
        assert len(identity["jwks_sha256"]) == 64
        assert started[request_id]["team"] == "ml"
    assert "ci-bot" not in json.dumps(started[rid])
    # A token not verified establishes no caller: counted per client network and reason.
    denied = [r for r in gw.records("request.refused")
              if r.get("error_code") == "token_key_unknown"]
    assert denied and denied[0]["count"] >= 1, "refused tokens are audited with their code"
    intruder = [r for r in gw.records("request.denied")
                if r.get("error_code") == "identity_not_mapped"]
    assert intruder[0]["identity"]["subject"] == subject_pseudonym(
        pseudo, provider.issuer, "intruder")  # verified, then refused: still says who

    # A data-subject access request: only ci-bot's requests, found from the plain subject by
    # the holder of the pseudonym key.
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "export", "--config", str(gw.path),
         "--subject", "ci-bot", "--issuer", provider.issuer],
        capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    mine = {r["data"]["request_id"] for r in rows}
    assert {rid, rid_new} <= mine
    assert {r["type"] for r in rows} == {"request.started", "request.completed"}
    assert all(r["data"].get("identity", {"subject": expected})["subject"] == expected
               for r in rows)
    assert intruder[0]["request_id"] not in mine
    by_pseudonym = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "export", "--store", gw.store,
         "--subject", expected], capture_output=True, text=True, check=True)
    assert by_pseudonym.stdout == res.stdout


def _login(provider: Provider, person: str) -> str:
    """The scripted user login: authorization code with PKCE through the provider's login and
    consent forms, as a browser would post them; returns the JWT access token."""
    import base64
    import re
    import secrets
    from urllib.parse import parse_qs, urljoin, urlsplit

    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect = "http://127.0.0.1:9/callback"
    with httpx.Client(base_url=provider.issuer, timeout=10) as browser:
        r = browser.get("/auth", params={
            "client_id": "webapp", "response_type": "code", "redirect_uri": redirect,
            "scope": "openid", "resource": "urn:sovereign-gateway",
            "code_challenge": challenge, "code_challenge_method": "S256", "state": "s1"})
        code = None
        for _ in range(12):  # redirects, the login form, the consent form
            if r.is_redirect:
                location = r.headers["location"]
                if location.startswith(redirect):
                    code = parse_qs(urlsplit(location).query)["code"][0]
                    break
                r = browser.get(urljoin(provider.issuer + "/", location))
                continue
            assert r.status_code == 200, r.text
            action = re.search(r'<form[^>]*action="([^"]+)"', r.text)
            assert action is not None, r.text
            # The form's own hidden fields (prompt: login or consent), then what a person types.
            fields = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', r.text))
            if 'name="login"' in r.text:
                fields.update(login=person, password="any")  # noqa: S106 (dev form: any)
            r = browser.post(action.group(1), data=fields)
        assert code is not None, "the login flow did not reach the callback"
        token = httpx.post(provider.issuer + "/token", timeout=10, auth=(
            "webapp", "webapp-secret-of-the-test"), data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect,
            "code_verifier": verifier, "resource": "urn:sovereign-gateway"})
        assert token.status_code == 200, token.text
        return str(token.json()["access_token"])


# slow (20 s: the real provider's login and consent forms, then a gateway process): in the fast
# lane test_provider_tokens_rotation_and_audit takes the provider's tokens through a gateway to
# its pseudonymised audit identity, and test_jwt_tokens.py maps and refuses token identities.
@pytest.mark.slow
def test_a_person_signs_in_and_is_served_as_herself(
    provider: Provider, sim: Sim, tmp_path: Path, serve: Callable[..., Served],
) -> None:
    provider.start(_private_jwk("key-login"))
    jwks = tmp_path / "idp-jwks.json"
    gw = serve(_gateway_config(sim, provider.issuer, jwks, _save(jwks, provider.public_jwks())))
    alice = _login(provider, "alice")
    claims = jwt.decode(alice, options={"verify_signature": False})
    assert claims["sub"] == "alice" and claims["groups"] == ["ml-engineers"]
    rid = _chat(gw.url, alice)
    assert _refused(gw.url, _login(provider, "mallory"))["code"] == "identity_not_mapped"
    started = {r["request_id"]: r for r in gw.records("request.started")}
    pseudo = load_pseudonymizer(Path(gw.cfg["audit"]["pseudonym_key_file"]))
    assert started[rid]["identity"]["subject"] == subject_pseudonym(
        pseudo, provider.issuer, "alice")
