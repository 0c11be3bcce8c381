"""API-key authentication: key -> SHA-256 digest -> :class:`Principal`; the ``keys:`` entries of
the gateway config (:class:`KeySettings`).

Only digests are configured (``keys[].sha256``). A presented key is hashed once and compared
against every configured digest with :func:`hmac.compare_digest`, without an early exit, so the
time taken does not depend on which digest (if any) matched. Every failure (no header, wrong
scheme, unknown key) raises the same :class:`~gateway.errors.AuthenticationFailed`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import Field, field_validator

from gateway.config.base import FrozenSection
from gateway.errors import AuthenticationFailed, InvalidRequest

if TYPE_CHECKING:
    from gateway.identity.model import Identity

__all__ = [
    "Authenticator",
    "KeyRing",
    "KeySettings",
    "Principal",
    "ambiguous_credentials",
    "authorization_of",
    "bearer_token",
    "canonical_path",
    "digest_key",
    "new_key",
    "principal_of",
    "repeated_header",
]

KEY_PREFIX = "sg-"
MAX_BEARER_BYTES = 65536
"""Longest bearer value read (API keys are 46 characters; a JWT is refused by its issuer's
``max_token_bytes``, 8 KiB by default, with its own error, so a long token is answered clearly)."""

_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SLASHES = re.compile(r"/{2,}")


class KeySettings(FrozenSection):
    """A client API key (an entry of the config's ``keys:`` section, or of its ``keys_file``),
    stored as the SHA-256 hex digest of the key string."""

    id: str
    sha256: str
    models: list[str] = Field(default_factory=list)
    team: str | None = None
    data_class: str = "internal"

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _KEY_ID.match(value):
            raise ValueError("must be 1-128 characters of letters, digits and ._-")
        return value

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HEX64.match(value):
            raise ValueError("must be 64 hex characters (sha256 of the key; `gateway keys new`)")
        return value


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling.

    Attributes:
        key_id: The configured key id (safe to log; the key itself never is).
        team: Team the key belongs to, if configured.
        data_class: Data classification of the key's traffic (for the egress policy).
        models: Model names the key may use; ``"*"`` means all.
        identity: The verified token or client-certificate identity (``None`` for an API
            key; :mod:`gateway.identity`). ``key_id`` is then ``id:`` + its subject pseudonym.
    """

    key_id: str
    team: str | None
    data_class: str
    models: frozenset[str]
    identity: Identity | None = None

    def may_use(self, model_name: str) -> bool:
        """True when the key may call the model with canonical name ``model_name``."""
        return "*" in self.models or model_name in self.models


class Authenticator(Protocol):
    """Turns a presented API key into a :class:`Principal` (seam for managed key stores)."""

    def authenticate(self, token: str | None, scope: Mapping[str, Any] | None = None) -> Principal:
        """Return the principal or raise :class:`AuthenticationFailed`.

        ``scope`` is the request's ASGI scope (path, TLS extension) for authenticators that
        look beyond the bearer token (:mod:`gateway.identity`); key lookups ignore it.
        """
        ...


def digest_key(key: str) -> bytes:
    """SHA-256 of the UTF-8 key string (32 raw bytes)."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def new_key() -> str:
    """A fresh random key: ``sg-`` + 43 URL-safe characters (256 bits of entropy)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def bearer_token(value: bytes | None) -> str | None:
    """Extract the token from an ``Authorization: Bearer <token>`` header value.

    Returns:
        The token, or ``None`` for a missing header, another scheme or an empty token.
    """
    if not value:
        return None
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    if not token or len(token) > MAX_BEARER_BYTES:
        return None
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        return None


def authorization_of(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The request's one ``Authorization`` header value (ASGI header pairs, names lower-case).

    Two of them are refused, not resolved: which one counts would depend on the reader (the
    first here, the last there), and a proxy in front may have checked the other.

    Returns:
        The value, or ``None`` when there is none.

    Raises:
        InvalidRequest: 400 ``ambiguous_credentials`` (the header is given more than once).
    """
    found: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            if found is not None:
                raise ambiguous_credentials()
            found = value
    return found


def repeated_header(name: str) -> InvalidRequest:
    """The 400 of a request giving a single-valued header (``name``, lower case) more than
    once: which copy counts would depend on the reader (the first here, the last there, a
    proxy in front checking either), so neither does. ``authorization``:
    :func:`ambiguous_credentials`; else code ``repeated_header``."""
    if name == "authorization":
        return ambiguous_credentials()
    return InvalidRequest(f"The {name} header is given more than once.", param=name,
                          code="repeated_header")


def ambiguous_credentials() -> InvalidRequest:
    """The 400 of a request with more than one ``Authorization`` header (its
    :attr:`~gateway.errors.GatewayError.reason` ``ambiguous_credentials``, as its code)."""
    refusal = InvalidRequest("The Authorization header is given more than once; send one "
                             "credential.", param="authorization", code="ambiguous_credentials")
    refusal.reason = "ambiguous_credentials"
    return refusal


def canonical_path(path: str) -> str:
    """The one form of a request path that per-path credentials (``identity.routes``) are
    matched on and the MCP endpoint takes its server name from: the decoded path with every
    run of ``/`` made one ``/`` and the trailing ``/`` removed (``/`` stays ``/``).

    ``/mcp/tools/``, ``/mcp//tools`` and the decoded ``/mcp/tools%2f`` are all ``/mcp/tools``,
    so no spelling reaches a handler under another name than the one its credentials were
    checked for (percent-escapes in the MCP and ``/v1/`` paths are refused before that).

    Args:
        path: The ASGI scope's ``path`` (percent-decoded).

    Returns:
        The canonical path.
    """
    canonical = _SLASHES.sub("/", path).rstrip("/")
    return canonical if canonical.startswith("/") else "/" + canonical


def principal_of(key: KeySettings) -> Principal:
    """The principal of a configured key (``keys:`` entry)."""
    return Principal(key.id, key.team, key.data_class, frozenset(key.models))


class KeyRing:
    """The keys from the configuration file.

    Args:
        keys: Configured keys (``keys:`` section).
    """

    def __init__(self, keys: Iterable[KeySettings]) -> None:
        self._entries: list[tuple[bytes, Principal]] = [
            (bytes.fromhex(k.sha256), principal_of(k))
            for k in keys
        ]
        # A dummy digest keeps the work constant when no key is configured.
        self._dummy = hashlib.sha256(b"no key configured").digest()

    def authenticate(self, token: str | None, scope: Mapping[str, Any] | None = None) -> Principal:
        """Return the principal for ``token`` (``scope`` is not used).

        Raises:
            AuthenticationFailed: Missing or unknown key (same answer for both; its ``reason``
                ``missing_credential`` or ``unknown_key`` tells them apart in the logs).
        """
        presented = digest_key(token if token is not None else "")
        found: Principal | None = None
        hit = False
        for digest, principal in self._entries or [(self._dummy, None)]:  # type: ignore[list-item]
            if hmac.compare_digest(digest, presented):
                found = principal
                hit = True
        if token is None:
            raise AuthenticationFailed("missing_credential")
        if not hit or found is None:
            raise AuthenticationFailed("unknown_key")
        return found
