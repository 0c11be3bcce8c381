"""Per-key and per-team overrides that name no key: a typo at start, a leftover on a reload.

Without managed keys (no ``keystore:`` section) every key is in the config file, so an override
in ``quotas.keys``/``quotas.teams`` or ``flow_control.keys``/``flow_control.teams`` that names no
key id or team is a typo that would leave the key it meant without its limit or class,
silently. :func:`unmatched_overrides` finds them; :func:`gateway.settings.parse` refuses them.

A live reload is different. Revoking a key is removing it from ``keys``/``keys_file`` and
sending SIGHUP; refusing that reload because the key's quota override was left behind kept the
revoked key working until someone found the log line. So a reload passes the names the running
configuration knew (:meth:`OverrideNames.known_to`): an unmatched override that names one of
them (the key was removed by this reload, or the running configuration already carried the
leftover) is a warning, logged and audited with the reload; an override new in this reload that
names nothing is refused as at start. A restart still refuses the leftover, which the warning
says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config_errors import KeyPath

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

__all__ = ["OverrideNames", "Unmatched", "unmatched_overrides"]


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
    """The key ids and teams that a reload tolerates in an override naming no key.

    Attributes:
        key_ids: Key ids (of keys, or of overrides already tolerated).
        teams: Teams, likewise.
    """

    key_ids: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()

    @classmethod
    def known_to(cls, settings: GatewaySettings) -> OverrideNames:
        """The names the running ``settings`` know: their keys' ids and teams, and the names
        their overrides give (a leftover tolerated by an earlier reload stays tolerated)."""
        ids = {k.id for k in settings.keys}
        teams = {k.team for k in settings.keys if k.team}
        for _, section in _sections(settings):
            ids.update(section.keys)
            teams.update(section.teams)
        return cls(frozenset(ids), frozenset(teams))

    def tolerates(self, unmatched: Unmatched) -> bool:
        """Whether ``unmatched`` names a key id or team these names hold."""
        names = self.key_ids if unmatched.kind == "key id" else self.teams
        return unmatched.name in names


def _sections(settings: GatewaySettings) -> Iterator[tuple[str, Any]]:
    """The override sections in force: ``quotas`` (when enabled) and ``flow_control``."""
    if settings.quotas is not None and settings.quotas.enabled:
        yield "quotas", settings.quotas
    yield "flow_control", settings.flow_control


def unmatched_overrides(settings: GatewaySettings) -> list[Unmatched]:
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
