"""What a bearer token is for: the resource it was issued for (RFC 8707) and its scopes.

A protected resource that serves one audience only (the MCP endpoint ``/mcp/<name>``: the MCP
authorization specification, 2025-06-18 and later, "Token Audience Binding and Validation")
accepts a token only when its ``aud`` names the resource's canonical URI; the issuer's
``audiences`` (those of the chat API) are not accepted there, and a token issued for that
resource is not accepted elsewhere unless an issuer lists it. :class:`BoundResource` is such a
path's binding, given to :class:`~gateway.identity.auth.IdentityAuthenticator` by path.

URIs are compared after the normalisation of RFC 3986 section 6.2.2-6.2.3 that cannot change
what they identify: scheme and host in lower case, the scheme's default port dropped, an empty
path or a trailing ``/`` dropped (the MCP specification's canonical form has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["BoundResource", "audience_names", "canonical_uri", "token_scopes"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class BoundResource:
    """A path whose bearer tokens must have been issued for one resource.

    Attributes:
        uri: The resource's canonical URI, which the token's ``aud`` must name (``None``: no
            URI is configured, so every bearer token is refused on the path: fail closed).
        setting: The configuration key that defines ``uri`` (named in refusals).
    """

    uri: str | None
    setting: str


def canonical_uri(uri: str) -> str:
    """``uri`` normalised for comparison (see the module docstring); not a validation.

    Args:
        uri: An absolute URI (``https://gw.example.eu/mcp/search``).

    Returns:
        The normalised form (``https://gw.example.eu/mcp/search``); a string that is not an
        absolute URI is returned unchanged, so it equals only itself.
    """
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        return uri
    if not parts.scheme or not parts.hostname:
        return uri
    scheme = parts.scheme.lower()
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    if parts.username is not None:  # userinfo kept as written: never part of a resource
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    path = parts.path.rstrip("/")
    out = f"{scheme}://{netloc}{path}"
    if parts.query:
        out += "?" + parts.query
    if parts.fragment:
        out += "#" + parts.fragment
    return out


def audience_names(claims: Mapping[str, Any], uri: str) -> bool:
    """True when the token's ``aud`` (a string or a list of strings, RFC 7519 section 4.1.3)
    names ``uri``, compared in canonical form."""
    aud = claims.get("aud")
    values = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    want = canonical_uri(uri)
    return any(isinstance(v, str) and canonical_uri(v) == want for v in values)


def token_scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """The scopes a token grants: ``scope``, a space-separated string (RFC 9068 section 2.2.3,
    RFC 8693 section 4.2), or ``scp``, a list or a space-separated string (Microsoft Entra,
    Okta); empty when neither is present or well formed."""
    for claim in ("scope", "scp"):
        value = claims.get(claim)
        if isinstance(value, str):
            return _split(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return frozenset(s for v in value for s in _split(v))
    return frozenset()


def _split(value: str) -> frozenset[str]:
    """Scope tokens separated by U+0020 only (RFC 6749 section 3.3: ``scope-token`` is
    ``%x21 / %x23-5B / %x5D-7E``): a NO-BREAK SPACE or a control character is part of a token,
    so ``"files\u00a0mcp"`` grants neither ``files`` nor ``mcp``."""
    return frozenset(t for t in value.split(" ") if t)
