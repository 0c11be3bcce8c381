"""Who a batch runs as: the owner's fields stored with the batch, and their re-authorisation
each time one of its requests is sent.

The caller's credential is never stored (an API key is only ever held as a digest; a bearer
token is not kept at all). What is stored (:func:`owner_fields`, JSON):

* an API key: its id and its principal at creation (team, data class, models);
* a verified identity (a JWT, or a client certificate): its key id (``id:`` + the subject's
  pseudonym), the principal, and what verified and admitted it: method, issuer, subject
  pseudonym, ``kid``, the deciding rule's id, the claims that made the rule match
  (``decided_by``, as the audit records keep them), and ``rules_sha256``, the SHA-256 of what
  decides whether the identity rules up to and including the deciding one hold (their ids,
  issuers, matches and team/org claims: :func:`rules_digest`).

Before each request (:func:`reauthorise`) the owner is checked against the configuration in
force *then* (after a live reload or a restart), failing closed:

* a config key must still be configured (else ``key_revoked``), and runs with its current
  models and data class;
* an identity's issuer must still be configured (``identity_issuer_removed``), its signing key
  not revoked (``identity_key_revoked``), its method accepted on the batch's endpoint
  (``credential_not_accepted``), and the rules that decided for it holding for the same
  claims: the deciding rule still there, and its and every earlier rule's deciding fields
  unchanged (``identity_rules_changed``). The token's full claims are not kept, so a changed
  earlier rule, which might now match those claims first, cannot be evaluated: the owner must
  submit again. When they hold, the deciding rule is applied again to the stored claims, so
  what it grants now (team, org, models, data class, flow class) applies, as a config key's
  current settings do.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gateway.auth import Principal, principal_of
from gateway.config.settings import GatewaySettings
from gateway.errors import GatewayError
from gateway.identity.errors import IdentityNotAllowed
from gateway.identity.model import Identity
from gateway.identity.rules import decide
from gateway.identity.settings import IdentityRule, IdentitySettings

__all__ = ["OwnerRevoked", "check_endpoint_credential", "owner_fields", "reauthorise",
           "record_identity", "rules_digest", "stored_record_identity"]


class OwnerRevoked(GatewayError):
    """The batch's owner is no longer allowed to send its requests (each remaining line
    becomes an error line with this code and reason)."""

    status = 401
    type = "authentication_error"
    code = "key_revoked"


_DECIDING = ("id", "issuer", "match", "team_claim", "org_claim")
"""The fields of a rule that decide whether it holds for some claims (:func:`decide`); the
others (team, org, models, data class, flow class) only say what it grants."""


def rules_digest(rules: list[IdentityRule]) -> str:
    """SHA-256 hex of the canonical JSON of the deciding fields of ``rules`` (in order): equal
    digests mean the rules hold for exactly the same claims."""
    text = json.dumps([r.model_dump(mode="json", include=set(_DECIDING)) for r in rules],
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def owner_fields(p: Principal, identity: IdentitySettings | None) -> dict[str, Any]:
    """The JSON-ready owner record stored with a new batch (see the module docstring).

    Args:
        p: The caller's principal.
        identity: The ``identity:`` section in force (``None``: none).
    """
    fields: dict[str, Any] = {"key_id": p.key_id, "team": p.team, "data_class": p.data_class,
                              "models": sorted(p.models)}
    who = p.identity
    if who is None:
        return fields
    rules = identity.rules if identity is not None else []
    at = next((i for i, r in enumerate(rules) if r.id == who.rule), None)
    fields["identity"] = {
        "method": who.method, "issuer": who.issuer, "subject": who.subject, "org": who.org,
        "flow_class": who.flow_class, "rule": who.rule,
        "decided_by": [list(pair) for pair in who.decided_by], "kid": who.kid,
        "jwks_sha256": who.jwks_sha256, "cert_sha256": who.cert_sha256,
        "rules_sha256": rules_digest(rules[:at + 1]) if at is not None else None,
    }
    return fields


def record_identity(p: Principal) -> dict[str, Any]:
    """The ``identity`` field of a batch audit record written for ``p``: ``{"identity": ...}``
    with the verified identity's audit fields (issuer, subject pseudonym, rule, ``kid``...;
    :meth:`gateway.identity.model.Identity.audit_fields`, as request records carry them), or
    ``{}`` for an API key; so that ``gateway audit export --subject`` finds the record."""
    return {"identity": p.identity.audit_fields()} if p.identity is not None else {}


def stored_record_identity(fields: dict[str, Any]) -> dict[str, Any]:
    """:func:`record_identity` of a batch's owner as :func:`owner_fields` stored it (the
    runner writes the records of a batch's end without the caller's request)."""
    who = fields.get("identity")
    if not isinstance(who, dict):
        return {}
    return {"identity": {
        "method": who.get("method"), "issuer": who.get("issuer"),
        "subject": who.get("subject"), "org": who.get("org"), "rule": who.get("rule"),
        "flow_class": who.get("flow_class"),
        "decided_by": {str(n): v for n, v in who.get("decided_by") or ()},
        "kid": who.get("kid"), "jwks_sha256": who.get("jwks_sha256"),
        "cert_sha256": who.get("cert_sha256")}}


def check_endpoint_credential(p: Principal, identity: IdentitySettings | None,
                              endpoint: str) -> None:
    """Refuse a batch whose requests the caller's credential could not send: ``identity``
    (``accept``, ``routes``) must accept it on ``endpoint`` as well as on ``/v1/batches``,
    else every line would fail at its re-authorisation (:func:`reauthorise`).

    Raises:
        IdentityNotAllowed: 403 ``credential_not_accepted``, naming the method and the path.
    """
    if identity is None:
        return
    method = p.identity.method if p.identity is not None else "key"
    if method not in identity.accepted(endpoint):
        raise IdentityNotAllowed(f"The credential of this request ({method}) is not accepted "
                                 f"on {endpoint} (identity.routes), so a batch of it cannot "
                                 "run.", "credential_not_accepted")


def stored_principal(fields: dict[str, Any]) -> Principal:
    """The principal as stored at creation (managed keys run with it)."""
    return Principal(fields["key_id"], fields["team"], fields["data_class"],
                     frozenset(fields["models"]))


def reauthorise(fields: dict[str, Any], settings: GatewaySettings, path: str) -> Principal:
    """The owner's principal under ``settings`` (the configuration in force now).

    Args:
        fields: What :func:`owner_fields` stored.
        settings: The live settings.
        path: The batch's endpoint (``identity.routes`` may restrict methods per path).

    Raises:
        OwnerRevoked: The owner is no longer allowed (the code and message say why).
    """
    who = fields.get("identity")
    if who is not None:
        return _identity_principal(fields, who, settings, path)
    if settings.keystore is not None:
        # Managed keys run with the principal stored at creation (docs/batch.md).
        return stored_principal(fields)
    key = next((k for k in settings.keys if k.id == fields["key_id"]), None)
    if key is None:
        raise OwnerRevoked(f"The API key '{fields['key_id']}' that created this batch is no "
                           "longer configured.")
    return principal_of(key)


def _revoked(code: str, message: str) -> OwnerRevoked:
    return OwnerRevoked(message, code=code)


def _identity_principal(fields: dict[str, Any], who: dict[str, Any],
                        settings: GatewaySettings, path: str) -> Principal:
    section = settings.identity
    name = f"identity {fields['key_id']} (issuer {who['issuer']})"
    if section is None:
        raise _revoked("identity_issuer_removed",
                       f"The {name} that created this batch can no longer be verified: the "
                       "identity section was removed.")
    method = who["method"]
    if method == "jwt":
        issuer = next((i for i in section.issuers if i.issuer == who["issuer"]), None)
        if issuer is None:
            raise _revoked("identity_issuer_removed",
                           f"The {name} that created this batch is no longer trusted: its "
                           "issuer is not configured any more.")
        if who.get("kid") in issuer.revoked_kids:
            raise _revoked("identity_key_revoked",
                           f"The {name} that created this batch was verified with the signing "
                           f"key '{who['kid']}', which is revoked now.")
    elif section.mtls is None:
        raise _revoked("identity_issuer_removed",
                       f"The {name} that created this batch can no longer be verified: client "
                       "certificates are not configured any more.")
    if method not in section.accepted(path):
        raise _revoked("credential_not_accepted",
                       f"The {name} that created this batch used a credential ({method}) that "
                       f"the configuration in force does not accept on {path} "
                       "(identity.accept/routes).")
    rules = section.rules
    at = next((i for i, r in enumerate(rules) if r.id == who["rule"]), None)
    if at is None or rules_digest(rules[:at + 1]) != who.get("rules_sha256"):
        raise _revoked("identity_rules_changed",
                       f"The identity rules that admitted the {name} that created this batch "
                       f"changed (rule '{who['rule']}' or one before it), and its token is not "
                       "kept to evaluate them again: submit the batch again.")
    claims = {n: v for n, v in who["decided_by"]}
    try:
        d = decide([rules[at]], who["issuer"], claims, implicit=section.implicit_source)
    except IdentityNotAllowed as exc:
        raise _revoked("identity_rules_changed",
                       f"The identity rule '{who['rule']}' no longer admits the {name} that "
                       f"created this batch: {exc.message}") from exc
    identity = Identity(
        method=method, issuer=who["issuer"], subject=who["subject"], team=d.team, org=d.org,
        models=d.models, data_class=d.data_class, rule=d.rule, decided_by=d.decided_by,
        kid=who.get("kid"), flow_class=d.flow_class, jwks_sha256=who.get("jwks_sha256"),
        cert_sha256=who.get("cert_sha256"))
    return Principal(identity.key_id, identity.team, identity.data_class, identity.models,
                     identity=identity)
