"""The verified identity of a caller (what a token or a client certificate proved).

:class:`Identity` is carried by :class:`gateway.auth.Principal` (``principal.identity``), so
every component that authorises by key (routing, egress policy, quotas, flow control) authorises
an identity the same way, and the audit log records who it was and what verified it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified caller.

    Attributes:
        method: ``jwt`` (bearer token) or ``mtls`` (client certificate).
        issuer: The token's ``iss``, or ``mtls`` for a client certificate.
        subject: Pseudonym of the subject (``hmac-sha256:<hex>`` under the pseudonym key; the
            subject itself is never kept).
        team: Team decided by the rule.
        org: Organisation decided by the rule (a quota budget shared across teams).
        models: Models the caller may use (``*``: all).
        data_class: Data class decided by the rule.
        flow_class: Flow-control priority class decided by the rule (``None``: the key's or
            team's class, as for keys).
        rule: Id of the rule that decided.
        decided_by: The claims (name, value) that made the rule match.
        kid: Key id that verified the token (``None`` for mTLS).
        jwks_sha256: SHA-256 hex of the JWKS file that held the key (``None`` for mTLS).
        cert_sha256: SHA-256 hex of the client certificate (DER) (``None`` for a token).
        scopes: The scopes the token grants (``scope``/``scp`` claim,
            :func:`gateway.identity.resources.token_scopes`; empty for mTLS).
    """

    method: Literal["jwt", "mtls"]
    issuer: str
    subject: str
    team: str | None
    org: str | None
    models: frozenset[str]
    data_class: str
    rule: str
    decided_by: tuple[tuple[str, str], ...]
    kid: str | None = None
    flow_class: str | None = None
    jwks_sha256: str | None = None
    cert_sha256: str | None = None
    scopes: frozenset[str] = frozenset()

    @property
    def key_id(self) -> str:
        """The principal's key id: ``id:`` + the first 32 hex digits of the subject pseudonym
        (what logs, quotas and flow control key on; never the subject itself)."""
        return "id:" + self.subject.rsplit(":", 1)[-1][:32]

    def audit_fields(self) -> dict[str, Any]:
        """The ``identity`` object of audit records."""
        return {
            "method": self.method,
            "issuer": self.issuer,
            "subject": self.subject,
            "org": self.org,
            "rule": self.rule,
            "flow_class": self.flow_class,
            "decided_by": {name: value for name, value in self.decided_by},
            "kid": self.kid,
            "jwks_sha256": self.jwks_sha256,
            "cert_sha256": self.cert_sha256,
        }
