"""TLS towards https:// replicas: certificates verified, CA bundle and client cert configurable."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.config.loader import parse
from gateway.errors import ConfigError
from tests.gateway.helpers import KEY_A, SERVED, Sim, config, settings, start_gateway
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

CHAT: Any = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


def _write_pki(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1; returns (ca.pem, server.pem, server.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test backend CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
            ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, cert_pem, key_pem = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return ca_pem, cert_pem, key_pem


@pytest.fixture
def tls_sim(serve_asgi: Any, tmp_path: Path) -> tuple[str, Path]:
    ca, cert, key = _write_pki(tmp_path)
    srv = serve_asgi(create_sim(SimConfig(models=[SERVED])), ssl_certfile=str(cert),
                     ssl_keyfile=str(key))
    return f"https://127.0.0.1:{srv.port}", ca


def test_unverifiable_backend_certificate_is_refused(serve_asgi: Any,
                                                     tls_sim: tuple[str, Path]) -> None:
    url, _ = tls_sim
    gw = start_gateway(serve_asgi, settings([url]))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 502
    assert "could not be verified" in r.json()["error"]["message"]
    sim = Sim(url)
    with httpx.Client(verify=False) as c:  # noqa: S501 - the test inspects its own server
        assert c.get(sim.url + "/sim/stats").json()["received"] == 0


def test_backend_ca_bundle(serve_asgi: Any, tls_sim: tuple[str, Path]) -> None:
    url, ca = tls_sim
    gw = start_gateway(serve_asgi, settings([url], upstream_tls={"ca_file": str(ca)}))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == SERVED


def test_tls_settings_validated(tmp_path: Path) -> None:
    cfg = config(["https://127.0.0.1:1"])
    cfg["upstream_tls"] = {"cert_file": "client.pem"}
    with pytest.raises(ConfigError, match="upstream_tls: set both cert_file and key_file"):
        parse(cfg, {"VLLM_KEY": "k"})
    cfg["upstream_tls"] = {}
    cfg["listen"]["tls_key_file"] = "k.pem"
    with pytest.raises(ConfigError, match="listen: set both tls_cert_file and tls_key_file"):
        parse(cfg, {"VLLM_KEY": "k"})
    from gateway.app import create_app

    cfg["listen"] = {"port": 0}
    cfg["upstream_tls"] = {"ca_file": "missing-ca.pem"}
    s = parse(cfg, {"VLLM_KEY": "k"}, base=tmp_path)
    assert s.upstream_tls.ca_file == tmp_path / "missing-ca.pem"
    with pytest.raises(ConfigError, match="upstream_tls: cannot load TLS files"):
        create_app(s)
