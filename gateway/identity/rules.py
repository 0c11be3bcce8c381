"""Claims mapping: the first :class:`IdentityRule` whose ``match`` holds decides what a verified
caller may do (team, models, data class). Pure functions over the claims, so ``policy explain``
and the request path give the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.identity.errors import IdentityNotAllowed
from gateway.identity.settings import IdentityRule

__all__ = ["Decision", "claim_value", "decide"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What a rule decided.

    Attributes:
        rule: The rule id.
        team: Team (from the rule, or its ``team_claim``).
        org: Organisation (from the rule, or its ``org_claim``).
        models: Models allowed.
        data_class: Data class.
        flow_class: Flow-control priority class (``None``: by team, as for keys).
        decided_by: The claims (name, matched value) that made the rule hold.
    """

    rule: str
    team: str | None
    org: str | None
    models: frozenset[str]
    data_class: str
    flow_class: str | None
    decided_by: tuple[tuple[str, str], ...]


def claim_value(claims: Mapping[str, Any], name: str) -> Any:
    """The claim ``name``; a dotted name walks nested objects (``realm_access.roles``), and a
    claim whose own name has dots is found too (``kubernetes.io.namespace``: the claim
    ``kubernetes.io``, then its ``namespace``). ``None`` when absent."""
    if name in claims:
        return claims[name]
    parts = name.split(".")
    for cut in range(1, len(parts)):
        head = ".".join(parts[:cut])
        inner = claims.get(head)
        if isinstance(inner, Mapping):
            found = claim_value(inner, ".".join(parts[cut:]))
            if found is not None:
                return found
    return None


def _matched(value: Any, wanted: str | list[str]) -> str | None:
    options = [wanted] if isinstance(wanted, str) else wanted
    have = value if isinstance(value, list) else [value]
    for item in have:
        if isinstance(item, (str, int, float, bool)) and not isinstance(item, dict):
            text = str(item).lower() if isinstance(item, bool) else str(item)
            if text in options:
                return text
    return None


def _named(claims: Mapping[str, Any], fixed: str | None, claim: str | None, rule: str,
           what: str, decided: list[tuple[str, str]]) -> str | None:
    if claim is None:
        return fixed
    value = claim_value(claims, claim)
    if not isinstance(value, str) or not value:
        raise IdentityNotAllowed(
            f"The identity has no {claim!r} claim naming its {what} (rule {rule}).")
    decided.append((claim, value))
    return value


def decide(rules: Sequence[IdentityRule], issuer: str, claims: Mapping[str, Any], *,
           implicit: str | None) -> Decision:
    """The decision of the first rule that holds for ``claims`` of ``issuer``.

    A rule is tried only for identities of its source: its ``issuer`` (``mtls``: client
    certificates), else ``implicit``. A token's claims never make a rule of another source hold,
    whatever they carry (``spiffe_id``, ``iss: mtls``, another issuer's group names).

    Args:
        rules: The rules, in order (first match wins).
        issuer: The verified source of ``claims``: the token's configured issuer, or ``mtls``.
        claims: The token's claims, or a certificate's names.
        implicit: The source of rules that name none
            (:meth:`~gateway.identity.settings.IdentitySettings.source_of`: the only configured
            source; ``None``: such rules hold for nobody).

    Raises:
        IdentityNotAllowed: No rule holds (403 ``identity_not_mapped``), or the matching
            rule's ``team_claim`` or ``org_claim`` is missing or not a string.
    """
    for rule in rules:
        if (rule.issuer if rule.issuer is not None else implicit) != issuer:
            continue
        decided: list[tuple[str, str]] = []
        for name, wanted in rule.match.items():
            hit = _matched(claim_value(claims, name), wanted)
            if hit is None:
                break
            decided.append((name, hit))
        else:
            team = _named(claims, rule.team, rule.team_claim, rule.id, "team", decided)
            org = _named(claims, rule.org, rule.org_claim, rule.id, "organisation", decided)
            return Decision(rule.id, team, org, frozenset(rule.models), rule.data_class,
                            rule.flow_class, tuple(decided))
    raise IdentityNotAllowed("The identity is verified but no identity rule grants it access.")
