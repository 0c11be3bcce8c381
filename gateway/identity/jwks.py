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

from gateway.errors import ConfigError
from gateway.identity.errors import JwksRefused

__all__ = ["MAX_JWKS_BYTES", "MAX_JWKS_DEPTH", "KeySet", "load_jwks", "parse_jwks"]

_FAMILY = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "EC:P-256": ("ES256",),
    "EC:P-384": ("ES384",),
    "OKP:Ed25519": ("EdDSA",),
    "OKP:Ed448": ("EdDSA",),
}
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
_PUBLIC_MEMBERS = {"RSA": ("n", "e"), "EC": ("x", "y"), "OKP": ("x",)}
MAX_JWKS_BYTES = 1 << 20
MAX_JWKS_DEPTH = 8
"""Deepest nesting of arrays and objects accepted in a JWKS: RFC 7517 needs 4 (``keys``, a
key, its ``x5c`` or ``key_ops``); a deeper document is refused before it is parsed."""


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

    Every failure, whatever raised it (the JSON parser, PyJWT or ``cryptography`` building a
    key from members of the wrong type or value), is one :class:`JwksRefused` naming
    ``where`` and the key's index: a document from outside never raises anything else.

    Args:
        data: The document's bytes (at most :data:`MAX_JWKS_BYTES`).
        algorithms: The algorithms keys may be prepared for.
        where: The document's source, prefixing messages (``jwks_uri https://...``).

    Returns:
        The key set.

    Raises:
        JwksRefused: Over 1 MiB, nested deeper than :data:`MAX_JWKS_DEPTH`, not JSON, not a
            JWKS, a private or symmetric key, a key without ``kid``, a duplicate ``kid``, a
            member of the wrong type, a key the JOSE library cannot build, or no key an
            allowed algorithm can use.
    """
    if len(data) > MAX_JWKS_BYTES:
        raise JwksRefused(where, f"larger than {MAX_JWKS_BYTES} bytes")
    depth = _nesting(data)
    if depth > MAX_JWKS_DEPTH:
        raise JwksRefused(where, f"nested {depth} levels deep (a JWKS needs at most "
                                 f"{MAX_JWKS_DEPTH})")
    digest = hashlib.sha256(data).hexdigest()
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise JwksRefused(where, f"not JSON: {exc}") from exc
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise JwksRefused(where, "has no \"keys\" list (RFC 7517 section 5)")
    allowed = set(algorithms)
    keys: dict[tuple[str, str], jwt.PyJWK] = {}
    kids: set[str] = set()
    for i, entry in enumerate(entries):
        kid = _check_entry(entry, where, i)
        if kid in kids:
            raise JwksRefused(where, f"duplicate kid {kid!r}", i)
        kids.add(kid)
        if entry.get("use", "sig") != "sig":
            continue  # an encryption key never verifies a signature
        for alg in _algorithms_of(entry, allowed, where, i):
            try:
                keys[(kid, alg)] = jwt.PyJWK({**entry, "alg": alg})
            # Foreign code fed foreign input: PyJWTError (InvalidKeyError, PyJWKError), and
            # whatever cryptography or base64 raise for a member of the wrong type or value
            # (TypeError, ValueError, OverflowError...). Each is this one refusal.
            except Exception as exc:
                raise JwksRefused(where, f"not a usable {alg} key: {type(exc).__name__}: "
                                         f"{exc}", i) from exc
    if not keys:
        raise JwksRefused(where, "no signing key usable with " + ", ".join(sorted(allowed)))
    return KeySet(digest, keys, frozenset(kids))


def _nesting(data: bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text (brackets inside strings skipped), so
    that a hostile document is refused before the recursive parser sees it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _check_entry(entry: Any, where: str, i: int) -> str:
    if not isinstance(entry, dict):
        raise JwksRefused(where, "not a JSON object", i)
    private = sorted(_PRIVATE_MEMBERS & entry.keys())
    if private:
        raise JwksRefused(where, f"holds private or symmetric key material "
                                 f"({', '.join(private)}); a JWKS for verification holds "
                                 "public keys only", i)
    kid = entry.get("kid")
    if not isinstance(kid, str) or not kid:
        raise JwksRefused(where, "no kid (every key needs one: tokens name their key by kid)", i)
    for member in ("kty", "crv", "alg", "use"):
        if member in entry and not isinstance(entry[member], str):
            raise JwksRefused(where, f"{member!r} is not a string", i)
    return kid


def _algorithms_of(entry: dict[str, Any], allowed: set[str], where: str, i: int) -> list[str]:
    kty = entry.get("kty")
    family = _FAMILY.get(str(kty) if kty == "RSA" else f"{kty}:{entry.get('crv')}", ())
    members = _PUBLIC_MEMBERS.get(str(kty), ())
    missing = [m for m in members if not isinstance(entry.get(m), str)]
    if family and missing:
        raise JwksRefused(where, f"{kty} key member(s) {', '.join(missing)} missing or not "
                                 "base64url strings", i)
    declared = entry.get("alg")
    if declared is not None:
        return [declared] if declared in family and declared in allowed else []
    return [a for a in family if a in allowed]
