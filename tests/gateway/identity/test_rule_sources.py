"""Every identity rule trusts one source: a rule is never met by the identities of another.

Load refuses, naming the file's line and key, a rule that leaves its source implicit beside
several sources (issuers, or issuers and client certificates), a rule reading a certificate
name (``spiffe_id``, ``subject_cn``) without ``issuer: mtls``, a rule naming a source that is
not configured, and a token issuer named ``mtls``. Through the production server on loopback
(TLS asking for client certificates, a trusted IdP beside it), a token carrying the
certificate rule's ``spiffe_id`` is refused and a token whose ``iss`` is ``mtls`` is unknown,
while the certificate itself is served.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import generate_key_file
from gateway.config.loader import load
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.identity.build import client_cert_context
from tests.gateway.gateway_cli import gateway as run_gateway
from tests.gateway.gateway_server import GuardedServer
from tests.gateway.helpers import Sim, settings
from tests.gateway.identity.jwtkit import AUDIENCE, ISSUER, SigningKey, write_jwks
from tests.gateway.identity.pki import Ca

SPIFFE = "spiffe://prod.example/ns/ml/sa/batch-scorer"
OTHER = "https://login.other.example/tenant-2/v2.0"
CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
PIN = "0" * 64


def _issuer(name: str) -> dict[str, Any]:
    return {"issuer": name, "audiences": [AUDIENCE], "jwks_file": "jwks.json",
            "jwks_sha256": PIN}


def _write(tmp: Path, identity: dict[str, Any]) -> Path:
    path = tmp / "gateway.yaml"
    doc = {"models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:9"}]}],
           "identity": identity}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _refusal(tmp: Path, identity: dict[str, Any]) -> str:
    path = _write(tmp, identity)
    with pytest.raises(ConfigError) as info:
        load(path, {})
    return info.value.message


def _line_of(path: Path, text: str, after: int = 0) -> int:
    lines = path.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if n > after and text in line)


ML = {"id": "ml", "match": {"groups": "ml-engineers"}, "team": "ml", "models": ["*"]}
BATCH = {"id": "batch", "match": {"spiffe_id": SPIFFE}, "team": "ml-batch", "models": ["*"]}


def test_an_implicit_rule_beside_two_issuers_is_refused_at_its_line(tmp_path: Path) -> None:
    identity = {"issuers": [_issuer(ISSUER), _issuer(OTHER)],
                "rules": [{**ML, "issuer": ISSUER}, {**ML, "id": "ml-2"}]}
    msg = _refusal(tmp_path, identity)
    path = tmp_path / "gateway.yaml"
    line = _line_of(path, "id: ml-2")
    assert msg.startswith(f"{path}:{line}: identity.rules[1].issuer: required when more than "
                          "one source is configured"), msg
    assert f"one of: {ISSUER}, {OTHER}" in msg, msg


def test_an_implicit_rule_beside_an_issuer_and_mtls_is_refused(tmp_path: Path) -> None:
    identity = {"issuers": [_issuer(ISSUER)], "mtls": {"trust_bundle_file": "ca.pem"},
                "rules": [ML]}
    msg = _refusal(tmp_path, identity)
    assert "identity.rules[0].issuer: required when more than one source" in msg, msg
    assert f"one of: {ISSUER}, mtls" in msg, msg


@pytest.mark.parametrize("rule", [
    BATCH,
    {**BATCH, "issuer": ISSUER},
    {**ML, "id": "cn", "match": {"subject_cn": "batch-scorer"}},
    {**ML, "id": "by-cn", "match": {}, "team": None, "team_claim": "subject_cn"},
])
def test_a_certificate_name_without_issuer_mtls_is_refused(
        tmp_path: Path, rule: dict[str, Any]) -> None:
    # One issuer only (the simple case), so the rule's source alone is the problem.
    msg = _refusal(tmp_path, {"issuers": [_issuer(ISSUER)], "rules": [rule]})
    assert "identity.rules[0].issuer: the rule reads" in msg, msg
    assert "client certificate name: say issuer: mtls" in msg, msg


def test_a_rule_naming_an_unconfigured_source_is_refused(tmp_path: Path) -> None:
    msg = _refusal(tmp_path, {"issuers": [_issuer(ISSUER)],
                              "rules": [{**BATCH, "issuer": "mtls"}]})
    assert "identity.rules[0].issuer: 'mtls' cannot be used: client certificates are not " \
           f"configured (identity.mtls); configured sources: {ISSUER}" in msg, msg
    msg = _refusal(tmp_path, {"issuers": [_issuer(ISSUER)], "rules": [{**ML, "issuer": OTHER}]})
    assert f"identity.rules[0].issuer: {OTHER!r} cannot be used: it is not a configured " \
           "issuer" in msg, msg


def test_a_certificate_rule_reading_a_token_claim_is_refused(tmp_path: Path) -> None:
    msg = _refusal(tmp_path, {"mtls": {"trust_bundle_file": "ca.pem"},
                              "rules": [{**ML, "issuer": "mtls"}]})
    assert "identity.rules[0].match.groups: 'groups' is never offered by a client " \
           "certificate" in msg, msg


def test_no_token_issuer_may_be_named_mtls(tmp_path: Path) -> None:
    msg = _refusal(tmp_path, {"issuers": [_issuer("mtls")], "rules": [ML]})
    assert "identity.issuers[0].issuer: 'mtls' is reserved for client certificates" in msg, msg


def test_one_source_may_stay_implicit(tmp_path: Path) -> None:
    one_issuer = load(_write(tmp_path, {"issuers": [_issuer(ISSUER)], "rules": [ML]}), {})
    assert one_issuer.identity is not None
    assert one_issuer.identity.source_of(one_issuer.identity.rules[0]) == ISSUER
    certs = load(_write(tmp_path, {"mtls": {"trust_bundle_file": "ca.pem"},
                                   "rules": [{**BATCH, "issuer": "mtls"}]}), {})
    assert certs.identity is not None and certs.identity.implicit_source == "mtls"


def test_check_config_shows_each_rules_source(tmp_path: Path) -> None:
    key = SigningKey("k1")
    pin = write_jwks(tmp_path / "jwks.json", key)
    path = _write(tmp_path, {"issuers": [{**_issuer(ISSUER), "jwks_sha256": pin}],
                             "pseudonym_key_file": str(generate_key_file(tmp_path / "p.key")),
                             "rules": [ML]})
    result = run_gateway("check-config", "--config", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["identity"]["rules"] == [
        {"id": "ml", "source": ISSUER, "implicit": True}]
    result = run_gateway("check-config", "--config", str(path))
    assert result.exit_code == 0, result.output
    assert f"rule ml: {ISSUER} (implicit: the only source)" in result.output, result.output


class Pki:
    def __init__(self, tmp: Path) -> None:
        self.ca = Ca("workload-ca", tmp)
        self.server = self.ca.issue("gateway", server=True)
        self.batch = self.ca.issue("batch-scorer", uri=SPIFFE)


class Gateway:
    """The production server over TLS asking for client certificates, one IdP beside it."""

    def __init__(self, sim: Sim, tmp: Path) -> None:
        self.pki = Pki(tmp)
        self.key = SigningKey("idp-1")
        pin = write_jwks(tmp / "jwks.json", self.key)
        s: GatewaySettings = settings(
            [sim.url],
            listen={"tls_cert_file": str(self.pki.server[0]),
                    "tls_key_file": str(self.pki.server[1])},
            identity={
                "accept": ["key", "jwt", "mtls"],
                "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key")),
                "issuers": [{**_issuer(ISSUER), "jwks_file": str(tmp / "jwks.json"),
                             "jwks_sha256": pin}],
                "mtls": {"trust_bundle_file": str(self.pki.ca.pem)},
                "rules": [{**BATCH, "issuer": "mtls", "models": ["llama-3.1-8b"]},
                          {**ML, "issuer": ISSUER}],
            })
        context = client_cert_context(s)
        assert context is not None
        self.server = GuardedServer(s, create_app(s, assemble(s)), ssl_context=context).start()
        self.url = f"https://127.0.0.1:{self.server.port}"

    def client(self, cert: tuple[Path, Path] | None = None) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.pem))
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return httpx.Client(verify=ctx, timeout=20)


@pytest.fixture
def gateway(sim: Sim, tmp_path: Path) -> Iterator[Gateway]:
    gw = Gateway(sim, tmp_path)
    yield gw
    gw.server.stop()


def _chat(gw: Gateway, token: str | None = None,
          cert: tuple[Path, Path] | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    with gw.client(cert) as http:
        return http.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)


def test_a_token_carrying_the_certificate_rules_spiffe_id_is_refused(gateway: Gateway) -> None:
    token = gateway.key.token(groups=["contractors"], spiffe_id=SPIFFE,
                              subject_cn="batch-scorer")
    r = _chat(gateway, token)
    assert r.status_code == 403 and r.json()["error"]["code"] == "identity_not_mapped", r.text


def test_a_token_whose_iss_is_mtls_is_an_unknown_issuer(gateway: Gateway) -> None:
    token = gateway.key.token(iss="mtls", spiffe_id=SPIFFE)
    r = _chat(gateway, token)
    assert r.status_code == 401 and r.json()["error"]["code"] == "token_issuer_unknown", r.text


def test_the_certificate_and_the_idps_token_each_meet_their_own_rule(gateway: Gateway) -> None:
    with gateway.client(gateway.pki.batch) as http:
        assert http.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert http.get(gateway.url + "/v1/usage").json()["caller"]["team"] == "ml-batch"
    token = gateway.key.token()
    with gateway.client() as http:
        headers = {"authorization": f"Bearer {token}"}
        assert http.post(gateway.url + "/v1/chat/completions", json=CHAT,
                         headers=headers).status_code == 200
        caller = http.get(gateway.url + "/v1/usage", headers=headers).json()["caller"]
    assert caller["team"] == "ml" and caller["issuer"] == ISSUER
