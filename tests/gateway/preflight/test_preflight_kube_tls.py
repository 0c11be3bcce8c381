"""The read-only API client over HTTPS with the kubeconfig's CA and client certificate."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.preflight import Criteria, Inputs, PreflightInputError, run_preflight
from tests.gateway.preflight.conftest import NAMESPACE, SCENARIO_POLICY, serve_kube


def _cert(name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
          issuer_key: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, bytes]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca_key, ca=True)
    out = {"ca": _pem(ca)}
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        out[who] = _pem(_cert(who, key, ca.subject, ca_key, ca=False))
        out[who + "-key"] = _pem(key)
    return out


def _server_tls(pki: dict[str, bytes], tmp_path: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "s.pem").write_bytes(pki["server"])
    (tmp_path / "s.key").write_bytes(pki["server-key"])
    ctx.load_cert_chain(tmp_path / "s.pem", tmp_path / "s.key")
    ctx.load_verify_locations(cadata=pki["ca"].decode())
    ctx.verify_mode = ssl.CERT_REQUIRED  # the client must present a certificate of the CA
    return ctx


def _kubeconfig(path: Path, server: str, pki: dict[str, bytes], ca: bytes) -> Path:
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "tls",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                                "certificate-authority-data": b64(ca)}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64(pki["client"]),
                                         "client-key-data": b64(pki["client-key"])}}],
        "contexts": [{"name": "tls", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_https_with_ca_and_client_certificate(pki: dict[str, bytes], tmp_path: Path) -> None:
    with serve_kube(_server_tls(pki, tmp_path)) as kube:
        cfg = _kubeconfig(tmp_path / "kc", kube.url, pki, pki["ca"])
        report, facts = run_preflight(
            Inputs(policy=SCENARIO_POLICY, kubeconfig=cfg, namespace=NAMESPACE),
            Criteria(regions=("eu-central-1",)))
    assert facts.workload_source == "kubernetes API" and len(facts.workloads or ()) == 3
    assert next(c for c in report.checks if c.id == "k8s.node-regions").status == "pass"
    assert {m for m, _ in kube.requests} == {"GET"}


def test_https_server_outside_the_kubeconfig_ca_is_refused(pki: dict[str, bytes],
                                                           tmp_path: Path) -> None:
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _pem(_cert("other-ca", other_key, None, other_key, ca=True))
    with serve_kube(_server_tls(pki, tmp_path)) as kube:
        cfg = _kubeconfig(tmp_path / "kc", kube.url, pki, other_ca)
        with pytest.raises(PreflightInputError, match="CERTIFICATE_VERIFY_FAILED"):
            run_preflight(Inputs(kubeconfig=cfg, namespace=NAMESPACE), Criteria())
    assert kube.requests == []
