"""The ASGI TLS extension: an app served over HTTPS reads the client's certificate in its scope.

https://asgi.readthedocs.io/en/latest/specs/tls.html: ``scope["extensions"]["tls"]`` with
``client_cert_chain`` (PEM strings, the client's certificate first) and ``tls_version``. The
identity work (mTLS client certificates) reads it; here a real client certificate is presented
over loopback to the gateway's own server.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.gateway.gateway_server import Servers, split_response
from tests.gateway.helpers import settings
from tests.gateway.test_gw_tls import _write_pki


async def _echo_tls(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    tls = scope["extensions"].get("tls")
    body = json.dumps({"scheme": scope["scheme"], "tls": tls}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def _client_cert(tmp: Path, ca_pem: Path) -> tuple[Path, Path, str]:
    """A client certificate signed by a second CA (the clients' CA); returns its files, PEM."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test client CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "team-a"),
                                     x509.NameAttribute(NameOID.ORGANIZATION_NAME, "acme")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    clients_ca = tmp / "clients-ca.pem"
    clients_ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = tmp / "client.pem", tmp / "client.key"
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    cert_file.write_text(pem)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file, pem


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.stop_all()


def _exchange(port: int, client: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            client.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(b"GET /whoami HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _get(port: int, client: ssl.SSLContext) -> dict[str, Any]:
    data = _exchange(port, client)
    status, _, body = split_response(data)
    assert status == 200, data[:300]
    out: dict[str, Any] = json.loads(body)
    return out


def test_the_client_certificate_is_in_the_scope(servers: Servers, tmp_path: Path) -> None:
    ca_pem, server_pem, server_key = _write_pki(tmp_path)
    client_pem, client_key, client_text = _client_cert(tmp_path, ca_pem)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(server_pem, server_key)
    server_tls.verify_mode = ssl.CERT_REQUIRED
    server_tls.load_verify_locations(tmp_path / "clients-ca.pem")
    srv = servers.start(settings(["http://127.0.0.1:9"]), _echo_tls, ssl_context=server_tls)

    client = ssl.create_default_context(cafile=str(ca_pem))
    client.load_cert_chain(client_pem, client_key)
    got = _get(srv.port, client)
    tls = got["tls"]
    assert got["scheme"] == "https"
    assert tls["client_cert_chain"][0] == client_text  # PEM, the client's own first
    assert tls["client_cert_name"] == "O=acme,CN=team-a"
    assert tls["tls_version"] in (0x0303, 0x0304)
    assert tls["client_cert_error"] is None

    # Without a client certificate the handshake fails (CERT_REQUIRED): nothing is served
    # (TLS 1.3: the client learns it at its first read).
    anonymous = ssl.create_default_context(cafile=str(ca_pem))
    try:
        answer = _exchange(srv.port, anonymous)
    except (ssl.SSLError, ConnectionError):
        answer = b""
    assert answer == b""


def test_no_client_certificate_gives_an_empty_chain(servers: Servers, tmp_path: Path) -> None:
    ca_pem, server_pem, server_key = _write_pki(tmp_path)
    srv = servers.start(settings(["http://127.0.0.1:9"]), _echo_tls, ssl_certfile=server_pem,
                        ssl_keyfile=server_key)
    tls = _get(srv.port, ssl.create_default_context(cafile=str(ca_pem)))["tls"]
    assert tls["client_cert_chain"] == [] and tls["client_cert_name"] is None
    assert tls["tls_version"] in (0x0303, 0x0304)
