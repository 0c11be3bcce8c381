"""Bearer-token (JWS compact JWT) verification against pinned key sets, with PyJWT.

Order of checks, cheapest first, each failure a :class:`TokenRejected` with its own code:
size; three base64url segments; header JSON; ``alg`` asymmetric and allowed (never ``none``,
never HMAC); no ``jku``/``x5u``/``jwk``/``x5c``/``crit`` header (a token never chooses its own
key, RFC 8725 §3.10); ``iss`` (read unverified only to pick the issuer's key set, then verified
by PyJWT); ``kid`` not revoked and in the pinned JWKS for that ``alg``; then PyJWT checks the
signature, ``exp``/``nbf``/``iat`` (with the clock skew), ``aud``, ``iss`` and the required
claims; on a path bound to a resource (RFC 8707, :mod:`gateway.identity.resources`) ``aud``
must name that resource instead of one of the issuer's ``audiences``. No key is ever fetched
here, so an unknown ``kid`` costs a dictionary lookup.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt import exceptions as jwt_errors

from gateway.identity.errors import TokenRejected
from gateway.identity.fetch import JwksFetcher
from gateway.identity.jwks import KeySet
from gateway.identity.resources import audience_names
from gateway.identity.settings import ASYMMETRIC_ALGORITHMS, IssuerSettings

__all__ = ["IssuerKeys", "JwtVerifier", "Verified", "looks_like_jwt"]

_B64URL = re.compile(rb"^[A-Za-z0-9_-]*$")
_REFUSED_HEADERS = ("jku", "x5u", "jwk", "x5c", "x5t", "x5t#S256", "crit")
_MAX_TOKEN_BYTES = 65536


def looks_like_jwt(token: str) -> bool:
    """True for a JWS compact serialisation (``eyJ...`` with two dots); API keys never are."""
    return token.startswith("eyJ") and token.count(".") == 2


@dataclass(frozen=True, slots=True)
class IssuerKeys:
    """One configured issuer, its pinned key set and (opt-in) its ``jwks_uri`` fetcher."""

    settings: IssuerSettings
    keyset: KeySet
    fetcher: JwksFetcher | None = None


@dataclass(frozen=True, slots=True)
class Verified:
    """A token that verified.

    Attributes:
        issuer: The issuer it verified against.
        claims: Its payload.
        kid: The key id that verified it.
        jwks_sha256: SHA-256 of the JWKS (pinned file or fetched document) that held the key.
    """

    issuer: IssuerKeys
    claims: Mapping[str, Any]
    kid: str
    jwks_sha256: str


_NUMERIC_DATES = ("exp", "nbf", "iat")


def _segment(raw: str, what: str) -> Any:
    data = raw.encode("ascii", "replace")
    if not _B64URL.match(data):
        raise TokenRejected(f"The token's {what} is not base64url.", "token_malformed")
    try:
        decoded = base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))
        value = json.loads(decoded)
    except (binascii.Error, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        raise TokenRejected(f"The token's {what} is not base64url JSON.",
                            "token_malformed") from exc
    if not isinstance(value, dict):
        raise TokenRejected(f"The token's {what} is not a JSON object.", "token_malformed")
    return value


class JwtVerifier:
    """Verifies bearer tokens of the configured issuers.

    Args:
        issuers: The issuers with their loaded key sets.
    """

    def __init__(self, issuers: list[IssuerKeys]) -> None:
        self._issuers = {i.settings.issuer: i for i in issuers}
        self._max = max((i.settings.max_token_bytes for i in issuers), default=8192)

    @property
    def issuers(self) -> dict[str, IssuerKeys]:
        """The issuers by ``iss``."""
        return self._issuers

    def verify(self, token: str, resource: str | None = None) -> Verified:
        """Verify ``token`` (see the module docstring for the order of checks).

        Args:
            token: The bearer token.
            resource: The canonical URI of the resource the token is presented to (RFC 8707):
                its ``aud`` must name it, and the issuer's ``audiences`` are not accepted
                instead (``None``: one of the issuer's ``audiences``).

        Returns:
            The verified token.

        Raises:
            TokenRejected: With the code of the first check that failed.
        """
        if len(token) > min(self._max, _MAX_TOKEN_BYTES):
            raise TokenRejected(f"The token is longer than {self._max} bytes.", "token_too_large")
        parts = token.split(".")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise TokenRejected("The token is not a signed JWT (three base64url parts).",
                                "token_malformed")
        header = _segment(parts[0], "header")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ASYMMETRIC_ALGORITHMS:
            raise TokenRejected(f"The token's algorithm {alg!r} is not accepted "
                                "(asymmetric signatures only).", "token_alg_refused")
        refused = [h for h in _REFUSED_HEADERS if h in header]
        if refused:
            raise TokenRejected(f"The token's header carries {refused[0]!r}; keys are never "
                                "taken from a token.", "token_header_refused")
        if not parts[2]:
            raise TokenRejected("The token is not signed.", "token_signature_invalid")
        payload = _segment(parts[1], "payload")
        for name in _NUMERIC_DATES:
            value = payload.get(name)
            # RFC 7519 section 2: a NumericDate is a JSON number; PyJWT would int() "1767225600"
            if name in payload and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TokenRejected(f"The token's {name!r} is not a NumericDate (a JSON number).",
                                    "token_malformed")
        iss = payload.get("iss")
        issuer = self._issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise TokenRejected("The token's issuer is not trusted.", "token_issuer_unknown")
        cfg = issuer.settings
        if len(token) > cfg.max_token_bytes:
            raise TokenRejected(f"The token is longer than {cfg.max_token_bytes} bytes.",
                                "token_too_large")
        if alg not in cfg.algorithms:
            raise TokenRejected(f"The algorithm {alg} is not accepted for this issuer.",
                                "token_alg_refused")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenRejected("The token names no key (kid).", "token_key_unknown")
        if kid in cfg.revoked_kids:
            raise TokenRejected(f"The token's key {kid!r} is revoked.", "token_key_revoked")
        keyset = issuer.keyset
        key = keyset.keys.get((kid, alg))
        fetched = issuer.fetcher.keyset if issuer.fetcher is not None else None
        if key is None and fetched is not None:  # never a fetch here: the refresh is timed
            keyset = fetched
            key = keyset.keys.get((kid, alg))
        if key is None:
            raise TokenRejected(f"The token's key {kid!r} is not a known {alg} key of its "
                                "issuer.", "token_key_unknown")
        try:
            claims = jwt.decode(
                token, key, algorithms=[alg], issuer=cfg.issuer, leeway=cfg.clock_skew_s,
                audience=cfg.audiences if resource is None else None,
                options={"require": cfg.required_claims, "verify_sub": False,
                         "verify_jti": False, "verify_aud": resource is None},
            )
        except jwt_errors.InvalidTokenError as exc:
            raise _rejected(exc) from exc
        if resource is not None and not audience_names(claims, resource):
            # Signature, issuer and times held: only the audience is wrong (RFC 8707 §2).
            wrong = TokenRejected(f"The token was not issued for this resource: its aud must "
                                  f"name {resource}.", "token_audience_invalid")
            wrong.verified = Verified(issuer, claims, kid, keyset.sha256)
            raise wrong
        return Verified(issuer, claims, kid, keyset.sha256)


def _rejected(exc: jwt_errors.InvalidTokenError) -> TokenRejected:
    if isinstance(exc, jwt_errors.ExpiredSignatureError):
        return TokenRejected("The token has expired.", "token_expired")
    if isinstance(exc, jwt_errors.ImmatureSignatureError):
        return TokenRejected("The token is not valid yet (nbf/iat).", "token_not_yet_valid")
    if isinstance(exc, jwt_errors.InvalidAudienceError):
        return TokenRejected("The token is not meant for this gateway (aud).",
                             "token_audience_invalid")
    if isinstance(exc, jwt_errors.InvalidIssuerError):
        return TokenRejected("The token's issuer does not match.", "token_issuer_invalid")
    if isinstance(exc, jwt_errors.MissingRequiredClaimError):
        return TokenRejected(f"The token lacks the required claim {exc.claim!r}.",
                             "token_claim_missing")
    if isinstance(exc, jwt_errors.InvalidSignatureError):
        return TokenRejected("The token's signature does not verify.", "token_signature_invalid")
    if isinstance(exc, jwt_errors.DecodeError):
        return TokenRejected("The token is malformed.", "token_malformed")
    return TokenRejected(f"The token is invalid ({type(exc).__name__}).", "token_invalid")
