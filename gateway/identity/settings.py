"""The ``identity:`` configuration section: who may sign tokens, which keys verify them, and
how verified claims (or a client certificate) map to what the caller may do.

Example::

    identity:
      accept: [key, jwt]              # on the listener; per path in routes:
      routes: {/v1/embeddings: [key]}
      pseudonym_key_file: /run/secrets/pseudonym.key   # default: audit.pseudonym_key_file
      issuers:
        - issuer: https://idp.example/realms/ai
          audiences: [sovereign-gateway]
          algorithms: [RS256, ES256]
          jwks_file: /etc/sg/idp-jwks.json
          jwks_sha256: 3f1c...        # sha256 of the file's bytes (`sha256sum`)
          revoked_kids: [old-2025]
          clock_skew_s: 30
          required_claims: [exp, iat, sub]
      rules:                          # first match wins
        - id: ml-team
          match: {groups: ml-engineers}
          team: ml
          models: ["*"]
          data_class: internal

An issuer may opt in to ``jwks_uri`` (fetched through the egress policy every
``jwks_refresh_s``, :mod:`gateway.identity.fetch`), beside its pinned file.

A token is accepted only when its issuer is listed, its ``kid`` is a key of that issuer's
pinned JWKS (and not revoked), its ``alg`` is one of the issuer's asymmetric algorithms, the
signature verifies, ``aud`` names one of the audiences, ``exp``/``nbf``/``iat`` hold within the
clock skew and every required claim is present; then the first rule whose ``match`` holds
decides the team, models and data class (no rule: 403).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.auth import canonical_path
from gateway.config.base import FrozenSection
from gateway.serving.settings import is_loopback_host

__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "CERTIFICATE_CLAIMS",
    "MTLS",
    "IdentityRule",
    "IdentitySettings",
    "IssuerSettings",
    "MtlsSettings",
]

ASYMMETRIC_ALGORITHMS = frozenset({
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
})
"""The only ``alg`` values a token may carry (RFC 7518 §3.1, RFC 8037): never ``none`` and never
an HMAC algorithm, whose key would be the public key everyone holds."""

Method = Literal["key", "jwt", "mtls"]
_DEFAULT_ACCEPT: tuple[Method, ...] = ("key", "jwt")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_RULE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MTLS = "mtls"
"""The source name of client certificates: a rule's ``issuer: mtls``, an identity's issuer. No
token issuer may be named so (a JWT can never speak for a certificate)."""
CERTIFICATE_CLAIMS = frozenset({"spiffe_id", "subject_cn"})
"""The names only a verified client certificate offers (:mod:`gateway.identity.mtls`): a rule
that reads one must say ``issuer: mtls``, or a token carrying that claim would meet it."""
_CERTIFICATE_OFFERS = CERTIFICATE_CLAIMS | {"iss"}


class IssuerSettings(FrozenSection):
    """One token issuer (an OpenID provider or a Kubernetes service-account issuer).

    Attributes:
        issuer: The exact ``iss`` value.
        audiences: ``aud`` values accepted (one must appear in the token).
        algorithms: Allowed ``alg`` values (asymmetric only).
        jwks_file: The issuer's JWKS (RFC 7517 §5), a file or a mounted Secret.
        jwks_sha256: SHA-256 hex of the file's bytes; a file that differs is refused.
        revoked_kids: Key ids refused even when present in the JWKS.
        clock_skew_s: Seconds of leeway on ``exp``, ``nbf`` and ``iat``.
        required_claims: Claims that must be present (``exp`` always is).
        subject_claim: The claim naming the person or workload (pseudonymised).
        max_token_bytes: Longer tokens are refused before any parsing.
        jwks_uri: Opt-in: also fetch the issuer's JWKS from this ``https://`` URL (``http://``
            only to loopback: fetched keys are not pinned), through the egress
            policy's transport (the host must be a policy destination), at start and then every
            ``jwks_refresh_s``; never because a token names an unknown ``kid``. The fetched keys
            are used beside the pinned file's; a fetched document that is not a valid JWKS is
            refused whole and the keys fetched before stay.
        jwks_refresh_s: Seconds between fetches of ``jwks_uri`` (the refresh cap).
    """

    issuer: str = Field(min_length=1)
    audiences: list[str] = Field(min_length=1)
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"], min_length=1)
    jwks_file: Path
    jwks_sha256: str
    revoked_kids: list[str] = Field(default_factory=list)
    clock_skew_s: float = Field(default=30.0, ge=0.0, le=600.0)
    required_claims: list[str] = Field(default_factory=lambda: ["exp", "iat", "sub"])
    subject_claim: str = "sub"
    max_token_bytes: int = Field(default=8192, ge=512, le=65536)
    jwks_uri: str | None = None
    jwks_refresh_s: float = Field(default=300.0, ge=10.0, le=86400.0)

    @field_validator("issuer")
    @classmethod
    def _not_mtls(cls, value: str) -> str:
        if value == MTLS:
            raise ValueError("'mtls' is reserved for client certificates (identity.mtls): a "
                             "token issuer named so would meet the rules written for them")
        return value

    @field_validator("jwks_uri")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or value.startswith("https://"):
            return value
        if value.startswith("http://") and is_loopback_host(urlsplit(value).hostname):
            return value  # a local sidecar: the path never leaves the host
        raise ValueError("must be an https:// URL (fetched keys are not pinned: over plain "
                         "http:// anyone on the path could add a signing key); http:// is "
                         "accepted only to loopback")

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if a not in ASYMMETRIC_ALGORITHMS]
        if bad:
            raise ValueError(f"{bad[0]!r} is not allowed; use asymmetric algorithms only: "
                             + ", ".join(sorted(ASYMMETRIC_ALGORITHMS)))
        return value

    @field_validator("jwks_sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HEX64.match(value):
            raise ValueError("must be 64 hex characters (sha256sum of the JWKS file)")
        return value

    @field_validator("required_claims")
    @classmethod
    def _exp_always(cls, value: list[str]) -> list[str]:
        return value if "exp" in value else [*value, "exp"]


class IdentityRule(FrozenSection):
    """Claims (or certificate names) -> what the caller may do. First matching rule wins.

    ``match`` maps a claim name (dotted for nested claims: ``realm_access.roles``) to a value or
    a list of values; it holds when, for every claim, the token's value equals one of them or
    (a list claim such as ``groups``) contains one of them. An mTLS identity offers the claims
    ``spiffe_id``, ``subject_cn`` and ``iss`` (``mtls``). An empty ``match`` holds for every
    caller of the rule's source.

    Attributes:
        id: Rule id, recorded in the audit log with the claims that decided.
        issuer: The one source the rule trusts: a configured issuer's ``iss``, or ``mtls`` for
            client certificates. Required when more than one source is configured
            (:meth:`IdentitySettings.source_of`); a rule reading ``spiffe_id`` or
            ``subject_cn`` must say ``mtls``.
        match: Conditions, all of which must hold.
        team: Team of the caller (quotas and flow-control classes by team apply).
        team_claim: Take the team from this claim instead (a string claim such as ``tenant``).
        org: Organisation of the caller (``quotas.orgs``: a budget shared across teams).
        org_claim: Take the organisation from this claim instead.
        models: Models the caller may use (``*``: all).
        data_class: Data class of the caller's traffic (egress policy).
        flow_class: Flow-control priority class (a name of ``flow_control.classes``); unset:
            the class of the team (``flow_control.teams``), else the default class.
    """

    id: str
    issuer: str | None = None
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    team: str | None = None
    team_claim: str | None = None
    org: str | None = None
    org_claim: str | None = None
    models: list[str] = Field(default_factory=list)
    data_class: str = "internal"
    flow_class: str | None = None

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _RULE_ID.match(value):
            raise ValueError("must be 1-64 characters of letters, digits and ._-")
        return value


class MtlsSettings(FrozenSection):
    """Workload identity from the client certificate of a TLS connection.

    Attributes:
        trust_bundle_file: PEM CA certificates that may issue client certificates.
    """

    trust_bundle_file: Path


class IdentitySettings(FrozenSection):
    """The ``identity:`` section (see the module docstring).

    Attributes:
        accept: Credentials accepted on the listener (``key``, ``jwt``, ``mtls``).
        routes: Per path, the credentials accepted there and on every path under it instead
            of ``accept`` (:meth:`accepted`); keys are kept in canonical form
            (:func:`gateway.auth.canonical_path`: no trailing ``/``, no ``//``).
        pseudonym_key_file: HMAC key pseudonymising subjects (default: the audit log's).
        issuers: Token issuers.
        rules: Claims mapping, first match wins.
        mtls: Client-certificate identities.
        required: ``gateway preflight`` fails unless identity is configured (Helm sets this
            when the operator says identity is mandatory).
    """

    accept: list[Method] = Field(default_factory=lambda: list(_DEFAULT_ACCEPT), min_length=1)
    routes: dict[str, list[Method]] = Field(default_factory=dict)
    pseudonym_key_file: Path | None = None
    issuers: list[IssuerSettings] = Field(default_factory=list)
    rules: list[IdentityRule] = Field(default_factory=list)
    mtls: MtlsSettings | None = None
    required: bool = False

    @field_validator("routes")
    @classmethod
    def _canonical_routes(cls, value: dict[str, list[Method]]) -> dict[str, list[Method]]:
        out: dict[str, list[Method]] = {}
        for path, methods in value.items():
            bad = next((c for c in ("%", "?", "#", " ", "\\") if c in path), None)
            if not path.startswith("/") or bad is not None:
                raise ValueError(f"{path!r}: a route is a literal path starting with '/' "
                                 "(no percent-escapes, query, fragment or spaces)")
            canonical = canonical_path(path)
            if {".", ".."} & set(canonical.split("/")):
                raise ValueError(f"{path!r}: '.' and '..' segments never match a request path")
            if canonical in out:
                raise ValueError(f"{path!r}: the same path as another entry ({canonical!r})")
            if not methods:
                raise ValueError(f"{path!r}: at least one credential (key, jwt, mtls)")
            out[canonical] = methods
        return out

    def accepted(self, path: str) -> list[Method]:
        """The credentials accepted on ``path``: those of the longest ``routes`` entry that is
        the path or one of its parents, segment by segment, else ``accept``.

        ``/v1/files`` covers ``/v1/files``, ``/v1/files/`` and ``/v1/files/f-1/content``, not
        ``/v1/filesystem``; with ``/mcp`` and ``/mcp/tools`` both listed, ``/mcp/tools``
        decides for its own path and ``/mcp`` for ``/mcp/notes``.

        Args:
            path: The request path (decoded; made canonical here).

        Returns:
            The accepted methods (``key``, ``jwt``, ``mtls``).
        """
        if not self.routes:
            return self.accept
        at = canonical_path(path)
        while True:
            methods = self.routes.get(at)
            if methods is not None:
                return methods
            if at == "/":
                return self.accept
            at = at.rsplit("/", 1)[0] or "/"

    @property
    def sources(self) -> list[str]:
        """The configured sources of identities: each issuer's ``iss``, then ``mtls`` when
        client certificates are configured."""
        return [i.issuer for i in self.issuers] + ([MTLS] if self.mtls is not None else [])

    @property
    def implicit_source(self) -> str | None:
        """The source of the rules that name none: the only configured source, else ``None``
        (they then hold for nobody; load refuses such a rule beside several sources)."""
        sources = self.sources
        return sources[0] if len(sources) == 1 else None

    def source_of(self, rule: IdentityRule) -> str | None:
        """The one source whose identities ``rule`` may decide: its ``issuer``, else
        :attr:`implicit_source`."""
        return rule.issuer if rule.issuer is not None else self.implicit_source

    @model_validator(mode="after")
    def _consistent(self) -> IdentitySettings:
        seen: set[str] = set()
        for i, issuer in enumerate(self.issuers):
            if issuer.issuer in seen:
                raise ValueError(f"issuers[{i}].issuer: duplicate issuer {issuer.issuer!r}")
            seen.add(issuer.issuer)
        sources = self.sources
        choices = ", ".join(sources) or "none: configure issuers or mtls"
        ids: set[str] = set()
        for i, rule in enumerate(self.rules):
            if rule.id in ids:
                raise ValueError(f"rules[{i}].id: duplicate rule id {rule.id!r}")
            ids.add(rule.id)
            self._check_source(i, rule, sources, choices)
        methods = {m for ms in (self.accept, *self.routes.values()) for m in ms}
        if "jwt" in methods and not self.issuers and "key" not in methods:
            raise ValueError("issuers: jwt is accepted but no issuer is configured")
        if "mtls" in methods and self.mtls is None:
            raise ValueError("mtls: mtls is accepted but mtls.trust_bundle_file is not set")
        return self

    @staticmethod
    def _check_source(i: int, rule: IdentityRule, sources: list[str], choices: str) -> None:
        """Refuse a rule whose source is ambiguous or cannot hold what it reads.

        Raises:
            ValueError: ``rules[i].<key>: problem``, naming the configured sources.
        """
        if rule.issuer is not None and rule.issuer not in sources:
            what = ("client certificates are not configured (identity.mtls)"
                    if rule.issuer == MTLS else "it is not a configured issuer")
            raise ValueError(f"rules[{i}].issuer: {rule.issuer!r} cannot be used: {what}; "
                             f"configured sources: {choices}")
        read = {**{name: f"match.{name}" for name in rule.match},
                **{c: k for k, c in (("team_claim", rule.team_claim),
                                     ("org_claim", rule.org_claim)) if c is not None}}
        cert = sorted(c for c in read if c in CERTIFICATE_CLAIMS)
        if cert and rule.issuer != MTLS:
            raise ValueError(f"rules[{i}].issuer: the rule reads {cert[0]!r}, a client "
                             "certificate name: say issuer: mtls (else any token carrying a "
                             f"{cert[0]!r} claim would meet it)")
        if rule.issuer is None and len(sources) > 1:
            raise ValueError(f"rules[{i}].issuer: required when more than one source is "
                             "configured (a rule for one would be met by the others' "
                             f"identities carrying the same claims); one of: {choices}")
        if rule.issuer == MTLS:
            other = sorted(c for c in read if c not in _CERTIFICATE_OFFERS)
            if other:
                raise ValueError(f"rules[{i}].{read[other[0]]}: {other[0]!r} is never offered "
                                 "by a client certificate (issuer: mtls): only spiffe_id, "
                                 "subject_cn and iss")
