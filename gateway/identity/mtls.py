"""Workload identity from a TLS client certificate, verified against a trust bundle file.

The server puts the peer's chain in the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``: PEM strings, leaf first; ASGI TLS
extension spec). The chain is verified here again with ``cryptography``'s X.509 path validation
(RFC 5280, client policy) against the ``identity.mtls.trust_bundle_file`` CAs, so a certificate
of another CA is refused even when the listener's TLS layer was configured more loosely. The
identity's names are the SPIFFE ID (a URI SAN ``spiffe://trust-domain/path``) and the subject
common name; the identity rules match them as claims ``spiffe_id`` and ``subject_cn``.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from gateway.errors import ConfigError
from gateway.identity.errors import TokenRejected

__all__ = ["MtlsVerifier", "peer_chain"]


def peer_chain(scope: Mapping[str, Any]) -> list[str] | None:
    """The client certificate chain (PEM strings, leaf first) of the ASGI TLS extension."""
    tls = (scope.get("extensions") or {}).get("tls")
    if not isinstance(tls, Mapping):
        return None
    chain = tls.get("client_cert_chain")
    return list(chain) if chain else None


class MtlsVerifier:
    """Verifies client certificate chains against a trust bundle.

    Args:
        bundle_file: PEM file of the CA certificates that may issue client certificates.
        where: Config key for error messages.

    Raises:
        ConfigError: The bundle is unreadable or holds no certificate.
    """

    def __init__(self, bundle_file: Path, where: str = "identity.mtls.trust_bundle_file") -> None:
        try:
            data = bundle_file.read_bytes()
            roots = x509.load_pem_x509_certificates(data)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where}: cannot load CA certificates from {bundle_file}: "
                              f"{exc}") from exc
        self.bundle_sha256 = hashlib.sha256(data).hexdigest()
        self._store = Store(roots)

    def verify(self, chain: list[str]) -> tuple[dict[str, str], str]:
        """Verify ``chain`` and return its names and the leaf's SHA-256 fingerprint (DER, hex).

        Raises:
            TokenRejected: Unparsable, expired, or not issued by a CA of the bundle
                (``client_cert_untrusted``).
        """
        try:
            certs = [x509.load_pem_x509_certificate(pem.encode("ascii")) for pem in chain]
        except (ValueError, UnicodeEncodeError) as exc:
            raise TokenRejected("The client certificate cannot be parsed.",
                                "client_cert_untrusted") from exc
        leaf, intermediates = certs[0], certs[1:]
        verifier = (PolicyBuilder().store(self._store)
                    .time(datetime.datetime.now(datetime.UTC)).build_client_verifier())
        try:
            verifier.verify(leaf, intermediates)
        except VerificationError as exc:
            raise TokenRejected("The client certificate is not issued by a trusted CA.",
                                "client_cert_untrusted") from exc
        names: dict[str, str] = {"iss": "mtls"}
        cns = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if cns:
            names["subject_cn"] = str(cns[0].value)
        try:
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            san = None
        if san is not None:
            for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
                if uri.startswith("spiffe://"):
                    names["spiffe_id"] = uri
                    break
        return names, hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
