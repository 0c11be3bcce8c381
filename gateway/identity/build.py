"""Building the identity authenticator from the settings (start-up and every live reload).

Every JWKS file is read and checked against its pin here; any problem is a
:class:`~gateway.errors.ConfigError` naming the key, so a reload with a changed or broken JWKS
is refused whole and the running key sets stay (:mod:`gateway.serving.reload`).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.audit.errors import AuditError
from gateway.audit.pseudonym import load_pseudonymizer
from gateway.auth import Authenticator
from gateway.errors import ConfigError
from gateway.identity.resources import BoundResource
from gateway.identity.settings import IdentitySettings, IssuerSettings

if TYPE_CHECKING:
    from gateway.identity.fetch import JwksFetcher

__all__ = ["client_cert_context", "identity_files", "wrap_identity"]


def wrap_identity(settings: Any, keys: Authenticator, *, policy: Any = None,
                  running: Authenticator | None = None,
                  resources: Mapping[str, BoundResource] | None = None) -> Authenticator:
    """``keys`` wrapped by the identity authenticator of ``settings.identity`` (or ``keys``
    itself when there is no ``identity:`` section).

    Args:
        settings: The gateway settings.
        keys: The key authenticator to wrap.
        policy: The egress policy (``policy.Policy``): the HTTP client of opted-in
            ``jwks_uri`` fetches goes through it.
        running: The authenticator serving now (a live reload): its started ``jwks_uri``
            fetchers are kept.
        resources: Paths whose bearer tokens must be issued for one resource (RFC 8707; the
            MCP endpoints, :func:`gateway.mcp.oauth.resource_bindings`).

    Raises:
        ConfigError: A JWKS file unreadable, invalid or not matching its pin; the trust bundle
            unreadable; no pseudonym key (``identity.pseudonym_key_file`` or
            ``audit.pseudonym_key_file``); a ``jwks_uri`` without an egress policy; a reload
            that adds, drops or changes a ``jwks_uri`` (code ``restart_required``).
    """
    section: IdentitySettings | None = getattr(settings, "identity", None)
    if section is None:
        return keys
    # Imported only with an ``identity:`` section: the token checks bring PyJWT and httpx
    # (with httpx's command line: click, rich, pygments), paid by every ``gateway serve``
    # and ``check-config`` otherwise.
    from gateway.identity.auth import IdentityAuthenticator
    from gateway.identity.jwks import load_jwks
    from gateway.identity.mtls import MtlsVerifier
    from gateway.identity.verify import IssuerKeys, JwtVerifier

    before = {f.issuer: f for f in (running.fetchers if isinstance(
        running, IdentityAuthenticator) else [])}
    issuers = []
    for n, i in enumerate(section.issuers):
        where = f"identity.issuers[{n}]"
        keyset = load_jwks(i.jwks_file, i.jwks_sha256, i.algorithms, where)
        issuers.append(IssuerKeys(i, keyset, _fetcher(i, where, policy, before, running)))
    if running is not None and before.keys() - {i.settings.issuer for i in issuers
                                                 if i.fetcher is not None}:
        raise ConfigError("identity.issuers: a jwks_uri was removed; the fetcher runs until a "
                          "restart: restart the gateway to apply", code="restart_required")
    flow = getattr(settings, "flow_control", None)
    classes = {c.name for c in flow.classes} if flow is not None else set()
    for n, rule in enumerate(section.rules):
        if rule.flow_class is not None and rule.flow_class not in classes:
            raise ConfigError(f"identity.rules[{n}].flow_class: {rule.flow_class!r} is not a "
                              "class of flow_control.classes (" + ", ".join(sorted(classes))
                              + ")")
    key_file = section.pseudonym_key_file
    audit = getattr(settings, "audit", None)
    if key_file is None and audit is not None:
        key_file = audit.pseudonym_key_file
    if key_file is None:
        raise ConfigError("identity.pseudonym_key_file: required (subjects are recorded only as "
                          "pseudonyms) when there is no audit section with a pseudonym key")
    try:
        pseudo = load_pseudonymizer(key_file)
    except AuditError as exc:
        raise ConfigError(f"identity.pseudonym_key_file: {exc}") from exc
    mtls = (MtlsVerifier(section.mtls.trust_bundle_file) if section.mtls is not None else None)
    return IdentityAuthenticator(keys, section, JwtVerifier(issuers) if issuers else None,
                                 pseudo, mtls, resources)


def _fetcher(issuer: IssuerSettings, where: str, policy: Any,
             before: dict[str, JwksFetcher], running: Authenticator | None) -> JwksFetcher | None:
    if issuer.jwks_uri is None:
        return None
    algorithms = tuple(issuer.algorithms)
    kept = before.get(issuer.issuer)
    if kept is not None and kept.same_as(issuer.jwks_uri, algorithms, issuer.jwks_refresh_s):
        return kept
    if running is not None:
        raise ConfigError(f"{where}.jwks_uri: added or changed while serving; fetchers start "
                          "with the gateway: restart to apply", code="restart_required")
    if policy is None:
        raise ConfigError(f"{where}.jwks_uri: fetching keys needs the egress policy "
                          "(policy.file): the fetch goes through it, and its host must be a "
                          "destination")
    from gateway.identity.fetch import JwksFetcher
    from policy import make_httpx_client

    return JwksFetcher(issuer.issuer, issuer.jwks_uri, algorithms, issuer.jwks_refresh_s,
                       lambda: make_httpx_client(policy))


def identity_files(settings: Any) -> list[Path]:
    """The files the identity section reads (watched by the live reload)."""
    section: IdentitySettings | None = getattr(settings, "identity", None)
    if section is None:
        return []
    out = [i.jwks_file for i in section.issuers]
    if section.mtls is not None:
        out.append(section.mtls.trust_bundle_file)
    return out


def client_cert_context(settings: Any) -> ssl.SSLContext | None:
    """The listener's TLS context asking for client certificates when ``identity.mtls`` is set.

    ``CERT_OPTIONAL``: a client may still come with an API key or a bearer token; a client
    certificate it does present must chain to the trust bundle, or the handshake fails (a
    certificate of another CA never reaches the app). The app verifies the chain again
    (:class:`~gateway.identity.mtls.MtlsVerifier`).

    Returns:
        The server context (the listener's certificate and key, the trust bundle), or ``None``
        when there is no ``identity.mtls`` or no TLS listener (the server then builds its
        plain TLS context from ``listen``).

    Raises:
        OSError, ssl.SSLError: A certificate, key or bundle file cannot be read or parsed.
    """
    section: IdentitySettings | None = getattr(settings, "identity", None)
    listen = getattr(settings, "listen", None)
    if section is None or section.mtls is None or listen is None or not listen.tls_cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(listen.tls_cert_file, listen.tls_key_file)
    context.load_verify_locations(cafile=str(section.mtls.trust_bundle_file))
    context.verify_mode = ssl.CERT_OPTIONAL
    return context
