"""Ed25519 keys and the detached signature over ``index.json`` (RFC 8032, PureEd25519).

``index.sig`` is a small JSON document (spec: docs/bundle-format.md)::

    {"format": "sovereign-gateway/airgap-signature", "version": 1, "algorithm": "ed25519",
     "key_id": "<sha256 hex of the 32-byte raw public key>",
     "signature": "<base64 of the 64-byte Ed25519 signature over the exact bytes of index.json>"}

The signature covers the raw bytes of index.json, so stock OpenSSL can check it too
(``openssl pkeyutl -verify -pubin -inkey KEY.pub -rawin -in index.json -sigfile SIG.bin``).
Verification needs nothing but the signer's public key (PEM SubjectPublicKeyInfo, RFC 8410).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from airgap.errors import AirgapError, Code, fail
from clishell import private_key_instead, public_key_path, read_input

SIGNATURE_FORMAT = "sovereign-gateway/airgap-signature"
#: A key id: lower-case hex SHA-256 of the raw public key (what :func:`key_id` returns).
KEY_ID = re.compile(r"[0-9a-f]{64}")
SIGNATURE_VERSION = 1
MAX_SIGNATURE_BYTES = 64 * 1024


def key_id(public_key: Ed25519PublicKey) -> str:
    """Hex SHA-256 of the 32-byte raw public key (the signer id shown to operators)."""
    return hashlib.sha256(public_key.public_bytes_raw()).hexdigest()


def generate_keypair(out: Path) -> tuple[Path, str]:
    """Write a new Ed25519 private key (PKCS#8 PEM, mode 0600) and its public key.

    Args:
        out: path of the private key; the public key goes to
            :func:`clishell.public_key_path` of it (``KEY.pem`` -> ``KEY.pub``).

    Returns:
        (public key path, key id).

    Raises:
        AirgapError: ``output_exists`` if either file exists, ``io_error`` on write failure.
    """
    pub_path = public_key_path(out)
    for p in (out, pub_path):
        if p.exists() or p.is_symlink():
            raise AirgapError(Code.OUTPUT_EXISTS, f"{p} already exists; refusing to overwrite")
    from cryptography.hazmat.primitives import serialization

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pub_pem)
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot write key: {exc}") from exc
    return pub_path, key_id(key.public_key())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted Ed25519 private key (PEM).

    Raises:
        AirgapError: ``key_invalid`` (unreadable, not PEM, or not Ed25519).
    """
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(read_input(path), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise AirgapError(Code.KEY_INVALID, f"cannot load private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AirgapError(Code.KEY_INVALID, f"{path} is not an Ed25519 key (use `airgap keygen`)")
    return key


#: DER of an Ed25519 SubjectPublicKeyInfo before its 32 key bytes (RFC 8410 section 4:
#: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (0 unused bits) }).
_ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM_PUBLIC_KEY = re.compile(
    rb"-----BEGIN PUBLIC KEY-----\r?\n([A-Za-z0-9+/=\r\n]{1,200})-----END PUBLIC KEY-----\r?\n?")


def _ed25519_spki(pem: bytes) -> Ed25519PublicKey | None:
    """The key of a plain PEM Ed25519 SubjectPublicKeyInfo (what ``airgap keygen`` writes), or
    None for anything else, which then goes to cryptography's full PEM loader (and its
    errors). Parsing the one fixed form here spares ``airgap verify`` the import of
    cryptography's serialization package (~0.06 CPU-s)."""
    found = _PEM_PUBLIC_KEY.fullmatch(pem)
    if found is None:
        return None
    try:
        der = base64.b64decode(found.group(1).replace(b"\r", b"").replace(b"\n", b""),
                               validate=True)
    except binascii.Error:
        return None
    if len(der) != len(_ED25519_SPKI_PREFIX) + 32 or not der.startswith(_ED25519_SPKI_PREFIX):
        return None
    return Ed25519PublicKey.from_public_bytes(der[len(_ED25519_SPKI_PREFIX):])


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load an Ed25519 public key (PEM SubjectPublicKeyInfo).

    Raises:
        AirgapError: ``key_invalid`` (unreadable, not PEM, or not Ed25519).
    """
    try:
        pem = read_input(path)
        mistake = private_key_instead(path, pem)
        if mistake is not None:
            raise AirgapError(Code.KEY_INVALID, mistake)
        fast = _ed25519_spki(pem)
        if fast is not None:
            return fast
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_public_key(pem)
    except (OSError, ValueError) as exc:
        raise AirgapError(Code.KEY_INVALID, f"cannot load public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise AirgapError(Code.KEY_INVALID, f"{path} is not an Ed25519 public key")
    return key


def sign_index(index_bytes: bytes, key: Ed25519PrivateKey) -> bytes:
    """Return the ``index.sig`` document for ``index_bytes``."""
    doc = {
        "format": SIGNATURE_FORMAT,
        "version": SIGNATURE_VERSION,
        "algorithm": "ed25519",
        "key_id": key_id(key.public_key()),
        "signature": base64.b64encode(key.sign(index_bytes)).decode("ascii"),
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def signer_key_id(sig_bytes: bytes) -> str:
    """The key id the signature claims (unverified), for ``inspect``.

    Raises:
        VerificationFailed: ``signature_malformed``.
    """
    return _parse_signature(sig_bytes)[0]


def _parse_signature(sig_bytes: bytes) -> tuple[str, bytes]:
    try:
        doc = json.loads(sig_bytes.decode("utf-8"))
        if (
            doc.get("format") != SIGNATURE_FORMAT
            or doc.get("version") != SIGNATURE_VERSION
            or doc.get("algorithm") != "ed25519"
        ):
            raise ValueError("not a version 1 ed25519 airgap signature")
        kid = doc["key_id"]
        # Printed before anything is trusted (verify, unpack, inspect): its form, never its text
        if not isinstance(kid, str) or KEY_ID.fullmatch(kid) is None:
            raise ValueError("key_id is not 64 lower-case hex digits (the sha256 of the "
                             "signer's raw public key)")
        sig = base64.b64decode(doc["signature"], validate=True)
        if len(sig) != 64:
            raise ValueError("the signature is not 64 bytes")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError,
            binascii.Error) as exc:  # fmt: skip
        raise fail(Code.SIGNATURE_MALFORMED, f"index.sig is malformed: {exc}") from None
    return kid, sig


def verify_index_signature(
    index_bytes: bytes, sig_bytes: bytes, trusted: Sequence[Ed25519PublicKey]
) -> str:
    """Check ``index.sig`` against the trusted public keys.

    Args:
        index_bytes: exact bytes of index.json.
        sig_bytes: bytes of index.sig.
        trusted: public keys whose signatures are accepted (at least one).

    Returns:
        the key id of the key that verified.

    Raises:
        VerificationFailed: ``signature_malformed``; ``signature_untrusted_key`` when the signer is
            none of the trusted keys; ``signature_invalid`` when the index was modified after
            signing (or the signature forged).
    """
    kid, sig = _parse_signature(sig_bytes)
    by_id = {key_id(k): k for k in trusted}
    key = by_id.get(kid)
    if key is None:
        raise fail(
            Code.SIGNATURE_UNTRUSTED_KEY,
            f"index signed by key {kid[:16]}, which is not a trusted key "
            f"({', '.join(k[:16] for k in by_id)})",
            expected=",".join(by_id), actual=kid,
        )  # fmt: skip
    try:
        key.verify(sig, index_bytes)
    except InvalidSignature:
        raise fail(
            Code.SIGNATURE_INVALID,
            f"index.json does not match its signature by key {kid[:16]}: "
            "it was modified after signing",
        ) from None
    return kid
