"""A request's priority class and fair-share flow (pure logic over the ``flow_control`` section).

The class is the key's (``keys``, by key id), else its team's (``teams``), else
``default_class``; the priority header may name a lower class, never a higher one. The flow
that shares the class fairly is the key (``share_by: key``) or its team (``share_by: team``; a
key without a team is its own team), with that key's or team's weight (1 when not listed).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.flow.errors import FlowError, PriorityRaiseRefused, UnknownPriorityClass
from gateway.flow.settings import FlowControlSettings

__all__ = ["Classifier"]


class Classifier:
    """Classes and flows of requests under one ``flow_control`` section.

    Args:
        settings: The section.
    """

    def __init__(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self.names = tuple(c.name for c in settings.classes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self._default = self.index[settings.default_class]
        self._by_team = settings.share_by == "team"

    def classify(self, key_id: str, team: str | None,
                 named: Sequence[str] = (), assigned: str | None = None) -> tuple[int, str, float]:
        """``(class index, flow, weight)`` of a request of key ``key_id`` (of ``team``).

        Args:
            key_id: The caller's key id.
            team: The key's team, if any.
            named: The values of the priority header's fields (empty: no header).
            assigned: A class the caller's identity rule assigned (gateway.identity): it
                replaces the key's or team's class; an unknown name is ignored.

        Raises:
            FlowError: The header names a higher class (``PriorityRaiseRefused``, 403), no
                class or more than one (``UnknownPriorityClass``, 400); ``param`` is the
                header's name.
        """
        s = self.settings
        share = s.keys.get(key_id)
        if share is None and team is not None:
            share = s.teams.get(team)
        cls = self.index[share.class_] if share is not None else self._default
        if assigned is not None and assigned in self.index:
            cls = self.index[assigned]
        if self._by_team:
            who = team or key_id
            team_share = s.teams.get(team) if team is not None else None
            weight = team_share.weight if team_share is not None else 1.0
        else:
            who = key_id
            weight = share.weight if share is not None else 1.0
        if named:
            cls = self._lowered(cls, named)
        return cls, who, weight

    def _lowered(self, cls: int, fields: Sequence[str]) -> int:
        header = self.settings.header
        classes = ", ".join(self.names)
        # Several fields are one comma-separated list in HTTP (RFC 9110, 5.3): naming more
        # than one class is ambiguous, whatever the order, and refused.
        names = [part.strip().lower() for field in fields for part in field.split(",")]
        err: FlowError | None = None
        asked = self.index.get(names[0])
        if len(names) > 1:
            err = UnknownPriorityClass(
                f"The {header} header names more than one priority class "
                f"({', '.join(names)[:64]!r}); name one of: {classes}.")
        elif asked is None:
            err = UnknownPriorityClass(
                f"The {header} header names no priority class ({names[0][:64]!r}); classes: "
                f"{classes}.")
        elif asked < cls:
            err = PriorityRaiseRefused(
                f"The {header} header may only lower this key's priority class "
                f"({self.names[cls]!r}), not raise it to {names[0]!r}.")
        if err is not None:
            err.param = header
            raise err
        assert asked is not None
        return asked
