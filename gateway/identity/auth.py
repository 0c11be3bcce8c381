"""Identity as a gateway :class:`~gateway.auth.Authenticator`: bearer JWTs and client
certificates beside API keys.

:class:`IdentityAuthenticator` wraps the key authenticator (config keys, managed keys). Per
request it takes the credential the path accepts (``identity.accept``, or ``identity.routes``
for the path), in this order: a bearer token shaped like a JWT is verified
(:mod:`gateway.identity.verify`) and its claims mapped (:mod:`gateway.identity.rules`); else a
client certificate of the TLS connection (ASGI TLS extension) is verified against the trust
bundle (:mod:`gateway.identity.mtls`); else the bearer value is an API key for the wrapped
authenticator. The result is a :class:`~gateway.auth.Principal` whose ``key_id`` is ``id:`` +
the subject's pseudonym and whose ``identity`` carries the verified
:class:`~gateway.identity.model.Identity`, so routing, policy, quotas and flow control treat it
as they treat a key.

On a path bound to a resource (``resources``, RFC 8707: the MCP endpoints), a bearer token
must have been issued for that resource (:mod:`gateway.identity.resources`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import Any

from gateway.audit.pseudonym import Pseudonymizer
from gateway.auth import Authenticator, Principal, canonical_path
from gateway.errors import AuthenticationFailed
from gateway.identity.errors import IdentityNotAllowed, TokenRejected
from gateway.identity.fetch import JwksFetcher
from gateway.identity.model import Identity
from gateway.identity.mtls import MtlsVerifier, peer_chain
from gateway.identity.resources import BoundResource, token_scopes
from gateway.identity.rules import decide
from gateway.identity.settings import MTLS, IdentitySettings
from gateway.identity.verify import IssuerKeys, JwtVerifier, Verified, looks_like_jwt

__all__ = ["TOKEN_CACHE_MAX", "IdentityAuthenticator", "subject_pseudonym"]

TOKEN_CACHE_MAX = 4096
"""Verified tokens remembered (then the cache starts afresh). A client reuses its token for
minutes, so a repeat costs a dictionary lookup and a clock read instead of a signature check
(the RS256 check alone is ~30 us here; PyJWT's whole decode ~100 us). The key is the whole
token string: only the exact bytes that verified hit. Entries leave at ``exp`` (plus the clock
skew), or when the key set that verified them is no longer in use (a ``jwks_uri`` refresh that
dropped the key: the token is verified again); a reload (new keys, revoked kids, new rules)
builds a new authenticator with an empty cache."""


def _still_in_use(issuer: IssuerKeys, jwks_sha256: str) -> bool:
    """True while the key set (by SHA-256) that verified a token is still one of ``issuer``'s:
    its pinned file, or the document its ``jwks_uri`` fetcher holds now."""
    if jwks_sha256 == issuer.keyset.sha256:
        return True
    fetched = issuer.fetcher.keyset if issuer.fetcher is not None else None
    return fetched is not None and fetched.sha256 == jwks_sha256


def subject_pseudonym(pseudo: Pseudonymizer, issuer: str, subject: str) -> str:
    """The pseudonym of ``subject`` at ``issuer`` (HMAC-SHA256 under the pseudonym key, domain
    ``subject``); whoever holds the key recomputes it for a data-subject access request."""
    return pseudo.pseudonymize(json.dumps([issuer, subject]), "subject")


class IdentityAuthenticator:
    """API keys, bearer JWTs and client certificates (see the module docstring).

    Args:
        keys: The key authenticator (config keys, managed keys).
        settings: The ``identity:`` section.
        verifier: Token verification over the loaded key sets (``None``: no issuer).
        pseudonymizer: The key that pseudonymises subjects.
        mtls: Client-certificate verification (``None``: not configured).
        resources: Request path (without a trailing ``/``) -> the resource a bearer token
            presented there must have been issued for (RFC 8707); other paths take the
            issuers' ``audiences``.
    """

    def __init__(self, keys: Authenticator, settings: IdentitySettings,
                 verifier: JwtVerifier | None, pseudonymizer: Pseudonymizer,
                 mtls: MtlsVerifier | None = None,
                 resources: Mapping[str, BoundResource] | None = None) -> None:
        self.keys = keys
        self.settings = settings
        self.verifier = verifier
        self.mtls = mtls
        self._pseudo = pseudonymizer
        self._accept = frozenset(settings.accept)
        self.resources = dict(resources or {})
        # (token, resource) -> (principal, until, its issuer, sha256 of the verifying key set)
        self._verified: dict[tuple[str, str | None], tuple[Principal, float, IssuerKeys,
                                                           str]] = {}

    @property
    def fetchers(self) -> list[JwksFetcher]:
        """The ``jwks_uri`` fetchers of the issuers that opted in."""
        issuers = self.verifier.issuers.values() if self.verifier is not None else ()
        return [i.fetcher for i in issuers if i.fetcher is not None]

    async def startup(self) -> None:
        """Start the wrapped authenticator (managed keys' cache) and the JWKS fetchers."""
        start = getattr(self.keys, "startup", None)
        if start is not None:
            await start()
        for fetcher in self.fetchers:
            await fetcher.start()

    async def shutdown(self) -> None:
        """Stop the JWKS fetchers and the wrapped authenticator."""
        for fetcher in self.fetchers:
            await fetcher.stop()
        stop = getattr(self.keys, "shutdown", None)
        if stop is not None:
            await stop()

    def authenticate(self, token: str | None, scope: Mapping[str, Any] | None = None) -> Principal:
        """The principal of the request's credential.

        Args:
            token: The bearer token or API key (``None``: no ``Authorization``).
            scope: The ASGI scope (path for ``identity.routes``, matched as
                :meth:`IdentitySettings.accepted` says; the TLS extension's client certificate
                chain).

        Raises:
            TokenRejected: A token or client certificate that does not verify, or a token not
                issued for the path's resource (``token_audience_invalid``) (401).
            IdentityNotAllowed: Verified but no rule maps it, or the credential is not accepted
                on this path (403).
            AuthenticationFailed: No credential, or an unknown API key (401).
        """
        accept: Collection[str] = self._accept
        if scope is not None and self.settings.routes:
            # the entry covering the canonical path, as the handlers take it (routes and MCP)
            accept = self.settings.accepted(scope.get("path", ""))
        if token is not None and looks_like_jwt(token) and self.verifier is not None:
            if "jwt" not in accept:
                raise IdentityNotAllowed("Bearer tokens are not accepted on this path.",
                                         "credential_not_accepted")
            return self._token_principal(token, self._resource(scope))
        chain = peer_chain(scope) if scope is not None and self.mtls is not None else None
        if chain and "mtls" in accept:
            # A verified client certificate outranks an API key on the same request (an SDK
            # always sends some api_key); a bearer JWT was taken above.
            return self._principal(self._from_cert(chain))
        if "key" not in accept:
            if token is None:
                raise AuthenticationFailed("missing_credential")
            raise IdentityNotAllowed("API keys are not accepted on this path.",
                                     "credential_not_accepted")
        return self.keys.authenticate(token)

    def identity_of_claims(self, issuer: str, claims: Mapping[str, Any], *, kid: str | None = None,
                           jwks_sha256: str | None = None) -> Identity:
        """The identity that ``claims`` of ``issuer`` map to (``policy explain``; the request
        path after verification).

        Raises:
            IdentityNotAllowed: No rule holds.
            TokenRejected: The subject claim is missing (``token_claim_missing``).
        """
        subject_claim = (self.verifier.issuers[issuer].settings.subject_claim
                         if self.verifier is not None and issuer in self.verifier.issuers
                         else "sub")
        subject = claims.get(subject_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenRejected(f"The token lacks the subject claim {subject_claim!r}.",
                                "token_claim_missing")
        pseudonym = subject_pseudonym(self._pseudo, issuer, subject)
        try:
            d = decide(self.settings.rules, issuer, claims,
                       implicit=self.settings.implicit_source)
        except IdentityNotAllowed as exc:
            # Verified but refused: the audit record still says who (gateway.relay.pipeline).
            exc.identity = {"method": "jwt", "issuer": issuer, "subject": pseudonym,
                            "rule": None, "kid": kid, "jwks_sha256": jwks_sha256}
            raise
        return Identity(
            method="jwt" if kid is not None or issuer != "mtls" else "mtls",
            issuer=issuer, subject=pseudonym,
            team=d.team, org=d.org, models=d.models, data_class=d.data_class, rule=d.rule,
            decided_by=d.decided_by, flow_class=d.flow_class, kid=kid, jwks_sha256=jwks_sha256,
            scopes=token_scopes(claims),
        )

    def _resource(self, scope: Mapping[str, Any] | None) -> str | None:
        """The resource URI the path is bound to (``None``: not bound).

        Raises:
            TokenRejected: The path is bound but no URI is configured (fail closed).
        """
        path = str(scope.get("path", "")) if scope is not None else ""
        bound = self.resources.get(canonical_path(path)) if self.resources else None
        if bound is None:
            return None
        if bound.uri is None:
            raise TokenRejected(f"Bearer tokens are refused on this path: set {bound.setting} "
                                "to its canonical URI (tokens must be issued for it).",
                                "token_audience_invalid")
        return bound.uri

    def _token_principal(self, token: str, resource: str | None = None) -> Principal:
        hit = self._verified.get((token, resource))
        if hit is not None:
            principal, until, issuer, jwks_sha256 = hit
            if time.time() < until and _still_in_use(issuer, jwks_sha256):
                return principal
            # expired (refused as token_expired), or its key set was replaced: verify again
            del self._verified[token, resource]
        assert self.verifier is not None
        try:
            verified = self.verifier.verify(token, resource)
        except TokenRejected as exc:
            if exc.verified is not None:  # signed by a trusted issuer, meant for another resource
                exc.identity = self._who(exc.verified)
            raise
        identity = self.identity_of_claims(
            verified.issuer.settings.issuer, verified.claims, kid=verified.kid,
            jwks_sha256=verified.jwks_sha256,
        )
        principal = self._principal(identity)
        # nbf and iat held at verification and only recede; exp is the one bound left.
        until = float(verified.claims["exp"]) + verified.issuer.settings.clock_skew_s
        if len(self._verified) >= TOKEN_CACHE_MAX:
            self._verified.clear()
        self._verified[token, resource] = (principal, until, verified.issuer,
                                           verified.jwks_sha256)
        return principal

    def _who(self, verified: Verified) -> dict[str, Any]:
        """The audit fields of a token that verified but is refused (no rule decided)."""
        issuer = verified.issuer.settings
        subject = verified.claims.get(issuer.subject_claim)
        return {"method": "jwt", "issuer": issuer.issuer,
                "subject": subject_pseudonym(self._pseudo, issuer.issuer, subject)
                if isinstance(subject, str) and subject else None,
                "rule": None, "kid": verified.kid, "jwks_sha256": verified.jwks_sha256}

    def _from_cert(self, chain: list[str]) -> Identity:
        assert self.mtls is not None
        names, fingerprint = self.mtls.verify(chain)
        subject = names.get("spiffe_id") or names.get("subject_cn") or fingerprint
        pseudonym = subject_pseudonym(self._pseudo, "mtls", subject)
        try:
            d = decide(self.settings.rules, MTLS, names, implicit=self.settings.implicit_source)
        except IdentityNotAllowed as exc:
            exc.identity = {"method": "mtls", "issuer": "mtls", "subject": pseudonym,
                            "rule": None, "cert_sha256": fingerprint}
            raise
        return Identity(
            method="mtls", issuer="mtls", subject=pseudonym,
            team=d.team, org=d.org, models=d.models, data_class=d.data_class, rule=d.rule,
            decided_by=d.decided_by, flow_class=d.flow_class, cert_sha256=fingerprint,
        )

    @staticmethod
    def _principal(identity: Identity) -> Principal:
        return Principal(identity.key_id, identity.team, identity.data_class, identity.models,
                         identity=identity)
