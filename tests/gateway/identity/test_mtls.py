"""mTLS workloads through a real socket: the production server over TLS asking for
client certificates (``identity.mtls``), a SPIFFE ID mapped by the identity rules like token
claims, a certificate of another CA refused, and the app's own chain check (401) for a
certificate that reaches it from a looser TLS terminator."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import generate_key_file
from gateway.config.settings import GatewaySettings
from gateway.identity.auth import IdentityAuthenticator
from gateway.identity.build import client_cert_context
from gateway.identity.errors import TokenRejected
from tests.gateway.gateway_server import GuardedServer
from tests.gateway.helpers import KEY_A, Sim, settings
from tests.gateway.identity.pki import Ca

SPIFFE = "spiffe://prod.example/ns/ml/sa/batch-scorer"
CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


class Pki:
    def __init__(self, tmp: Path) -> None:
        self.ca = Ca("workload-ca", tmp)
        self.other = Ca("other-ca", tmp)
        self.server = self.ca.issue("gateway", server=True)
        self.batch = self.ca.issue("batch-scorer", uri=SPIFFE)
        self.unmapped = self.ca.issue("stranger", uri="spiffe://prod.example/ns/x/sa/y")
        self.foreign = self.other.issue("impostor", uri=SPIFFE)


def _settings(sim: Sim, pki: Pki, tmp: Path) -> GatewaySettings:
    return settings(
        [sim.url],
        listen={"tls_cert_file": str(pki.server[0]), "tls_key_file": str(pki.server[1])},
        identity={
            "accept": ["key", "mtls"],
            "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key")),
            "mtls": {"trust_bundle_file": str(pki.ca.pem)},
            "rules": [{"id": "batch", "issuer": "mtls", "match": {"spiffe_id": SPIFFE},
                       "team": "ml-batch", "models": ["llama-3.1-8b"]}],
        })


class TlsServer:
    """The app under the production server, with the TLS context of gateway serve."""

    def __init__(self, s: GatewaySettings) -> None:
        context = client_cert_context(s)
        assert context is not None
        self.server = GuardedServer(s, create_app(s, assemble(s)), ssl_context=context).start()
        self.port = self.server.port
        self.url = f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def tls_server(sim: Sim, pki: Pki, tmp_path: Path) -> Iterator[TlsServer]:
    srv = TlsServer(_settings(sim, pki, tmp_path))
    yield srv
    srv.stop()


def _context(pki: Pki, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.pem))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def test_a_spiffe_workload_is_served_by_its_certificate(tls_server: TlsServer, pki: Pki) -> None:
    with httpx.Client(verify=_context(pki, pki.batch), timeout=20) as http, \
            openai.OpenAI(base_url=tls_server.url + "/v1", api_key="unused-with-mtls",
                          max_retries=0, http_client=http) as client:
        reply = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert reply.choices[0].message.content
        usage = http.get(tls_server.url + "/v1/usage").json()
    assert usage["caller"]["team"] == "ml-batch" and usage["caller"]["issuer"] == "mtls"
    assert usage["caller"]["key_id"].startswith("id:")


def test_no_certificate_falls_back_to_api_keys(tls_server: TlsServer, pki: Pki) -> None:
    with httpx.Client(verify=_context(pki, None), timeout=20) as http:
        ok = http.post(tls_server.url + "/v1/chat/completions", json=CHAT,
                       headers={"authorization": f"Bearer {KEY_A}"})
        refused = http.post(tls_server.url + "/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 401


def test_a_certificate_no_rule_maps_is_forbidden(tls_server: TlsServer, pki: Pki) -> None:
    with httpx.Client(verify=_context(pki, pki.unmapped), timeout=20) as http:
        r = http.post(tls_server.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 403 and r.json()["error"]["code"] == "identity_not_mapped"


def test_a_certificate_of_another_ca_is_refused_at_the_handshake(
        tls_server: TlsServer, pki: Pki) -> None:
    # TLS 1.3: the client finishes its side first; the server then fails the handshake on the
    # certificate and closes: no HTTP byte ever comes back (asyncio closes without an alert
    # the client could read), and the request never reached the app.
    ctx = _context(pki, pki.foreign)
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        try:
            tls.sendall(b"GET /v1/usage HTTP/1.1\r\nhost: x\r\n\r\n")
            got = tls.recv(1024)
        except (ssl.SSLError, OSError) as exc:
            got = repr(exc).encode()
    assert b"HTTP/1.1" not in got
    assert got == b"" or b"unknown ca" in got.lower(), got
    # The same client with a certificate of the trusted CA is answered.
    with httpx.Client(verify=_context(pki, pki.batch), timeout=20) as http:
        assert http.get(tls_server.url + "/v1/usage").status_code == 200


def test_the_app_checks_the_chain_itself(sim: Sim, pki: Pki, tmp_path: Path) -> None:
    # A looser TLS terminator in front (or the next server) hands the app another CA's chain:
    # the app's own path validation refuses it with a clear 401.
    auth = assemble(_settings(sim, pki, tmp_path)).authenticator
    assert isinstance(auth, IdentityAuthenticator)
    scope: dict[str, Any] = {"path": "/v1/chat/completions", "extensions": {"tls": {
        "client_cert_chain": [pki.foreign[0].read_text()]}}}
    with pytest.raises(TokenRejected) as info:
        auth.authenticate(None, scope)
    assert (info.value.status, info.value.code) == (401, "client_cert_untrusted")
    scope["extensions"]["tls"]["client_cert_chain"] = [pki.batch[0].read_text()]
    principal = auth.authenticate(None, scope)
    assert principal.identity is not None and principal.identity.cert_sha256 is not None
    assert principal.identity.decided_by == (("spiffe_id", SPIFFE),)
