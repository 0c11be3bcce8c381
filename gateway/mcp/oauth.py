"""The MCP endpoints as OAuth 2.1 protected resources (MCP authorization, 2025-06-18 and later).

* **Audience.** Each endpoint is its own resource: ``/mcp/<name>`` is
  ``<resource>/mcp/<name>``, the aggregate ``/mcp`` is ``<resource>/mcp``
  (``mcp.resource_metadata.resource``, the same URI its RFC 9728 document names).
  :func:`resource_bindings` hands these to the identity authenticator
  (:mod:`gateway.identity.resources`): a bearer token presented there must name the endpoint's
  URI in ``aud`` (RFC 8707). A token for the chat API (the issuers' ``audiences``), for another
  MCP server or for the aggregate is refused 401 ``token_audience_invalid``, and a token for an
  MCP endpoint is not accepted by the chat API. Without ``resource_metadata`` there is no
  canonical URI, and bearer tokens are refused at the MCP endpoints (fail closed).
* **Scopes.** :func:`check_scopes`: a bearer token lacking a scope the request needs
  (:func:`gateway.mcp.metadata.scopes_of`) is refused 403 ``insufficient_scope`` with
  ``WWW-Authenticate: Bearer error="insufficient_scope", scope="<every scope needed>",
  resource_metadata="..."`` (RFC 6750 section 3.1; MCP 2025-11-25 "Scope Challenge
  Handling", so a client can step up). API keys and client certificates carry no scopes:
  ``access`` rules decide for them, as for tokens.
* **Challenges.** :func:`challenge` is the 401's ``WWW-Authenticate``; a presented credential
  that fails adds ``error="invalid_token"`` (:func:`auth_refusal`).
* **Upstream.** The client's token is never forwarded: upstream requests carry only the
  server's own credential (``auth_token_file``, :mod:`gateway.mcp.upstream`).
* **Audit.** :func:`caller_identity` is the ``identity`` of MCP audit records: issuer,
  subject pseudonym, rule, key id and the token's scopes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import AuthenticationFailed, GatewayError
from gateway.identity.resources import BoundResource
from gateway.mcp.jsonrpc import FORBIDDEN, INVALID_REQUEST, McpRefusal
from gateway.mcp.metadata import metadata_url, resource_uri, scopes_of
from gateway.mcp.paths import AGGREGATE, PREFIX
from gateway.mcp.settings import McpSettings

__all__ = [
    "auth_refusal",
    "caller_identity",
    "challenge",
    "check_scopes",
    "oauth_problems",
    "resource_bindings",
]

_SETTING = "mcp.resource_metadata.resource"


def resource_bindings(settings: McpSettings | None) -> dict[str, BoundResource]:
    """Path -> the resource a bearer token presented there must be issued for: every
    ``/mcp/<name>`` and, with ``aggregate``, ``/mcp`` (empty without an ``mcp:`` section).

    Without ``resource_metadata`` each binding has no URI: bearer tokens are refused there.
    """
    if settings is None:
        return {}
    meta = settings.resource_metadata
    names: list[str | None] = [s.name for s in settings.servers]
    if settings.aggregate:
        names.append(None)
    return {
        (PREFIX + name if name is not None else AGGREGATE): BoundResource(
            resource_uri(meta, name) if meta is not None else None, _SETTING)
        for name in names
    }


def oauth_problems(settings: McpSettings, identity: Any) -> list[str]:
    """Where the OAuth settings of the MCP endpoints and the ``identity:`` section disagree
    (``gateway preflight``'s ``mcp.destinations``; the gateway serves either way).

    Args:
        settings: The ``mcp:`` section.
        identity: The ``identity:`` section (:class:`gateway.identity.IdentitySettings`), or
            ``None``.

    Returns:
        One line per problem, naming the key: token issuers but no ``resource_metadata`` (every
        bearer token is refused at the MCP endpoints); an ``authorization_servers`` entry that
        is not an issuer (its tokens would not verify, yet clients are sent there).
    """
    issuers = [i.issuer for i in identity.issuers] if identity is not None else []
    meta = settings.resource_metadata
    if meta is None:
        return ["mcp.resource_metadata: not set, so bearer tokens of identity.issuers are "
                "refused at the MCP endpoints (set resource to the gateway's public origin)"
                ] if issuers else []
    return [f"mcp.resource_metadata.authorization_servers[{i}]: {server} is not an "
            "identity.issuers entry: clients are sent there for tokens that would not verify"
            for i, server in enumerate(meta.authorization_servers)
            if server.rstrip("/") not in {s.rstrip("/") for s in issuers}]


def _server_of(path: str) -> str | None:
    return None if path.rstrip("/") == AGGREGATE else path[len(PREFIX):].rstrip("/")


def challenge(settings: McpSettings, server: str | None, *, error: str | None = None,
              description: str | None = None, scopes: list[str] | None = None) -> bytes:
    """The ``WWW-Authenticate`` value of a refusal at ``/mcp/<server>`` (``None``: ``/mcp``).

    Args:
        settings: The ``mcp:`` section.
        server: The endpoint's server (an undeclared name gets no metadata URL).
        error: RFC 6750 error code (``invalid_token``, ``insufficient_scope``; ``None``: no
            credential was presented, section 3.1).
        description: ``error_description`` (printable ASCII, no ``"`` or ``\\``).
        scopes: The scopes to name (``None``: those every request to the endpoint needs).
    """
    parts: list[str] = []
    if error is not None:
        parts.append(f'error="{error}"')
    if description is not None:
        clean = "".join(c for c in description if " " <= c <= "~" and c not in '"\\')
        parts.append(f'error_description="{clean}"')
    needed = scopes_of(settings, server) if scopes is None else scopes
    if needed:
        parts.append(f'scope="{" ".join(needed)}"')
    meta = settings.resource_metadata
    known = server is None or any(s.name == server for s in settings.servers)
    if meta is not None and known:
        parts.append(f'resource_metadata="{metadata_url(meta, server)}"')
    return ("Bearer " + ", ".join(parts) if parts else "Bearer").encode("ascii")


def auth_refusal(settings: McpSettings, path: str, exc: GatewayError,
                 presented: bool) -> McpRefusal:
    """The MCP refusal of an authentication error at ``path``: 401 with the resource's
    challenge (``error="invalid_token"`` when a credential was presented), or the error's 403;
    its ``identity`` is the error's (a verified token's audit fields) for the audit record.

    Args:
        settings: The ``mcp:`` section.
        path: The request path (``/mcp/<name>`` or ``/mcp``).
        exc: The authenticator's error (:class:`~gateway.identity.TokenRejected`, ...).
        presented: An ``Authorization`` credential was sent.
    """
    if exc.status != 401:
        refusal = McpRefusal(exc.status, FORBIDDEN if exc.status == 403 else INVALID_REQUEST,
                             exc.code or "forbidden", exc.message)
    else:
        value = challenge(settings, _server_of(path),
                          error="invalid_token" if presented else None)
        # The audit's reason: invalid_api_key answers both a missing credential and an
        # unknown key; its reason tells them apart (a token's code already says why).
        reason = exc.reason if isinstance(exc, AuthenticationFailed) else exc.code
        refusal = McpRefusal(401, INVALID_REQUEST, reason or "unauthenticated", exc.message,
                             headers=[(b"www-authenticate", value)])
    # A verified token refused for its audience or by the rules: the audit says who it was.
    refusal.identity = getattr(exc, "identity", None)
    return refusal


def check_scopes(settings: McpSettings, principal: Any, server: str | None,
                 tool: str | None) -> None:
    """Refuse a bearer token that lacks a scope the request needs.

    Args:
        settings: The ``mcp:`` section.
        principal: The caller (:class:`gateway.auth.Principal`); only a bearer-token identity
            (``identity.method == "jwt"``) is checked.
        server: The server the request goes to (``None``: the aggregate's own methods).
        tool: The tool of a ``tools/call`` (``None``: another method).

    Raises:
        McpRefusal: 403 ``insufficient_scope``; ``data.required_scopes`` and the
            ``WWW-Authenticate`` challenge name every scope the request needs.
    """
    identity = getattr(principal, "identity", None)
    if identity is None or identity.method != "jwt":
        return
    needed = scopes_of(settings, server, tool)
    missing = [s for s in needed if s not in identity.scopes]
    if not missing:
        return
    value = challenge(settings, server, error="insufficient_scope", scopes=needed,
                      description="the token lacks scope " + " ".join(missing))
    raise McpRefusal(403, FORBIDDEN, "insufficient_scope",
                     "the token lacks the scope(s) " + ", ".join(missing) + " needed here",
                     data={"required_scopes": needed, "missing_scopes": missing},
                     headers=[(b"www-authenticate", value)])


def caller_identity(principal: Any) -> dict[str, Any] | None:
    """The ``identity`` of an MCP audit record (``None``: an API key): the verified
    identity's audit fields (issuer, subject pseudonym, rule, ``kid``...) and the token's
    ``scopes``; never the token or the plain subject."""
    identity = getattr(principal, "identity", None)
    if identity is None:
        return None
    fields: Mapping[str, Any] = identity.audit_fields()
    return {**fields, "scopes": sorted(identity.scopes)}
