"""The identity check: callers are known by who they are when the operator says they must be.

``identity.configured`` runs when identity is required (``gateway preflight
--require-identity``, or ``identity.required: true`` in the config, which the chart sets from
``identity.required``): the config must have an ``identity:`` section with at least one token
issuer or a client-certificate trust bundle, and every JWKS file must load and match its
SHA-256 pin (the same :func:`gateway.identity.build.wrap_identity` that ``serve`` runs).
"""

from __future__ import annotations

from gateway.preflight.inputs import Facts
from gateway.preflight.report import CheckResult

__all__ = ["check_identity"]


def check_identity(facts: Facts) -> CheckResult:
    """Identity is configured (issuers or mTLS) and its pinned keys load, when required."""
    from gateway.auth import KeyRing
    from gateway.errors import GatewayError
    from gateway.identity.build import wrap_identity

    cid, title, crit = ("identity.configured",
                        "callers are identified (OIDC/JWT or mTLS) when required",
                        ("AIA-12", "SOV-7"))
    settings = facts.settings
    section = getattr(settings, "identity", None) if settings is not None else None
    required = facts.criteria.require_identity or bool(section is not None and section.required)
    if not required:
        return CheckResult(cid, title, "skip", "identity not required (--require-identity, "
                           "identity.required)", {}, crit)
    if settings is None:
        return CheckResult(cid, title, "skip", "no gateway config given", {}, crit)
    if section is None:
        return CheckResult(cid, title, "fail", "identity is required but the config has no "
                           "identity: section", {}, crit)
    evidence = {
        "issuers": [i.issuer for i in section.issuers],
        "jwks_sha256": [i.jwks_sha256 for i in section.issuers],
        "mtls": section.mtls is not None,
        "accept": list(section.accept),
        "rules": [r.id for r in section.rules],
    }
    if not section.issuers and section.mtls is None:
        return CheckResult(cid, title, "fail", "identity is required but no issuer and no "
                           "mtls trust bundle is configured", evidence, crit)
    try:
        wrap_identity(settings, KeyRing(()))
    except GatewayError as exc:
        return CheckResult(cid, title, "fail", f"identity keys do not load: {exc.message}",
                           evidence, crit)
    return CheckResult(cid, title, "pass", f"{len(section.issuers)} issuer(s) with pinned JWKS"
                       + (", mTLS trust bundle" if section.mtls is not None else ""),
                       evidence, crit)
