"""The ASGI TLS extension of a connection: ``scope["extensions"]["tls"]``.

https://asgi.readthedocs.io/en/latest/specs/tls.html: ``server_cert`` (PEM or ``None``),
``client_cert_chain`` (PEM strings, the client's certificate first; empty without one),
``client_cert_name`` (its subject as an RFC 4514 string, or ``None``), ``client_cert_error``
(``None``: the TLS layer verified what it was configured to verify, or the handshake would have
failed), ``tls_version`` (``0x0303`` for TLS 1.2, ``0x0304`` for TLS 1.3) and ``cipher_suite``
(``None``: Python's ``ssl`` names the cipher, it does not give its IANA number).

Python before 3.13 gives only the peer's own certificate (``getpeercert(binary_form=True)``),
so ``client_cert_chain`` then holds one PEM string; from 3.13 the verified chain
(``SSLObject.get_verified_chain``) when there is one.
"""

from __future__ import annotations

import ssl
from typing import Any

from cryptography import x509

__all__ = ["TLS_VERSIONS", "tls_extension"]

TLS_VERSIONS = {"TLSv1": 0x0301, "TLSv1.1": 0x0302, "TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
"""``SSLObject.version()`` -> the protocol version number of the ASGI TLS extension."""


def tls_extension(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> dict[str, Any]:
    """The ASGI TLS extension of one established TLS connection.

    Args:
        ssl_object: The connection's ``ssl_object`` (``transport.get_extra_info``).

    Returns:
        The extension's dictionary (see the module docstring for the keys).
    """
    chain: list[str] = []
    name: str | None = None
    verified = getattr(ssl_object, "get_verified_chain", None)  # Python >= 3.13
    ders: list[bytes] = []
    if verified is not None:
        ders = [bytes(der) for der in verified() or ()]  # DER, the peer's certificate first
    if not ders:
        leaf = ssl_object.getpeercert(binary_form=True)
        ders = [leaf] if leaf else []
    if ders:
        chain = [ssl.DER_cert_to_PEM_cert(der) for der in ders]
        name = x509.load_der_x509_certificate(ders[0]).subject.rfc4514_string()
    version = ssl_object.version()
    return {
        "server_cert": None,
        "client_cert_chain": chain,
        "client_cert_name": name,
        "client_cert_error": None,
        "tls_version": TLS_VERSIONS.get(version) if version else None,
        "cipher_suite": None,
    }
