"""Adapter for the gateway's routing seam (``RoutePolicy.decide``), without importing gateway.

The gateway asks a route policy, per request, which replicas of a model the caller may reach
(``decide(principal, model, replicas) -> RouteDecision``). :class:`EgressRoutePolicy` answers
from :meth:`~policy.evaluate.Policy.select`. It relies only on attribute names (duck typing):
``principal.key_id``, ``principal.team``, ``principal.data_class`` and
``replica.destination``; the gateway passes its own decision type as ``make_decision`` so this
leaf package never imports it.

The data class must already be resolved (key default changed by the classification header
through :meth:`~policy.evaluate.Policy.resolve_class`) when ``decide`` is called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from .evaluate import Policy, Principal, Selection

D = TypeVar("D")


class _Caller(Protocol):
    key_id: str
    team: str | None
    data_class: str


class EgressRoutePolicy:
    """Route only to replicas whose destination the policy allows for the request.

    Args:
        policy: the policy.
        make_decision: builds the gateway's decision from ``(allowed replicas, rule_id)``.
        on_selection: called with every :class:`~policy.evaluate.Selection` (e.g. to put the
            decision and policy revision on the request record); must not raise.
    """

    def __init__(
        self,
        policy: Policy,
        make_decision: Callable[[tuple[Any, ...], str | None], D],
        on_selection: Callable[[Selection], None] | None = None,
    ) -> None:
        self.policy = policy
        self._make = make_decision
        self._on_selection = on_selection

    def decide(self, principal: _Caller, model: object, replicas: Sequence[Any]) -> Any:
        """Return ``make_decision(allowed replicas, deciding rule id)``.

        Raises:
            UnknownDataClass: the principal's data class is not defined by the policy.
        """
        sel = self.policy.select(
            Principal(principal.key_id, principal.team),
            principal.data_class,
            [getattr(r, "destination", None) for r in replicas],
        )
        if self._on_selection is not None:
            self._on_selection(sel)
        return self._make(tuple(replicas[i] for i in sel.allowed), sel.rule_id)
