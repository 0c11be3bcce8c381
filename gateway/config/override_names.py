"""Per-key and per-team overrides that name no key: a typo at start, a leftover on a reload.

Without managed keys (no ``keystore:`` section) every key is in the config file, so an override
in ``quotas.keys``/``quotas.teams`` or ``flow_control.keys``/``flow_control.teams`` that names no
key id or team is a typo that would leave the key it meant without its limit or class,
silently. :func:`unmatched_overrides` finds them; :func:`gateway.config.loader.parse` refuses
them.

A live reload is different. Revoking a key is removing it from ``keys``/``keys_file`` and
sending SIGHUP; refusing that reload because the key's quota override was left behind kept the
revoked key working until someone found the log line. So a reload passes what the running
configuration knew (:meth:`OverrideNames.known_to`), and an unmatched override is a warning,
logged and audited with the reload, only when it is a revocation's leftover:

* a key id whose running key's secret (its ``sha256``) no key of the new configuration has:
  the key was removed. A key renamed with the same secret is no revocation: its override
  naming the old id is refused (the renamed key would run without its limit or class);
* a team none of whose running keys' secrets remains: the team's keys were removed. A key
  moved to another team (``a`` -> ``A``) keeps its secret: the old team's override is refused;
* a name the running configuration already carried unmatched (tolerated by an earlier
  reload, or by this rule on a restarted worker).

Any other override naming no key is refused as at start. A restart still refuses the
leftover, which the warning says.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config.errors import KeyPath

__all__ = ["OverrideNames", "OverrideSource", "Unmatched", "unmatched_overrides"]


class _Key(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def team(self) -> str | None: ...


class _Switch(Protocol):
    @property
    def enabled(self) -> bool: ...


class OverrideSource(Protocol):
    """What this module reads of a configuration (:class:`gateway.config.settings.GatewaySettings`
    has it): the keys, and the sections with per-key and per-team overrides (``quotas``,
    ``flow_control``; each with ``keys`` and ``teams`` mappings), and whether keys are managed
    (``keystore``)."""

    @property
    def keys(self) -> Sequence[_Key]: ...
    @property
    def quotas(self) -> Any: ...
    @property
    def flow_control(self) -> Any: ...
    @property
    def keystore(self) -> _Switch | None: ...


@dataclass(frozen=True, slots=True)
class Unmatched:
    """One override naming no key id (``kind`` ``"key id"``) or no team (``"team"``).

    Attributes:
        path: Its key path, e.g. ``("quotas", "keys", "bot")``.
        kind: ``"key id"`` or ``"team"``.
        name: The name it gives.
        known: The key ids (or teams) the configuration has, sorted.
    """

    path: KeyPath
    kind: str
    name: str
    known: tuple[str, ...]

    def refusal(self) -> str:
        """The problem text when it is refused (a typo)."""
        return (f"no key has the {self.kind} {self.name!r} (known: "
                f"{', '.join(self.known) or 'none'}); without a keystore: section every key is "
                "in the config")

    def warning(self) -> str:
        """The problem text when a reload tolerates it (a key removed, its override left)."""
        return (f"no key has the {self.kind} {self.name!r} any more: the override applies to "
                "no key and is ignored; remove it (a restart refuses it as a typo)")


@dataclass(frozen=True, slots=True)
class OverrideNames:
    """What a running configuration knew, against which a reload's unmatched overrides are
    judged (see the module docstring).

    Attributes:
        key_secrets: Running key id -> its ``sha256``.
        team_secrets: Running team -> the ``sha256`` of its keys.
        leftover_key_ids: Key ids the running overrides name without a key.
        leftover_teams: Teams likewise.
    """

    key_secrets: Mapping[str, str] = field(default_factory=dict)
    team_secrets: Mapping[str, frozenset[str]] = field(default_factory=dict)
    leftover_key_ids: frozenset[str] = frozenset()
    leftover_teams: frozenset[str] = frozenset()

    @classmethod
    def known_to(cls, settings: OverrideSource) -> OverrideNames:
        """What the running ``settings`` know: their keys' ids, teams and secrets, and the
        names their overrides give without a key."""
        key_secrets = {k.id: k.sha256 for k in settings.keys}
        team_secrets: dict[str, set[str]] = {}
        for k in settings.keys:
            if k.team:
                team_secrets.setdefault(k.team, set()).add(k.sha256)
        ids: set[str] = set()
        teams: set[str] = set()
        for _, section in _sections(settings):
            ids.update(name for name in section.keys if name not in key_secrets)
            teams.update(name for name in section.teams if name not in team_secrets)
        return cls(key_secrets, {t: frozenset(d) for t, d in team_secrets.items()},
                   frozenset(ids), frozenset(teams))

    def tolerates(self, unmatched: Unmatched, secrets_now: Set[str]) -> bool:
        """Whether ``unmatched`` is a revocation's leftover.

        Args:
            unmatched: An override of the new configuration naming no key id or team.
            secrets_now: The ``sha256`` of every key of the new configuration.
        """
        if unmatched.kind == "key id":
            if unmatched.name in self.leftover_key_ids:
                return True
            secret = self.key_secrets.get(unmatched.name)
            return secret is not None and secret not in secrets_now
        if unmatched.name in self.leftover_teams:
            return True
        secrets = self.team_secrets.get(unmatched.name)
        return secrets is not None and secrets.isdisjoint(secrets_now)


def _sections(settings: OverrideSource) -> Iterator[tuple[str, Any]]:
    """The override sections in force: ``quotas`` (when enabled) and ``flow_control``."""
    if settings.quotas is not None and settings.quotas.enabled:
        yield "quotas", settings.quotas
    yield "flow_control", settings.flow_control


def unmatched_overrides(settings: OverrideSource) -> list[Unmatched]:
    """Every per-key or per-team override of ``settings`` naming no key id or team, in file
    order of the sections (``quotas`` first); none with managed keys (keys may live in the
    key store)."""
    ks = settings.keystore
    if ks is not None and ks.enabled:
        return []
    ids = sorted({k.id for k in settings.keys})
    teams = sorted({k.team for k in settings.keys if k.team})
    out: list[Unmatched] = []
    for where, section in _sections(settings):
        for plural, kind, known, names in (("keys", "key id", ids, section.keys),
                                           ("teams", "team", teams, section.teams)):
            out.extend(Unmatched((where, plural, name), kind, name, tuple(known))
                       for name in names if name not in known)
    return out
