"""A JWKS file pinned by SHA-256, turned into verification keys once (at start and reload).

The file (RFC 7517 §5: ``{"keys": [...]}``) is read whole, its SHA-256 compared with the pin,
then every key parsed; any problem refuses the whole file (a reload then keeps the keys that
were serving). Each key is prepared once per algorithm it may verify, so a request only looks
up ``(kid, alg)``: a key is never used with an algorithm of another family (RFC 8725 §2.1,
algorithm confusion), and a header's ``alg`` that the key cannot verify is simply not found.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from jwt.exceptions import PyJWKError

from gateway.errors import ConfigError

__all__ = ["KeySet", "load_jwks", "parse_jwks"]

_FAMILY = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "EC:P-256": ("ES256",),
    "EC:P-384": ("ES384",),
    "OKP:Ed25519": ("EdDSA",),
    "OKP:Ed448": ("EdDSA",),
}
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
MAX_JWKS_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class KeySet:
    """The verification keys of one issuer.

    Attributes:
        sha256: SHA-256 hex of the JWKS file's bytes.
        keys: ``(kid, alg)`` -> prepared key.
        kids: Every key id in the file.
    """

    sha256: str
    keys: dict[tuple[str, str], jwt.PyJWK]
    kids: frozenset[str]


def load_jwks(path: Path, sha256: str, algorithms: Iterable[str], where: str) -> KeySet:
    """Read, check against its pin and parse a JWKS file.

    Args:
        path: The JWKS file.
        sha256: Expected SHA-256 hex of its bytes.
        algorithms: The algorithms keys may be prepared for (the issuer's allowed set).
        where: The config key path for error messages (``identity.issuers[0]``).

    Returns:
        The key set.

    Raises:
        ConfigError: Unreadable, too large (over 1 MiB), a digest other than the pin, not a
            JWKS, a private or symmetric key, a key without ``kid``, a duplicate ``kid``, or a
            key no allowed algorithm can use.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_JWKS_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}.jwks_file: cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_JWKS_BYTES:
        raise ConfigError(f"{where}.jwks_file: {path} is larger than {MAX_JWKS_BYTES} bytes")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ConfigError(f"{where}.jwks_sha256: {path} has sha256 {digest}, the pin is "
                          f"{sha256}; refusing the file (update the pin with the file)")
    return parse_jwks(data, algorithms, f"{where}.jwks_file: {path}")


def parse_jwks(data: bytes, algorithms: Iterable[str], where: str) -> KeySet:
    """Parse JWKS bytes (a file's or a fetched document's) into a key set, all or nothing.

    Raises:
        ConfigError: Not JSON, not a JWKS, a private or symmetric key, a key without ``kid``,
            a duplicate ``kid``, or no key an allowed algorithm can use (``where`` prefixes
            the message).
    """
    digest = hashlib.sha256(data).hexdigest()
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where} has no \"keys\" list (RFC 7517 section 5)")
    allowed = set(algorithms)
    keys: dict[tuple[str, str], jwt.PyJWK] = {}
    kids: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"{where}: keys[{i}]"
        kid = _check_entry(entry, at)
        if kid in kids:
            raise ConfigError(f"{at}: duplicate kid {kid!r}")
        kids.add(kid)
        if entry.get("use", "sig") != "sig":
            continue  # an encryption key never verifies a signature
        for alg in _algorithms_of(entry, allowed):
            try:
                keys[(kid, alg)] = jwt.PyJWK({**entry, "alg": alg})
            except PyJWKError as exc:
                raise ConfigError(f"{at}: not a usable {alg} key: {exc}") from exc
    if not keys:
        raise ConfigError(f"{where}: no signing key usable with "
                          + ", ".join(sorted(allowed)))
    return KeySet(digest, keys, frozenset(kids))


def _check_entry(entry: Any, at: str) -> str:
    if not isinstance(entry, dict):
        raise ConfigError(f"{at}: not a JSON object")
    private = sorted(_PRIVATE_MEMBERS & entry.keys())
    if private:
        raise ConfigError(f"{at}: holds private or symmetric key material ({', '.join(private)}); "
                          "a JWKS for verification holds public keys only")
    kid = entry.get("kid")
    if not isinstance(kid, str) or not kid:
        raise ConfigError(f"{at}: no kid (every key needs one: tokens name their key by kid)")
    return kid


def _algorithms_of(entry: dict[str, Any], allowed: set[str]) -> list[str]:
    kty = entry.get("kty")
    family = _FAMILY.get(str(kty) if kty == "RSA" else f"{kty}:{entry.get('crv')}", ())
    declared = entry.get("alg")
    if declared is not None:
        return [declared] if declared in family and declared in allowed else []
    return [a for a in family if a in allowed]
