"""Rule evaluation: may this principal, with this data class, send a request to that destination?

Semantics (deny by default):

* A request's data class is the key's default; the classification header may lower or raise
  it only under a grant (:meth:`Policy.resolve_class`).
* Prompts only go to destinations of purpose ``inference``, and tool calls (which carry the
  prompt's data in their arguments) to ``tool`` destinations (MCP servers, and what a tool's
  URL arguments may reach); telemetry, audit and storage destinations exist for the process
  guard and transport, never for routing.
* Rules are tried in order. A rule *applies* when its principals, classes and destinations
  selectors match; the first rule that applies decides. An ``allow`` rule whose constraints
  the destination does not meet denies, naming the failed constraint; a ``deny`` rule denies.
  When no rule applies, the request is denied ("no rule matched").
* ``unsafe_allow_all`` allows everything and logs a warning on every evaluation.

Rules are precompiled (sets, and every constraint checked once per destination at load) and
decisions are cached per ``(key, team, class, destination)`` inside the immutable
:class:`Policy`, so a new revision is a new object with a new cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ClassChangeForbidden, UnknownDataClass, UnknownDestination
from .model import Destination, PolicyDocument, Rule, load_document, parse_document
from .pii.inspect import PiiPolicy

_log = logging.getLogger(__name__)

UNSAFE_RULE_ID = "unsafe_allow_all"
_CACHE_MAX = 65_536


@dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request: an API key id and, optionally, its team."""

    key: str
    team: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one evaluation, attached to the request record for the audit log.

    Attributes:
        allowed: whether the request may go to the destination.
        rule_id: the rule that decided, or ``None`` when no rule matched.
        reason: human-readable explanation.
        revision: the policy revision (``sha256:<hex>``) that decided.
        destination_id: the destination evaluated.
        content_hmac: the deciding ``allow`` rule opts in to content HMACs in the audit log
            (``audit: {content_hmac: true}``); always ``False`` for denials.
    """

    allowed: bool
    rule_id: str | None
    reason: str
    revision: str
    destination_id: str
    content_hmac: bool = False

    def as_record(self) -> dict[str, Any]:
        """Return the JSON-ready form for audit records."""
        return {
            "decision": "allow" if self.allowed else "deny",
            "rule_id": self.rule_id,
            "reason": self.reason,
            "policy_revision": self.revision,
            "destination": self.destination_id,
        }


@dataclass(frozen=True, slots=True)
class Selection:
    """The routing outcome for one request over a model's replicas.

    Attributes:
        allowed: indices (into the given destination list) of the replicas that may be used.
        decisions: one decision per replica, in the given order.
        rule_id: the rule of the first allowed replica; when none is allowed, the rule of the
            first denial (``None``: no rule matched) -- what a 403 names.
        reason: the first denial's reason when nothing is allowed, else ``""``.
        content_hmac: the rule of the first allowed replica (``rule_id``) opts in to content
            HMACs; ``False`` when nothing is allowed.
    """

    allowed: tuple[int, ...]
    decisions: tuple[Decision, ...]
    rule_id: str | None
    reason: str
    content_hmac: bool = False


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    keys: frozenset[str]
    teams: frozenset[str]
    classes: frozenset[str] | None
    destinations: frozenset[str] | None
    failures: dict[str, str] = field(hash=False)  # destination id -> failed constraint

    def applies(self, principal: Principal, data_class: str, destination_id: str) -> bool:
        if self.keys or self.teams:
            if principal.key not in self.keys and (
                principal.team is None or principal.team not in self.teams
            ):
                return False
        if self.classes is not None and data_class not in self.classes:
            return False
        return self.destinations is None or destination_id in self.destinations


def _constraint_failure(rule: Rule, d: Destination) -> str | None:
    c = rule.constraints
    if c.jurisdiction is not None:
        wanted = [c.jurisdiction] if isinstance(c.jurisdiction, str) else c.jurisdiction
        if d.jurisdiction not in wanted:
            return f"requires jurisdiction {' or '.join(wanted)}; {d.id} is {d.jurisdiction}"
    if c.regions is not None and d.region not in c.regions:
        return f"requires region in [{', '.join(c.regions)}]; {d.id} is in {d.region}"
    missing = [t for t in c.require_tags if t not in d.tags]
    if missing:
        return f"requires tags [{', '.join(c.require_tags)}]; {d.id} lacks {', '.join(missing)}"
    if c.operators is not None and d.operator not in c.operators:
        return f"requires operator in [{', '.join(c.operators)}]; {d.id} is run by {d.operator}"
    return None


class Policy:
    """A validated, compiled, immutable policy revision.

    Build one with :meth:`from_file` or :meth:`from_text`. Thread-safe for evaluation (the
    decision cache only ever gains entries whose value is a pure function of the key).
    """

    def __init__(self, document: PolicyDocument, revision: str, source: str = "<string>") -> None:
        self.document = document
        self.revision = revision
        self.source = source
        self.destinations: dict[str, Destination] = {d.id: d for d in document.destinations}
        self.classes: tuple[str, ...] = tuple(document.data_classes)
        self._class_rank = {c: i for i, c in enumerate(self.classes)}
        self._rules = tuple(
            _CompiledRule(
                rule=r,
                keys=frozenset(r.principals.keys),
                teams=frozenset(r.principals.teams),
                classes=frozenset(r.classes) if r.classes is not None else None,
                destinations=frozenset(r.destinations) if r.destinations is not None else None,
                failures={
                    d.id: f
                    for d in document.destinations
                    if (f := _constraint_failure(r, d)) is not None
                },
            )
            for r in document.rules
        )
        self._cache: dict[tuple[str, str | None, str, str], Decision] = {}
        pii = document.pii
        #: Sensitive-data detection (``pii`` section, enabled), its detector built on ``load()``.
        self.pii: PiiPolicy | None = (
            PiiPolicy(pii, self.classes) if pii is not None and pii.enabled else None)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Load and compile a policy file.

        Raises:
            PolicyFileError: unreadable or invalid file (message names file, line, key).
        """
        doc, rev = load_document(path)
        return cls(doc, rev, str(path))

    @classmethod
    def from_text(cls, text: str, source: str = "<string>") -> Policy:
        """Parse and compile a policy given as YAML text.

        Raises:
            PolicyFileError: invalid document.
        """
        doc, rev = parse_document(text, source)
        return cls(doc, rev, source)

    @property
    def unsafe_allow_all(self) -> bool:
        """Whether the development-only allow-everything switch is on."""
        return self.document.unsafe_allow_all

    @property
    def classification_header(self) -> str:
        """The request header that may change a request's data class (lower case)."""
        return self.document.classification.header.lower()

    def destination(self, destination_id: str) -> Destination:
        """Return a destination by id.

        Raises:
            UnknownDestination: no such destination in this policy.
        """
        try:
            return self.destinations[destination_id]
        except KeyError:
            raise UnknownDestination(
                f"destination {destination_id!r} is not defined in policy {self.source}"
            ) from None

    def check_class(self, data_class: str) -> str:
        """Return ``data_class`` if the policy defines it.

        Raises:
            UnknownDataClass: it does not.
        """
        if data_class not in self._class_rank:
            raise UnknownDataClass(
                f"data class {data_class!r} is not defined (known: {', '.join(self.classes)})"
            )
        return data_class

    def resolve_class(
        self, key_default: str, header_value: str | None, principal: Principal
    ) -> str:
        """Return the data class of a request.

        Args:
            key_default: the key's default data class (from the gateway config).
            header_value: the classification header's value, or ``None``/empty when absent.
            principal: the caller.

        Returns:
            ``key_default``, or the header's class when a grant lets this principal change to it.

        Raises:
            UnknownDataClass: the default or the requested class is not defined.
            ClassChangeForbidden: the principal has no grant for this change.
        """
        self.check_class(key_default)
        if header_value is None or not header_value.strip():
            return key_default
        wanted = self.check_class(header_value.strip().lower())
        if wanted == key_default:
            return wanted
        lowering = self._class_rank[wanted] < self._class_rank[key_default]
        for g in self.document.classification.grants:
            team_ok = principal.team is not None and principal.team in g.teams
            if principal.key not in g.keys and not team_ok:
                continue
            if not (g.lower if lowering else g.raise_):
                continue
            if g.classes is not None and wanted not in g.classes:
                continue
            return wanted
        verb = "lower" if lowering else "raise"
        raise ClassChangeForbidden(
            f"key {principal.key!r} may not {verb} its data class from {key_default!r} to "
            f"{wanted!r}: no classification grant in the policy allows it"
        )

    def evaluate(self, principal: Principal, data_class: str, destination_id: str) -> Decision:
        """Decide whether a request may be sent to one destination.

        Args:
            principal: the caller (key id, team).
            data_class: the request's resolved data class.
            destination_id: the destination of a candidate replica.

        Returns:
            The decision, with the deciding rule id (``None``: no rule matched) and revision.

        Raises:
            UnknownDataClass: ``data_class`` is not defined in this policy.
        """
        if self.document.unsafe_allow_all:
            _log.warning(
                "policy %s has unsafe_allow_all on: request to %s allowed without checks",
                self.source, destination_id,
            )
            return Decision(True, UNSAFE_RULE_ID, "unsafe_allow_all is on (development only)",
                            self.revision, destination_id)
        cache_key = (principal.key, principal.team, data_class, destination_id)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        self.check_class(data_class)
        decision = self._decide(principal, data_class, destination_id)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[cache_key] = decision
        return decision

    def _decide(self, principal: Principal, data_class: str, destination_id: str) -> Decision:
        dest = self.destinations.get(destination_id)
        if dest is None:
            return Decision(False, None, f"destination {destination_id!r} is not defined",
                            self.revision, destination_id)
        if dest.purpose not in ("inference", "tool"):
            return Decision(
                False, None,
                f"destination {dest.id} has purpose {dest.purpose!r}: prompts only go to "
                "'inference' and 'tool' destinations", self.revision, destination_id,
            )
        for cr in self._rules:
            if not cr.applies(principal, data_class, destination_id):
                continue
            rid = cr.rule.id
            if cr.rule.effect == "deny":
                return Decision(False, rid, f"denied by rule {rid}", self.revision, destination_id)
            failure = cr.failures.get(destination_id)
            if failure is not None:
                return Decision(False, rid, f"rule {rid} {failure}", self.revision, destination_id)
            return Decision(True, rid, f"allowed by rule {rid}", self.revision, destination_id,
                            cr.rule.audit.content_hmac)
        return Decision(
            False, None,
            f"no rule matched key {principal.key!r} (team {principal.team!r}), class "
            f"{data_class!r}, destination {destination_id}", self.revision, destination_id,
        )

    def select(
        self, principal: Principal, data_class: str, destination_ids: Sequence[str | None]
    ) -> Selection:
        """Evaluate every replica of a model; a replica without a destination is denied.

        Args:
            principal: the caller.
            data_class: the request's resolved data class.
            destination_ids: each replica's destination id (``None``: not configured).

        Raises:
            UnknownDataClass: ``data_class`` is not defined.
        """
        decisions = tuple(self._replica_decision(principal, data_class, d)
                          for d in destination_ids)
        allowed = tuple(i for i, d in enumerate(decisions) if d.allowed)
        if allowed:
            first = decisions[allowed[0]]
            return Selection(allowed, decisions, first.rule_id, "", first.content_hmac)
        if not decisions:
            return Selection((), (), None, "model has no replicas")
        return Selection((), decisions, decisions[0].rule_id, decisions[0].reason)

    def _replica_decision(
        self, principal: Principal, data_class: str, destination_id: str | None
    ) -> Decision:
        if destination_id is None:
            return Decision(False, None, "replica has no policy destination", self.revision, "")
        return self.evaluate(principal, data_class, destination_id)

    def explain(
        self, principal: Principal, data_class: str,
        destination_ids: Iterable[str | None] | None = None,
    ) -> list[Decision]:
        """Evaluate every given destination (default: every inference destination).

        Args:
            principal: the caller.
            data_class: the request's resolved data class.
            destination_ids: destination ids in the order to explain, ``None`` for a replica
                that names none (denied, as :meth:`select` denies it); default: every
                ``inference`` destination in policy order.

        Returns:
            One decision per destination, in the order given (policy order by default).

        Raises:
            UnknownDataClass: ``data_class`` is not defined.
        """
        ids: Sequence[str | None] = (
            list(destination_ids) if destination_ids is not None
            else [d.id for d in self.document.destinations if d.purpose == "inference"]
        )
        self.check_class(data_class)
        return [self._replica_decision(principal, data_class, d) for d in ids]
